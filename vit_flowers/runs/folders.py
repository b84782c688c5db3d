"""Run folders: ``<out_dir>/<run_name>/``, the files a training run keeps there, and the rule that no run is ever
replaced without a word.

A folder *holds a run* when it has a checkpoint, the metrics of trained epochs or an export of them
(:data:`RESULTS`). A new run never starts in such a folder: it refuses and names the ways out (another
``--run-name``, ``--resume`` to continue it, or ``--overwrite``, which deletes the whole folder first). Any other
folder is a place to start: a missing or empty one, or one prepared with a ``split.json`` that pins the split (as
``benchmarks/accuracy.py`` prepares its runs). ``--overwrite`` clears only folders that hold nothing but a run's
files, so a mistyped ``--out-dir`` / ``--run-name`` cannot delete anything else. A start that fails removes the
folders it made (:func:`remove_new_folders`): failed starts leave nothing behind. ``<out_dir>/latest`` links the
newest run (:func:`mark_latest`); a run removed after it was marked (the web app's Train tab cancelled or failed)
takes the link back to the newest run left (:func:`unmark_latest`), so that it never points at nothing.

Everything that reads or writes a run's files names them by the constants here (:data:`BEST`, :data:`METRICS`,
...), and ``metrics.csv`` has one reader and one formatter (:func:`read_metrics`, :func:`metrics_text`). The same
rule holds for what the commands write elsewhere (``predict --output``, ``evaluate``'s report folder, exports):
:func:`check_new_output`.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

__all__ = ["RUNS_HOME", "BEST", "LAST", "CONFIG", "METRICS", "CURVES", "LOG", "SPLIT", "PLAN", "REPORT", "ONNX",
           "ONNX_INT8", "LATEST", "RESULTS", "RUN_FILES", "IN_PROGRESS", "RunExistsError", "free_run_dir", "results_in",
           "check_new_run", "make_run_dir", "clear_run_dir", "remove_new_folders", "metrics_text", "read_metrics",
           "KeptWeights", "check_new_output", "mark_latest", "unmark_latest"]

log = logging.getLogger(__name__)

RUNS_HOME = "checkpoints"  # where runs are written (out_dir) and found (--runs, the page's runs) by default
BEST = "best.pt"  # the weights of the best validation epoch
LAST = "last.pt"  # the last epoch, with what --resume needs
CONFIG = "config.yaml"
METRICS = "metrics.csv"  # one row per epoch
CURVES = "curves.png"
LOG = "train.log"  # the log of a training the web app's Train tab ran (train itself logs to the terminal)
SPLIT = "split.json"  # a folder dataset's train / val split
PLAN = "plan.json"  # what the run was planned to do (training/plan.py)
REPORT = "report"  # the evaluation report of best.pt (a folder)
ONNX = "model.onnx"  # python -m vit_flowers.export
ONNX_INT8 = "model.int8.onnx"  # ... --int8
LATEST = "latest"  # <out_dir>/latest: the link to the newest run
RESULTS = (BEST, LAST, METRICS, ONNX, ONNX_INT8)  # what makes a folder hold a run
# what --overwrite may delete
RUN_FILES = (BEST, LAST, CONFIG, METRICS, CURVES, SPLIT, PLAN, REPORT, ONNX, ONNX_INT8, LOG)
_PROBE = ".write-test"  # written and removed by make_run_dir
# The web app's mark on a run folder that its Train tab is filling (removed when the run ends well, the whole folder
# when it does not): such a folder is not listed as a run. Temporary by its name, so --overwrite may delete it.
IN_PROGRESS = ".in-progress.tmp"


@dataclass(frozen=True)
class KeptWeights:
    """Which weights a run's best.pt holds (its ``epoch`` and ``weights``): the epoch, and "raw" or "ema". Read
    with :func:`vit_flowers.runs.checkpoint.kept_weights`; the training curves mark it (their accuracy is that epoch's
    row of metrics.csv)."""

    epoch: int
    weights: str


class RunExistsError(CheckpointError):
    """A new run that would replace another run's files; the message names the folder and the ways out."""


def free_run_dir(out_dir: str | Path, name: str) -> Path:
    """``out_dir/name``, or the first free ``out_dir/name-2``, ``-3``, ...: a run named by the clock never shares
    a folder with one started in the same second."""
    run_dir, n = Path(out_dir) / name, 1
    while run_dir.exists() or run_dir.is_symlink():
        n += 1
        run_dir = Path(out_dir) / f"{name}-{n}"
    return run_dir


def results_in(folder: Path) -> list[str]:
    """The :data:`RESULTS` that ``folder`` holds (empty: it holds no run)."""
    return [name for name in RESULTS if (folder / name).exists()]


