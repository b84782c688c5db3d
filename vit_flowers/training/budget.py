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


def plan_epochs(cfg: TrainConfig, history: list[dict[str, float]], first_estimate: float | None = None) -> int:
    """How many epochs the run has in all: ``cfg.optim.epochs`` end-to-end epochs after those on cached trunk outputs
    (``trunk_frozen`` rows, :mod:`vit_flowers.training.token_cache`), or with ``cfg.optim.time_budget`` (minutes) as
    many as fit.

    An end-to-end epoch's cost is the mean of the last three; before one has run, ``first_estimate`` (seconds)
    when given, else the mean of the rows so far; with no row at all the plan is ``cfg.optim.epochs`` (warmup does not
    depend on it). With less than half an epoch left, the run stops where it is.
    """
    done_on_tokens = sum(1 for row in history if row.get("trunk_frozen") == 1)
    max_epochs, time_budget = cfg.optim.epochs + done_on_tokens, cfg.optim.time_budget
    if not time_budget or not history:
        return max_epochs
    ends = epoch_ends(history)
    walls = np.diff([0.0, *ends])
    end_to_end = [w for w, row in zip(walls, history) if row.get("trunk_frozen") != 1][-3:]
    if end_to_end:
        per_epoch = float(np.mean(end_to_end))
    else:
        per_epoch = first_estimate if first_estimate is not None else float(walls[-3:].mean())
    per_epoch = max(per_epoch, 1e-6)
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
