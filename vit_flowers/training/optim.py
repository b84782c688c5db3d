"""What the optimizer trains and how its lr moves: parameter groups (a hybrid's pretrained trunk at its own lr, or
left out) and the warmup-then-decay schedule."""

from __future__ import annotations

from typing import Any

import torch
from timm.optim import param_groups_weight_decay
from timm.scheduler import CosineLRScheduler, PolyLRScheduler

from ..models.efficientnet import EfficientNetTrunk
from ..models.vit import ViT
from .config import TrainConfig

__all__ = ["pretrained_trunk", "param_groups", "make_scheduler"]


def pretrained_trunk(model: ViT) -> EfficientNetTrunk | None:
    """A hybrid's pretrained CNN stages (None for the other patch embeddings)."""
    trunk = getattr(model.to_patch_embedding, "trunk", None)
    return trunk if isinstance(trunk, EfficientNetTrunk) else None


def param_groups(model: ViT, weight_decay: float, trunk_lr_scale: float | None) -> list[dict[str, Any]]:
    """AdamW's parameter groups: timm's (no weight decay on norms, biases, positions and the CLS token), each split
    so that a hybrid's pretrained CNN stages learn at ``trunk_lr_scale`` times the lr (timm's schedulers apply
    ``lr_scale``), or are left out with None (the head start on their cached outputs); the new parts come first,
    since the run logs ``param_groups[0]``'s lr."""
    trunk = pretrained_trunk(model)
    pretrained = {id(p) for p in trunk.parameters()} if trunk is not None else set()
    scales = ((1.0, False),) if trunk_lr_scale is None else ((1.0, False), (trunk_lr_scale, True))
    groups = []
    for group in param_groups_weight_decay(model, weight_decay, no_weight_decay_list=model.no_weight_decay()):
        for scale, in_trunk in scales:
            params = [p for p in group["params"] if (id(p) in pretrained) == in_trunk]
            if params:
                groups.append({**group, "params": params, "lr_scale": scale})
    return sorted(groups, key=lambda g: g["lr_scale"] != 1.0)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, decay_steps: int,
                   warmup_steps: int) -> CosineLRScheduler | PolyLRScheduler:
    """A linear warmup from 1% of ``cfg.optim.lr``, then ``cfg.optim.lr_schedule``'s decay to ``cfg.optim.min_lr`` over
    ``decay_steps`` optimizer steps (``fit`` moves that end with the time budget's plan)."""
    common: dict[str, Any] = dict(t_initial=decay_steps, lr_min=cfg.optim.min_lr, warmup_t=warmup_steps,
                                  warmup_lr_init=cfg.optim.lr * 0.01, warmup_prefix=True, t_in_epochs=False)
    if cfg.optim.lr_schedule == "linear":
        return PolyLRScheduler(optimizer, power=1.0, **common)  # a straight line from the peak to min_lr
    return CosineLRScheduler(optimizer, **common)

