"""Patch embeddings for the ViT: image (B, C, H, W) -> tokens (B, N, dim).

``LinearPatchEmbed`` is the paper's: non-overlapping ``patch_size`` squares, flattened and
projected by one Linear (the same as a stride-``patch_size`` convolution).
``ConvPatchEmbed`` is the early-convolution stem of Xiao et al. 2021, "Early Convolutions
Help Transformers See Better": 3x3 stride-2 convolutions with BatchNorm + ReLU, doubling the
channels, until the stride equals ``patch_size``, then a 1x1 projection to ``dim``. It makes
the same token grid as the linear embedding, so the rest of the ViT is unchanged; the
locality it brings helps a ViT trained from scratch on a few thousand images.

    >>> embed = make_patch_embed("conv", patch_size=8, channels=3, dim=192)
    >>> embed(torch.randn(2, 3, 64, 64)).shape      # torch.Size([2, 64, 192])
"""

from __future__ import annotations

import math

import torch
from einops.layers.torch import Rearrange
from torch import nn

__all__ = ["PATCH_EMBEDS", "LinearPatchEmbed", "ConvPatchEmbed", "make_patch_embed"]

PATCH_EMBEDS: tuple[str, ...] = ("linear", "conv")


class LinearPatchEmbed(nn.Sequential):
    """Flatten each ``patch_size`` square and project it: (B, C, H, W) -> (B, N, dim).

    Submodule ``1`` is the Linear (state-dict keys ``1.weight``, ``1.bias``; ``ViT.from_timm`` relies on them).
    """

    def __init__(self, patch_size: int, channels: int, dim: int) -> None:
        super().__init__(
            Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch_size, p2=patch_size),  # (B, N, p*p*C)
            nn.Linear(channels * patch_size**2, dim),
        )


class ConvPatchEmbed(nn.Module):
    """Early-convolution stem: log2(patch_size) x [3x3 conv stride 2, BatchNorm, ReLU], then a 1x1 conv to dim.

    Channels double at each stride-2 convolution and end at ``dim // 2`` (e.g. 24, 48, 96 for dim 192 and
    patch 8), as in Xiao et al. 2021. Output: (B, (H / patch_size) * (W / patch_size), dim), row-major like the
    linear embedding.
    """

    def __init__(self, patch_size: int, channels: int, dim: int) -> None:
        super().__init__()
        stages = int(math.log2(patch_size)) if patch_size > 0 else 0
        if patch_size < 2 or 2**stages != patch_size:
            raise ValueError(f"ConvPatchEmbed: patch_size must be a power of two >= 2, got {patch_size}")
        widths = [max(8, dim // 2 ** (stages - i)) for i in range(stages)]  # e.g. [24, 48, 96] for dim 192
        layers: list[nn.Module] = []
        c_in = channels
        for c_out in widths:
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True)]
            c_in = c_out
        self.stem = nn.Sequential(*layers)
        self.proj = nn.Conv2d(c_in, dim, 1)
        self.flatten = Rearrange("b d h w -> b (h w) d")

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        """img (B, C, H, W) -> tokens (B, N, dim)."""
        x = self.proj(self.stem(img))  # (B, dim, H / p, W / p)
        return self.flatten(x)  # (B, N, dim)


def make_patch_embed(kind: str, patch_size: int, channels: int, dim: int) -> nn.Module:
    """Build the patch embedding named ``kind`` ("linear" | "conv")."""
    if kind == "linear":
        return LinearPatchEmbed(patch_size, channels, dim)
    if kind == "conv":
        return ConvPatchEmbed(patch_size, channels, dim)
    raise ValueError(f"unknown patch_embed {kind!r}: choose one of {', '.join(PATCH_EMBEDS)}")
