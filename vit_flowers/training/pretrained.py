"""Start a ViT from pretrained weights, with a new head for the user's classes.

A source is one of:

- a vit_flowers checkpoint (``.pt``, e.g. a training run's ``best.pt``), or a vit_flowers ``.safetensors``
  file (weights plus their ``model_config`` in the metadata): any patch embedding, positions resampled to the
  new image size;
- a timm ``VisionTransformer`` state dict (``.pth`` / ``.safetensors``; give its number of heads);
- a timm model name, downloaded by timm (needs the network the first time).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from ..models.taught import untaught
from ..models.timm_port import from_timm
from ..models.vit import ViT
from ..runs.checkpoint import PREFIX, migrate
from ..runs.errors import CheckpointError
from ..runs.torch_files import read_torch_file
from .retired import FRACTALS_REMOVED

__all__ = ["PretrainedError", "SHAPE_KEYS", "load_pretrained", "pretrained_shape"]

log = logging.getLogger(__name__)

# sources that once named weights shipped with the package, and why they are gone
RETIRED_SOURCES: dict[str, str] = {"fractal": FRACTALS_REMOVED}
# the config keys that pretrained weights decide (their model's shape): :func:`pretrained_shape`
SHAPE_KEYS: tuple[str, ...] = ("patch_embed", "patch_size", "dim", "depth", "heads", "mlp_dim", "pos_init")
WEIGHT_SUFFIXES = (".pt", ".pth", ".safetensors", ".bin")  # a source ending so names a file, never a timm model


class PretrainedError(ValueError):
    """Pretrained weights that cannot be read or used; the message names the source."""


def load_pretrained(source: str | Path, *, num_classes: int, image_size: int, heads: int | None = None,
                    **regularisation: Any) -> ViT:
    """A ViT with the weights of ``source`` (see the module docstring), a new ``num_classes`` head when the
    classes differ, positions resampled to ``image_size``; ``regularisation``: ``dropout``, ``drop_path``."""
    path = Path(source)
    if not path.is_file():
        _check_name(source)
        return _from_timm_name(str(source), num_classes=num_classes, image_size=image_size, **regularisation)
    state, meta = _read_weights(path)
    if meta is not None:
        return _from_ours(state, meta, path, num_classes=num_classes, image_size=image_size, **regularisation)
    if heads is None:
        raise PretrainedError(f"pretrained: {path} is a bare state dict; set pretrained_heads (e.g. 3 for ViT-Ti, "
                              f"6 for ViT-S)")
    try:
        return from_timm(state, heads=heads, num_classes=num_classes, image_size=image_size, **regularisation)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise PretrainedError(f"pretrained: {path} is neither a vit_flowers checkpoint nor a timm ViT: {exc}") from None


def pretrained_shape(source: str | Path) -> dict[str, Any]:
    """The :data:`SHAPE_KEYS` that ``source``'s weights decide, read before any photo is: a vit_flowers file's
    from its ``model_config``; someone else's ViT (a timm name or state dict) has a linear patch embedding. Raises
    PretrainedError for a file that cannot be read, a retired source, or a path to a weights file that is not
    there."""
    path = Path(source)
    if not path.is_file():
        _check_name(source)
        return {"patch_embed": "linear"}
    _, meta = _read_weights(path)
    if meta is None:
        return {"patch_embed": "linear"}
    config = meta["model_config"]
    return {"patch_embed": "linear", **{k: config[k] for k in SHAPE_KEYS if config.get(k) is not None}}


def _check_name(source: str | Path) -> None:
    """PretrainedError unless ``source``, which is no file, may be a timm model name: not a retired source, not a
    path to a weights file or folder."""
    if str(source) in RETIRED_SOURCES:
        raise PretrainedError(f"pretrained: {str(source)!r} is no longer available ({RETIRED_SOURCES[str(source)]}); "
                              f"start from imagenet, a run's best.pt or a weights file")
    if Path(source).suffix in WEIGHT_SUFFIXES or Path(source).exists():
        raise PretrainedError(f"pretrained: {source} is not a file (give a run's best.pt, a weights file, imagenet "
                              f"or a timm model name)")


def _read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """(state dict, our metadata or None for someone else's weights) of a weights file."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is not iterable
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types for a damaged file
            raise PretrainedError(f"pretrained: cannot read {path} as safetensors: {exc}") from None
        ours = meta.get("format", "").startswith(PREFIX)
        return state, ({"model_config": json.loads(meta["model_config"])} if ours else None)
    try:
        state = read_torch_file(path, what="the weights file")
    except CheckpointError as exc:  # one line that says what the file is instead
        raise PretrainedError(f"pretrained: {exc}") from None
    if not isinstance(state, dict):
        raise PretrainedError(f"pretrained: {path} holds a {type(state).__name__}, not weights")
    if str(state.get("format", "")).startswith(PREFIX):  # a checkpoint of ours (of any format it reads)
        try:
            ckpt = migrate(state, path)
        except CheckpointError as exc:  # e.g. a newer format
            raise PretrainedError(f"pretrained: {exc}") from None
        return ckpt["model"], {"model_config": ckpt["model_config"]}
    return state.get("model", state.get("state_dict", state)), None


def _from_ours(state: dict[str, torch.Tensor], meta: dict[str, Any], path: Path, *, num_classes: int,
               image_size: int, **regularisation: Any) -> ViT:
    # a taught run's trained network: its gate is not trained on (nor taken further), so the head is new
    config, state = untaught(meta["model_config"], state)
    config = {**config, **regularisation, "image_size": image_size}
    pretrained_classes = config["num_classes"]
    try:
        model = ViT.from_state_dict(config, state)
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:
        raise PretrainedError(f"pretrained: {path}: the weights do not fit their model_config "
                              f"({str(exc).strip().splitlines()[-1]})") from None
    new_head = num_classes != pretrained_classes or bool(meta["model_config"].get("taught"))
    if new_head:
        model.reset_classifier(num_classes)
    log.info("fine-tuning from %s (%d blocks, dim %d, %s patch embedding, %s)", path, config["depth"],
             config["dim"], config.get("patch_embed", "linear"), "new head" if new_head else "its head kept")
    return model


def _from_timm_name(name: str, *, num_classes: int, image_size: int, **regularisation: Any) -> ViT:
    import timm

    log.info("loading timm model %s with pretrained weights (needs the network the first time)", name)
    try:
        source = timm.create_model(name, pretrained=True)
    except Exception as exc:  # noqa: BLE001 - offline, unknown name, ...
        raise PretrainedError(f"pretrained: cannot load timm model {name!r}: {exc}. Offline? Pass a local weights "
                              f"file instead.") from None
    return from_timm(source, num_classes=num_classes, image_size=image_size, **regularisation)
