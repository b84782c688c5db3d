/* The Python path's pixels, in JavaScript: vit_flowers.data.images.resize_crop (PyTorch's antialiased bicubic
 * resize on uint8 pixels, the shorter side to the model's size, then a centre crop) and
 * vit_flowers.data.augment's normalisation, with the same integer arithmetic, so that the page gives the model
 * the same numbers as `vit-flowers predict` (tests/test_web_export.py checks it in Chromium).
 *
 * PyTorch's uint8 resize (like Pillow's) filters each axis in turn, horizontal first, with the filter's weights
 * turned into integers of `precision` bits and every sum rounded back to 0..255 between the two passes: a float
 * resize would land a grey level off on some pixels. Loaded as a classic script (window.vfPreprocess) by the page
 * and as a CommonJS module by node in the tests.
 */
(function (root) {
  "use strict";

  const A = -0.5; // the antialiased bicubic filter's a (Pillow's and PyTorch's antialias=True)
  const MAX_ASPECT_RATIO = 8;  // image_files.MAX_ASPECT_RATIO: a longer strip is cut to its centre square first

  function bicubic(x) {
    x = Math.abs(x);
    if (x < 1.0) return ((A + 2) * x - (A + 3)) * x * x + 1;
    if (x < 2.0) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
    return 0.0;
  }

  /* The integer weights of one axis, inSize -> outSize: PyTorch's _compute_index_ranges_int16_weights. */
  function axisWeights(inSize, outSize) {
    const scale = inSize / outSize;
    const support = scale >= 1.0 ? 2 * scale : 2.0;
    const invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    const ksize = Math.ceil(support) * 2 + 1;
    const starts = new Int32Array(outSize);
    const sizes = new Int32Array(outSize);
    const weights = new Float64Array(outSize * ksize);
    let wtMax = 0.0;
    for (let i = 0; i < outSize; i++) {
      const center = scale * (i + 0.5);
      const xmin = Math.max(Math.trunc(center - support + 0.5), 0);
      const xsize = Math.min(Math.min(Math.trunc(center + support + 0.5), inSize) - xmin, ksize);
      let total = 0.0;
      for (let j = 0; j < xsize; j++) {
        const w = bicubic((j + xmin - center + 0.5) * invscale);
        weights[i * ksize + j] = w;
        total += w;
      }
      for (let j = 0; j < xsize; j++) {
        if (total !== 0.0) weights[i * ksize + j] /= total;
        wtMax = Math.max(wtMax, weights[i * ksize + j]);
      }
      starts[i] = xmin;
      sizes[i] = Math.max(xsize, 0);
    }
    let precision = 0;
    for (; precision < 22; precision++) {
      if (Math.trunc(0.5 + wtMax * 2 ** (precision + 1)) >= 1 << 15) break;
    }
    const ints = new Int32Array(outSize * ksize);
    for (let k = 0; k < ints.length; k++) {
      const v = weights[k] * 2 ** precision;
      ints[k] = weights[k] < 0 ? Math.trunc(-0.5 + v) : Math.trunc(0.5 + v);
    }
    return { starts, sizes, ints, ksize, precision };
  }

  function clip8(sum, precision) {
    const v = sum >> precision; // an arithmetic shift, as the C++ kernel's
    return v < 0 ? 0 : v > 255 ? 255 : v;
  }

  /* RGB uint8 (h, w, 3) -> (h, outW, 3), filtered along the rows. */
  function horizontal(rgb, h, w, outW) {
    const { starts, sizes, ints, ksize, precision } = axisWeights(w, outW);
    const out = new Uint8Array(h * outW * 3);
    const half = 1 << (precision - 1);
    for (let y = 0; y < h; y++) {
      const row = y * w * 3;
      for (let x = 0; x < outW; x++) {
        let r = half, g = half, b = half;
        const s = starts[x], k0 = x * ksize;
        for (let j = 0; j < sizes[x]; j++) {
          const p = row + (s + j) * 3, c = ints[k0 + j];
          r += rgb[p] * c; g += rgb[p + 1] * c; b += rgb[p + 2] * c;
        }
        const o = (y * outW + x) * 3;
        out[o] = clip8(r, precision); out[o + 1] = clip8(g, precision); out[o + 2] = clip8(b, precision);
      }
    }
    return out;
  }

  /* RGB uint8 (h, w, 3) -> (outH, w, 3), filtered along the columns. */
  function vertical(rgb, h, w, outH) {
    const { starts, sizes, ints, ksize, precision } = axisWeights(h, outH);
    const out = new Uint8Array(outH * w * 3);
    const half = 1 << (precision - 1);
    for (let y = 0; y < outH; y++) {
      const s = starts[y], k0 = y * ksize;
      for (let x = 0; x < w * 3; x++) {
        let v = half;
        for (let j = 0; j < sizes[y]; j++) v += rgb[(s + j) * w * 3 + x] * ints[k0 + j];
        out[y * w * 3 + x] = clip8(v, precision);
      }
    }
    return out;
  }

  /* Python's round() of a half-integer or integer: halves to even (torchvision's centre-crop offsets). */
  function roundHalfEven(v) {
    const f = Math.floor(v);
    const d = v - f;
    if (d > 0.5) return f + 1;
    if (d < 0.5) return f;
    return f % 2 === 0 ? f : f + 1;
  }

  /* A (h, w, 3) region cut out at (top, left), (ch, cw) in size; zero beyond the image, as torchvision pads. */
  function crop(rgb, h, w, top, left, ch, cw) {
    const out = new Uint8Array(ch * cw * 3);
    for (let y = 0; y < ch; y++) {
      const sy = y + top;
      if (sy < 0 || sy >= h) continue;
      for (let x = 0; x < cw; x++) {
        const sx = x + left;
        if (sx < 0 || sx >= w) continue;
        const p = (sy * w + sx) * 3, o = (y * cw + x) * 3;
        out[o] = rgb[p]; out[o + 1] = rgb[p + 1]; out[o + 2] = rgb[p + 2];
      }
    }
    return out;
  }

  /* image_files.crop_strip: a strip longer than MAX_ASPECT_RATIO times its width -> its centre square. */
  function cropStrip(rgb, h, w) {
    if (Math.max(h, w) <= MAX_ASPECT_RATIO * Math.min(h, w)) return { rgb, h, w };
    const side = Math.min(h, w);
    const top = roundHalfEven((h - side) / 2), left = roundHalfEven((w - side) / 2);
    return { rgb: crop(rgb, h, w, top, left, side, side), h: side, w: side };
  }

  /* images.resize_crop for one image: RGB uint8 (h, w, 3) -> (size, size, 3). */
  function resizeCrop(rgb, h, w, size) {
    ({ rgb, h, w } = cropStrip(rgb, h, w));
    const outH = h <= w ? size : Math.trunc(size * h / w);
    const outW = h <= w ? Math.trunc(size * w / h) : size;
    let x = rgb;
    if (outW !== w) x = horizontal(x, h, w, outW);
    if (outH !== h) x = vertical(x, h, outW, outH);
    const top = roundHalfEven((outH - size) / 2), left = roundHalfEven((outW - size) / 2);
    return crop(x, outH, outW, top, left, size, size);
  }

  /* How much smaller Pillow decodes a JPEG whose shorter side is at least four times the model's size
   * (image_files.load_image's Image.draft: 1/2, 1/4 or 1/8), or 1. */
  function draftScale(h, w, size) {
    if (Math.min(h, w) < 4 * size) return 1;
    const scale = Math.min(Math.floor(w / (2 * size)), Math.floor(h / (2 * size)));
    for (const a of [8, 4, 2]) if (scale >= a) return a;
    return 1;
  }

  /* The draft's reduced decode, approximated: the mean of each a x a block (libjpeg's DCT scaling is within a
   * grey level or two of it), rounded; the last row and column of blocks may be partial, as libjpeg's. */
  function boxReduce(rgb, h, w, a) {
    const oh = Math.ceil(h / a), ow = Math.ceil(w / a);
    const out = new Uint8Array(oh * ow * 3);
    for (let y = 0; y < oh; y++) {
      const y1 = Math.min(h, (y + 1) * a);
      for (let x = 0; x < ow; x++) {
        const x1 = Math.min(w, (x + 1) * a);
        let r = 0, g = 0, b = 0, n = 0;
        for (let yy = y * a; yy < y1; yy++) {
          for (let xx = x * a; xx < x1; xx++) {
            const p = (yy * w + xx) * 3;
            r += rgb[p]; g += rgb[p + 1]; b += rgb[p + 2]; n++;
          }
        }
        const o = (y * ow + x) * 3;
        out[o] = Math.round(r / n); out[o + 1] = Math.round(g / n); out[o + 2] = Math.round(b / n);
      }
    }
    return { rgb: out, h: oh, w: ow };
  }

  /* RGB uint8 (size, size, 3) -> float32 (1, 3, size, size): augment._normalize's x * (1 / (255 std)) - mean / std,
   * its two constants rounded to float32 as PyTorch rounds them. */
  function normalize(rgb, size, mean, std) {
    const out = new Float32Array(3 * size * size);
    for (let c = 0; c < 3; c++) {
      const scale = Math.fround(1.0 / (255.0 * std[c]));
      const shift = Math.fround(-mean[c] / std[c]);
      const plane = c * size * size;
      for (let i = 0; i < size * size; i++) out[plane + i] = Math.fround(shift + Math.fround(rgb[i * 3 + c] * scale));
    }
    return out;
  }

  /* RGBA (h, w, 4) as a canvas gives it -> RGB (h, w, 3); transparency composited on white. */
  function rgbaToRgb(rgba, h, w) {
    const out = new Uint8Array(h * w * 3);
    for (let i = 0; i < h * w; i++) {
      const a = rgba[i * 4 + 3];
      for (let c = 0; c < 3; c++) {
        const v = rgba[i * 4 + c];
        out[i * 3 + c] = a === 255 ? v : Math.round((v * a + 255 * (255 - a)) / 255);
      }
    }
    return out;
  }

  /* A decoded photo -> the model's input: float32 (1, 3, size, size). `isJpeg`: reduce as Pillow's draft would. */
  function toInput(rgba, h, w, config, isJpeg) {
    let rgb = rgbaToRgb(rgba, h, w);
    const a = isJpeg ? draftScale(h, w, config.image_size) : 1;
    if (a > 1) ({ rgb, h, w } = boxReduce(rgb, h, w, a));
    const pixels = resizeCrop(rgb, h, w, config.image_size);
    return normalize(pixels, config.image_size, config.mean, config.std);
  }

  const api = { axisWeights, resizeCrop, draftScale, boxReduce, normalize, rgbaToRgb, toInput, roundHalfEven };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.vfPreprocess = api;
})(typeof self !== "undefined" ? self : this);
