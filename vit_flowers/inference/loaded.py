"""The trained model that the commands open and pass around (torch-free, so that ``vit_flowers.cli`` imports no
torch: the fields say in comments what they hold)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["LoadedModel"]


class LoadedModel(NamedTuple):
    """A trained model ready to run: in eval mode on ``device``, with its checkpoint dict and file."""

    model: Any  # vit_flowers.models.vit.ViT
    ckpt: dict[str, Any]
    path: Path
    device: Any  # torch.device
