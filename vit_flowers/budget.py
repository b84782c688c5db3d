"""Training on a clock: how many epochs fit in ``time_budget`` minutes.

After every epoch the plan is made again from the mean cost of the last three epochs (training,
validation and checkpoint writes), so a run follows the machine when it gets busier or quieter; the
trainer then stretches or shrinks the lr schedule (``lr_schedule``) to end with the last planned epoch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .config import TrainConfig

__all__ = ["plan_epochs", "epoch_ends"]


def plan_epochs(cfg: TrainConfig, history: list[dict[str, float]]) -> int:
    """How many epochs the run has in all: ``cfg.epochs``, or with ``cfg.time_budget`` (minutes) as many as fit.

    Never more than ``cfg.epochs``; before the first epoch is measured the plan is ``cfg.epochs`` (warmup does
    not depend on it). With less than half an epoch left, the run stops where it is.
    """
    max_epochs, time_budget = cfg.epochs, cfg.time_budget
    if not time_budget or not history:
        return max_epochs
    ends = epoch_ends(history)
    walls = np.diff([0.0, *ends])[-3:]
    per_epoch = max(float(walls.mean()), 1e-6)
    left = time_budget * 60 - ends[-1]
    if left < 0.5 * per_epoch:
        return len(history)
    return min(max_epochs, len(history) + max(1, round(left / per_epoch - 0.25)))


def epoch_ends(history: list[dict[str, float]]) -> list[float]:
    """The run's wall clock at the end of each epoch of ``history``. Rows written before the ``elapsed``
    column existed (a resumed older run) count their training seconds on top of the row before."""
    ends: list[float] = []
    for row in history:
        end = row.get("elapsed")
        ends.append(float(end) if end is not None else (ends[-1] if ends else 0.0) + float(row["seconds"]))
    return ends