def check_new_run(run_dir: Path, overwrite: bool) -> None:
    """Refuse to start a new run in ``run_dir`` when it holds a run, unless ``overwrite``; with ``overwrite``, refuse
    when the folder holds anything that is not a run's file (what :func:`clear_run_dir` will delete). Raises
    RunExistsError; writes nothing."""
    if run_dir.is_symlink():
        raise RunExistsError(f"{run_dir} is a link, not a run folder"
                             f"{' (the newest run)' if run_dir.name == LATEST else ''}: choose another --run-name")
    if not run_dir.is_dir():
        return
    if overwrite:
        foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in RUN_FILES and not _temporary(p.name))
        if foreign:
            raise RunExistsError(f"--overwrite: {run_dir} holds files that are not a run's ({', '.join(foreign[:5])}"
                                 f"{', ...' if len(foreign) > 5 else ''}), so it is not deleted: move them away, or "
                                 f"choose another --run-name")
        return
    found = results_in(run_dir)
    if found:
        resume = f", continue it with --resume {run_dir}" if LAST in found else ""
        raise RunExistsError(f"the run folder {run_dir} already holds a run ({', '.join(found)}): choose another "
                             f"--run-name{resume}, or start it afresh with --overwrite (deletes the whole folder "
                             f"first)")


def clear_run_dir(run_dir: Path) -> None:
    """Delete everything in ``run_dir`` (``--overwrite``, once :func:`check_new_run` allowed it)."""
    try:
        for entry in run_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    except OSError as exc:
        raise CheckpointError(f"--overwrite: cannot clear {run_dir}: {exc.strerror or exc}") from None


def make_run_dir(run_dir: Path, what: str = "the run folder") -> list[Path]:
    """Make ``run_dir`` (with its parents) and check that it can be written; returns the folders it made, deepest
    first (for :func:`remove_new_folders`). Raises CheckpointError naming the folder as ``what`` (e.g.
    "--work-dir")."""
    made, folder = [], run_dir
    while not (folder.exists() or folder.is_symlink()) and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"cannot write to {what} {run_dir}: it is a file, not a folder")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / _PROBE
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        remove_new_folders(made)
        raise CheckpointError(f"cannot write to {what} {run_dir}: {exc.strerror or exc}") from None
    return made


def remove_new_folders(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first, as :func:`make_run_dir` lists them) while they are empty: what a
    start that failed had made. A folder that something was written into is kept."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def mark_latest(run_dir: Path) -> None:
    """Point ``<out_dir>/latest`` at ``run_dir`` (a relative symlink, swapped atomically)."""
    _point_latest(run_dir.parent, run_dir.name)


def unmark_latest(run_dir: Path) -> None:
    """``run_dir`` was removed (a run the web app's Train tab cancelled, or that failed there, after train had marked
    it): when ``<out_dir>/latest`` points at it, point it back at the newest run left (a folder with a checkpoint that
    no training is filling), or remove it when none is left. A link to nothing would send ``--checkpoint
    OUT/latest/best.pt`` and the commands' default run to a folder that is gone. Never raises."""
    link = run_dir.parent / LATEST
    try:
        if not link.is_symlink() or Path(os.readlink(link)).name != run_dir.name or run_dir.exists():
            return
        left = [p for name in (LAST, BEST) for p in run_dir.parent.glob(f"*/{name}")
                if p.parent.name != LATEST and not (p.parent / IN_PROGRESS).exists()]
        if left:  # the run whose checkpoint was written last
            _point_latest(run_dir.parent, max(left, key=lambda p: p.stat().st_mtime).parent.name)
        else:
            link.unlink()
    except OSError as exc:
        log.debug("could not take %s off %s: %s", link, run_dir, exc)


def _point_latest(out_dir: Path, name: str) -> None:
    link, tmp = out_dir / LATEST, out_dir / f".{LATEST}.{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(name, target_is_directory=True)
        os.replace(tmp, link)
    except OSError as exc:  # e.g. no symlinks on this file system: latest_run() falls back to mtimes
        log.debug("could not mark %s as latest: %s", out_dir / name, exc)


def _temporary(name: str) -> bool:
    """A file that a writer of the run leaves for a moment: ``.<name>.<pid>.<hex>.tmp``, the ``.write-test`` probe."""
    return name == _PROBE or (name.startswith(".") and name.endswith(".tmp"))


def metrics_text(rows: Sequence[dict[str, float]], columns: Sequence[str]) -> str:
    """The text of a ``metrics.csv``: a header of ``columns``, then one line per row (one per epoch); keys of a row
    that are not in ``columns`` are left out, missing ones left empty."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """The rows of a ``metrics.csv`` (one per epoch), each cell as a float: an empty, missing or unparsable cell is
    NaN, cells beyond the header are dropped. Raises FileNotFoundError (an OSError) naming a missing file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training metrics not found: {path}")
    with open(path, newline="") as f:
        return [{key.strip(): _number(value) for key, value in row.items() if key is not None}
                for row in csv.DictReader(f)]


def _number(cell: str | None) -> float:
    try:
        return float(cell)  # type: ignore[arg-type]  # None (a short row) is caught below
    except (TypeError, ValueError):
        return math.nan


def check_new_output(path: Path, overwrite: bool, what: str = "file", option: str = "--output") -> None:
    """Raise ValueError naming ``path`` when it exists (a non-empty folder, a file or a link) and ``overwrite`` is
    not given: no command replaces a user's earlier output without being told to (``predict --output``,
    ``evaluate``'s report folder). ``what``: "file" or "folder", and ``option``, the option that named it, for the
    message."""
    if overwrite or not (path.exists() or path.is_symlink()):
        return
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return  # an empty folder holds nothing to lose
    raise ValueError(f"{option} {path} already exists: pass --overwrite to replace it, or choose another {what}")
