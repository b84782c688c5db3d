"""An exported model (``python -m vit_flowers.export``) behind PyTorch's module interface, so that the PyTorch
pipelines (``evaluate``'s datasets and files, :func:`vit_flowers.inference.batches.predict_batch`) run it unchanged, its
logits coming from ONNX Runtime. (:mod:`vit_flowers.inference.onnx_runtime` is the torch-free way to run an export.)

    loaded, run_dir = load_onnx_module("checkpoints/latest/model.onnx")   # evaluate --checkpoint model.onnx
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..runs import folders as runs
from .loaded import LoadedModel
from .onnx_runtime import OnnxClassifier, load_onnx

if TYPE_CHECKING:
    from ..runs.checkpoint import ModelFacts

__all__ = ["OnnxModule", "load_onnx_module"]


class OnnxModule(nn.Module):
    """An ONNX Runtime session as an ``nn.Module``: float images (N, 3, S, S) in, logits out (on the CPU)."""

    def __init__(self, onnx_model: OnnxClassifier) -> None:
        super().__init__()
        self.onnx = onnx_model
        self.image_size = onnx_model.image_size
        self.num_classes = len(onnx_model.classes)

    @property
    def gives_features(self) -> bool:
        return self.onnx.gives_features

    @property
    def precision(self) -> str:
        """The precision it was exported in ("fp32", "int8"), from its metadata."""
        return self.onnx.metadata.get("precision", "fp32")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.onnx.logits(x.detach().float().cpu().numpy()))

    def forward_with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, feats = self.onnx.outputs(x.detach().float().cpu().numpy())
        if feats is None:
            raise ValueError(f"{self.onnx.path} has no features output (exported before the unknown rule)")
        return torch.from_numpy(logits), torch.from_numpy(feats)


def load_onnx_module(path: str | Path) -> tuple[LoadedModel, Path]:
    """(the export at ``path`` as a :class:`LoadedModel` on the CPU, the training run it came from: its own
    folder when that holds the run's config.yaml, else the source checkpoint's folder when it exists)."""
    onnx_model = load_onnx(path)
    meta = onnx_model.metadata
    try:
        config = json.loads(meta.get("config", "{}"))
    except json.JSONDecodeError:
        config = {}
    ckpt: ModelFacts = {"classes": onnx_model.classes, "image_size": onnx_model.image_size, "mean": onnx_model.mean,
                        "std": onnx_model.std, "config": config if isinstance(config, dict) else {},
                        "unknown": onnx_model.checkpoint_keys().get("unknown")}
    run_dir = Path(path).parent
    source = Path(meta.get("source_checkpoint", "")).parent
    if not (run_dir / runs.CONFIG).is_file() and (source / runs.CONFIG).is_file():
        run_dir = source
    return LoadedModel(OnnxModule(onnx_model), ckpt, Path(path), torch.device("cpu")), run_dir
