"""Patch embeddings for the ViT: image (B, C, H, W) -> tokens (B, N, dim).

``LinearPatchEmbed`` is the paper's: non-overlapping ``patch_size`` squares, flattened and
projected by one Linear (the same as a stride-``patch_size`` convolution).
``ConvPatchEmbed`` is the early-convolution stem of Xiao et al. 2021, "Early Convolutions
Help Transformers See Better": 3x3 stride-2 convolutions with BatchNorm + ReLU, doubling the
channels, until the stride equals ``patch_size``, then a 1x1 projection to ``dim``. It makes
the same token grid as the linear embedding, so the rest of the ViT is unchanged; the
locality it brings helps a ViT trained from scratch on a few thousand images.
``deep=True`` ("conv_deep") is a wider version in the spirit of CCT's convolutional tokenizer:
channels 32, 64, 128, ... and a second (stride-1) 3x3 convolution in every middle stage.
``pool=True`` ("cct") is the tokenizer of Hassani et al. 2021, "Escaping the Big Data Paradigm with
Compact Transformers": each stage a stride-1 3x3 convolution at the stage's full resolution, then a 3x3
stride-2 max-pool (with BatchNorm here, as the stems above), channels as conv_deep's.
``HybridPatchEmbed`` ("lite0", "lite1", "lite2") is the hybrid of the ViT paper (section 3.1; timm's
``HybridEmbed``): the stem and first stages of EfficientNet-Lite0, -Lite1 or -Lite2 (:mod:`.efficientnet`, ImageNet
weights with ``--pretrained imagenet``; Lite1/Lite2 are deeper, Lite2 also wider) up to a stride of ``patch_size``
(8, 16 or 32), then a 1x1 projection to ``dim``: one token per feature-map cell.

    >>> embed = make_patch_embed("conv", patch_size=8, channels=3, dim=192)
    >>> embed(torch.randn(2, 3, 64, 64)).shape      # torch.Size([2, 64, 192])
"""

from __future__ import annotations

import math

import torch
from einops.layers.torch import Rearrange
from torch import nn

from .efficientnet import LITE_VARIANTS, TRUNK_STRIDES, EfficientNetTrunk

__all__ = ["PATCH_EMBEDS", "HYBRID_EMBEDS", "LinearPatchEmbed", "ConvPatchEmbed", "HybridPatchEmbed",
           "check_patch_embed", "make_patch_embed", "hybrid_embed"]

HYBRID_EMBEDS: tuple[str, ...] = tuple(LITE_VARIANTS)  # a pretrained CNN's stages: what --pretrained imagenet fills
PATCH_EMBEDS: tuple[str, ...] = ("linear", "conv", "conv_deep", "cct", *HYBRID_EMBEDS)


def check_patch_embed(kind: str, patch_size: int) -> None:
    """Raise ValueError unless ``kind`` is a known patch embedding that can make ``patch_size`` patches
    (the convolutional stems halve the resolution per stage, so they need a power of two)."""
    if kind not in PATCH_EMBEDS:
        raise ValueError(f"unknown patch_embed {kind!r}: choose one of {', '.join(PATCH_EMBEDS)}")
    if kind in HYBRID_EMBEDS:
        if patch_size not in TRUNK_STRIDES:
            raise ValueError(f"patch_embed {kind!r} cuts {LITE_VARIANTS[kind].title} at a stride of patch_size: one "
                             f"of {', '.join(map(str, TRUNK_STRIDES))}, got {patch_size}")
    elif kind != "linear" and (patch_size < 2 or patch_size & (patch_size - 1)):
        raise ValueError(f"patch_embed {kind!r} needs a patch_size that is a power of two >= 2, got {patch_size}")


class LinearPatchEmbed(nn.Sequential):
    """Flatten each ``patch_size`` square and project it: (B, C, H, W) -> (B, N, dim).

    Submodule ``1`` is the Linear (state-dict keys ``1.weight``, ``1.bias``; ``timm_port.from_timm`` relies on them).
    """

    def __init__(self, patch_size: int, channels: int, dim: int) -> None:
        super().__init__(
            Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch_size, p2=patch_size),  # (B, N, p*p*C)
            nn.Linear(channels * patch_size**2, dim),
        )


def _conv_bn_relu(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True)]


