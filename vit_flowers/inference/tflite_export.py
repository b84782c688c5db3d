"""A model for LiteRT (TensorFlow Lite's runtime: Android, iOS, the Raspberry Pi), checked before it is written: what
``vit-flowers export --tflite FILE`` does.

Google's maintained converter, ``litert-torch`` (formerly ai-edge-torch), converts the PyTorch model itself (no ONNX
step) into a .tflite file whose input is the normalised image, float32 (1, 3, S, S) as PyTorch's, and whose outputs
are the logits and, for a run whose unknown rule needs them, the features. :func:`write_tflite` runs it with the
``ai-edge-litert`` interpreter next to PyTorch on the check photos and refuses (nothing written) a file whose logits
differ by more than the tolerance; with int8, a copy with int8 weights (``ai-edge-quantizer``'s dynamic recipe:
weights int8 per channel, activations float) is checked against fp32 as export's ONNX int8 copy is. Beside the model,
``<FILE>.json``: the classes, the preprocessing and the unknown rule, for the app that runs it.

Needs the tflite extra (``pip install -e ".[tflite]"``): large (JAX, transformers), so not in the base install.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.datasets import Photos
from ..models.vit import ViT
from ..runs.checkpoint import Checkpoint, atomic_write, atomic_write_text
from .onnx_export import INT8_MAX_LOSS, _WithFeatures, accuracy, batched_logits, check_logits
from .unknown import rule_from_checkpoint
from .web_export import rule_arrays

__all__ = ["TFLITE_INSTALL", "TFLITE_FORMAT", "tflite_missing", "convert_tflite", "quantize_tflite", "TfliteModel",
           "tflite_int8_path", "CheckedTflite", "sidecar", "write_tflite"]

logger = logging.getLogger(__name__)

TFLITE_INSTALL = 'pip install -e ".[tflite]"'
TFLITE_FORMAT = "vit_flowers-tflite/1"  # the sidecar JSON's "format"


def tflite_missing() -> str | None:
    """Why ``--tflite`` cannot run here (the converter or the interpreter missing, and the pip command), or None."""
    try:
        import ai_edge_litert.interpreter  # noqa: F401
        import litert_torch  # noqa: F401
    except ImportError as exc:
        return f"--tflite needs litert-torch and ai-edge-litert ({exc}): {TFLITE_INSTALL}"
    return None


def convert_tflite(model: ViT, features: bool = False) -> bytes:
    """``model`` (eval mode, on the CPU) as a .tflite file's bytes: input float32 (1, 3, S, S), outputs the logits
    (and with ``features`` the features, second)."""
    import litert_torch

    size = model.image_size
    module = _WithFeatures(model).eval() if features else model.eval()
    with torch.no_grad():
        edge = litert_torch.convert(module, (torch.zeros(1, 3, size, size),))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tflite"
        edge.export(str(path))
        return path.read_bytes()


def quantize_tflite(fp32: bytes) -> bytes:
    """The int8 copy: ai-edge-quantizer's dynamic recipe (int8 weights per channel, float activations), which needs
    no calibration photos and keeps the graph's float input and outputs."""
    from ai_edge_quantizer import quantizer, recipe

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "fp32.tflite", Path(tmp) / "int8.tflite"
        src.write_bytes(fp32)
        logging.disable(logging.INFO)  # the quantizer prints its sizes and timings on the root logger
        try:
            quantizer.Quantizer(str(src), recipe.dynamic_wi8_afp32()).quantize().export_model(str(out), overwrite=True)
        finally:
            logging.disable(logging.NOTSET)
        return out.read_bytes()


class TfliteModel:
    """A .tflite file run by the ai-edge-litert interpreter, one photo at a time (the graph's batch is 1)."""

    def __init__(self, path: str | Path) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path))
        signature = self.interpreter.get_signature_list()["serving_default"]
        self.input = signature["inputs"][0]
        self.outputs = sorted(signature["outputs"])  # output_0: the logits, output_1: the features
        self.run = self.interpreter.get_signature_runner()

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Normalised float32 images (N, 3, S, S) -> logits (N, num_classes)."""
        return np.concatenate([self.run(**{self.input: x[i:i + 1]})[self.outputs[0]] for i in range(len(x))])


def tflite_int8_path(output: Path) -> Path:
    """Where the int8 copy of ``output`` goes: <output>.int8.tflite beside it."""
    return output.with_name(output.stem + ".int8.tflite")


@dataclass(frozen=True)
class CheckedTflite:
    """A .tflite file written and its check on ``n`` photos: the same top-1 as its reference (PyTorch for fp32, the
    fp32 file for int8) on ``same``, the largest probability difference ``worst_probability``, the largest logit
    difference ``worst_logit``, ``ms`` per photo in the interpreter, its ``accuracy`` where the photos have labels."""

    path: Path
    precision: str
    n: int
    same: int
    worst_logit: float
    worst_probability: float
    ms: float
    accuracy: float
    size: int


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _run_checked(data: bytes, val: Photos, ckpt: Checkpoint) -> tuple[np.ndarray, float]:
    """The logits of the .tflite ``data`` on ``val`` (run from a file, as an app reads it) and its ms per photo."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tflite"
        path.write_bytes(data)
        model = TfliteModel(path)
        start = time.perf_counter()
        logits = batched_logits(lambda x: model.logits(x.numpy()), val, ckpt)
        return logits, 1000 * (time.perf_counter() - start) / max(len(val.names), 1)


