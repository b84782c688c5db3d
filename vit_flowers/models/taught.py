"""A hybrid ViT taught classes after training (by ``teach``, :mod:`vit_flowers.teaching.gate`), its taught state in a
head of its own.

:class:`TaughtHead` holds the trained head (``trained``: the run's linear head on the head's input, its trained
classes) and the gate (``gate``: a linear model of every class, trained and taught, on the L2-normalised pooled trunk
output, :func:`gate_features`), and is the one place that mixes them: a taught class gets the
gate's probability times ``exp(taught_bias)``, the trained classes the gate's probability of them all, shared out in
proportion to the product of the gate's and the trained head's probabilities (two classifiers of the trained classes
agreeing: #55 measured it keeping the trained classes' accuracy where sharing by the trained head alone lost 2 points);
the logits are the log of that mixture, normalised. :class:`TaughtViT` is the
hybrid :class:`~vit_flowers.models.vit.ViT` that holds one as its ``mlp_head``: its ``forward_head`` is the trained
head's (logits of the trained classes, from the tokens alone, as any ViT's), and :meth:`TaughtViT.classify` (what
``forward``, ``attention_maps`` and :func:`~vit_flowers.models.vit.logits_and_features` call) the mixture's, over
every class. :func:`build_vit` rebuilds either from a checkpoint's ``model_config``; :func:`untaught` gives the
trained network back (``--pretrained`` from a taught run); :func:`moved_keys` names where the weights of a taught
run written before the head had a module of its own (checkpoint format 2) are now.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .patch_embed import HYBRID_EMBEDS, hybrid_embed
from .vit import ViT

__all__ = ["TaughtHead", "TaughtViT", "gate_features", "mix", "build_vit", "taught_classes", "trained_head",
           "untaught", "with_gate", "moved_keys"]
HEAD = "mlp_head."  # where a ViT's head is, and a TaughtViT's TaughtHead
TRAINED = f"{HEAD}trained."  # where a TaughtViT's trained head is


def gate_features(trunk: torch.Tensor) -> torch.Tensor:
    """A hybrid's pooled trunk output (B, C_trunk) -> what the gate reads: L2-normalised (B, C_trunk)."""
    return nn.functional.normalize(trunk, dim=-1)


