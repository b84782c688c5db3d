"""What a training run holds between epochs: :class:`Run` (the state), :class:`Steps` (what a training step needs)
and :class:`Kept` (what the end of the run reads: best.pt's score and the outputs kept for it). The run's shape is
not here: it is the :class:`~vit_flowers.training.plan.Plan`, made once; what the run measured of the machine is
:class:`~vit_flowers.training.budget.Speeds`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from timm.data import Mixup
from timm.scheduler import CosineLRScheduler, PolyLRScheduler
from timm.utils import ModelEmaV3
from torch import nn

from ..data.augment import TrainAugment
from ..data.datasets import Datasets
from ..models.vit import ViT
from .budget import Speeds
from .config import TrainConfig
from .distributed import Dist
from .objectives import Objective
from .plan import Plan

if TYPE_CHECKING:
    from ..inference.calibration import Calibration
    from ..inference.features import Outputs
    from .feature_start import FeatureStart

__all__ = ["LRSchedule", "Steps", "Kept", "Run"]

LRSchedule = CosineLRScheduler | PolyLRScheduler  # (timm's base Scheduler has no t_initial, which fit moves)


@dataclasses.dataclass
class Steps:
    """What an end-to-end training step needs besides the model."""

    optimizer: torch.optim.Optimizer
    scheduler: LRSchedule  # warmup, then cosine or linear decay to min_lr at the end of the last planned epoch
    ema: ModelEmaV3 | None  # moving average of the weights
    mixup: Mixup | None  # mixup / CutMix of whole batches
    augment: TrainAugment  # crops, flips, TrivialAugment / RandAugment on uint8 batches (at the objective's view
    #                        size: the larger of the model's and, distilling, the teacher's input sizes)
    objective: Objective  # what each step minimises: cross-entropy, distillation, ... (objectives.py)
    amp_dtype: torch.dtype | None = None  # bf16 autocast, or None for fp32
    net: nn.Module | None = None  # the model as a step runs it (DistributedDataParallel, torch.compile)


@dataclasses.dataclass
class Kept:
    """best.pt's score, and what the run keeps of its passes for the end of the run to read instead of another."""

    best_acc: float = -1.0  # best validation accuracy so far (raw or EMA weights; the frozen-feature start's)
    start_kept: bool = False  # best.pt holds the frozen-feature start: an epoch replaces it only beyond the noise
    feature_start: FeatureStart | None = None  # a feature head's start (feature_start.py)
    # the head start's trunk outputs of the train and val photos while the trunk has not trained since: the unknown
    # rule's features and refit_best read them
    trunk_cache: tuple[torch.Tensor, torch.Tensor] | None = None
    # the end of the run for best.pt's head-start weights, computed over the trunk cache before the trunk trains
    head_start_end: Calibration | None = None
    # the validation outputs of the weights best.pt keeps (its epoch, the fp32 Outputs and their seconds), when the
    # epoch that gave best.pt kept them: the end of the run reads them instead of another pass
    val_outputs: tuple[int, Outputs, float] | None = None
    head_state: dict[str, Any] | None = None  # a resumed head start's optimizer and schedule (last.pt)


@dataclasses.dataclass
class Run:
    """Everything a training run holds between epochs."""

    cfg: TrainConfig  # the resolved configuration (a resumed run's own, with what the user gave on top)
    ctx: Dist  # this process's place in a torchrun job
    device: torch.device
    run_dir: Path  # checkpoints/<run>/
    data: Datasets  # train / val images in memory
    model: ViT  # the network being trained (raw weights)
    steps: Steps
    plan: Plan  # the run's shape (plan.py), made once
    speeds: Speeds = dataclasses.field(default_factory=Speeds)  # what the run measured, for the time budget
    kept: Kept = dataclasses.field(default_factory=Kept)
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)  # one metrics row per epoch
    stopped_early: bool = False  # fit() returned at stop_after, before the planned epochs

    @property
    def step_net(self) -> nn.Module:
        """``steps.net``, which :func:`~vit_flowers.training.setup.start_run` sets before any step."""
        if self.steps.net is None:
            raise RuntimeError("the run has no net: start_run sets it")
        return self.steps.net

    @property
    def head_epochs_done(self) -> int:
        """Epochs trained on the cached trunk outputs (``trunk_frozen`` rows): the end-to-end schedule and EMA count
        steps after them."""
        return sum(1 for row in self.history if row.get("trunk_frozen") == 1)

    @property
    def trunk_trained(self) -> bool:
        """Whether an end-to-end epoch has run: the trunk's cached outputs are then stale."""
        return any(row.get("trunk_frozen") != 1 for row in self.history)
