"""The frozen-feature recipe inside the hybrid: what Teachable Machine and Create ML classify with, as a branch of the
model beside the encoder's head (#60).

An EfficientNet-Lite's ImageNet network ends, after the stages the hybrid keeps as its trunk, with a 1x1 "head"
convolution (320 -> 1,280 channels for Lite0), BatchNorm and ReLU6, then a mean over the grid: the 1,280 pooled
features that a logistic regression reads in the peers' recipe. :class:`FeatureHead` is that convolution with its
ImageNet weights, frozen, over the trunk's grid, and a linear classifier on the pooled features. The hybrid adds its
logits to the encoder's head's (:meth:`vit_flowers.models.vit.ViT.classify`): with the classifier fitted as the
peer fits it (:func:`vit_flowers.training.feature_start.start_from_features`) and the encoder's head at zero, the
model *is* the peer at its first step, and what the encoder learns on top is kept only where it beats that start.

    >>> head = FeatureHead("lite0", in_channels=320, num_classes=5)
    >>> load_imagenet_head(head)
    >>> head(torch.randn(2, 320, 7, 7)).shape     # torch.Size([2, 5])
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from .efficientnet import LITE_VARIANTS, imagenet_state

__all__ = ["FeatureHead", "load_imagenet_head"]

log = logging.getLogger(__name__)


class FeatureHead(nn.Module):
    """The ImageNet head convolution of EfficientNet-``variant`` (frozen) over a trunk grid cut at its last stage,
    mean-pooled, then a linear classifier: (B, in_channels, h, w) -> logits (B, num_classes)."""

    conv: nn.Conv2d
    norm: nn.Module
    fc: nn.Linear

    def __init__(self, variant: str, in_channels: int, num_classes: int) -> None:
        """
        Args:
            variant: the trunk's EfficientNet-Lite (a key of ``LITE_VARIANTS``), whose head convolution this is.
            in_channels: the trunk's output channels (its last stage's: 320 for Lite0 and Lite1, 352 for Lite2).
            num_classes: the classifier's classes.
        """
        super().__init__()
        import timm

        net: Any = timm.create_model(LITE_VARIANTS[variant].timm_name, pretrained=False)  # timm's untyped modules
        if net.conv_head.in_channels != in_channels:
            raise ValueError(f"FeatureHead: {LITE_VARIANTS[variant].title}'s head convolution reads "
                             f"{net.conv_head.in_channels} channels, the trunk gives {in_channels}: the trunk must "
                             f"end with its last stage (patch_size 32)")
        self.variant = variant
        self.conv = net.conv_head  # (B, C, h, w) -> (B, 1280, h, w), no bias
        self.norm = net.bn2  # BatchNorm with its ReLU6
        self.num_features = int(net.num_features)
        self.fc = nn.Linear(self.num_features, num_classes)
        nn.init.zeros_(self.fc.weight)  # nothing until fitted (start_from_features)
        nn.init.zeros_(self.fc.bias)
        self.freeze()

    def freeze(self) -> None:
        """No gradients anywhere: the convolution and its BatchNorm stay ImageNet's (running statistics kept: call
        after every ``train()``, which puts BatchNorm back in training mode), the classifier is fitted, not trained
        (:func:`vit_flowers.training.feature_start.start_from_features`)."""
        self.requires_grad_(False)
        self.conv.eval()
        self.norm.eval()

    def train(self, mode: bool = True) -> FeatureHead:
        super().train(mode)
        self.freeze()
        return self

    def features(self, grid: torch.Tensor) -> torch.Tensor:
        """The trunk's grid (B, C, h, w) -> the pooled ImageNet features (B, num_features)."""
        features: torch.Tensor = self.norm(self.conv(grid))  # (B, num_features, h, w)
        return features.mean((2, 3))

    def forward(self, grid: torch.Tensor) -> torch.Tensor:
        """The trunk's grid (B, C, h, w) -> logits (B, num_classes)."""
        return self.fc(self.features(grid))


def load_imagenet_head(head: FeatureHead) -> None:
    """Put the ImageNet weights of the head convolution and its BatchNorm into ``head`` (its classifier stays as it
    is)."""
    state = imagenet_state(head.variant)
    own = {f"{part}.{name}": f"{timm_part}.{name}" for part, timm_part in (("conv", "conv_head"), ("norm", "bn2"))
           for name in getattr(head, part).state_dict()}
    missing, _ = head.load_state_dict({ours: state[theirs] for ours, theirs in own.items()}, strict=False)
    assert set(missing) == {"fc.weight", "fc.bias"}, missing  # every tensor but the classifier's, from the file
    log.info("ImageNet weights (%s): the head convolution, %d tensors", LITE_VARIANTS[head.variant].package, len(own))
