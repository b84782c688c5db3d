"""A model as an ONNX file, checked before it is written: what ``python -m vit_flowers.export`` does to a run
(:mod:`vit_flowers.export` wires these to a run folder and its photos).

:func:`export_onnx` writes the graph (input ``images``, a dynamic batch axis) with what predict needs in its
metadata (:func:`onnx_metadata`); :func:`batched_logits` runs PyTorch or ONNX Runtime over the same photos and
:func:`check_logits` refuses an export whose logits differ from PyTorch's by more than :data:`TOLERANCE`.
:func:`quantize_int8` makes the int8 copy (ONNX Runtime's static quantization) and :func:`write_int8` writes it
unless it loses more than :data:`INT8_MAX_LOSS` against fp32.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import math
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data.augment import eval_transform
from ..data.datasets import Photos
from ..models.layers import Attention
from ..models.vit import ViT
from ..runs import folders as runs
from ..runs.checkpoint import Checkpoint, CheckpointError, ModelFacts, atomic_write
from .batches import with_features
from .onnx_runtime import FEATURES, FORMAT, load_onnx
from .unknown import metadata_entries, rule_from_checkpoint

__all__ = ["OPSET", "TOLERANCE", "ONNX_INSTALL", "onnx_missing", "CHECK_PHOTOS", "CALIBRATION_PHOTOS",
           "INT8_MAX_LOSS", "onnx_metadata", "export_onnx", "batched_logits", "check_logits", "accuracy",
           "CheckedExport", "export_checked", "quantize_int8", "int8_path", "write_int8"]

logger = logging.getLogger(__name__)

OPSET = 17  # LayerNormalization is an ONNX op from 17 on
TOLERANCE = 1e-4  # largest logit difference allowed between PyTorch and ONNX Runtime (fp32)
# the most photos an export is checked on (export's --max-images, the app's ONNX download), and the training photos
# that set the int8 ranges (export's --calibration-images)
CHECK_PHOTOS = 2000
CALIBRATION_PHOTOS = 256
ONNX_INSTALL = 'pip install -e ".[onnx]"'  # the onnx extra: onnx writes an export, onnxruntime checks it
# The int8 recipe, for every model (the pure ViT's and the hybrid's graphs differ only in which of these ops
# they hold): the ops below quantized, MatMul outputs in float, the first layer in float (_first_layer), per
# channel weights, MinMax ranges. The variants measured: benchmarks/HISTORY.md, "ONNX export".
WEIGHTED_OPS = ("Conv", "MatMul", "Gemm")  # int8 weights and inputs
# Activations quantized so that the quantizer gives each convolution its activation's range and ONNX Runtime
# fuses the two. Relu: the conv stems'; without it their (large) activations are dequantized and requantized
# around every ReLU. Clip: EfficientNet's ReLU6 in the hybrid; without it each convolution's output is
# quantized over its whole range before the clip to [0, 6]: two 14-minute hybrids lost 0.6 and 7.3 points
# (fp32's top-1 on 89% and 74% of photos; with Clip -0.3 and +1.2 points, 98% and 94%, 1.1-1.25x faster).
# The depthwise convolutions stay int8: in float they were no more faithful and 1.2-1.4x slower. The Clips
# of the trunk's "same" padding arithmetic stay float: the quantizer leaves a Clip whose input is float.
QUANTIZED_OPS = WEIGHTED_OPS + ("Relu", "Clip")
# Ops whose output stays float: ONNX Runtime then runs each MatMul as one MatMulIntegerToFloat (int8 product,
# scales applied on the way out) instead of QLinearMatMul + DequantizeLinear before the bias and the residual.
FLOAT_OUTPUT_OPS = ("MatMul",)
# The most an int8 copy may lose against fp32 on the check photos (accuracy; the share of fp32's top-1 labels it
# keeps when the photos have no labels) and still be written without --force: int8 files of the pure ViT and of
# today's hybrid keep within 1.5 points, while one calibrated badly lost 25 (issue #34).
INT8_MAX_LOSS = 0.02


def onnx_missing() -> str | None:
    """What an export needs and this Python lacks (the onnx extra), with how to install it; None when it has it.
    ``export`` and the app's ONNX download say it alike."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return f"the onnx extra ({exc}): {ONNX_INSTALL}"
    return None


def onnx_metadata(ckpt: Checkpoint, source: str | Path, precision: str = "fp32") -> dict[str, str]:
    """The metadata an export carries: what :func:`vit_flowers.inference.onnx_runtime.load_onnx` needs (JSON values)
    and where it came from."""
    return {"format": FORMAT, "classes": json.dumps(list(ckpt["classes"]), ensure_ascii=False),
            "image_size": json.dumps(int(ckpt["image_size"])), "mean": json.dumps([float(x) for x in ckpt["mean"]]),
            "std": json.dumps([float(x) for x in ckpt["std"]]), "source_checkpoint": str(source),
            "precision": precision, "model_config": json.dumps(ckpt["model_config"], default=str),
            "config": json.dumps(ckpt["config"], default=str), **metadata_entries(ckpt)}


