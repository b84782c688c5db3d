"""Process settings that the command-line tools apply when they start.

``keep_freed_memory``: PyTorch allocates every activation of every batch with ``malloc``. By default glibc
serves a block over its mmap threshold (128 KiB at start, rising with what the process frees, at most 32
MiB) with a fresh ``mmap`` and unmaps it on ``free``, and it trims the top of its heap whenever more than
twice that threshold is free. Either way the next batch's activations land on fresh pages: a page fault and
a zero fill for each 4 KiB, which on a small CPU costs as much as a good part of the model (figures:
benchmarks/HISTORY.md, "Allocator"); training gains nothing, since autograd holds its activations anyway.
The price: memory the process has freed stays with it (its resident size stays near its peak until it
exits), which is what a training or prediction run needs anyway.

A library user who wants the same calls ``keep_freed_memory()`` once; importing the package changes nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

logger = logging.getLogger(__name__)

MMAP_THRESHOLD: int = 256 << 20  # blocks below this come from the heap, so freed ones are reused
TRIM_THRESHOLD: int = 1 << 30  # free memory kept at the top of the heap before any is given back

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Have glibc's ``malloc`` keep and reuse freed blocks instead of returning them to the system.

    Returns True when applied. Does nothing (False) off glibc Linux (macOS, Windows and musl have other
    allocators), or when the user has set glibc's own malloc settings in the environment
    (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, or ``glibc.malloc`` tunables
    in ``GLIBC_TUNABLES``): those win.
    """
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in _USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        logger.debug("glibc malloc settings come from the environment; left as they are")
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    logger.debug("glibc malloc: mmap threshold %d, trim threshold %d (%s)", mmap_threshold, trim_threshold,
                 "applied" if applied else "refused")
    return applied
