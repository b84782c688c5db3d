"""The Model tab's downloads, without Gradio: the model in use exported as ``python -m vit_flowers.export`` exports
it, checked against PyTorch on the run's validation photos before it is offered, as an ONNX file and as the web page
of ``export --web`` (zipped: a folder to put on any web server)."""

from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .engine import Engine

if TYPE_CHECKING:
    from ..inference.onnx_export import CheckedExport

__all__ = ["OnnxMissing", "WebDownload", "model_onnx", "model_web"]

logger = logging.getLogger(__name__)


class OnnxMissing(ValueError):
    """The onnx extra (onnx, onnxruntime) is not installed: the message says how to install it."""


def model_onnx(engine: Engine) -> CheckedExport:
    """The model in use as ``<run>.onnx`` in the engine's work folder (the page's own file, replaced each time; the run
    folder is not touched), checked as ``export`` checks it. Raises NoModel, OnnxMissing, CheckpointError (the
    export disagrees with PyTorch: nothing written) or OSError with a message."""
    path = Path(engine.model().path)
    from ..inference.onnx_export import CHECK_PHOTOS, export_checked, onnx_missing

    missing = onnx_missing()
    if missing:
        raise OnnxMissing(f"the ONNX download needs {missing}")
    from ..inference.run_data import validation_photos
    from ..runs.checkpoint import load_model

    model, ckpt = load_model(path, "cpu")  # (the export runs on the CPU, whatever device the page uses)
    val = validation_photos(ckpt, path.parent, None, CHECK_PHOTOS)
    return export_checked(model, ckpt, path, val, engine.output_dir() / f"{path.resolve().parent.name}.onnx")


@dataclass(frozen=True)
class WebDownload:
    """The web page's zip, the checked ONNX export inside it (``onnx``), and whether ONNX Runtime Web is in it (not:
    the page loads it from the CDN, as ``export --web-cdn``)."""

    path: Path
    onnx: CheckedExport
    runtime_included: bool


def model_web(engine: Engine) -> WebDownload:
    """The model in use as ``export --web``'s page, zipped: ``<run>-web.zip`` in the engine's work folder (replaced
    each time), its model the checked ONNX file of :func:`model_onnx`. ONNX Runtime Web is copied in from the
    repository's `npm ci` install, or, where there is none, loaded by the page from the CDN. Raises as
    :func:`model_onnx` does."""
    from ..inference.web_export import find_ort, rule_arrays, web_config, write_web_folder
    from ..runs.checkpoint import atomic_write

    done = model_onnx(engine)
    loaded = engine.model()
    try:
        ort = find_ort()
    except ValueError as exc:
        logger.info("web download: %s; the page loads ONNX Runtime Web from the CDN", exc)
        ort = find_ort(cdn=True)
    folder = done.path.with_name(f"{done.path.stem}-web")
    write_web_folder(folder, done.path, web_config(loaded.ckpt, loaded.path, "fp32", ort), rule_arrays(loaded.ckpt),
                     ort, overwrite=True)
    archive = folder.with_suffix(".zip")

    def write(f: Any) -> None:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
            for file in sorted(folder.iterdir()):
                z.write(file, f"{folder.name}/{file.name}")

    atomic_write(archive, write)
    return WebDownload(archive, done, ort.dist is not None)
