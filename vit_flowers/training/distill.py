"""Knowledge distillation: a trained model (the teacher, e.g. the hybrid ViT from ImageNet weights) teaches the
model being trained (the student, e.g. the pure ViT) through its predictions.

"Function matching" (Beyer et al. 2022, "Knowledge distillation: A good teacher is patient and consistent"): the
teacher looks at the very views the student trains on (crops, flips, mixup / CutMix included), afresh on every
batch, so the student learns the teacher's function over the whole neighbourhood of the photos instead of a fixed
label per photo. Each model sees a view at its own input size: the trainer makes the view at the larger of the two
sizes and resizes it for the other (:func:`vit_flowers.data.augment.resize_square`).

    # the teacher: the hybrid from ImageNet weights; then the pure ViT taught by it
    python -m vit_flowers.train --config configs/flowers5-imagenet.yaml --data PHOTOS --run-name flowers5-imagenet
    python -m vit_flowers.train --config configs/flowers5-distill.yaml --data PHOTOS
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..data.augment import resize_square
from ..inference.precision import autocast
from ..runs.checkpoint import CheckpointError, load_model, resolve_checkpoint

__all__ = ["Teacher", "teacher_file", "load_teacher", "distill_loss"]

log = logging.getLogger("vit_flowers.train")


class Teacher(nn.Module):
    """A frozen trained model in eval mode (BatchNorm statistics and dropout fixed): views -> its logits.

    It runs under its own autocast dtype, not the student's: on a CPU the student's bf16 training step and the
    teacher's forward pass (another network: e.g. depthwise convolutions) need not gain alike, and the teacher
    can cost most of a step (the trainer probes each)."""

    def __init__(self, model: nn.Module, image_size: int, amp_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.image_size = image_size  # the input size it was trained at
        self.amp_dtype = amp_dtype  # bf16 autocast for its forward pass, or None for fp32

    def train(self, mode: bool = True) -> Teacher:
        return self  # always in eval mode, whatever the trainer does around it

    @torch.no_grad()
    def forward(self, views: torch.Tensor) -> torch.Tensor:
        """Normalised views (B, 3, S, S) at any size S -> float32 logits (B, num_classes)."""
        with autocast(views.device, self.amp_dtype):  # replaces the caller's autocast for this pass
            return self.model(resize_square(views, self.image_size)).float()


def teacher_file(path: str | Path) -> Path:
    """The checkpoint file of the teacher ``path`` names (a checkpoint, or a run folder: its best.pt); raises
    CheckpointError saying how to make one. Cheap: the trainer calls it before reading any photo."""
    try:
        return resolve_checkpoint(path)
    except CheckpointError as exc:
        raise CheckpointError(f"teacher: {exc}. Train the teacher first (e.g. `python -m vit_flowers.train --config "
                              f"configs/flowers5-imagenet.yaml --data PHOTOS --run-name flowers5-imagenet`) or give "
                              f"--teacher PATH") from None


def load_teacher(path: str | Path, classes: Sequence[str], mean: Sequence[float], std: Sequence[float],
                 device: torch.device) -> Teacher:
    """The teacher in ``path`` (a checkpoint, or a run folder: its best.pt), checked against the data it will
    teach on: the same classes in the same order, and the same input normalisation as the training pipeline."""
    file = teacher_file(path)
    model, state = load_model(file, device)
    if list(state["classes"]) != list(classes):
        raise CheckpointError(f"teacher {file} was trained on the classes {list(state['classes'])}, but the data has "
                              f"{list(classes)}: a teacher must know the same classes, in the same order")
    for key, theirs, ours in (("mean", state["mean"], mean), ("std", state["std"], std)):
        if [round(v, 6) for v in theirs] != [round(v, 6) for v in ours]:
            raise CheckpointError(f"teacher {file} normalises its input with {key} {theirs}, the training "
                                  f"pipeline with {list(ours)}: its predictions on these views would be off")
    cfg, best = state["config"], state["best_accuracy"]
    log.info("teacher: %s (%s, patch embedding %s, %d px; val accuracy %.1f%% when it was trained)", file,
             cfg.get("model"), cfg.get("patch_embed"), state["image_size"], 100 * (math.nan if best is None else best))
    return Teacher(model, int(state["image_size"])).to(device)


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher || student) between the two softmax distributions at ``temperature``, averaged over the batch,
    times temperature² (Hinton et al. 2015: the gradients keep their scale as the temperature changes)."""
    t = temperature
    return F.kl_div(F.log_softmax(student_logits / t, dim=-1), F.log_softmax(teacher_logits / t, dim=-1),
                    log_target=True, reduction="batchmean") * (t * t)
