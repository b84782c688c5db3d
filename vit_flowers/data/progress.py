"""A training's progress for a process that watches it (the web app's Train tab runs ``train`` as a child): where
the environment variable :data:`PROGRESS_ENV` names a file, the training's long loops (decoding the photos, the
trunk's pass, each epoch's steps, the report) write there what they are doing, ``{"phase", "done", "total"}`` as
JSON, replaced whole at most every :data:`INTERVAL_S` seconds. Without it nothing is written: on a terminal the
loops show tqdm's bars."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

__all__ = ["PROGRESS_ENV", "INTERVAL_S", "Step", "counting", "tracked", "read_step"]

PROGRESS_ENV = "VF_PROGRESS_FILE"
INTERVAL_S = 0.5  # the most often a loop rewrites the file (the page reads it every second)

T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """Where a loop is: its ``phase`` in words, ``done`` of ``total`` items."""

    phase: str
    done: int
    total: int


def _write(path: str, step: Step) -> None:
    """Replace the file whole (a reader never sees half of it); a failed write is left out: progress never stops a
    training (a full disk stops it where it writes its results, with train's own message)."""
    tmp = f"{path}.{os.getpid()}.tmp"  # temporary by its name (runs.folders), as the mark itself
    try:
        with open(tmp, "w") as f:
            json.dump({"phase": step.phase, "done": step.done, "total": step.total}, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def counting(phase: str, total: int) -> Callable[[int], None]:
    """A callback for a loop that counts its own items (``count(n)``: n more done); where :data:`PROGRESS_ENV` is
    set, the file says ``phase`` and how many of ``total`` are done as the loop starts, every :data:`INTERVAL_S`
    seconds and at its last item. Without it the callback does nothing."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return lambda n: None
    _write(path, Step(phase, 0, total))
    done, last = 0, time.monotonic()

    def count(n: int) -> None:
        nonlocal done, last
        done += n
        now = time.monotonic()
        if now - last >= INTERVAL_S or done >= total:
            _write(path, Step(phase, done, total))
            last = now

    return count


def tracked(items: Iterable[T], phase: str, total: int) -> Iterator[T]:
    """``items`` as they are, each counted by :func:`counting` (``phase``, of ``total``)."""
    count = counting(phase, total)
    for item in items:
        yield item
        count(1)


def read_step(path: Path) -> Step | None:
    """The step a progress file says, or None (not written yet, or not one)."""
    try:
        data = json.loads(path.read_text())
        return Step(str(data["phase"]), int(data["done"]), int(data["total"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None
