"""The cross-attention of the encoder-decoder Transformer for one example, drawn as a heat map (output tokens as
rows, source tokens as columns) with matplotlib's object-oriented API (Agg: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure

__all__ = ["cross_attention_figure"]


def cross_attention_figure(weights: torch.Tensor, source: Sequence[str], output: Sequence[str], path: Path,
                           title: str = "cross-attention") -> Path:
    """Save ``weights`` (T, S): row t says where output token ``output[t]`` looked among ``source``, as a PNG at
    ``path``; returns ``path``. Raises ValueError when the shape does not match the token lists."""
    if tuple(weights.shape) != (len(output), len(source)):
        raise ValueError(f"attention of shape {tuple(weights.shape)} does not match {len(output)} output tokens x "
                         f"{len(source)} source tokens")
    fig = Figure(figsize=(1.0 + 0.5 * len(source), 1.0 + 0.5 * len(output)), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(weights.float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(source)), list(source))
    ax.set_yticks(range(len(output)), list(output))
    ax.set_xlabel("source token")
    ax.set_ylabel("output token")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, shrink=0.8)
    fig.savefig(path, dpi=100)
    return path
