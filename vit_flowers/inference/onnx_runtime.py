"""Run an exported model (``python -m vit_flowers.export``) with ONNX Runtime: no torch, no torchvision.

A deployment needs only onnxruntime, pillow and numpy: this module and :mod:`vit_flowers.data.image_files`
(the file-reading rules it shares with the PyTorch path). The .onnx file carries in its metadata what
prediction needs: class names, image size, mean and std, and the checkpoint it came from.

    python -m vit_flowers.predict photos/ --checkpoint model.onnx --output predictions.csv   # the CLI
    python -c "from vit_flowers.inference.onnx_runtime import load_onnx; print(load_onnx('model.onnx').classes)"

    model = load_onnx("model.onnx")                       # or CheckpointError naming the file
    for indices, probs, errors, scores in predict_files(model, paths):
        ...  # paths[indices[i]] -> probs[i] (num_classes,); errors: [FileError(index, path, reason)]

Pixels are those of the PyTorch path (:mod:`vit_flowers.data.images`): the same decoder and file rules,
shorter side resized with PIL's antialiased bicubic filter (the filter PyTorch's resize reimplements: within
2 grey levels of it) and the same centre crop and normalisation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..data.image_files import FileError, ImageLoadError, crop_strip, decode_in_chunks, load_image
from ..runs.errors import CheckpointError
from .unknown import UnknownRule, from_metadata

__all__ = ["FORMAT", "OnnxClassifier", "is_onnx_path", "load_onnx", "decode_image", "normalize", "softmax",
           "predict_files"]

FORMAT = "vit_flowers-onnx/1"  # metadata "format" of the files export writes
FEATURES = "features"  # the graph's second output, the head's input (exports of runs with an unknown rule)
REQUIRED = ("classes", "image_size", "mean", "std")  # metadata keys (JSON values) prediction needs


def is_onnx_path(path: str | os.PathLike | None) -> bool:
    """Whether ``--checkpoint`` names an ONNX model (by its extension) rather than a PyTorch checkpoint."""
    return path is not None and Path(path).suffix.lower() == ".onnx"


@dataclass
class OnnxClassifier:
    """An ONNX Runtime session of an exported classifier and the metadata it was exported with."""

    path: Path
    session: Any  # onnxruntime.InferenceSession
    classes: list[str]
    image_size: int
    mean: list[float]
    std: list[float]
    metadata: dict[str, str] = field(default_factory=dict)  # every metadata entry, as stored (JSON text)
    unknown: UnknownRule | None = None  # "none of these" (the caller sets it: cli.unknown_rule)

    @property
    def input_name(self) -> str:
        return self.session.get_inputs()[0].name

    @property
    def gives_features(self) -> bool:
        """Whether the graph has the ``features`` output (exports of runs with an unknown rule)."""
        return any(o.name == FEATURES for o in self.session.get_outputs())

    def checkpoint_keys(self) -> dict[str, Any]:
        """The checkpoint's ``unknown`` and ``class_means`` keys, from the metadata (see inference/unknown.py)."""
        return from_metadata(self.metadata)

    def outputs(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Normalised float32 images (B, 3, S, S) -> (logits (B, num_classes), features (B, dim) or None)."""
        out = self.session.run(None, {self.input_name: np.ascontiguousarray(x, dtype=np.float32)})
        return out[0], (out[1] if len(out) > 1 else None)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Normalised float32 images (B, 3, S, S) -> logits float32 (B, num_classes)."""
        return self.outputs(x)[0]

    def scored(self, images: np.ndarray, tta: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """uint8 images (B, 3, S, S) -> (class probabilities float32 (B, num_classes), the ``unknown`` rule's scores
        (B,) or None); ``tta``: the mean of the logits (and features) of each image and its mirror image, as the
        PyTorch path's."""
        if len(images) == 0:
            return np.empty((0, len(self.classes)), dtype=np.float32), (np.empty(0) if self.unknown else None)
        x = normalize(images, self.mean, self.std)
        logits, feats = self.outputs(x)
        if tta:
            mirrored, mirrored_feats = self.outputs(x[..., ::-1])
            logits = (logits + mirrored) / 2
            feats = (feats + mirrored_feats) / 2 if feats is not None else None
        scores = self.unknown.scores(logits, feats) if self.unknown is not None else None
        return softmax(logits), scores

    def probabilities(self, images: np.ndarray, tta: bool = False) -> np.ndarray:
        """uint8 images (B, 3, S, S) -> class probabilities float32 (B, num_classes) (see :meth:`scored`)."""
        return self.scored(images, tta)[0]


def _metadata(path: Path, meta: dict[str, str]) -> dict[str, Any]:
    """The parsed and checked values of ``REQUIRED`` in an export's metadata, or CheckpointError naming the file."""
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a vit_flowers ONNX model (its metadata has no format {FORMAT!r}): "
                              f"export one with `python -m vit_flowers.export`")
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        raise CheckpointError(f"{path}: its metadata lacks {', '.join(missing)}; export it again")
    try:
        values = {k: json.loads(meta[k]) for k in REQUIRED}
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: unreadable metadata ({exc})") from None
    classes, size, mean, std = (values[k] for k in REQUIRED)
    ok = (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)
          and isinstance(size, int) and size > 0
          and all(isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v)
                  for v in (mean, std)) and all(x > 0 for x in std))
    if not ok:
        raise CheckpointError(f"{path}: its metadata does not describe a classifier (classes {classes!r}, "
                              f"image_size {size!r}, mean {mean!r}, std {std!r})")
    return values


