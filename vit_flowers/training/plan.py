"""The run's shape, one typed value made once from the config, the photos and the model (:func:`make_plan`), made
again from the same inputs on ``--resume``, written to the run folder (plan.json) and logged:

- the head start (:mod:`.recipe`: epochs on the hybrid's cached trunk outputs, passes and steps), preceded by the
  frozen-feature start where the model has a feature head (:mod:`.feature_start`);
- the end-to-end epochs that may follow (none where a class has too few photos), their steps and warmup;
- the time budget, and the forward passes each epoch's validation makes.

The loop (:func:`.trainer.fit`) reads it and does not work any of it out again. How many of the planned epochs fit
the budget is what follows the machine: :meth:`Plan.epochs_planned`, made again after every epoch from what the run
measured (:class:`.budget.Speeds`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from .budget import plan_epochs
from .config import TrainConfig
from .recipe import Recipe, after_feature_start, plan_recipe

__all__ = ["Plan", "make_plan"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a run does, in order."""

    head_start: Recipe | None  # epochs on the cached trunk outputs (None: no pretrained trunk, or token_epochs 0)
    feature_start: bool  # the model starts as the frozen-feature fit, saved as best.pt (epoch 0), before the head start
    epochs: int  # end-to-end epochs at most (0: the run ends with its head start)
    steps_per_epoch: int  # optimizer steps of an end-to-end epoch on this process (its full batches)
    warmup_steps: int  # of the end-to-end lr schedule
    time_budget: float  # seconds of the whole command, the end of the run included (0: no limit)
    val_passes: float  # forward passes of a val photo in an end-to-end epoch's validation, this process's share
    #                    (the raw weights, and the EMA's)

    @property
    def head_epochs(self) -> int:
        """The head start's epochs (0 without one)."""
        return self.head_start.head_epochs if self.head_start is not None else 0

    def epochs_planned(self, history: list[dict[str, float]], first_estimate: float | None = None,
                       reserve: float = 0.0, now: float | None = None) -> int:
        """Every epoch of the run, the head start's rows in ``history`` included: without a budget all of the
        plan's; with one, as many end-to-end epochs as end within it (:func:`.budget.plan_epochs`)."""
        return plan_epochs(self.epochs, self.time_budget, history, first_estimate, reserve, now)

    def describe(self) -> str:
        """The log's line."""
        parts = []
        if self.feature_start:
            parts.append("the frozen-feature start (best.pt, epoch 0)")
        if self.head_start is not None:
            r = self.head_start
            parts.append(f"head start {r.head_epochs} epoch{'s' if r.head_epochs > 1 else ''} x {r.passes} pass"
                         f"{'es' if r.passes > 1 else ''} x {r.steps_per_pass} steps")
        if self.epochs:
            parts.append(f"up to {self.epochs} end-to-end epochs of {self.steps_per_epoch} steps "
                         f"({self.warmup_steps} of warmup)")
        budget = (f"as many as fit in {self.time_budget / 60:g} min, the end of the run included" if self.time_budget
                  else "time budget 0: no limit, every epoch runs")
        return f"{', then '.join(parts)}; {budget}"

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "describe": self.describe()}

    def write(self, run_dir: Path) -> None:
        from ..runs import folders as runs
        from ..runs.checkpoint import atomic_write_text

        atomic_write_text(run_dir / runs.PLAN, json.dumps(self.as_dict(), indent=1) + "\n")


def make_plan(cfg: TrainConfig, train_counts: list[int], classes: list[str], *, has_trunk: bool,
              feature_head: bool, world: int, ema: bool) -> Plan:
    """The plan for training photos counted per class (``train_counts``), a model with a pretrained trunk
    (``has_trunk``) and a feature head or not, on ``world`` processes."""
    optim = cfg.optim
    head = None
    if optim.token_epochs and has_trunk:
        head = plan_recipe(train_counts, batch_size=optim.batch_size, token_epochs=optim.token_epochs,
                           head_start_steps=optim.head_start_steps,
                           end_to_end_min_per_class=optim.end_to_end_min_per_class, classes=classes)
        if feature_head:
            head = after_feature_start(head)
    steps = max(1, math.ceil(sum(train_counts) / world) // optim.batch_size)  # full batches; one short batch
    warmup = min(round(optim.warmup_epochs * steps), optim.epochs * steps - 1)
    end_to_end = head is None or head.end_to_end
    return Plan(head_start=head, feature_start=feature_head and head is not None,
                epochs=optim.epochs if end_to_end else 0, steps_per_epoch=steps, warmup_steps=warmup,
                time_budget=60 * optim.time_budget, val_passes=(2 if ema else 1) / world)
