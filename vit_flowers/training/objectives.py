"""What a training step minimises: an :class:`Objective` turns the student's logits on (a part of) one batch of views
into a loss and a few named figures to log; the trainer's loop calls it on every micro-batch without knowing which
one it is.

- :class:`CrossEntropy`: to the labels, with label smoothing, or to mixup / CutMix's soft targets;
- :class:`Distillation`: a teacher's predictions on the same views (:mod:`vit_flowers.training.distill`), a weighted
  KL to them plus the cross-entropy to the labels; the teacher runs under its own precision.

:func:`make_objective` picks one from the config (the one place that reads its distillation keys). A new objective
subclasses :class:`Objective`, overrides :meth:`Objective.loss` (and whatever else it needs: the size of the views,
a precision probe, state to resume) and is returned by :func:`make_objective`; the loop does not change. What it
logs reaches each epoch's metrics row (``train_<name>``: the epoch's mean) and metrics.csv; its state is saved in
last.pt and given back on ``--resume``.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from timm.loss import SoftTargetCrossEntropy
from torch import nn

from ..data.augment import IMAGENET_MEAN, IMAGENET_STD
from ..inference.precision import dtype_name
from .config import TrainConfig
from .distill import Teacher, distill_loss, load_teacher

__all__ = ["Batch", "Logs", "PrecisionProbe", "Objective", "CrossEntropy", "Distillation", "make_objective",
           "objective_state", "restore_objective"]

log = logging.getLogger("vit_flowers.train")

Logs = dict[str, torch.Tensor]  # named 0-dim figures of one micro-batch, detached; read (.item()) after the step,
#                                 so that computing them never makes the step wait for the device


@dataclasses.dataclass(frozen=True)
class Batch:
    """(A part of) one training batch as the objective sees it."""

    views: torch.Tensor  # (B, 3, S, S) normalised augmented (and mixed) views at S = the objective's view_size
    labels: torch.Tensor  # (B,) class indices (before mixing)
    targets: torch.Tensor | None = None  # (B, num_classes) mixup / CutMix soft targets, None when not mixed

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, part: slice) -> Batch:
        """The micro-batch ``part`` of this batch."""
        return Batch(self.views[part], self.labels[part], None if self.targets is None else self.targets[part])


class PrecisionProbe(Protocol):
    """The trainer's precision rule for a network that is not the one being trained: the autocast dtype that the
    run's ``precision`` setting gives ``model``'s forward pass (no autograd) on a batch of ``size`` px inputs; under
    "auto" it times fp32 against bf16, unless ``resumed`` (the choice a resumed run made, "bf16" / "fp32") says."""

    def __call__(self, model: nn.Module, size: int, *, what: str,
                 resumed: str | None = None) -> torch.dtype | None: ...


class Objective(abc.ABC):
    """The base of every objective: subclasses give :attr:`name` and :meth:`loss`; the other methods have
    defaults for an objective with no network of its own and no state."""

    name = "objective"  # stored with its state in last.pt: a resumed run gets the state back only under this name

    @abc.abstractmethod
    def loss(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, Logs]:
        """(the mean loss over ``batch``, the figures to log) of the student's float32 ``logits`` (B, num_classes)
        on ``batch.views``. Called on every micro-batch under the run's autocast; the same names every step."""

    def view_size(self, image_size: int) -> int:
        """The size the views are made at for a student trained at ``image_size`` px (each network resizes them to
        its own): larger when the objective runs a network of its own at a larger size."""
        return image_size

    def setup(self, probe: PrecisionProbe) -> None:
        """Choose what the run's precision setting decides for the objective's own networks (called once the run is
        built and a resumed state restored)."""
        return None  # nothing of its own to run: a default, not a method to fill in

    def state_dict(self) -> dict[str, Any]:
        """What ``--resume`` needs to carry on as if never stopped (plain Python values and tensors only: a
        checkpoint is loaded with ``weights_only``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave."""
        return None  # no state: a default, not a method to fill in


class CrossEntropy(Objective):
    """Cross-entropy to the labels with ``label_smoothing``, or to mixup / CutMix's soft targets (which carry the
    smoothing themselves: :class:`timm.data.Mixup`)."""

    name = "cross_entropy"

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = label_smoothing
        self.soft_loss = SoftTargetCrossEntropy()

    def loss(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, Logs]:
        if batch.targets is not None:
            return self.soft_loss(logits, batch.targets), {}
        return F.cross_entropy(logits, batch.labels, label_smoothing=self.label_smoothing), {}


class Distillation(Objective):
    """``weight`` of the loss is the KL to a teacher's predictions on the very views the student sees (mixed ones
    included), at ``temperature``; the rest is ``labels``'s loss. Logs both parts: ``kl`` and ``ce``.

    The teacher's forward pass runs under its own autocast dtype (:class:`vit_flowers.training.distill.Teacher`),
    chosen by :meth:`setup` and kept by a resumed run, as the student's own choice is."""

    name = "distillation"

    def __init__(self, teacher: Teacher, weight: float, temperature: float = 1.0,
                 labels: Objective | None = None) -> None:
        self.teacher = teacher
        self.weight, self.temperature = weight, temperature
        self.labels = labels if labels is not None else CrossEntropy()
        self.resumed_amp: str | None = None  # the teacher's precision a resumed run chose

    def loss(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, Logs]:
        ce, logs = self.labels.loss(logits, batch)
        taught = distill_loss(logits, self.teacher(batch.views), self.temperature)
        loss = (1 - self.weight) * ce + self.weight * taught
        return loss, {**logs, "ce": ce.detach(), "kl": taught.detach()}

    def view_size(self, image_size: int) -> int:
        return max(image_size, self.teacher.image_size)

    def setup(self, probe: PrecisionProbe) -> None:
        self.teacher.amp_dtype = probe(self.teacher.model, self.teacher.image_size, what="teacher's forward pass",
                                       resumed=self.resumed_amp)

    def state_dict(self) -> dict[str, Any]:
        return {"teacher_amp": dtype_name(self.teacher.amp_dtype)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resumed_amp = state.get("teacher_amp")


def make_objective(cfg: TrainConfig, classes: Sequence[str], device: torch.device) -> Objective:
    """The objective ``cfg`` asks for: :class:`Distillation` by ``cfg.distill.teacher`` (checked against ``classes`` and
    the training pipeline's normalisation: :func:`vit_flowers.training.distill.load_teacher`) when it names one,
    else :class:`CrossEntropy`."""
    labels = CrossEntropy(cfg.optim.label_smoothing)
    if not cfg.distill.teacher:
        return labels
    teacher = load_teacher(cfg.distill.teacher, classes, IMAGENET_MEAN, IMAGENET_STD, device)
    return Distillation(teacher, cfg.distill.distill_weight, cfg.distill.distill_temperature, labels=labels)


def objective_state(objective: Objective) -> dict[str, Any]:
    """What last.pt keeps of ``objective``: its name and its state."""
    return {"name": objective.name, "state": objective.state_dict()}


def restore_objective(objective: Objective, saved: dict[str, Any] | None) -> None:
    """Give ``objective`` the state that :func:`objective_state` saved: nothing for a last.pt from before
    objectives had state, or from a run that trained with another objective (e.g. resumed without its teacher)."""
    if not saved:
        return
    if saved.get("name") != objective.name:
        log.info("--resume: the objective changed from %s to %s; its state starts afresh", saved.get("name"),
                 objective.name)
        return
    objective.load_state_dict(saved.get("state", {}))