def _check_graph(path: Path, session: Any, size: int, num_classes: int) -> None:
    """CheckpointError unless the graph takes (N, 3, size, size) float images and gives (N, num_classes)."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    want_in, want_out = [3, size, size], [num_classes]
    if (len(inputs) != 1 or inputs[0].type != "tensor(float)" or len(inputs[0].shape) != 4
            or list(inputs[0].shape[1:]) != want_in or not outputs or len(outputs[0].shape) != 2
            or list(outputs[0].shape[1:]) != want_out):
        got = ", ".join(f"{i.name} {i.type} {i.shape}" for i in inputs)
        raise CheckpointError(f"{path}: its graph takes {got or 'no input'} and gives "
                              f"{[o.shape for o in outputs]}, not the (N, 3, {size}, {size}) float images -> "
                              f"(N, {num_classes}) logits its metadata describes")


def load_onnx(path: str | os.PathLike, threads: int | None = None) -> OnnxClassifier:
    """An exported model ready to run on the CPU, or CheckpointError with one line naming the file: not found,
    not an ONNX file (or damaged), no vit_flowers metadata, or a graph that does not fit its metadata.
    ``threads``: ONNX Runtime's intra-op threads (default: one per physical core)."""
    import onnxruntime as ort

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"ONNX model not found: {path}")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # its own warnings are not the user's business; errors are raised below
    # Idle threads sleep instead of spinning: predict decodes the next batch between runs, and a laptop has other
    # work; spinning was slower in every A/B on the 2-core dev machine (benchmarks/HISTORY.md, "ONNX export").
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types for damaged files
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CheckpointError(f"cannot read ONNX model {path}: not an ONNX file, or damaged ({reason})") from None
    meta = dict(session.get_modelmeta().custom_metadata_map)
    values = _metadata(path, meta)
    _check_graph(path, session, values["image_size"], len(values["classes"]))
    return OnnxClassifier(path, session, values["classes"], values["image_size"],
                          [float(x) for x in values["mean"]], [float(x) for x in values["std"]], meta)


# ---------------------------------------------------------------------------------------------- pixels


def decode_image(path: str | os.PathLike, size: int) -> np.ndarray | str:
    """One file -> uint8 (3, size, size), or the reason it cannot be read (:func:`image_files.load_image`'s).

    Shorter side to ``size`` (PIL's antialiased bicubic; the same output size as the PyTorch path's resize),
    then the centre crop with torchvision's rounding."""
    try:
        img = crop_strip(load_image(path, min_size=size))
    except ImageLoadError as exc:
        return exc.reason
    w, h = img.size
    out_w, out_h = (int(size * w / h), size) if h <= w else (size, int(size * h / w))
    if (out_w, out_h) != (w, h):
        img = img.resize((out_w, out_h), Image.Resampling.BICUBIC)
    left, top = int(round((out_w - size) / 2.0)), int(round((out_h - size) / 2.0))
    img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)  # (H, W, 3) -> (3, H, W)


def normalize(images: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """uint8 (B, 3, H, W) -> float32 ``(x / 255 - mean) / std``, computed as ``x * (1 / (255 std)) - mean / std``, the
    constants computed in float64 as the PyTorch path's."""
    mean64 = np.asarray(mean, dtype=np.float64).reshape(1, 3, 1, 1)
    std64 = np.asarray(std, dtype=np.float64).reshape(1, 3, 1, 1)
    scale = (1.0 / (255.0 * std64)).astype(np.float32)
    shift = (-mean64 / std64).astype(np.float32)
    return images.astype(np.float32) * scale + shift


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (B, C) logits, in float32."""
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)


def predict_files(
    model: OnnxClassifier,
    paths: Sequence[str | os.PathLike],
    batch_size: int = 64,
    tta: bool = False,
    num_threads: int | None = None,
) -> Iterator[tuple[list[int], np.ndarray, list[FileError], np.ndarray | None]]:
    """Stream ``(input positions, probs (B, num_classes), errors, scores (B,) of the model's unknown rule or
    None)`` over image files, a batch at a time.

    Each batch is decoded on ``num_threads`` threads just before the model runs it (the model then has every
    core); unreadable files are in ``errors`` and never stop the stream."""
    files = [Path(p) for p in paths]
    size = model.image_size
    for indices, pixels, errors in decode_in_chunks(files, lambda p: decode_image(p, size), batch_size,
                                                    num_threads, read_ahead=False):
        images = np.stack(pixels) if pixels else np.empty((0, 3, size, size), dtype=np.uint8)
        probs, scores = model.scored(images, tta)
        yield indices, probs, errors, scores
