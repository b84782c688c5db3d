/* The exported page: photos (chosen, dropped, or a webcam frame) through the model with ONNX Runtime Web, the top
 * classes with their probabilities, and "not sure" from the run's own unknown rule (vit_flowers/inference/unknown.py,
 * the same arithmetic in float64). Everything it needs is beside it: config.json (classes, preprocessing, the
 * rule), rule.json (a feature rule's arrays), the model, and ONNX Runtime (or its CDN address in config.json).
 *
 * window.vf holds what a test or benchmark reads: `state` ("loading", "ready", "unsupported", "error"),
 * `readyMs` (page start to model ready), and `results`, one per photo in the order given: {name, source,
 * probabilities, label, top, unknown, score, ms (preprocessing + model), doneMs (since page start)} or {name, error}.
 */
(function () {
  "use strict";

  const TOP = 3;
  // the smallest module that uses a SIMD instruction (i8x16.splat, i8x16.popcnt): ONNX Runtime Web's only builds
  // need WebAssembly SIMD (Chrome 91, Firefox 89, Safari 16.4 and later)
  const SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 10, 1, 8, 0,
    65, 0, 253, 15, 253, 98, 11]);

  const vf = (window.vf = { state: "loading", readyMs: null, results: [] });
  const $ = (id) => document.getElementById(id);
  let config = null, rule = null, session = null, queue = Promise.resolve(), frames = 0;

  function say(state, text) {
    vf.state = state;
    $("status").dataset.state = state;
    $("status").textContent = text;
  }

  function hasSimd() {
    try {
      return typeof WebAssembly === "object" && WebAssembly.validate(SIMD_PROBE);
    } catch (e) {
      return false;
    }
  }

  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = src;
      s.onload = resolve;
      s.onerror = () => reject(new Error("cannot load " + src));
      document.head.appendChild(s);
    });
  }

  async function fetchJson(name) {
    const r = await fetch(name);
    if (!r.ok) throw new Error(name + ": HTTP " + r.status);
    return r.json();
  }

  async function classify(rgba, h, w, isJpeg) {
    const t0 = performance.now();
    const x = window.vfPreprocess.toInput(rgba, h, w, config, isJpeg);
    const s = config.image_size;
    const out = await session.run({ images: new ort.Tensor("float32", x, [1, 3, s, s]) });
    const logits = Array.from(out.logits.data);
    const probabilities = window.vfUnknown.softmax(logits);
    const order = probabilities.map((p, i) => i).sort((a, b) => probabilities[b] - probabilities[a]);
    const top = order.slice(0, TOP).map((i) => [config.classes[i], probabilities[i]]);
    let score = null, unknown = false;
    if (rule) {
      score = window.vfUnknown.knownScore(rule, logits, probabilities, out.features ? out.features.data : null);
      unknown = !(score >= rule.threshold); // a NaN score is unknown too, as unknown.UnknownRule.rejects
    }
    const label = unknown ? "unknown" : config.classes[order[0]];
    return { probabilities, top, label, unknown, score, ms: performance.now() - t0, doneMs: performance.now() };
  }

  /* A file's pixels as decoded by the browser, no colour management (Pillow applies none), EXIF orientation applied. */
  async function filePixels(file) {
    const bitmap = await createImageBitmap(file, { colorSpaceConversion: "none", premultiplyAlpha: "none",
      imageOrientation: "from-image" });
    const canvas = document.createElement("canvas");
    canvas.width = bitmap.width;
    canvas.height = bitmap.height;
    const ctx = canvas.getContext("2d", { willReadFrequently: true });
    ctx.drawImage(bitmap, 0, 0);
    bitmap.close();
    return { rgba: ctx.getImageData(0, 0, canvas.width, canvas.height).data, h: canvas.height, w: canvas.width };
  }

  async function isJpeg(file) {
    const head = new Uint8Array(await file.slice(0, 3).arrayBuffer());
    return head[0] === 0xff && head[1] === 0xd8 && head[2] === 0xff;
  }

  function card(name, thumb, result) {
    const div = document.createElement("div");
    div.className = "card";
    div.dataset.index = String(vf.results.length - 1);
    const img = document.createElement("img");
    img.src = thumb;
    img.alt = name;
    const caption = document.createElement("div");
    caption.className = "name";
    caption.textContent = name;
    const label = document.createElement("div");
    if (result.error) {
      label.className = "label error";
      label.textContent = "Could not read it: " + result.error;
      div.append(img, caption, label);
      return div;
    }
    label.className = "label" + (result.unknown ? " unsure" : "");
    label.textContent = result.unknown ? "Not sure (none of the classes, or unclear)"
      : result.top[0][0] + " (" + (100 * result.top[0][1]).toFixed(1) + "%)";
    div.append(img, caption, label);
    for (const [cls, p] of result.top) {
      const bar = document.createElement("div");
      bar.className = "bar";
      const name = document.createElement("span");
      name.textContent = cls;
      const meter = document.createElement("meter");
      meter.value = p;
      const pct = document.createElement("span");
      pct.textContent = (100 * p).toFixed(1) + "%";
      bar.append(name, meter, pct);
      div.append(bar);
    }
    return div;
  }

  function show(name, source, thumb, result) {
    vf.results.push(Object.assign({ name, source }, result));
    $("results").prepend(card(name, thumb, result));
  }

  async function classifyFile(file) {
    const thumb = URL.createObjectURL(file);
    try {
      const { rgba, h, w } = await filePixels(file);
      show(file.name, "file", thumb, await classify(rgba, h, w, await isJpeg(file)));
    } catch (e) {
      show(file.name, "file", thumb, { error: e && e.message ? e.message : String(e) });
    }
  }

  function addFiles(files) {
    for (const file of files) queue = queue.then(() => classifyFile(file)); // one at a time, in the order given
  }

  async function snap() {
    const video = $("video");
    if (!video.videoWidth) return;
    const canvas = document.createElement("canvas");
    canvas.width = video.videoWidth;
    canvas.height = video.videoHeight;
    const ctx = canvas.getContext("2d", { willReadFrequently: true });
    ctx.drawImage(video, 0, 0);
    const rgba = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    const name = "webcam frame " + ++frames;
    queue = queue.then(async () => {
      try {
        show(name, "webcam", canvas.toDataURL("image/jpeg"), await classify(rgba, canvas.height, canvas.width, false));
      } catch (e) {
        show(name, "webcam", "", { error: e && e.message ? e.message : String(e) });
      }
    });
  }

  async function startCamera() {
    try {
      const stream = await navigator.mediaDevices.getUserMedia({ video: true, audio: false });
      $("video").srcObject = stream;
      $("camera").hidden = false;
    } catch (e) {
      say("ready", "The webcam is not available (" + (e && e.message ? e.message : e) + "); photos still work.");
    }
  }

  function stopCamera() {
    const stream = $("video").srcObject;
    if (stream) stream.getTracks().forEach((t) => t.stop());
    $("video").srcObject = null;
    $("camera").hidden = true;
  }

  function describe() {
    const n = config.classes.length;
    let text = n + " classes: " + config.classes.join(", ") + ". ";
    if (!rule) {
      text += "This model has no \"not sure\" rule: every photo gets one of its classes, even one of none of them.";
    } else {
      const u = config.unknown;
      const kept = u.val_accepted != null && u.n_val ? ", which accepts " + (100 * u.val_accepted).toFixed(1)
        + "% of the run's " + u.n_val + " validation photos" : "";
      text += "\"Not sure\" when the run's " + u.rule + " score is below its threshold" + kept + ".";
    }
    $("about").textContent = text + " Model: " + config.precision + ".";
  }

  function wire() {
    $("files").disabled = false;
    const camera = Boolean(navigator.mediaDevices && navigator.mediaDevices.getUserMedia);
    $("camera-start").disabled = !camera;
    if (!camera) $("camera-start").textContent = "The webcam needs https (or localhost)"; // browsers allow no other
    $("files").addEventListener("change", (e) => addFiles(Array.from(e.target.files)));
    const drop = $("drop");
    drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (e) => {
      e.preventDefault();
      drop.classList.remove("over");
      addFiles(Array.from(e.dataTransfer.files).filter((f) => f.type.startsWith("image/") || f.type === ""));
    });
    $("camera-start").addEventListener("click", startCamera);
    $("camera-stop").addEventListener("click", stopCamera);
    $("snap").addEventListener("click", snap);
  }

  async function start() {
    if (!hasSimd()) {
      say("unsupported", "This browser cannot run the model: it has no WebAssembly SIMD, which ONNX Runtime Web "
        + "needs. Use a recent Chrome, Edge, Firefox (89+) or Safari (16.4+).");
      $("about").textContent = "";
      return;
    }
    if (location.protocol === "file:") {
      say("error", "Open this page from a web server (for example `python -m http.server` in its folder): "
        + "a browser does not let a page opened as a file read its model.");
      return;
    }
    try {
      config = await fetchJson("config.json");
      rule = window.vfUnknown.prepareRule(config.unknown, config.unknown && config.unknown.arrays
        ? await fetchJson(config.unknown.arrays) : null);
      describe();
      await loadScript(config.ort.script);
      ort.env.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
      if (config.ort.wasm_paths) ort.env.wasm.wasmPaths = config.ort.wasm_paths;
      session = await ort.InferenceSession.create(config.model, { executionProviders: ["wasm"] });
    } catch (e) {
      say("error", "Could not load the model: " + (e && e.message ? e.message : e));
      return;
    }
    vf.readyMs = performance.now();
    wire();
    say("ready", "Ready: choose or drop photos, or use the webcam.");
  }

  start();
})();
