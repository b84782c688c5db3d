"""timm's ``VisionTransformer`` weights in our ViT: the name mapping, checks of what we cannot carry over,
and the position embedding resampled to another image size.

    >>> ours = from_timm(timm.create_model("vit_tiny_patch16_224", pretrained=True), num_classes=5)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .vit import ViT, resample_positions

__all__ = ["from_timm"]

# our parameter names for the per-block tensors of timm's ViT
_BLOCK_NAMES = {"norm1": "norm1", "attn.qkv": "attn.to_qkv", "attn.proj": "attn.to_out",
                "norm2": "norm2", "mlp.fc1": "ff.net.0", "mlp.fc2": "ff.net.3"}


def from_timm(
    source: nn.Module | dict[str, torch.Tensor],
    *,
    heads: int | None = None,
    num_classes: int | None = None,
    image_size: int | None = None,
    **kwargs: Any,
) -> ViT:
    """Build a ViT from a timm ``VisionTransformer`` (or its state dict) and load its weights.

    Args:
        source: a timm ``VisionTransformer`` with a class token, token pooling, no
            register tokens and no layer scale; or such a model's ``state_dict()``
            (then ``heads`` is required, since it is not in the weights).
        heads: attention heads (taken from the model when a model is given).
        num_classes: keep timm's head when None or equal; otherwise a new head is
            initialised (fine-tuning on your own classes).
        image_size: resample the position embedding to this size (default: timm's).
        kwargs: regularisation for fine-tuning (``dropout``, ``emb_dropout``, ``drop_path``).
    """
    if kwargs.get("patch_embed", "linear") != "linear":
        raise ValueError("ViT.from_timm: timm weights have a linear patch embedding; patch_embed must be 'linear'")
    state, heads = _timm_state(source, heads)
    proj_w = state["patch_embed.proj.weight"]  # (dim, C, p, p)
    dim, channels, patch_size, _ = proj_w.shape
    src_tokens = state["pos_embed"].shape[1] - 1
    src_grid = math.isqrt(src_tokens)
    if src_grid**2 != src_tokens:
        raise ValueError(f"ViT.from_timm: position embedding of {src_tokens} patches is not a square grid")
    timm_classes = state["head.weight"].shape[0] if "head.weight" in state else 0
    model = ViT(
        image_size=image_size or src_grid * patch_size, patch_size=patch_size, num_classes=timm_classes, dim=dim,
        depth=1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks.")), heads=heads,
        mlp_dim=state["blocks.0.mlp.fc1.weight"].shape[0], channels=channels,
        dim_head=state["blocks.0.attn.qkv.weight"].shape[0] // (3 * heads),
        qkv_bias="blocks.0.attn.qkv.bias" in state, **kwargs,
    )
    model.load_state_dict(_our_names(state, model), strict=True)
    if num_classes is not None and num_classes != timm_classes:
        model.reset_classifier(num_classes)
    return model


def _timm_state(source: nn.Module | dict[str, torch.Tensor], heads: int | None) -> tuple[dict, int]:
    """(state dict, heads) of a timm model or state dict, after checking that we can carry it over."""
    if isinstance(source, nn.Module):
        timm_model: Any = source  # a timm VisionTransformer: untyped (its blocks, their attn, ...)
        _check_timm_model(timm_model)
        heads = timm_model.blocks[0].attn.num_heads
        state = source.state_dict()
    else:
        state = dict(source)
        if heads is None:
            raise ValueError("ViT.from_timm: give heads=... when loading from a state dict")
    required = {"cls_token", "pos_embed", "patch_embed.proj.weight", "norm.weight"}
    missing = required - state.keys()
    if missing:
        raise ValueError(f"ViT.from_timm: not a timm VisionTransformer state dict, missing {sorted(missing)}")
    unsupported = [k for k in state if k.startswith("reg_token") or ".ls1." in k or ".ls2." in k
                   or "fc_norm.weight" in k or ".q_norm.weight" in k]
    if unsupported:
        raise ValueError(f"ViT.from_timm: unsupported timm features (register tokens, layer scale, "
                         f"fc_norm, qk-norm): {unsupported[:4]}")
    return state, heads


def _our_names(state: dict[str, torch.Tensor], model: ViT) -> dict[str, torch.Tensor]:
    """timm's state dict renamed (and reshaped) to ``model``'s parameter names, positions resampled to its grid."""
    proj_w = state["patch_embed.proj.weight"]  # (dim, C, p1, p2)
    ours = {
        "cls_token": state["cls_token"],
        "pos_embedding": resample_positions(state["pos_embed"], model.grid_size),
        # conv (dim, c, p1, p2) -> linear over the '(p1 p2 c)' patch layout
        "to_patch_embedding.1.weight": proj_w.permute(0, 2, 3, 1).reshape(proj_w.shape[0], -1),
        "to_patch_embedding.1.bias": state["patch_embed.proj.bias"],
        "norm.weight": state["norm.weight"],
        "norm.bias": state["norm.bias"],
    }
    for i in range(model.config["depth"]):
        for src, dst in _BLOCK_NAMES.items():
            for p in ("weight", "bias"):
                key = f"blocks.{i}.{src}.{p}"
                if key in state:
                    ours[f"transformer.layers.{i}.{dst}.{p}"] = state[key]
    if "head.weight" in state:
        ours["mlp_head.weight"] = state["head.weight"]
        ours["mlp_head.bias"] = state["head.bias"]
    return ours


def _check_timm_model(model: Any) -> None:  # a timm VisionTransformer
    problems = []
    if getattr(model, "cls_token", None) is None:
        problems.append("no class token")
    if getattr(model, "global_pool", "token") != "token":
        problems.append(f"global_pool={model.global_pool!r} (need 'token')")
    if getattr(model, "num_reg_tokens", 0):
        problems.append(f"{model.num_reg_tokens} register tokens")
    if getattr(model, "no_embed_class", False):
        problems.append("no_embed_class=True")
    if not isinstance(getattr(model, "norm_pre", nn.Identity()), nn.Identity):
        problems.append("pre-norm before the blocks")
    block = model.blocks[0]
    if not isinstance(block.ls1, nn.Identity):
        problems.append("layer scale")
    if not isinstance(block.attn.q_norm, nn.Identity):
        problems.append("qk-norm")
    if problems:
        raise ValueError(f"ViT.from_timm: unsupported timm model ({type(model).__name__}): " + ", ".join(problems))
