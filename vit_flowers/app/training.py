"""The Train tab's training, without Gradio: ``python -m vit_flowers.train --data PHOTOS`` in a child process (so
the page stays alive and a Cancel can end it at once; :mod:`vit_flowers.app.child` runs it, and ends it when the app
is gone), the same recipe as the command line; its progress read from
the files the run writes (config.yaml when the training starts, metrics.csv after each epoch, report/ at the end)
and from the step its loops are at (decoding the photos, an epoch's steps, the report: :mod:`vit_flowers.data.progress`,
written into the run's in-progress mark); a run that does not end well leaves no run folder."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..data.progress import PROGRESS_ENV, read_step
from ..runs import folders as runs
from .child import child_argv

__all__ = ["CONFIG_ENV", "Progress", "Training", "train_argv", "start_training"]

logger = logging.getLogger(__name__)

# The tests' override of the recipe: a YAML file (tests/data/app_train.yaml: configs/smoke.yaml's tiny model) given
# as train's --config, so that a training through the page takes seconds in a browser test, not the real recipe's
# minutes. Not an option of the command: a user's page trains what `train --data PHOTOS` trains.
CONFIG_ENV = "VF_APP_TRAIN_CONFIG"
STOP_WAIT_S = 3.0  # Cancel: seconds between asking the child to stop (SIGTERM) and killing it


def train_argv(data: Path, run_dir: Path, minutes: float, config: str | None = None) -> list[str]:
    """train's arguments for a new run ``run_dir`` on the ImageFolder ``data``, trained for ``minutes``."""
    argv = ["--data", str(data), "--out-dir", str(run_dir.parent), "--run-name", run_dir.name,
            "--time-budget", f"{minutes:g}"]
    return ["--config", config, *argv] if config else argv


@dataclass
class Progress:
    """What the progress bar shows: ``state`` running / done / failed / cancelled, the phase in words, the epochs
    done, the best validation accuracy so far, the seconds left (None: not known yet), the bar's fraction and the
    seconds since Train (a clock that moves in the phases that say nothing for a while: the start, the report)."""

    state: str
    phase: str
    epochs: int = 0
    accuracy: float | None = None
    seconds_left: float | None = None
    fraction: float = 0.0
    elapsed: float = 0.0


def _rows(run_dir: Path) -> list[dict[str, float]]:
    try:
        return runs.read_metrics(run_dir / runs.METRICS)
    except OSError:
        return []


def _best(rows: list[dict[str, float]]) -> float | None:
    scores = [v for r in rows for v in (r.get("val_acc", math.nan), r.get("val_acc_ema", math.nan))
              if math.isfinite(v)]
    return max(scores) if scores else None


