"""The frozen-feature recipe inside the hybrid: what Teachable Machine and Create ML classify with, as a branch of the
model beside the encoder's head (#60).

An EfficientNet-Lite's ImageNet network ends, after the stages the hybrid keeps as its trunk, with a 1x1 "head"
convolution (320 -> 1,280 channels for Lite0), BatchNorm and ReLU6, then a mean over the grid: the 1,280 pooled
features that a logistic regression reads in the peers' recipe. :class:`FeatureHead` is that convolution with its
ImageNet weights, frozen, over the trunk's grid, and a linear classifier on the pooled features. The hybrid adds its
logits to the encoder's head's (:meth:`vit_flowers.models.vit.ViT.classify`): with the classifier fitted as the
peer fits it (:func:`vit_flowers.training.feature_start.start_from_features`) and the encoder's head at zero, the
model *is* the peer at its first step, and what the encoder learns on top is kept only where it beats that start.
Other whole Lites (``extras``, e.g. Lite2) can add their pooled features on the same photo: their last-stage grids
follow the trunk's along the channels (:meth:`vit_flowers.models.vit.ViT.trunk_grid`), so whatever carries the
trunk's output (the head start's cache, ONNX) carries theirs.

    >>> head = FeatureHead("lite0", in_channels=320, num_classes=5)
    >>> load_imagenet_head(head)
    >>> head(torch.randn(2, 320, 7, 7)).shape     # torch.Size([2, 5])
"""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
from torch import nn

from .efficientnet import LITE_VARIANTS, EfficientNetTrunk, imagenet_state, load_imagenet_trunk

__all__ = ["FeatureHead", "load_imagenet_head"]

log = logging.getLogger(__name__)


class FeatureHead(nn.Module):
    """The ImageNet head convolution of EfficientNet-``variant`` (frozen) over a trunk grid cut at its last stage,
    mean-pooled, beside those of ``extras``' whole networks (other Lites, frozen, on the same photo: their grids
    follow the trunk's along the channels, :meth:`extra_grids`), then a linear classifier on all the pooled features:
    (B, in_channels + extra channels, h, w) -> logits (B, num_classes)."""

    conv: nn.Conv2d
    norm: nn.Module
    fc: nn.Linear

    def __init__(self, variant: str, in_channels: int, num_classes: int, extras: tuple[str, ...] = ()) -> None:
        """
        Args:
            variant: the trunk's EfficientNet-Lite (a key of ``LITE_VARIANTS``), whose head convolution this is.
            in_channels: the trunk's output channels (its last stage's: 320 for Lite0 and Lite1, 352 for Lite2).
            num_classes: the classifier's classes.
            extras: other EfficientNet-Lites whose whole networks' pooled features join the trunk's (e.g. "lite2").
        """
        super().__init__()
        net = _lite(variant)
        if net.conv_head.in_channels != in_channels:
            raise ValueError(f"FeatureHead: {LITE_VARIANTS[variant].title}'s head convolution reads "
                             f"{net.conv_head.in_channels} channels, the trunk gives {in_channels}: the trunk must "
                             f"end with its last stage (patch_size 32)")
        self.variant, self.extras = variant, tuple(extras)
        self.conv = net.conv_head  # (B, C, h, w) -> (B, 1280, h, w), no bias
        self.norm = net.bn2  # BatchNorm with its ReLU6
        trunks = [EfficientNetTrunk(stride=32, variant=v) for v in self.extras]
        self.extra_trunks = nn.ModuleList(trunks)
        self.extra_heads = nn.ModuleList(nn.Sequential(n.conv_head, n.bn2) for n in map(_lite, self.extras))
        self.splits = [in_channels, *(t.out_channels for t in trunks)]  # the grid's channels, trunk by trunk
        self.num_features = int(net.num_features) * (1 + len(self.extras))
        self.fc = nn.Linear(self.num_features, num_classes)
        nn.init.zeros_(self.fc.weight)  # nothing until fitted (start_from_features)
        nn.init.zeros_(self.fc.bias)
        self.freeze()

    def freeze(self) -> None:
        """No gradients anywhere, BatchNorm on its running statistics: the networks stay ImageNet's (call after every
        ``train()``, which puts BatchNorm back in training mode), the classifier is fitted, not trained
        (:func:`vit_flowers.training.feature_start.start_from_features`)."""
        self.requires_grad_(False)
        for module in (self.conv, self.norm, self.extra_trunks, self.extra_heads):
            module.eval()

    def train(self, mode: bool = True) -> FeatureHead:
        super().train(mode)
        self.freeze()
        return self

    def extra_grids(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Photos scaled as the Lites were trained, (x - 0.5) / 0.5 (B, 3, H, W) -> each extra network's last-stage
        grid (B, C_extra, H / 32, W / 32)."""
        return [trunk(x) for trunk in self.extra_trunks]

    def features(self, grid: torch.Tensor) -> torch.Tensor:
        """The trunk's grid, the extras' after it (B, C + C_extras, h, w) -> the pooled ImageNet features of each,
        side by side (B, num_features)."""
        parts = grid.split(self.splits, dim=1)
        pooled = [self.norm(self.conv(parts[0])).mean((2, 3))]  # (B, 1280) each
        pooled += [head(part).mean((2, 3)) for head, part in zip(self.extra_heads, parts[1:])]
        return torch.cat(pooled, dim=1)

    def forward(self, grid: torch.Tensor) -> torch.Tensor:
        """The trunk's grid, the extras' after it (B, C + C_extras, h, w) -> logits (B, num_classes)."""
        return self.fc(self.features(grid))


def _lite(variant: str) -> Any:
    """timm's EfficientNet-``variant`` (untyped modules), without weights."""
    import timm

    return timm.create_model(LITE_VARIANTS[variant].timm_name, pretrained=False)


def load_imagenet_head(head: FeatureHead) -> None:
    """Put the ImageNet weights of every network in ``head`` into it: the head convolution and its BatchNorm of the
    trunk's Lite, the whole of each extra Lite (its classifier stays as it is). ImageNetWeightsError where a
    package is missing."""
    def head_state(variant: str, conv: str, norm: str) -> dict[str, torch.Tensor]:
        state = imagenet_state(variant)
        return {f"{ours}.{name}": state[f"{timm_part}.{name}"] for ours, timm_part in ((conv, "conv_head"),
                                                                                       (norm, "bn2"))
                for name in head.get_submodule(ours).state_dict()}

    weights = head_state(head.variant, "conv", "norm")
    for i, (variant, trunk) in enumerate(zip(head.extras, head.extra_trunks)):
        load_imagenet_trunk(cast(EfficientNetTrunk, trunk))
        weights |= head_state(variant, f"extra_heads.{i}.0", f"extra_heads.{i}.1")
    missing, _ = head.load_state_dict(weights, strict=False)
    assert all(k.startswith(("fc.", "extra_trunks.")) for k in missing), missing  # those: the classifier, and above
    log.info("ImageNet weights: the head convolution of %s%s", LITE_VARIANTS[head.variant].title,
             "".join(f", the whole {LITE_VARIANTS[v].title}" for v in head.extras))
