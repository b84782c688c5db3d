"""A training run, in the order it happens (:func:`vit_flowers.train.train` wires these):

1. :func:`.setup.start_run`: the run folder, the photos, the model, its :class:`~.plan.Plan` (made once, again from
   the same inputs on ``--resume``), the optimizer and the rest, a resumed state;
2. :func:`fit`: the plan's head start (:func:`.head_start.run_head_start`: the frozen-feature start, epochs on the
   cached trunk outputs), then its end-to-end epochs, as many as the time budget leaves room for at the speeds the
   run measures, each ending with validation and the run folder's files (:func:`.epoch_end.end_epoch`);
3. :func:`.run_end.final_report`: best.pt's "none of these" rule and its evaluation report, then
   :func:`.head_start.refit_best`.
"""

from __future__ import annotations

import logging
import time

import torch

from .budget import epoch_ends
from .distributed import agree
from .epoch_end import end_epoch
from .head_start import calibrate_head_start, refit_best, run_head_start
from .run_end import budget_watch, end_of_run_seconds, final_report, rule_at_hand
from .setup import start_run
from .state import Run
from .steps import TrainingError, train_one_epoch

__all__ = ["Run", "TrainingError", "start_run", "fit", "final_report", "refit_best"]

log = logging.getLogger("vit_flowers.train")


def _log_budget(run: Run, clock_zero: float, estimate: float | None, planned: int) -> None:
    """Where the time budget left no end-to-end epoch after a head start that planned them, say so and why."""
    plan = run.plan
    if estimate is None or not plan.time_budget or not plan.epochs or planned != len(run.history) or not run.ctx.main:
        return
    left = plan.time_budget - (time.perf_counter() - clock_zero)
    log.info("time budget %g min: an end-to-end epoch (about %.0f s on this machine) does not fit in the %.0f s "
             "left, the end of the run's %.0f s kept: the run ends with its head start (a larger --time-budget "
             "trains end to end)", plan.time_budget / 60, estimate, left, end_of_run_seconds(run, False))


def fit(run: Run, started: float | None = None) -> None:
    """The plan's head start, then its end-to-end epochs: with a time budget as many as end within it, the end of
    the run kept, re-planned after every epoch from what it measured, the lr decay ending with the last planned one.
    ``started``: when the command started (``time.perf_counter()``), where the budget's clock starts (default: now);
    a resumed run's epochs count on top."""
    cfg, plan = run.cfg, run.plan
    now = time.perf_counter()
    clock_zero = (now if started is None else started) - (epoch_ends(run.history)[-1] if run.history else 0.0)
    threads = torch.get_num_threads()  # the head start may run on one (TokenPhase.fastest_threads)
    estimate = run_head_start(run, clock_zero)
    planned = agree(plan.epochs_planned(run.history, estimate, end_of_run_seconds(run, False),
                                        time.perf_counter() - clock_zero), run.ctx)
    _log_budget(run, clock_zero, estimate, planned)
    epoch = len(run.history)
    while epoch < planned:
        if cfg.optim.stop_after and agree(int(time.perf_counter() - now > cfg.optim.stop_after * 60), run.ctx):
            log.info("stop_after %.1f min: stopping after epoch %d of %d; continue with --resume auto",
                     cfg.optim.stop_after, epoch, planned)
            run.stopped_early = True
            return
        if run.kept.trunk_cache is not None:  # the trunk trains from here on: its cached outputs go stale
            run.kept.head_start_end, run.kept.trunk_cache = calibrate_head_start(run), None
        run.steps.scheduler.t_initial = max(1, (planned - run.head_epochs_done) * plan.steps_per_epoch
                                            - plan.warmup_steps)  # the lr decay ends with the last planned epoch
        torch.set_num_threads(threads)  # an end-to-end step's large convolutions keep the process's threads
        stats = train_one_epoch(run, epoch, planned, budget_watch(run, clock_zero))
        end_epoch(run, epoch, planned, stats, time.perf_counter() - clock_zero)
        epoch += 1
        if plan.time_budget:
            planned = agree(plan.epochs_planned(run.history, reserve=end_of_run_seconds(run, False),
                                                now=time.perf_counter() - clock_zero), run.ctx)
    if plan.time_budget and run.ctx.main:
        log.info("time budget %g min: %d epochs, %.1f min of it so far; the end of the run should take %.0f s",
                 plan.time_budget / 60, len(run.history), (time.perf_counter() - clock_zero) / 60,
                 end_of_run_seconds(run, rule_at_hand(run)))
