"""Training on a clock: how many epochs fit in ``time_budget`` minutes of the whole command.

The budget is the whole command's: its clock starts when the command does (reading the photos, building the model
and the head start's trunk pass count), and the end of the run (the unknown rule's passes and the report,
:func:`run_end_seconds`, estimated from the per-photo speed the run measured) is kept out of the time the epochs may
take. After every epoch the plan is made again from the mean cost of the last three epochs (training, validation
and checkpoint writes), so a run follows the machine when it gets busier or quieter; no end-to-end epoch is started
that the plan says will not end in time (:func:`epochs_that_fit`; the hybrid's head start, epochs of seconds, plans
its own: :func:`.head_start.run_head_start`). The trainer stretches or shrinks the lr schedule (``lr_schedule``) to
end with the last planned epoch. Within an epoch the machine is watched too: when its steps run slower than the
speeds the plan read (other work on the cores), everything still to come is counted that much slower, and the epoch
stops at the step that leaves time for it (:meth:`Speeds.late`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["REPORT_OVER_SAVE", "STEP_OVER_FORWARD", "Speeds", "plan_epochs", "epochs_that_fit", "run_end_seconds",
           "epoch_ends"]

# The report's own work (best.pt read and written again with the rule, its figures and pages) against an epoch's
# checkpoint writes and curves, which every epoch times: a bound, not a fit (AVX2 EPYC, flowers5, 2026-12-07:
# benchmarks/README.md, "The whole command against its budget")
REPORT_OVER_SAVE = 4.0
# A training step of a photo (forward, backward, update) against an evaluation forward pass of it: what the first
# end-to-end epoch is planned at from the head start's trunk pass, what passes over cached trunk outputs are estimated
# at from the head start's steps, and the validation of a first epoch from its own steps (Lite0 hybrid at 224 px,
# batch 64, 2 cores: 47 img/s forward, 11 img/s training)
STEP_OVER_FORWARD = 4.3


@dataclasses.dataclass
class Speeds:
    """What the run measured of this machine, each the last time it ran: what the budget plans with."""

    forward: float = 0.0  # seconds of an evaluation forward pass, a photo (the last validation, or the trunk pass)
    cached: float = 0.0  # seconds of a forward pass over a photo's cached trunk outputs
    save: float = 0.0  # seconds of the last epoch's checkpoint writes and curves
    step: float = 0.0  # seconds of a training step a photo, in the epoch whose validation measured ``forward``

    def late(self, now: float, deadline: float, step_now: float, next_step: float, after: float) -> bool:
        """Whether an epoch whose steps take ``step_now`` seconds a photo must stop now (``now``, the budget's
        clock) for its next step (``next_step`` seconds) and what comes after the epoch to end by ``deadline``:
        ``after`` seconds at the measured speeds, counted slower by as much as the steps now run slower than when
        those speeds were measured (``step``)."""
        load = step_now / self.step if self.step > 0 and step_now > 0 else 1.0
        return now + next_step + max(load, 1.0) * after > deadline


def plan_epochs(epochs: int, time_budget: float, history: list[dict[str, float]],
                first_estimate: float | None = None, reserve: float = 0.0, now: float | None = None) -> int:
    """How many epochs the run has in all: ``epochs`` end-to-end epochs after those on cached trunk outputs
    (``trunk_frozen`` rows, :mod:`vit_flowers.training.token_cache`), or with ``time_budget`` (seconds) as many as
    end within it, ``reserve`` seconds (the end of the run) kept. ``now``: the budget's clock as the plan is made
    (default: the last row's ``elapsed``, taken before that epoch's validation and checkpoint writes).

    An end-to-end epoch's cost is the last one's or the mean of the last three, whichever is longer (a machine that
    got busier is believed at once, one that got quieter after three epochs); before one has run, ``first_estimate``
    (seconds) when given, else the mean of the rows so far; with no row at all the plan is ``epochs`` (warmup does
    not depend on it; the first epoch always runs, so that the run has weights to keep).
    """
    done_on_tokens = sum(1 for row in history if row.get("trunk_frozen") == 1)
    max_epochs = epochs + done_on_tokens
    if not time_budget or not history:
        return max_epochs
    ends = epoch_ends(history)
    walls = np.diff([0.0, *ends])
    end_to_end = [w for w, row in zip(walls, history) if row.get("trunk_frozen") != 1][-3:]
    if end_to_end:
        per_epoch = max(float(np.mean(end_to_end)), float(end_to_end[-1]))
    else:
        per_epoch = first_estimate if first_estimate is not None else float(walls[-3:].mean())
    left = time_budget - (ends[-1] if now is None else now) - reserve
    return min(max_epochs, len(history) + epochs_that_fit(left, per_epoch))


def epochs_that_fit(left: float, per_epoch: float) -> int:
    """Whole epochs of ``per_epoch`` seconds that end within ``left`` seconds (none when less than one fits: a
    shorter run rather than an overshoot)."""
    return max(0, math.floor(left / max(per_epoch, 1e-6)))


def run_end_seconds(per_photo: float, photos: int, save_seconds: float, cached_photos: int = 0,
                    cached_per_photo: float = 0.0) -> float:
    """What the end of a run should take: ``photos`` passes of the model at ``per_photo`` seconds (measured on the
    run's validation, or the head start's trunk pass), ``cached_photos`` passes over cached trunk outputs at
    ``cached_per_photo``, and the report's own work, :data:`REPORT_OVER_SAVE` times an epoch's checkpoint writes
    (``save_seconds``)."""
    return per_photo * photos + cached_per_photo * cached_photos + REPORT_OVER_SAVE * save_seconds


def epoch_ends(history: list[dict[str, float]]) -> list[float]:
    """The run's wall clock at the end of each epoch of ``history``. Rows written before the ``elapsed``
    column existed (a resumed older run) count their training seconds on top of the row before."""
    ends: list[float] = []
    for row in history:
        end = row.get("elapsed")
        ends.append(float(end) if end is not None else (ends[-1] if ends else 0.0) + float(row["seconds"]))
    return ends
