"""The Train tab's child process: ``train``'s own command (the same recipe as the command line), stopped when the app
that started it is gone, whatever ended it (a crash, ``kill -9``: its end of the child's stdin closes), and then the
folders the page made for it removed, so that no training goes on for no one and no half-written run is left.

    python -m vit_flowers.app.child RUN_DIR PHOTOS_MADE -- TRAIN_ARGS...     (PHOTOS_MADE "": none)

An app that stops in order (Ctrl+C, ``kill``) cancels its training itself (:meth:`Training.cancel`)."""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import shutil
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ..runs.folders import unmark_latest

__all__ = ["child_argv", "main"]

logger = logging.getLogger("vit_flowers.app.child")


def child_argv(run_dir: Path, photos_made: Path | None, train_argv: Sequence[str]) -> list[str]:
    """The child's arguments (after ``python -m vit_flowers.app.child``)."""
    return [str(run_dir), str(photos_made or ""), "--", *train_argv]


def _end(folders: Sequence[Path]) -> None:
    """The app is gone: remove the page's folders (the run's first) and end the process at once (what train would
    still write is unwanted; each folder is first moved aside, so that a write of train's in the meantime cannot refill
    it). The ``latest`` link that train pointed at the run goes back to the newest run left (none: removed)."""
    logger.error("the app that started this training is gone: training stopped, its run removed")
    for folder in folders:
        aside = folder.with_name(f".{folder.name}.{os.getpid()}.removed.tmp")
        with contextlib.suppress(OSError):
            folder.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)  # (where the move failed, or train made it again)
    if folders:
        unmark_latest(folders[0])
    os._exit(1)


def _watch_parent(on_gone: Callable[[], None]) -> None:
    """Call ``on_gone`` once stdin, a pipe the app never writes to, reaches its end: the app has exited."""
    def read() -> None:
        try:  # the file descriptor, not sys.stdin: a thread blocked in its buffer holds a lock that Python's exit
            while os.read(0, 4096):  # then waits for (a fatal error, SIGABRT, after train ended well)
                pass
        except OSError:  # no stdin at all: nothing to watch
            return
        on_gone()

    threading.Thread(target=read, name="vf-parent-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Watch the app, then run ``python -m vit_flowers.train TRAIN_ARGS`` in this process (as the command: its exit
    status is this process's)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[2] != "--":
        logger.error("usage: python -m vit_flowers.app.child RUN_DIR PHOTOS_MADE -- TRAIN_ARGS...")
        return 2
    folders = [Path(a) for a in args[:2] if a]
    _watch_parent(lambda: _end(folders))
    sys.argv = ["-m", *args[3:]]  # (argv[0] as Python sets it for `python -m`: train's usage line says so)
    runpy.run_module("vit_flowers.train", run_name="__main__", alter_sys=True)  # exits with train's status
    return 0


if __name__ == "__main__":
    sys.exit(main())
