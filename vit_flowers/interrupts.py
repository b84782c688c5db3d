"""Ctrl-C at any moment of a command is one line, never a traceback: :func:`quiet_interrupts` installs a
``sys.excepthook`` that reports an uncaught KeyboardInterrupt as "interrupted" (the commands catch it themselves
where they have something to say, e.g. train's "continue with --resume auto"). It matters most while a command
imports (torch takes seconds), before any of its own code runs. Other exceptions go to the hook that was there.

The package installs it when it is imported to start a command (:func:`starting_a_command`), so that a program that
imports vit_flowers as a library keeps its own hook.
"""

from __future__ import annotations

import logging
import os
import sys
from types import TracebackType

__all__ = ["starting_a_command", "quiet_interrupts"]

log = logging.getLogger("vit_flowers")


def starting_a_command(argv0: str, entry_point: str) -> bool:
    """Whether the package is being imported to start one of its commands: ``python -m vit_flowers.X`` (Python sets
    ``sys.argv[0]`` to "-m" while it imports the parent packages of the module to run) or the ``entry_point``
    console script."""
    return argv0 == "-m" or os.path.basename(argv0).startswith(entry_point)


def quiet_interrupts() -> None:
    """Report an uncaught KeyboardInterrupt as one logged line; Python still exits as killed by SIGINT."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            log.error("interrupted")  # (logging's last-resort handler writes it before logging is set up)
        else:
            previous(kind, value, tb)

    sys.excepthook = hook