class ConvPatchEmbed(nn.Module):
    """Early-convolution stem: log2(patch_size) x [3x3 conv stride 2, BatchNorm, ReLU], then a 1x1 conv to dim.

    Channels double at each stride-2 convolution and end at ``dim // 2`` (e.g. 24, 48, 96 for dim 192 and
    patch 8), as in Xiao et al. 2021. With ``deep`` they start at 32 instead (32, 64, 128, 256 for patch 16)
    and every stage but the first and the last adds a stride-1 3x3 convolution (the recipe's stem for
    flowers5; its ablation is in benchmarks/README.md). With ``pool`` (CCT's tokenizer) each stage convolves
    at stride 1 and then max-pools by 2, with ``deep``'s widths. Output:
    (B, (H / patch_size) * (W / patch_size), dim), row-major like the linear embedding.
    """

    def __init__(self, patch_size: int, channels: int, dim: int, deep: bool = False, pool: bool = False) -> None:
        super().__init__()
        check_patch_embed("conv", patch_size)
        stages = int(math.log2(patch_size))
        if deep or pool:
            widths = [32 * 2**i for i in range(stages)]  # e.g. [32, 64, 128, 256] for patch 16
        else:
            widths = [max(8, dim // 2 ** (stages - i)) for i in range(stages)]  # e.g. [24, 48, 96] for dim 192
        layers: list[nn.Module] = []
        c_in = channels
        for i, c_out in enumerate(widths):
            if pool:  # CCT: convolve at full resolution, then halve it by max-pooling
                layers += [*_conv_bn_relu(c_in, c_out, stride=1), nn.MaxPool2d(3, stride=2, padding=1)]
                c_in = c_out
                continue
            layers += _conv_bn_relu(c_in, c_out, stride=2)
            if deep and 0 < i < stages - 1:
                layers += _conv_bn_relu(c_out, c_out, stride=1)
            c_in = c_out
        self.stem = nn.Sequential(*layers)
        self.proj = nn.Conv2d(c_in, dim, 1)
        self.flatten = Rearrange("b d h w -> b (h w) d")

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        """img (B, C, H, W) -> tokens (B, N, dim)."""
        if img.device.type == "cpu":  # oneDNN's convolutions and BatchNorm skip layout reorders in channels-last
            img = img.contiguous(memory_format=torch.channels_last)
        x = self.proj(self.stem(img))  # (B, dim, H / p, W / p)
        return self.flatten(x)  # (B, N, dim)


class HybridPatchEmbed(nn.Module):
    """EfficientNet-Lite ``variant`` (lite0, lite1, lite2) up to stride ``patch_size``, then a 1x1 conv to
    ``dim``: (B, 3, H, W) -> (B, N, dim).

    Inputs come normalised with ImageNet's mean and std like every model here; the Lites were trained on
    (x - 0.5) / 0.5, so a fixed per-channel affine maps one onto the other first (exact, and it keeps one
    normalisation for training, the checkpoint, predict and ONNX).
    """

    input_scale: torch.Tensor  # buffers (register_buffer: typed here, not as nn.Module's "Tensor | Module")
    input_shift: torch.Tensor

    def __init__(self, patch_size: int, channels: int, dim: int, variant: str = "lite0") -> None:
        super().__init__()
        from ..data.augment import IMAGENET_MEAN, IMAGENET_STD

        if channels != 3:
            raise ValueError(f"patch_embed {variant!r} takes RGB images (channels 3), got {channels}")
        mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        # (x * std + mean - 0.5) / 0.5 = x * 2 std + (2 mean - 1); not in the state dict: a constant
        self.register_buffer("input_scale", 2 * std, persistent=False)
        self.register_buffer("input_shift", 2 * mean - 1, persistent=False)
        self.trunk = EfficientNetTrunk(stride=patch_size, variant=variant)
        self.proj = nn.Conv2d(self.trunk.out_channels, dim, 1)
        self.flatten = Rearrange("b d h w -> b (h w) d")

    def lite_input(self, img: torch.Tensor) -> torch.Tensor:
        """img (B, 3, H, W), ImageNet-normalised -> as the Lites were trained, (x - 0.5) / 0.5."""
        x = img * self.input_scale + self.input_shift
        if x.device.type == "cpu":  # as ConvPatchEmbed: oneDNN's convolutions are faster in channels-last
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def trunk_features(self, img: torch.Tensor) -> torch.Tensor:
        """img (B, 3, H, W), ImageNet-normalised -> the pretrained stages' output (B, C, H / p, W / p): while
        those stages are frozen, a function of the photo alone (what :mod:`vit_flowers.training.token_cache` keeps)."""
        return self.trunk(self.lite_input(img))

    def tokens(self, features: torch.Tensor) -> torch.Tensor:
        """The trunk's output (B, C, h, w) -> tokens (B, h * w, dim); channels after the trunk's own (a feature
        head's other trunks, :meth:`vit_flowers.models.vit.ViT.trunk_grid`) are not read."""
        return self.flatten(self.proj(features[:, :self.trunk.out_channels]))

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        """img (B, 3, H, W), ImageNet-normalised -> tokens (B, (H / p) * (W / p), dim)."""
        return self.tokens(self.trunk_features(img))


def make_patch_embed(kind: str, patch_size: int, channels: int, dim: int) -> nn.Module:
    """Build the patch embedding named ``kind`` (one of ``PATCH_EMBEDS``)."""
    check_patch_embed(kind, patch_size)
    if kind == "linear":
        return LinearPatchEmbed(patch_size, channels, dim)
    if kind in HYBRID_EMBEDS:
        return HybridPatchEmbed(patch_size, channels, dim, variant=kind)
    return ConvPatchEmbed(patch_size, channels, dim, deep=kind == "conv_deep", pool=kind == "cct")


def hybrid_embed(embed: nn.Module) -> HybridPatchEmbed:
    """``embed`` (a ViT's ``to_patch_embedding``) as the hybrid's it is; TypeError when it is another kind."""
    if not isinstance(embed, HybridPatchEmbed):
        raise TypeError(f"a hybrid's patch embedding (EfficientNet-Lite) was expected, not {type(embed).__name__}")
    return embed
