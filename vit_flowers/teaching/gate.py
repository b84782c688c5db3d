"""How ``teach`` adds classes to a hybrid run: a gate on the trunk's pooled output, mixed with the trained head.

The pretrained trunk (EfficientNet-Lite's ImageNet stages) tells a species it has never been trained on apart
better than the encoder, which learnt only the run's classes: on five rotations of flowers5 a logistic regression
on the encoder's features recognised a species taught from 10 photos on half of its photos, one on the trunk's
pooled output on four in five (benchmarks/README.md). So a taught hybrid (:class:`~vit_flowers.models.taught.TaughtViT`)
keeps its trained head for the trained classes and adds a ``gate``: a multinomial logistic regression over every
class (trained and taught) on the L2-normalised pooled trunk output (:func:`~vit_flowers.models.taught.gate_features`),
fitted (:func:`fit_gate`) on the run's kept training photos (``teach_sample["trunk"]``) and the photos given, with
their mirror images, each class weighted alike. The gate shares the probability out: a taught class gets its own
times ``exp(GATE_BIAS)``, the trained ones their total, shared as the gate and the trained head agree
(:class:`~vit_flowers.models.taught.TaughtHead`). Teaching a taught run again refits the gate over all its classes;
the trained head is never changed.
"""

from __future__ import annotations

import numpy as np
import torch

from ..inference.calibration import fit_head
from ..models.patch_embed import HybridPatchEmbed
from ..models.taught import TaughtViT, gate_features, taught_classes, with_gate
from ..models.vit import ViT
from ..runs.checkpoint import TeachSample

__all__ = ["GATE_BIAS", "reads_trunk", "gate_inputs", "fit_gate", "gated_model", "describe"]

# The log-odds added to every taught class in the mixture: it trades the taught classes' recall against the trained
# classes' accuracy. On flowers5's rotations (#55, benchmarks/HISTORY.md) 1.25 kept the trained classes within 1 point
# of the trained head alone (1.5: 2.4 points; 1.0: none), each point of them buying about 2.5 of the taught ones; a
# bias chosen per class from the cross-validated mixture did no better (the kept rows' trained logits are in-sample).
GATE_BIAS = 1.25


def reads_trunk(model: ViT) -> bool:
    """Whether ``model`` is a hybrid, whose taught classes ``teach`` fits a gate for (other models: a new head)."""
    return isinstance(model.to_patch_embedding, HybridPatchEmbed)


def gate_inputs(trunk: np.ndarray) -> np.ndarray:
    """Pooled trunk outputs (n, C_trunk) as the gate reads them (:func:`~vit_flowers.models.taught.gate_features`):
    float32, L2-normalised."""
    return gate_features(torch.from_numpy(np.asarray(trunk, dtype=np.float32))).numpy()


def fit_gate(trunk: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (C, C_trunk), bias (C,)) of the gate: a logistic regression of ``labels`` (n,) over ``num_classes``
    on the pooled trunk outputs ``trunk`` (n, C_trunk) as the gate reads them, each class weighted alike."""
    return fit_head(gate_inputs(trunk.float().numpy()), labels.numpy(), num_classes)


def gated_model(model: ViT, sample: TeachSample, num_classes: int) -> TaughtViT:
    """A copy of the hybrid ``model`` that scores ``num_classes`` classes: its trained classes with its trained head,
    the rest (taught, numbered after them) through a gate fitted on ``sample`` (its ``trunk`` and ``labels``: the
    kept training photos, every taught class's photos, and their mirror images). ValueError when the sample has no
    trunk outputs or the classes are not more than the trained ones."""
    if "trunk" not in sample:
        raise ValueError("teach: the kept features hold no trunk outputs to fit a gate on")
    trained = model.num_classes - taught_classes(model)
    if num_classes <= trained:
        raise ValueError(f"teach: a gate needs a class beyond the {trained} trained one(s), got {num_classes}")
    weight, bias = fit_gate(sample["trunk"], sample["labels"], num_classes)  # (C, C_trunk), (C,)
    return with_gate(model, weight, bias, GATE_BIAS).eval()


def describe(model: TaughtViT) -> str:
    """What a taught run's ``taught["head"]`` says of ``model`` (a :func:`gated_model`)."""
    taught = taught_classes(model)
    return (f"the trained head for {model.num_classes - taught} class(es) and a gate (logistic regression on "
            f"the trunk's pooled output, bias {float(model.mlp_head.taught_bias):g}) for {taught} taught")
