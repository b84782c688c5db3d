"""What an epoch leaves in the run folder: best.pt (when it improved), last.pt with what ``--resume`` needs,
metrics.csv and curves.png."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from ..data.augment import IMAGENET_MEAN, IMAGENET_STD
from ..inference.precision import dtype_name
from ..runs import folders as runs
from ..runs.checkpoint import Checkpoint, atomic_write_text, make_checkpoint, save_checkpoint
from .objectives import objective_state
from .state import Run

__all__ = ["METRIC_COLUMNS", "metric_columns", "write_metrics", "plot_curves", "checkpoint_of", "save_epoch"]

log = logging.getLogger("vit_flowers.train")

METRIC_COLUMNS = ["epoch", "train_loss", "train_acc", "val_loss", "val_acc", "val_acc_ema", "lr", "seconds",
                  "images_per_s", "elapsed", "trunk_frozen"]  # seconds: this epoch's training; elapsed: the run's
#                 wall clock so far; trunk_frozen: 1 for an epoch on the cached trunk outputs (token_cache.py)


def metric_columns(history: list[dict[str, float]]) -> list[str]:
    """metrics.csv's columns: :data:`METRIC_COLUMNS`, then what the objective logged (``train_kl``, ...) in the
    order the rows first hold them."""
    extra = dict.fromkeys(key for row in history for key in row if key not in METRIC_COLUMNS)
    return METRIC_COLUMNS + list(extra)


def write_metrics(run_dir: Path, history: list[dict[str, float]]) -> None:
    atomic_write_text(run_dir / runs.METRICS, runs.metrics_text(history, metric_columns(history)))


def plot_curves(run_dir: Path) -> None:
    from ..reporting.report import plot_training_curves
    from ..runs.checkpoint import kept_weights

    try:
        plot_training_curves(run_dir / runs.METRICS, run_dir / runs.CURVES, kept_weights(run_dir))
    except Exception as exc:  # noqa: BLE001 - a plot never stops training
        log.warning("could not draw %s: %s", run_dir / runs.CURVES, exc)


def checkpoint_of(run: Run, epoch: int, use_ema: bool, train_state: bool = False,
                  head_state: dict[str, Any] | None = None) -> Checkpoint:
    """The run's checkpoint after ``epoch`` epochs: the evaluation weights (EMA's or raw), and with ``train_state``
    what ``--resume`` needs (``head_state``: the head start's optimizer and schedule, during the head start)."""
    steps, kept = run.steps, run.kept
    state = None
    if train_state:
        state = {"model": run.model.state_dict(), "optimizer": steps.optimizer.state_dict(),
                 "scheduler": steps.scheduler.state_dict(), "ema": steps.ema.module.state_dict() if steps.ema else None,
                 "history": run.history, "amp": dtype_name(steps.amp_dtype),
                 "objective": objective_state(steps.objective), "head_start": head_state,
                 "feature_start": dataclasses.asdict(kept.feature_start) if kept.feature_start else None,
                 "start_kept": kept.start_kept}
    return make_checkpoint(
        run.model, classes=run.data.classes, image_size=run.cfg.data.image_size, mean=list(IMAGENET_MEAN),
        std=list(IMAGENET_STD), config=run.cfg.flat(), epoch=epoch, best_accuracy=kept.best_acc,
        weights=(steps.ema.module if use_ema and steps.ema is not None else run.model).state_dict(),
        weights_kind="ema" if use_ema else "raw",
        train_state=state,
    )


def save_epoch(run: Run, epoch: int, use_ema: bool, improved: bool, head_state: dict[str, Any] | None = None) -> None:
    """best.pt (when ``improved``), last.pt, metrics.csv and curves.png after ``epoch`` epochs (rank 0 only)."""
    if improved:
        save_checkpoint(checkpoint_of(run, epoch, use_ema), run.run_dir / runs.BEST)
    save_checkpoint(checkpoint_of(run, epoch, use_ema, train_state=True, head_state=head_state),
                    run.run_dir / runs.LAST)
    write_metrics(run.run_dir, run.history)
    plot_curves(run.run_dir)