class TaughtHead(nn.Module):
    """The trained head and the gate of a taught hybrid, mixed (see the module's docstring): (the head's input
    (B, head_dim), the pooled trunk output (B, C_trunk)) -> logits (B, K + taught), the log-probabilities of the
    mixture."""

    taught_bias: torch.Tensor  # a buffer: register_buffer's, typed here

    def __init__(self, trained: nn.Linear, trunk_channels: int, taught: int) -> None:
        super().__init__()
        self.trained = trained  # (B, head_dim) -> (B, K): the trained classes
        self.taught = taught
        self.gate = nn.Linear(trunk_channels, trained.out_features + taught)  # every class, trained and taught
        nn.init.zeros_(self.gate.weight)  # an even gate until teach fits it
        nn.init.zeros_(self.gate.bias)
        self.register_buffer("taught_bias", torch.zeros(()))  # log-odds added to every taught class

    def forward(self, x: torch.Tensor, trunk: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """``features``: the trained classes' logits of a feature head (B, K), added to the trained head's."""
        trained = self.trained(x) if features is None else self.trained(x) + features
        return mix(trained, self.gate(gate_features(trunk)), self.taught_bias)


def mix(trained: torch.Tensor, gate: torch.Tensor, taught_bias: torch.Tensor | float) -> torch.Tensor:
    """The trained head's logits (B, K) and the gate's (B, K + taught) -> the mixture's log-probabilities
    (B, K + taught), as :class:`TaughtHead` mixes them (see the module's docstring); what teach's estimate predicts
    its held-out photos with too (:mod:`vit_flowers.teaching.estimate`)."""
    gate = torch.log_softmax(gate, dim=-1)
    k = trained.shape[-1]
    agreed = gate[:, :k] + torch.log_softmax(trained, dim=-1)  # (B, K): the product of the two
    old = torch.logsumexp(gate[:, :k], dim=-1, keepdim=True) + torch.log_softmax(agreed, dim=-1)  # (B, K)
    new = gate[:, k:] + taught_bias  # (B, taught)
    return torch.log_softmax(torch.cat([old, new], dim=-1), dim=-1)


class TaughtViT(ViT):
    """A hybrid ViT with ``taught`` classes, the last of its ``num_classes``, after the trained ones: its
    ``mlp_head`` is a :class:`TaughtHead`. ``self.config`` (the ViT's arguments and ``taught``) rebuilds it through
    :func:`build_vit`."""

    mlp_head: TaughtHead

    def __init__(self, *, num_classes: int, taught: int, **config: Any) -> None:
        if not isinstance(taught, int) or taught < 1:
            raise ValueError(f"TaughtViT: taught must be an integer >= 1, got {taught!r}")
        if taught >= num_classes:
            raise ValueError(f"TaughtViT: taught ({taught}) must leave a trained class of the {num_classes}")
        if config.get("patch_embed") not in HYBRID_EMBEDS:
            raise ValueError(f"TaughtViT: taught classes read the trunk: they need a hybrid patch_embed "
                             f"({', '.join(HYBRID_EMBEDS)}), got {config.get('patch_embed', 'linear')!r}")
        super().__init__(num_classes=num_classes - taught, **config)
        assert isinstance(self.mlp_head, nn.Linear), "a trained class at least"
        channels = hybrid_embed(self.to_patch_embedding).trunk.out_channels
        self.mlp_head = TaughtHead(self.mlp_head, channels, taught)
        self.num_classes = num_classes
        self.config.update(num_classes=num_classes, taught=taught)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """tokens (B, 1 + N, dim) -> the trained head's logits (B, K), of the trained classes alone (every class:
        :meth:`classify`); ``pre_logits``: the head's input (B, head_dim)."""
        x = super().forward_head(x, pre_logits=True)
        return x if pre_logits else self.mlp_head.trained(x)

    def classify(self, tokens: torch.Tensor, trunk: torch.Tensor | None) -> torch.Tensor:
        """tokens (B, 1 + N, dim) and the trunk output (B, C_trunk, h, w) -> logits (B, num_classes): the
        :class:`TaughtHead`'s mixture (the trained classes' logits with the feature head's, where there is one).
        ValueError without the trunk output."""
        if trunk is None:
            raise ValueError(f"TaughtViT: {self.mlp_head.taught} taught class(es) need the trunk output")
        features = None if self.feature_head is None else self.feature_logits(trunk)
        return self.mlp_head(self.forward_head(tokens, pre_logits=True), self.pooled_trunk(trunk), features)

    def reset_classifier(self, num_classes: int) -> None:
        raise TypeError("TaughtViT: a new head replaces the trained head and the gate: take untaught() first")


def build_vit(config: dict[str, Any]) -> ViT:
    """The model of a checkpoint's ``model_config``: a :class:`TaughtViT` when it has ``taught`` classes, else a
    :class:`ViT` (configs written before 2026-12-07 say ``taught: 0`` there)."""
    taught = config.get("taught", 0)
    rest = {k: v for k, v in config.items() if k != "taught"}
    return TaughtViT(**rest, taught=taught) if taught else ViT(**rest)


def taught_classes(model: ViT) -> int:
    """How many of ``model``'s classes were taught (0 for a ViT as trained)."""
    return model.mlp_head.taught if isinstance(model, TaughtViT) else 0


def trained_head(model: ViT) -> nn.Module:
    """``model``'s trained head, (B, head_dim) -> the trained classes' logits: a TaughtViT's is in its TaughtHead."""
    return model.mlp_head.trained if isinstance(model, TaughtViT) else model.mlp_head


def untaught(config: dict[str, Any], state: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(``model_config``, weights) of the trained network in a model's: of a taught model, the ViT with its trained
    head alone (the gate and the taught classes dropped); of another, the same."""
    taught = config.get("taught", 0)
    rest = {k: v for k, v in config.items() if k != "taught"}
    if not taught:
        return rest, state
    weights = {(HEAD + k[len(TRAINED):] if k.startswith(TRAINED) else k): v for k, v in state.items()
               if not k.startswith(HEAD) or k.startswith(TRAINED)}
    return {**rest, "num_classes": rest["num_classes"] - taught}, weights


def with_gate(model: ViT, weight: torch.Tensor, bias: torch.Tensor, taught_bias: float) -> TaughtViT:
    """A :class:`TaughtViT` of ``model``'s trained network (a taught model's: without its gate) and a gate of
    ``weight`` (C, C_trunk) and ``bias`` (C,) over C classes, the trained ones first; ValueError unless C is more."""
    config, state = untaught(model.config, model.state_dict())
    trained = config["num_classes"]
    if len(weight) <= trained:
        raise ValueError(f"a gate needs a class beyond the {trained} trained one(s), got {len(weight)}")
    gated = TaughtViT(**{**config, "num_classes": len(weight), "taught": len(weight) - trained})
    moved = {(TRAINED + k[len(HEAD):] if k.startswith(HEAD) else k): v for k, v in state.items()}
    gated.load_state_dict({**moved, f"{HEAD}gate.weight": weight, f"{HEAD}gate.bias": bias,
                           f"{HEAD}taught_bias": torch.tensor(float(taught_bias))})
    return gated


def moved_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A taught model's weights as a checkpoint of format 2 (before 2026-12-07) named them (``mlp_head.*`` the
    trained head, ``gate.*``, ``taught_bias``) under today's names (in ``mlp_head``: ``trained.*``, ``gate.*``,
    ``taught_bias``); weights already named so are kept."""
    if "taught_bias" not in state:
        return dict(state)

    def renamed(key: str) -> str:
        if key.startswith(HEAD):
            return TRAINED + key[len(HEAD):]
        return HEAD + key if key.startswith("gate.") or key == "taught_bias" else key

    return {renamed(k): v for k, v in state.items()}
