"""Weights that ship with the package, by name: ``--pretrained fractal`` works offline on a fresh clone.

Every pixel these weights saw was drawn by the package's own formulas (``python -m vit_flowers.pretrain``);
no natural image and no downloaded weight went into them. How each was made: docs/pretraining.md.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SHIPPED", "WEIGHTS_DIR", "resolve_pretrained"]

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"

# name -> file in vit_flowers/weights/
SHIPPED: dict[str, str] = {
    "fractal": "fractal-vit_tiny_cpu-conv_deep-p16.safetensors",
}


def resolve_pretrained(spec: str) -> str:
    """The file behind a shipped name, else ``spec`` unchanged (a path or a timm model name)."""
    if spec not in SHIPPED:
        return spec
    path = WEIGHTS_DIR / SHIPPED[spec]
    if not path.is_file():
        raise FileNotFoundError(f"pretrained: the shipped weights {spec!r} are missing ({path}); reinstall the "
                                f"package or make them with `python -m vit_flowers.pretrain` (docs/pretraining.md)")
    return str(path)
