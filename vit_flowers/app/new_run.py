"""The Train tab's new run, without Gradio: its folder where runs live, the page's photos kept beside it as an
ImageFolder, its training started (one at a time), and the command lines that do the same from a terminal."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..runs import folders as runs
from .classes import ClassCheck, write_image_folder
from .engine import Engine
from .training import Training, start_training

__all__ = ["NewRun", "begin_training", "commands"]

logger = logging.getLogger(__name__)

RUN_PREFIX = "page"  # the Train tab's runs: page-<date>-<time>, their photos page-<date>-<time>-photos


@dataclass
class NewRun:
    """A training started by the page: its run folder, the photos it trains on and the training."""

    run_dir: Path
    photos: Path
    minutes: float
    training: Training


def commands(run_dir: Path, photos: Path, minutes: float) -> list[str]:
    """The command lines that train the same recipe again on the same photos (a new run) and evaluate the run."""
    return [f"vit-flowers train --data {photos} --time-budget {minutes:g}",
            f"vit-flowers evaluate --checkpoint {run_dir / runs.BEST}"]


def begin_training(engine: Engine, check: ClassCheck, minutes: float, folder: Path | None = None) -> NewRun:
    """Start training the checked classes for ``minutes``: on ``folder`` (a PHOTOS folder of this computer, read
    in place) or on a copy of the page's photos beside the new run; the engine switches to the run once it has
    ended well. Raises ValueError (the classes cannot train, or a training is running), ConfigError or OSError with
    a message."""
    if not check.ok:
        raise ValueError("; ".join(check.errors) or "nothing to train")
    if engine.training is not None and engine.training.running:
        raise ValueError("a training is running: wait for it to end, or cancel it")
    home = engine.runs_home
    home.mkdir(parents=True, exist_ok=True)
    run_dir = runs.free_run_dir(home, f"{RUN_PREFIX}-{time.strftime('%Y%m%d-%H%M%S')}")
    made: Path | None = None
    if folder is None:
        photos = made = runs.free_run_dir(home, f"{run_dir.name}-photos")
        write_image_folder(check.classes, made)
    else:
        photos = folder
    try:
        job = start_training(photos, run_dir, minutes, made, engine.switch)
    except BaseException:  # (the training removes its own folders once started)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    engine.training = job
    threading.Thread(target=engine.warm_up, name="vf-warm-up", daemon=True).start()  # while the child trains
    logger.info("training %s on %s for %g min", run_dir, photos, minutes)
    return NewRun(run_dir, photos, minutes, job)