def _with_metadata(proto: Any, metadata: dict[str, str]) -> bytes:
    """The ONNX model ``proto`` serialised with ``metadata`` (and no other) as its metadata properties."""
    del proto.metadata_props[:]
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    return proto.SerializeToString()


class _WithFeatures(nn.Module):
    """The model's logits and features (:func:`vit_flowers.inference.batches.with_features`) as the graph's two
    outputs."""

    def __init__(self, model: ViT) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return with_features(self.model, x)


def export_onnx(model: ViT, metadata: dict[str, str], opset: int = OPSET, features: bool = False) -> bytes:
    """``model`` (eval mode, on the CPU) as a serialised ONNX model: input ``images`` float32 (N, 3, S, S),
    output ``logits`` (N, num_classes) (and with ``features`` a second output, ``features`` (N, dim), for the
    unknown rule), N dynamic, ``metadata`` in its metadata properties."""
    import onnx

    size = model.image_size
    model = _scale_folded(model)
    outputs = ["logits", FEATURES] if features else ["logits"]
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice and tracer shape checks
        # (torch's annotation of ``f`` names paths only; it writes to a file object as well)
        torch.onnx.export(_WithFeatures(model) if features else model, (torch.zeros(2, 3, size, size),),
                          buffer,  # type: ignore[arg-type]
                          dynamo=False, opset_version=opset, input_names=["images"], output_names=outputs,
                          dynamic_axes={"images": {0: "batch"}, **{name: {0: "batch"} for name in outputs}})
    return _with_metadata(onnx.load_from_string(buffer.getvalue()), metadata)


def _scale_folded(model: ViT) -> ViT:
    """A copy of ``model`` with every attention's scale folded into its query projection
    (:meth:`Attention.fold_scale`): ONNX Runtime then drops the exporter's multiplications by the scale's root."""
    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, Attention):
            module.fold_scale()
    return model


