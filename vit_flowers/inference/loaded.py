"""The trained model that the commands open and pass around (torch-free, so that ``vit_flowers.cli`` imports no
torch: the fields say in comments what they hold)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ..runs.checkpoint import ModelFacts

__all__ = ["LoadedModel"]


class LoadedModel(NamedTuple):
    """A trained model ready to run: in eval mode on ``device``, with what its checkpoint says of it and its file."""

    model: Any  # vit_flowers.models.vit.ViT, or an ONNX export's OnnxModule
    ckpt: ModelFacts  # a PyTorch checkpoint's whole Checkpoint; an ONNX export's, made from its metadata
    path: Path
    device: Any  # torch.device
