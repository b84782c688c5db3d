/* The run's "none of these" rule in JavaScript: vit_flowers/inference/unknown.py's known_scores with the same
 * arithmetic in float64, on the float32 values the checkpoint holds (rule.json's numbers rounded back with
 * Math.fround), so that the page says "not sure" of the photos predict calls unknown. Loaded as a classic script
 * (window.vfUnknown) by the page and as a CommonJS module by node in the tests.
 */
(function (root) {
  "use strict";

  /* The rule's arrays as float64 values of the float32s the checkpoint holds, and each class mean's m P m. */
  function prepareRule(unknown, arrays) {
    if (!unknown) return null;
    const f32 = (rows) => rows.map((row) => Float64Array.from(row, Math.fround));
    const r = { rule: unknown.rule, threshold: unknown.threshold };
    if (arrays) {
      r.means = f32(arrays.means);
      if (arrays.precision) r.precision = f32(arrays.precision);
      if (arrays.offsets) r.offsets = Float64Array.from(arrays.offsets, Math.fround);
      if (r.precision) r.mPm = r.means.map((m) => dot(matVec(m, r.precision), m));
    }
    return r;
  }

  function dot(a, b) {
    let s = 0;
    for (let i = 0; i < a.length; i++) s += a[i] * b[i];
    return s;
  }

  /* The row vector v times the matrix p: (v p)_j = sum_i v_i p_ij. */
  function matVec(v, p) {
    const out = new Float64Array(p[0].length);
    for (let i = 0; i < v.length; i++) {
      const row = p[i], vi = v[i];
      for (let j = 0; j < out.length; j++) out[j] += vi * row[j];
    }
    return out;
  }

  function softmax(logits) {
    const top = Math.max(...logits);
    const z = logits.map((l) => Math.exp(l - top));
    const total = z.reduce((a, b) => a + b, 0);
    return z.map((v) => v / total);
  }

  /* unknown.known_scores for one photo: higher is more like a known class. */
  function knownScore(r, logits, probs, features) {
    if (r.rule === "max_softmax") return Math.max(...probs);
    if (r.rule === "energy") {
      const top = Math.max(...logits);
      return top + Math.log(logits.reduce((a, l) => a + Math.exp(l - top), 0));
    }
    const f = Float64Array.from(features);
    if (r.rule === "mahalanobis") {
      const fp = matVec(f, r.precision), fPf = dot(fp, f);
      let best = Infinity;
      r.means.forEach((m, c) => {
        const d2 = fPf - 2 * dot(fp, m) + r.mPm[c] - (r.offsets ? r.offsets[c] : 0);
        best = Math.min(best, d2);
      });
      return -best;
    }
    if (r.rule === "distance") {
      const ff = dot(f, f);
      const best = Math.min(...r.means.map((m) => ff - 2 * dot(f, m) + dot(m, m)));
      return -Math.sqrt(Math.max(best, 0));
    }
    if (r.rule === "cosine") {
      const center = new Float64Array(f.length);
      r.means.forEach((m) => m.forEach((v, i) => (center[i] += v / r.means.length)));
      const unit = (v) => {
        const d = v.map((x, i) => x - center[i]);
        const n = Math.max(Math.sqrt(dot(d, d)), 1e-12);
        return d.map((x) => x / n);
      };
      const fu = unit(f);
      return Math.max(...r.means.map((m) => dot(fu, unit(m))));
    }
    throw new Error("unknown rule " + r.rule);
  }

  const api = { prepareRule, knownScore, softmax };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.vfUnknown = api;
})(typeof self !== "undefined" ? self : this);
