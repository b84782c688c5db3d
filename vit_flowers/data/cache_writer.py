"""The photo cache's writes (:mod:`vit_flowers.data.photo_cache` builds a set through them): a set's rows written in
order to a temporary file, renamed once complete and on disk (:class:`RowWriter`), or kept in memory where the
folder cannot be written (read-only, a full disk: one warning line, the rows written so far read back); and the lock
a set is built under (:func:`locked`, POSIX ``flock``), so that a second run on the same folder waits for the first.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .cache_format import crc

__all__ = ["RowWriter", "cannot_write", "locked"]

log = logging.getLogger(__name__)


def cannot_write(where: Path | str, exc: OSError) -> None:
    """The one warning line of a cache folder that cannot be written: the run goes on with its photos in memory."""
    why = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
    log.warning("photo cache: cannot write in %s (%s): this run keeps its photos in memory", where, why)


class RowWriter:
    """Rows written in order to a temporary file in ``folder`` (or to memory: no folder, or writing failed)."""

    def __init__(self, folder: Path | None, stem: str, n: int, row_shape: tuple[int, ...], dtype: torch.dtype):
        self.n, self.shape, self.dtype, self.count = n, row_shape, dtype, 0
        self.crcs: list[int] = []  # each row's CRC-32, written in the index
        self.memory: torch.Tensor | None = None
        self.tmp: Path | None = None
        self.file: Any = None
        if folder is not None:
            self.tmp = folder / f"{stem}.tmp-{socket.gethostname()}-{os.getpid()}"
            try:
                # unbuffered: a write that fails (a full disk, a file-size limit) fails at once, every row before it
                # is whole on disk, and closing has nothing left to flush (that would raise again)
                self.file = open(self.tmp, "wb", buffering=0)  # noqa: SIM115 (closed by finish / discard)
            except OSError as exc:
                self._to_memory(exc)
        else:
            self.memory = torch.empty((n, *row_shape), dtype=dtype)

    def _to_memory(self, exc: OSError) -> None:
        """Go on in memory, with the rows written so far read back."""
        cannot_write(self.tmp.parent if self.tmp is not None else "?", exc)
        self.memory = torch.empty((self.n, *self.shape), dtype=self.dtype)
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None
            if self.count and self.tmp is not None:
                done = np.fromfile(self.tmp, dtype=np.uint8, count=self.count * self._row_bytes())
                self.memory[:self.count] = torch.from_numpy(done).view(self.dtype).view(self.count, *self.shape)
        self._remove_tmp()

    def _row_bytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def _remove_tmp(self) -> None:
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                self.tmp.unlink()
            self.tmp = None

    def add(self, row: torch.Tensor) -> None:
        self.crcs.append(crc(row))
        if self.file is not None:
            try:
                left = memoryview(row.contiguous().numpy().tobytes())
                while left:  # a raw write may take part of the bytes (the disk filling up), then fail on the rest
                    left = left[self.file.write(left):]
            except OSError as exc:
                self._to_memory(exc)
        if self.memory is not None:
            self.memory[self.count] = row
        self.count += 1

    def finish(self, final: Path) -> torch.Tensor | None:
        """The data file renamed to ``final`` (None: the rows are in memory, :attr:`memory`)."""
        if self.file is not None:
            try:
                self.file.flush()
                os.fsync(self.file.fileno())  # the rows on disk before the name says they are complete
                self.file.close()
                self.file = None
                assert self.tmp is not None
                os.replace(self.tmp, final)
                self.tmp = None
                return None
            except OSError as exc:
                self._to_memory(exc)
        return None

    def discard(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None
        self._remove_tmp()


@contextlib.contextmanager
def locked(path: Path, what: str) -> Iterator[None]:
    """Hold ``path`` locked (POSIX ``flock``; elsewhere, or where it cannot be made, nothing is held)."""
    try:
        import fcntl
    except ImportError:  # (Windows: two runs at once build a set twice, each into its own temporary file)
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            log.info("photo cache: another run is building %s; waiting for it", what)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)
