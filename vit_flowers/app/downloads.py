"""The Model tab's ONNX download, without Gradio: the model in use exported as ``python -m vit_flowers.export`` exports
it, checked against PyTorch on the run's validation photos before it is offered."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from .engine import Engine

if TYPE_CHECKING:
    from ..inference.onnx_export import CheckedExport

__all__ = ["OnnxMissing", "model_onnx"]

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
