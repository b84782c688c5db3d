#!/usr/bin/env python
"""The model taken elsewhere (issue #64): ``export --web``'s page in headless Chromium and ``export --tflite``'s model
in the ai-edge-litert interpreter, each against PyTorch (``predict``) on the same flowers5 photos.

    python benchmarks/web_export.py --checkpoint /tmp/ck/f5            # 32 photos, page + LiteRT (if installed)
    python benchmarks/web_export.py --checkpoint RUN --photos 64 --json /tmp/web.json

What it measures (benchmarks/README.md):

1. ``page``: the exported folder served by a local http.server on 127.0.0.1 (no internet) and opened in Debian's
   headless Chromium: the time from opening the page to the model ready (ONNX Runtime Web's WebAssembly and the
   model loaded), to the first answer (the photos given as soon as it is ready), the milliseconds per photo (the
   browser's decode, preprocess.js, the model; one thread, as a static server without cross-origin isolation
   gives); against ``predict`` (PyTorch): the same top-1, the largest probability difference, the same unknown
   answer; how many photos took Pillow's reduced-scale JPEG decode (a shorter side of at least 4x the model's size),
   which a browser can only approximate. ``page_int8``: the same with ``--int8``'s page (its int8 ONNX copy).
2. ``litert``: the fp32 and int8 .tflite files (where litert-torch and ai-edge-litert are installed): the same top-1
   as PyTorch, the largest probability difference, ms per photo, file size; beside ONNX Runtime's and PyTorch's
   ms per photo (batch 1, one thread each, the same preprocessed tensors).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import DEFAULT_DATA, machine

from vit_flowers.data.augment import eval_transform
from vit_flowers.data.datasets import Photos
from vit_flowers.data.images import decode_file
from vit_flowers.export import export_checkpoint
from vit_flowers.inference.onnx_runtime import load_onnx
from vit_flowers.inference.predictions import predict_images
from vit_flowers.inference.unknown import rule_from_checkpoint
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import load_model

logger = logging.getLogger("benchmarks.web_export")


def pick_photos(data: Path, count: int) -> list[Path]:
    """``count`` photos spread evenly over each class folder of ``data`` (sorted names, the same every run)."""
    folders = sorted(f for f in data.iterdir() if f.is_dir())
    per_class = [sorted(f.glob("*.jpg")) for f in folders]
    picked: list[Path] = []
    for i, files in enumerate(per_class):
        n = count // len(folders) + (i < count % len(folders))
        picked += [files[(k * len(files)) // n] for k in range(n)]
    return picked


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/index.html"
    finally:
        server.shutdown()


def chromium(profile: Path) -> Any:
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))))
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(service=service, options=options)


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise TimeoutError(what)


def page_results(site: Path, files: list[Path], profile: Path) -> tuple[float, list[dict[str, Any]]]:
    """(ms from opening the page to its model ready, the page's result per photo)."""
    driver = chromium(profile)
    try:
        with served(site) as url:
            driver.get(url)
            wait_for(lambda: driver.execute_script("return window.vf && window.vf.state !== 'loading'"), 120, "ready")
            state, ready = driver.execute_script("return [vf.state, vf.readyMs]")
            if state != "ready":
                raise RuntimeError(driver.find_element("id", "status").text)
            driver.find_element("id", "files").send_keys("\n".join(str(f) for f in files))
            return ready, wait_for(lambda: (r := driver.execute_script("return vf.results")) and
                                   len(r) == len(files) and r, 600, "answers")
    finally:
        driver.quit()


def reference(run: Path, files: list[Path]) -> list[Any]:
    model, ckpt = load_model(run / runs.BEST)
    return [row for rows in predict_images(model, files, ckpt["classes"], image_size=ckpt["image_size"],
                                           mean=ckpt["mean"], std=ckpt["std"], top_k=len(ckpt["classes"]),
                                           unknown=rule_from_checkpoint(ckpt)) for row in rows]


def per_photo_ms(fn: Callable[[np.ndarray], Any], x: np.ndarray, rounds: int = 3) -> float:
    """The median over ``rounds`` of the mean ms of ``fn`` on each photo of ``x`` (batch 1), after one warm-up."""
    fn(x[:1])
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(len(x)):
            fn(x[i:i + 1])
        times.append(1000 * (time.perf_counter() - start) / len(x))
    return statistics.median(times)


def probabilities(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def page_section(run: Path, site: Path, files: list[Path], rows: list[Any], classes: list[str], size: int,
                 work: Path) -> dict[str, Any]:
    ready, results = page_results(site, files, work / "profile")
    diffs = [max(abs(dict(row.top_k)[c] - p) for c, p in zip(classes, r["probabilities"]))
             for row, r in zip(rows, results)]
    from PIL import Image

    draft = [min(Image.open(f).size) >= 4 * size for f in files]
    exact = [d for d, reduced in zip(diffs, draft) if not reduced]
    return {"photos": len(files), "ready_ms": ready, "first_answer_ms": results[0]["doneMs"],
            "per_photo_ms_median": statistics.median(r["ms"] for r in results[1:]),
            "per_photo_ms_first": results[0]["ms"],
            "same_top1": sum(r["top"][0][0] == row.top_k[0][0] for row, r in zip(rows, results)),
            "same_unknown": sum(r["unknown"] == (row.label == "unknown") for row, r in zip(rows, results)),
            "max_probability_difference": max(diffs),
            "max_probability_difference_full_decode": max(exact) if exact else None,
            "reduced_decode_photos": sum(draft), "model_mb": (site / runs.ONNX).stat().st_size / 1e6,
            "folder_mb": sum(f.stat().st_size for f in site.iterdir()) / 1e6}


def runtimes_section(run: Path, site: Path, files: list[Path], work: Path, ckpt: Any, model: Any) -> dict[str, Any]:
    pixels = torch.stack([decode_file(f, ckpt["image_size"]) for f in files])
    x = eval_transform(pixels, ckpt["image_size"], ckpt["mean"], ckpt["std"])
    with torch.inference_mode():
        torch_logits = model(x).numpy()
        out: dict[str, Any] = {"pytorch_ms": per_photo_ms(lambda b: model(torch.from_numpy(b)), x.numpy())}
    onnx = load_onnx(site / runs.ONNX, threads=1)
    out["onnxruntime_ms"] = per_photo_ms(onnx.logits, x.numpy())
    try:
        from vit_flowers.inference.tflite_export import TfliteModel, tflite_missing, write_tflite
    except ImportError as exc:
        out["litert"] = f"not run: {exc}"
        return out
    if tflite_missing():
        out["litert"] = f"not run: {tflite_missing()}"
        return out
    classes = list(ckpt["classes"])
    labels = np.array([classes.index(f.parent.name) if f.parent.name in classes else -1 for f in files])
    photos = Photos(pixels, labels, [str(f) for f in files], f"{len(files)} flowers5 photos")
    path = work / "model.tflite"
    write_tflite(model, ckpt, run / runs.BEST, photos, path, tolerance=1e-3, int8=True, force=True)
    reference_p = probabilities(torch_logits)
    for name, file in (("litert_fp32", path), ("litert_int8", path.with_name("model.int8.tflite"))):
        lite = TfliteModel(file)
        logits = lite.logits(x.numpy())
        out[name] = {"same_top1": int((logits.argmax(1) == torch_logits.argmax(1)).sum()),
                     "max_probability_difference": float(np.abs(probabilities(logits) - reference_p).max()),
                     "ms": per_photo_ms(lite.logits, x.numpy()), "mb": file.stat().st_size / 1e6}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a run folder (best.pt)")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="class folders of photos (default: %(default)s)")
    p.add_argument("--photos", type=int, default=32)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    run, files = Path(args.checkpoint), pick_photos(Path(args.data), args.photos)
    model, ckpt = load_model(run / runs.BEST)
    start = time.time()
    figures: dict[str, Any] = {"machine": machine(), "load_start": os.getloadavg(), "checkpoint": str(run),
                               "image_size": ckpt["image_size"], "command": " ".join(sys.argv)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        export_checkpoint(run, web=work / "site", max_images=200)
        rows = reference(run, files)
        figures["page"] = page_section(run, work / "site", files, rows, list(ckpt["classes"]), ckpt["image_size"],
                                       work)
        export_checkpoint(run, web=work / "site-int8", int8=True, force=True, max_images=200)
        figures["page_int8"] = page_section(run, work / "site-int8", files, rows, list(ckpt["classes"]),
                                            ckpt["image_size"], work)
        figures["runtimes"] = runtimes_section(run, work / "site", files, work, ckpt, model)
    figures["load_end"], figures["seconds"] = os.getloadavg(), time.time() - start
    text = json.dumps(figures, indent=1, default=str)
    logger.info("%s", text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