def batched_logits(run: Callable[[torch.Tensor], np.ndarray], photos: Photos, ckpt: ModelFacts,
            batch_size: int = 64) -> np.ndarray:
    """Logits (N, num_classes) of ``run`` (normalised float images (B, 3, S, S) -> logits) over ``photos``."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(photos.images), batch_size):
            x = eval_transform(photos.images[start:start + batch_size], ckpt["image_size"], ckpt["mean"], ckpt["std"])
            out.append(np.asarray(run(x), dtype=np.float32))
    return np.concatenate(out)


def check_logits(reference: np.ndarray, exported: np.ndarray, photos: Photos, classes: Sequence[str],
           tolerance: float) -> float:
    """The largest logit difference; CheckpointError naming it (image and class) when over ``tolerance``."""
    diff = np.abs(reference - exported)
    i, j = (int(k) for k in np.unravel_index(int(np.argmax(diff)), diff.shape))
    worst = float(diff[i, j])
    if not worst <= tolerance:  # NaN fails too
        raise CheckpointError(f"the exported model disagrees with PyTorch: largest logit difference {worst:.3g} "
                              f"(tolerance {tolerance:g}) on {photos.names[i]}, class {classes[j]} "
                              f"({reference[i, j]:.6g} vs {exported[i, j]:.6g}); nothing written")
    return worst


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """The share of the photos with a label (``labels`` >= 0) whose top-1 is it; NaN when none has one."""
    known = labels >= 0
    return float((logits.argmax(1)[known] == labels[known]).mean()) if known.any() else float("nan")


@dataclass(frozen=True)
class CheckedExport:
    """An fp32 export written, and its check against PyTorch on the photos ``val`` (``val.source`` says which):
    ``same`` of them got PyTorch's top-1, the largest logit difference was ``worst``; ``fp32`` (the file's bytes) and
    ``logits`` (the export's on ``val``) for an int8 copy."""

    path: Path
    fp32: bytes
    val: Photos
    logits: np.ndarray
    same: int
    worst: float


def export_checked(model: ViT, ckpt: Checkpoint, source: Path, val: Photos, output: Path,
                   tolerance: float = TOLERANCE) -> CheckedExport:
    """Export ``model`` (eval mode, on the CPU; ``ckpt`` its checkpoint, read from ``source``) to ``output``
    (replaced when it exists: the caller decides), once ONNX Runtime has run it next to PyTorch on ``val`` within
    ``tolerance`` (CheckpointError naming the largest difference, nothing written)."""
    rule = rule_from_checkpoint(ckpt, where=str(source))  # its features go into the graph when it needs them
    fp32 = export_onnx(model, onnx_metadata(ckpt, source), features=rule is not None and rule.needs_features)
    with tempfile.TemporaryDirectory() as tmp:  # ONNX Runtime reads the model as predict will: from a file
        (Path(tmp) / runs.ONNX).write_bytes(fp32)
        exported = load_onnx(Path(tmp) / runs.ONNX)
        out = batched_logits(lambda x: exported.logits(x.numpy()), val, ckpt)
    ref = batched_logits(lambda x: model(x).float().numpy(), val, ckpt)
    worst = check_logits(ref, out, val, ckpt["classes"], tolerance)
    same = int((ref.argmax(1) == out.argmax(1)).sum())
    atomic_write(output, lambda f: f.write(fp32))
    logger.info("wrote %s (%.1f MB, fp32, opset %d, dynamic batch) from %s", output, len(fp32) / 1e6, OPSET, source)
    logger.info("checked against PyTorch on %d images (%s): largest logit difference %.1e (tolerance %g), the same "
                "top-1 on %d of %d; accuracy %.2f%%", len(val.names), val.source, worst, tolerance, same,
                len(val.names), 100 * accuracy(out, val.labels))
    return CheckedExport(output, fp32, val, out, same, worst)


def quantize_int8(fp32: bytes, calibration: Photos, ckpt: ModelFacts, metadata: dict[str, str]) -> bytes:
    """The fp32 model with int8 weights (per channel) and activations (uint8, ranges from ``calibration``):
    ONNX Runtime's static QDQ quantization of its convolutions (with their ReLUs and ReLU6s) and matrix products
    (their outputs left in float), all but the first layer, after its graph optimisations (batch norm folded
    into the convolutions, fused layer norm and GELU)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    x = eval_transform(calibration.images, ckpt["image_size"], ckpt["mean"], ckpt["std"]).numpy()

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"images": x[s:s + 32]} for s in range(0, len(x), 32)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)  # the quantizer logs its progress and shape notes on the root logger
        src, pre, out = (Path(tmp) / name for name in ("fp32.onnx", "pre.onnx", "int8.onnx"))
        src.write_bytes(fp32)
        try:
            quant_pre_process(str(src), str(pre))
            quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            op_types_to_quantize=list(QUANTIZED_OPS), nodes_to_exclude=_first_layer(pre),
                            extra_options={"OpTypesToExcludeOutputQuantization": list(FLOAT_OUTPUT_OPS)})
        finally:
            logging.disable(logging.NOTSET)
        return _with_metadata(onnx.load(str(out)), {**metadata, "precision": "int8"})


def _first_layer(path: Path) -> list[str]:
    """The name of the model's first layer with weights, which int8 leaves in float: the normalised image in
    uint8 steps cost agreement with fp32's labels (the head in float did not), and the layer is cheap
    (benchmarks/HISTORY.md, "ONNX export")."""
    import onnx

    nodes = onnx.load(str(path)).graph.node  # in topological order
    return next(([n.name] for n in nodes if n.op_type in WEIGHTED_OPS), [])


def int8_path(output: Path) -> Path:
    """Where the int8 copy of ``output`` goes: <output>.int8.onnx beside it."""
    return output.with_name(output.stem + ".int8.onnx")


def write_int8(fp32: bytes, calibration: Photos, ckpt: Checkpoint, source: Path, val: Photos,
               fp32_logits: np.ndarray, output: Path, force: bool = False) -> None:
    """Quantize (calibrated on ``calibration``, the run's training photos), check and write <output>.int8.onnx: its
    accuracy on ``val`` next to fp32's. One that loses more than INT8_MAX_LOSS raises ValueError and is not
    written, unless ``force``."""
    int8 = quantize_int8(fp32, calibration, ckpt, onnx_metadata(ckpt, source))
    path = int8_path(output)
    with tempfile.TemporaryDirectory() as tmp:  # checked from a file, as predict will read it, before it is written
        (Path(tmp) / runs.ONNX_INT8).write_bytes(int8)
        int8_model = load_onnx(Path(tmp) / runs.ONNX_INT8)
        logits = batched_logits(lambda x: int8_model.logits(x.numpy()), val, ckpt)
    acc, acc32 = accuracy(logits, val.labels), accuracy(fp32_logits, val.labels)
    same = float((logits.argmax(1) == fp32_logits.argmax(1)).mean())
    # rounded: (0.64 - 0.62) is 0.0200...02 in floats, and a loss of exactly INT8_MAX_LOSS is allowed
    lost = round(acc32 - acc if math.isfinite(acc32) else 1.0 - same, 12)
    n = len(val.names)
    few = f" (each of them {100 / n:.1f} points: check on more with --data)" if n < 100 else ""
    what = (f"accuracy {100 * acc:.2f}% (fp32 {100 * acc32:.2f}%, {100 * (acc - acc32):+.2f} points) on "
            f"{len(val.names)} images{few}, the same top-1 as fp32 on {100 * same:.1f}%")
    if lost > INT8_MAX_LOSS and not force:
        raise ValueError(f"int8 loses {100 * lost:.1f} points, more than {100 * INT8_MAX_LOSS:g} "
                         f"(onnx_export.INT8_MAX_LOSS): {what} (calibrated on {len(calibration.names)} "
                         f"{calibration.source}). {path} was not written; {output} was. Predict with {output}, or "
                         f"pass --force to write the int8 file anyway (with --overwrite, as {output} exists now)")
    atomic_write(path, lambda f: f.write(int8))
    logger.info("wrote %s (%.1f MB, int8, calibrated on %d %s): %s", path, len(int8) / 1e6,
                len(calibration.names), calibration.source, what)
    if lost > INT8_MAX_LOSS:
        logger.warning("warning: --force: %s loses %.1f points against %s", path, 100 * lost, output)
