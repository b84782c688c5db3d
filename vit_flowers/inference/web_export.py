"""A static web page that classifies photos in the browser: what ``vit-flowers export --web DIR`` writes.

The folder needs no Python and no server-side code (any static web server, GitHub Pages): ``index.html`` and its
scripts (``app.js``; ``preprocess.js``, the Python path's resize, crop and normalisation in integer-exact
JavaScript; ``unknown.js``, the unknown rule's scores as :mod:`.unknown` computes them), the checked ONNX model,
``config.json`` (class names, image size, mean / std, the unknown rule's name and threshold) and, for a rule on the
model's features, ``rule.json`` (the class means, the precision matrix, a taught run's offsets as float32 values,
which the page computes with in float64 as :mod:`.unknown` does), and ONNX Runtime Web: copied from the
repository's pinned npm install (``web/``, ``npm ci``) or, with ``cdn``, loaded from jsDelivr at the same version.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..runs import folders as runs
from .unknown import rule_from_checkpoint

__all__ = ["WEB_FORMAT", "ORT_FILES", "NPM_FOLDER", "OrtWeb", "find_ort", "web_config", "rule_arrays",
           "check_web_output", "write_web_folder"]

logger = logging.getLogger(__name__)

WEB_FORMAT = "vit_flowers-web/1"  # config.json's "format": how a folder this module may replace is recognised
ASSETS = Path(__file__).with_name("web")  # index.html, app.js, preprocess.js: the page's own files
PAGE_FILES = ("index.html", "app.js", "preprocess.js", "unknown.js")
# ONNX Runtime Web's plain WebAssembly build (no WebGL / WebGPU): its loader, the module and the binary (SIMD; it
# runs on one thread unless the server sends the cross-origin isolation headers)
ORT_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
NPM_FOLDER = Path(__file__).resolve().parents[2] / "web"  # package.json + package-lock.json: `npm ci` there
ORT_PACKAGE = "onnxruntime-web"
CDN = "https://cdn.jsdelivr.net/npm/onnxruntime-web@{version}/dist/"
MODEL_FILE = runs.ONNX  # the page's model: the fp32 export, or with --int8 its int8 copy under this name


@dataclass(frozen=True)
class OrtWeb:
    """Where the page's ONNX Runtime Web comes from: ``dist`` (a local install's files, copied in) or, when None,
    the CDN at ``version``."""

    version: str
    dist: Path | None

    @property
    def script(self) -> str:
        """The ``src`` of the page's ONNX Runtime script."""
        return ORT_FILES[0] if self.dist is not None else CDN.format(version=self.version) + ORT_FILES[0]

    @property
    def wasm_paths(self) -> str | None:
        """Where ONNX Runtime finds its WebAssembly files: None, beside the page; else the CDN's folder."""
        return None if self.dist is not None else CDN.format(version=self.version)