class Training:
    """One training of the Train tab: the child process, its run folder (marked
    :data:`~vit_flowers.runs.folders.IN_PROGRESS` until it ends well) and the photos folder the page wrote for it
    (``photos_made``: removed with the run when it does not end well). ``on_done(run_dir)`` runs once the run has
    ended well (the page switches to it); an exception there makes the training failed, with its message."""

    def __init__(self, run_dir: Path, argv: list[str], photos_made: Path | None = None,
                 on_done: Callable[[Path], None] | None = None, minutes: float = 0.0) -> None:
        self.run_dir, self.argv, self.log_path = run_dir, argv, run_dir / runs.LOG  # kept with the run
        self.mark = run_dir / runs.IN_PROGRESS  # the child writes the step it is at into it
        self.budget_s = 60 * minutes  # the bar's clock before the run says its own plan (0: none)
        self._plan: tuple[float, int, bool] | None = None  # the run's plan.json: budget (s), epochs, budget-bound
        self.photos_made, self.on_done = photos_made, on_done
        self.state, self.error = "running", ""
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Mark the run folder and start the child; a thread waits for it and finishes the run."""
        self.run_dir.mkdir(parents=True)
        try:
            self.mark.write_bytes(b"")
            with open(self.log_path, "wb") as log:  # the child keeps its own copy of the handle
                # a session of its own: a Ctrl+C in the app's terminal reaches the app, which cancels the child;
                # its stdin a pipe the app keeps open, never writes: an app gone (even killed) ends the child
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "vit_flowers.app.child",
                     *child_argv(self.run_dir, self.photos_made, self.argv)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, start_new_session=True,
                    env={**os.environ, PROGRESS_ENV: str(self.mark)})
        except OSError:
            self._remove()
            raise
        threading.Thread(target=self._wait, name="vf-train-wait", daemon=True).start()

    def _wait(self) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        code = self._proc.wait()
        self._proc.stdin.close()
        with self._lock:
            if self.state != "running":  # cancelled
                return
            if code == 0 and (self.run_dir / runs.BEST).is_file():
                try:
                    self.mark.unlink()
                    if self.on_done:
                        self.on_done(self.run_dir)
                    self.state = "done"
                    return
                except Exception as exc:  # the run is kept (it ended well); the page says why it is not used
                    logger.exception("the new run %s could not be opened", self.run_dir)
                    self.state, self.error = "failed", f"the new run {self.run_dir} could not be opened: {exc}"
                    return
            error = self._last_error(code)  # (read before its folder goes)
            self._remove()
            self.state, self.error = "failed", error  # said once nothing of it is left

    def _last_error(self, code: int) -> str:
        """The child's last error line (train logs one line per error), else its exit status."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        errors = [line.split(" ERROR ", 1)[1] for line in lines if " ERROR " in line]
        return errors[-1] if errors else f"the training stopped with exit status {code}" + (
            f": {lines[-1]}" if lines else "")

    def _remove(self) -> None:
        """Remove what this training made: its run folder and the photos folder it wrote (nothing else); the
        ``latest`` link that train pointed at the run goes back to the newest run left (none: removed)."""
        for folder in (self.run_dir, self.photos_made):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        runs.unmark_latest(self.run_dir)

    def _planned(self) -> tuple[float, int, bool] | None:
        """The time budget (seconds, 0: none), the most epochs of the run and whether the budget bounds it (end-to-end
        epochs planned; a run that ends with its head start ends well before it), from the plan.json it wrote:
        what ``train`` decided, whatever recipe it chose. None before it is written."""
        if self._plan is None:
            try:
                plan = json.loads((self.run_dir / runs.PLAN).read_text())
                head = plan["head_start"]["head_epochs"] if plan.get("head_start") else 0
                self._plan = (float(plan["time_budget"]), int(head + plan["epochs"]), plan["epochs"] > 0)
            except (OSError, ValueError, KeyError, TypeError):
                return None
        return self._plan

    @property
    def running(self) -> bool:
        return self.state == "running"

    def cancel(self) -> None:
        """End the child (SIGTERM, then SIGKILL after :data:`STOP_WAIT_S`) and remove the run folder."""
        with self._lock:
            if self.state != "running":
                return
            self.state = "cancelled"
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._remove()

    def progress(self) -> Progress:
        """The progress now, from the run's files and the clock."""
        if self.state == "done":
            rows = _rows(self.run_dir)
            return Progress("done", f"done: the page uses {self.run_dir.name} now", len(rows), _best(rows),
                            fraction=1.0)
        if self.state != "running":
            return Progress(self.state, "cancelled: no run kept" if self.state == "cancelled" else
                            f"failed: {self.error}")
        since = time.monotonic() - self.started
        step = read_step(self.mark)
        doing = f"{step.phase}: {step.done:,} of {step.total:,}" if step else None
        planned = self._planned()
        if planned is None:  # train writes it once the photos are read and the model is built
            clock = since / self.budget_s if self.budget_s else 0.0
            return Progress("running", f"starting: {doing or 'loading the libraries'}",
                            fraction=min(0.97, max(0.01, clock)), elapsed=since)
        rows = _rows(self.run_dir)
        budget_s, epochs, bounded = planned
        fractions = [len(rows) / epochs] if epochs else []
        lefts = [(epochs - len(rows)) * since / len(rows)] if rows and epochs else []
        if budget_s and bounded:  # train's budget counts the whole command, from its start (a second or two after ours)
            fractions.append(since / budget_s)
            lefts.append(budget_s - since)
        if doing:  # a step between epochs (a validation pass, the report) says how many are done
            phase = doing if "epoch" in doing or not rows else f"{doing} (after epoch {len(rows)})"
        elif (self.run_dir / runs.REPORT).is_dir():
            phase = "evaluating the best epoch (the report)"
        elif not rows:
            phase = "training: the first epoch"
        else:
            phase = "head start (the pretrained part frozen)" if rows[-1].get("trunk_frozen") == 1 else "training"
            phase += f", epoch {len(rows)}"
        return Progress("running", phase, len(rows), _best(rows), max(0.0, min(lefts)) if lefts else None,
                        min(0.97, max([0.02, *fractions])), since)


def start_training(data: Path, run_dir: Path, minutes: float, photos_made: Path | None = None,
                   on_done: Callable[[Path], None] | None = None) -> Training:
    """Start training a new run ``run_dir`` on the ImageFolder ``data`` for ``minutes``: the recipe of
    ``train --data`` (under the tests, :data:`CONFIG_ENV`'s). Raises OSError with a message; what the child
    refuses (e.g. a folder that is not one) makes the training failed, with train's message."""
    job = Training(run_dir, train_argv(data, run_dir, minutes, os.environ.get(CONFIG_ENV) or None), photos_made,
                   on_done, minutes)
    job.start()
    return job
