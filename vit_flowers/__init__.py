"""vit_flowers: a Vision Transformer flower classifier for laptop CPUs.

    vit_flowers/models/   the networks: layers (the shared encoder), patch embeddings, ViT, seq2seq, timm port
    vit_flowers/data/     images on disk, augmentation, datasets and splits, synthetic images
    vit_flowers/*.py      the commands (train, evaluate, predict, explain) and what they share

``import vit_flowers`` is cheap: the names below are imported (with torch) on first use.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__version__ = "0.1.0"
ENTRY_POINT = "vit-flowers"  # the console script of pyproject.toml's [project.scripts]

_EXPORTS = {
    "Attention": "models.layers", "Block": "models.layers", "DropPath": "models.layers",
    "FeedForward": "models.layers", "Transformer": "models.layers",
    "Seq2SeqTransformer": "models.seq2seq", "causal_mask": "models.seq2seq", "padding_mask": "models.seq2seq",
    "target_mask": "models.seq2seq",
    "PRESETS": "models.vit", "ViT": "models.vit", "create_vit": "models.vit", "from_timm": "models.timm_port",
}

__all__ = list(_EXPORTS)


def _quiet_interrupts_of_commands() -> None:
    """A command started from the shell reports Ctrl-C in one line, even while it imports (interrupts.py)."""
    from .interrupts import quiet_interrupts, starting_a_command

    if sys.argv and starting_a_command(sys.argv[0], ENTRY_POINT):
        quiet_interrupts()


_quiet_interrupts_of_commands()


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vit_flowers' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