def _pinned_version(npm: Path) -> str:
    """The onnxruntime-web version that ``npm``'s package-lock.json pins (ValueError naming the file, unreadable)."""
    lock = npm / "package-lock.json"
    try:
        return str(json.loads(lock.read_text())["packages"][f"node_modules/{ORT_PACKAGE}"]["version"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read the pinned {ORT_PACKAGE} version from {lock}: {exc}") from None


def find_ort(cdn: bool = False, npm: Path | None = None) -> OrtWeb:
    """ONNX Runtime Web for the page: the files of ``npm``'s (default :data:`NPM_FOLDER`) ``npm ci`` install
    (ValueError saying how to install it when they are missing), or with ``cdn`` the CDN's copy of the version its
    lock file pins."""
    npm = NPM_FOLDER if npm is None else npm
    version = _pinned_version(npm)
    if cdn:
        return OrtWeb(version, None)
    dist = npm / "node_modules" / ORT_PACKAGE / "dist"
    missing = [name for name in ORT_FILES if not (dist / name).is_file()]
    if missing:
        raise ValueError(f"ONNX Runtime Web is not installed ({dist / missing[0]} is missing): run `npm ci` in {npm} "
                         f"(it installs {ORT_PACKAGE} {version}), or pass --web-cdn to load it from "
                         f"{CDN.format(version=version)}")
    return OrtWeb(version, dist)


def _float32s(values: Any) -> Any:
    """An array as nested lists of float32 values written with 9 significant digits: the page rounds each back to the
    same float32 (Math.fround), as :mod:`.unknown` reads the checkpoint's float32 arrays."""
    array = np.asarray(values, dtype=np.float32)
    return np.vectorize(lambda v: float(f"{v:.9g}"), otypes=[object])(array).tolist() if array.size else []


def rule_arrays(ckpt: Mapping[str, Any]) -> dict[str, Any] | None:
    """``rule.json``: what a feature rule needs (means, precision, offsets); None for a rule on the logits, or none."""
    rule = rule_from_checkpoint(ckpt)
    if rule is None or not rule.needs_features:
        return None
    arrays = {"means": rule.means, "precision": rule.precision, "offsets": rule.offsets}
    return {key: _float32s(value) for key, value in arrays.items() if value is not None}


def web_config(ckpt: Mapping[str, Any], source: str | Path, precision: str, ort: OrtWeb) -> dict[str, Any]:
    """``config.json``: what the page needs to give the model the Python path's input and read its answer."""
    rule = rule_from_checkpoint(ckpt)
    unknown = None if rule is None else {
        "rule": rule.rule, "threshold": float(rule.threshold), "accept": float(rule.accept),
        "val_accepted": rule.val_accepted, "n_val": rule.n_val, "arrays": "rule.json" if rule.needs_features else None}
    return {"format": WEB_FORMAT, "model": MODEL_FILE, "precision": precision, "classes": list(ckpt["classes"]),
            "image_size": int(ckpt["image_size"]), "mean": [float(x) for x in ckpt["mean"]],
            "std": [float(x) for x in ckpt["std"]],
            "resize": "shorter side to image_size, antialiased bicubic (a=-0.5) on uint8 pixels, centre crop",
            "features_output": rule is not None and rule.needs_features, "unknown": unknown,
            "source_checkpoint": str(source), "ort": {"version": ort.version, "script": ort.script,
                                                      "wasm_paths": ort.wasm_paths}}


def _is_web_export(folder: Path) -> bool:
    try:
        return json.loads((folder / "config.json").read_text()).get("format") == WEB_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def check_web_output(folder: Path, overwrite: bool) -> None:
    """Refuse (ValueError naming it) a ``folder`` that exists and is not empty, unless ``overwrite``; even then,
    one that is not an earlier web export (a file, a user's folder) is not replaced: --overwrite must not delete
    a home folder given by mistake."""
    if not (folder.exists() or folder.is_symlink()):
        return
    if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
        return
    if not overwrite:
        raise ValueError(f"--web {folder} already exists: pass --overwrite to replace it, or choose another folder")
    if not (folder.is_dir() and not folder.is_symlink() and _is_web_export(folder)):
        raise ValueError(f"--web {folder} exists and is not a web export (no config.json of {WEB_FORMAT}): "
                         f"it is not replaced, even with --overwrite; choose another folder")


def write_web_folder(folder: Path, model: Path, config: dict[str, Any], arrays: dict[str, Any] | None,
                     ort: OrtWeb, overwrite: bool = False) -> Path:
    """Write the page into ``folder``: built in a temporary folder beside it, then renamed into place, so that a
    failure leaves no half-written page (and an earlier one replaced only with ``overwrite``, when it is a web
    export: :func:`check_web_output`). ``model``: the checked ONNX file, copied in. Returns ``folder``."""
    check_web_output(folder, overwrite)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        for name in PAGE_FILES:  # the page loads ONNX Runtime from config.json's "ort", after its SIMD check
            shutil.copyfile(ASSETS / name, staging / name)
        shutil.copyfile(model, staging / MODEL_FILE)
        (staging / "config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False), encoding="utf-8")
        if arrays is not None:
            (staging / "rule.json").write_text(json.dumps(arrays, separators=(",", ":")), encoding="utf-8")
        if ort.dist is not None:
            for name in ORT_FILES:
                shutil.copyfile(ort.dist / name, staging / name)
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the page from a web server running as another user
        if folder.exists():
            shutil.rmtree(folder) if folder.is_dir() else folder.unlink()  # checked above: empty or a web export
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    size = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
    logger.info("wrote %s (%.1f MB: index.html, %s, ONNX Runtime Web %s %s): serve it with any web server, e.g. "
                "`python -m http.server -d %s`", folder, size, MODEL_FILE, ort.version,
                "copied in" if ort.dist is not None else "from the CDN", folder)
    return folder