def _compare(path: Path, precision: str, data: bytes, logits: np.ndarray, reference: np.ndarray, ms: float,
             val: Photos) -> CheckedTflite:
    return CheckedTflite(path, precision, len(val.names), int((logits.argmax(1) == reference.argmax(1)).sum()),
                         float(np.abs(logits - reference).max()),
                         float(np.abs(_softmax(logits) - _softmax(reference)).max()), ms,
                         accuracy(logits, val.labels), len(data))


def sidecar(ckpt: Checkpoint, source: str | Path, model_file: str, precision: str) -> dict[str, Any]:
    """``<FILE>.json``: what an app needs to give the model its input and read its outputs, the unknown rule with
    its arrays (float32 values, 9 digits) when it has one."""
    rule = rule_from_checkpoint(ckpt)
    unknown = None if rule is None else {"rule": rule.rule, "threshold": float(rule.threshold),
                                         **(rule_arrays(ckpt) or {})}
    return {"format": TFLITE_FORMAT, "model": model_file, "precision": precision, "classes": list(ckpt["classes"]),
            "image_size": int(ckpt["image_size"]), "mean": [float(x) for x in ckpt["mean"]],
            "std": [float(x) for x in ckpt["std"]],
            "input": "float32 (1, 3, image_size, image_size): RGB, the shorter side resized to image_size "
                     "(antialiased bicubic), centre-cropped, then (x / 255 - mean) / std",
            "outputs": ["logits", "features"] if rule is not None and rule.needs_features else ["logits"],
            "unknown": unknown, "source_checkpoint": str(source)}


def _write(path: Path, data: bytes, ckpt: Checkpoint, source: Path, precision: str) -> None:
    atomic_write(path, lambda f: f.write(data))
    atomic_write_text(path.with_suffix(".json"), json.dumps(sidecar(ckpt, source, path.name, precision), indent=1))


def write_tflite(model: ViT, ckpt: Checkpoint, source: Path, val: Photos, output: Path,
                 tolerance: float, int8: bool = False, force: bool = False) -> list[CheckedTflite]:
    """Convert ``model``, check it against PyTorch on ``val`` within ``tolerance`` (CheckpointError naming the
    largest difference, nothing written), write ``output`` and ``<output>.json``; with ``int8`` also
    <output>.int8.tflite (+ .json), unless it loses more than INT8_MAX_LOSS against fp32 (ValueError; ``force``
    writes it). Returns the checks of the files written."""
    rule = rule_from_checkpoint(ckpt)
    fp32 = convert_tflite(model, features=rule is not None and rule.needs_features)
    with torch.no_grad():
        reference = batched_logits(lambda x: model(x).float().numpy(), val, ckpt)
    logits, ms = _run_checked(fp32, val, ckpt)
    worst = check_logits(reference, logits, val, ckpt["classes"], tolerance)
    _write(output, fp32, ckpt, source, "fp32")
    done = [_compare(output, "fp32", fp32, logits, reference, ms, val)]
    logger.info("wrote %s (%.1f MB, fp32, LiteRT) from %s, checked against PyTorch on %d images (%s): largest logit "
                "difference %.1e (tolerance %g), the same top-1 on %d; %.1f ms a photo", output, len(fp32) / 1e6,
                source, len(val.names), val.source, worst, tolerance, done[0].same, ms)
    if int8:
        done.append(_write_int8(fp32, logits, ckpt, source, val, output, force))
    return done


def _write_int8(fp32: bytes, fp32_logits: np.ndarray, ckpt: Checkpoint, source: Path, val: Photos,
                output: Path, force: bool) -> CheckedTflite:
    """The int8 copy, checked against the fp32 file's answers and written unless it loses too much (ValueError)."""
    data = quantize_tflite(fp32)
    path = tflite_int8_path(output)
    logits, ms = _run_checked(data, val, ckpt)
    checked = _compare(path, "int8", data, logits, fp32_logits, ms, val)
    acc32 = accuracy(fp32_logits, val.labels)
    lost = round(acc32 - checked.accuracy if math.isfinite(acc32) else 1.0 - checked.same / checked.n, 12)
    what = (f"the same top-1 as fp32 on {checked.same} of {checked.n}, largest probability difference "
            f"{checked.worst_probability:.3g}, accuracy {100 * checked.accuracy:.2f}% (fp32 {100 * acc32:.2f}%)")
    if lost > INT8_MAX_LOSS and not force:
        raise ValueError(f"the int8 LiteRT copy loses {100 * lost:.1f} points, more than {100 * INT8_MAX_LOSS:g}: "
                         f"{what}. {path} was not written; {output} was (pass --force to write it anyway, with "
                         f"--overwrite)")
    _write(path, data, ckpt, source, "int8")
    logger.info("wrote %s (%.1f MB, int8 weights, LiteRT): %s; %.1f ms a photo", path, len(data) / 1e6, what, ms)
    return checked
