"""Decoded photos (and a hybrid's trunk outputs) kept on disk and read back through a memory map, so that a run's
anonymous memory does not grow with its number of photos and a second run on the same folder decodes nothing.

:class:`PhotoCache` reads a set (a run's training photos at 224 px, its validation photos, their trunk outputs) back
from its pack (:mod:`vit_flowers.data.cache_format`: the keys, the files, the checksums) when the pack's index lists
exactly the keys asked for, in order; otherwise it builds it again, each row copied from any pack of the folder that
holds its key (another split of the same photos, the photos of a folder that gained one) and the rest produced
(decoded: :func:`vit_flowers.data.images.decode_rows`, or passed through the trunk). A set with damaged rows (their
CRC-32 no longer matches: the file was overwritten in place) is built again, its good rows copied and the damaged ones
produced anew: one warning line naming the pack.

Writing is atomic (:mod:`vit_flowers.data.cache_writer`): rows go to a temporary file, renamed once complete, and the
index (which names the data file and its size) is replaced after it; a killed run leaves a temporary file (removed
by the next build of that set), a truncated or missing data file, an index of another version or an unreadable one
are a rebuild. A set is built under a lock file, so a second run on the same folder waits for the first and then
reads its pack. Where the folder cannot be written (read-only, a full disk), the rows stay in memory: one warning
line. ``vit-flowers cache`` lists and clears the folder (:mod:`vit_flowers.data.cache_folder`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .cache_format import Pack, dtype_name, packs_folder, read_pack, read_packs, write_index
from .cache_writer import RowWriter, cannot_write, locked

__all__ = ["PhotoCache", "Rows", "Produce"]

log = logging.getLogger(__name__)

# what a build produces: for each index asked for, in order, its row or the reason it could not be made
Produce = Callable[[list[int]], Iterator[tuple[int, "np.ndarray | str"]]]


@dataclass
class Rows:
    """A built or read set: ``data`` (kept, *row_shape) memory-mapped (or in memory), ``kept`` the indices of the
    keys asked for that it holds, in order, and why each of the others could not be made."""

    data: torch.Tensor
    kept: list[int]
    failed: dict[int, str] = field(default_factory=dict)
    reused: int = 0  # rows read from a pack rather than produced
    where: Path | None = None  # the data file (None: in memory)


class PhotoCache:
    """The packs of one cache folder (``root``; None: nothing is kept, every set is built in memory)."""

    def __init__(self, root: str | os.PathLike | None) -> None:
        self.root = Path(root) if root is not None else None
        self.folder = packs_folder(self.root) if self.root is not None else None
        self._retired: list[Pack] = []  # packs replaced by this process, read from until :meth:`tidy`
        self._warned: set[Path] = set()  # data files found damaged (warned of once)

    def _writable(self) -> Path | None:
        """The packs' folder, made where needed; None (a warning) when it cannot be."""
        if self.folder is None:
            return None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe = self.folder / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            cannot_write(self.folder, exc)
            self.folder = None
            return None
        return self.folder

    def rows(self, group: str, keys: list[str], row_shape: tuple[int, ...], dtype: torch.dtype, produce: Produce,
             source: str, progress: Callable[[int], None] | None = None) -> Rows:
        """The set ``group`` (a name for the set, e.g. a digest of its folder, role and spec) of the rows ``keys``:
        read from its pack when that holds exactly those keys, else built (rows copied from the folder's packs or
        ``produce``d) and kept as its pack. ``progress`` is called with the rows done."""
        name = dtype_name(dtype)
        found = self._read(group, keys, row_shape, name)
        if found is not None:
            if progress is not None:
                progress(len(keys))
            return found
        folder = self._writable()
        if folder is None:
            return self._build(None, group, keys, row_shape, dtype, produce, source, progress)
        with locked(folder / f"{group}.lock", source):
            found = self._read(group, keys, row_shape, name)  # built by the run this one waited for
            if found is not None:
                if progress is not None:
                    progress(len(keys))
                return found
            return self._build(folder, group, keys, row_shape, dtype, produce, source, progress)

    def lookup(self, group: str, keys: list[str], row_shape: tuple[int, ...], dtype: torch.dtype) -> Rows | None:
        """The set ``group`` when its pack holds exactly ``keys``; None otherwise (nothing is built)."""
        return self._read(group, keys, row_shape, dtype_name(dtype))

    def _read(self, group: str, keys: list[str], row_shape: tuple[int, ...], dtype: str) -> Rows | None:
        if self.folder is None:
            return None
        pack = read_pack(self.folder / f"{group}.json")
        if pack is None or pack.keys != keys or pack.row_shape != row_shape or pack.dtype != dtype:
            return None
        try:
            data = pack.rows()
        except (OSError, ValueError, RuntimeError) as exc:
            log.info("photo cache: %s is incomplete (%s): building it again", pack.data, exc)
            return None
        damaged = pack.damaged(data)
        if damaged:
            self._warn_damaged(pack, len(damaged), len(data))
            return None  # built again: its good rows copied (:meth:`_sources` checks each), the others produced
        with contextlib.suppress(OSError):
            os.utime(pack.index)  # last used: what `vit-flowers cache` lists
        return Rows(data, pack.kept(), dict(pack.failed), reused=len(data), where=pack.data)

    def _warn_damaged(self, pack: Pack, damaged: int, rows: int) -> None:
        if pack.data not in self._warned:
            self._warned.add(pack.data)
            log.warning("photo cache: %d of %d rows of %s (%s) do not match their checksums (the file was changed "
                        "in place): producing them again", damaged, rows, pack.info.get("source", "?"), pack.data)

    def _sources(self, wanted: set[str], row_shape: tuple[int, ...], dtype: str) -> dict[str, tuple[torch.Tensor, int]]:
        """Each key of ``wanted`` that a readable pack holds: (that pack's rows, the row)."""
        found: dict[str, tuple[torch.Tensor, int]] = {}
        for pack in read_packs(self.folder) + self._retired:
            if pack.row_shape != row_shape or pack.dtype != dtype:
                continue
            rows = [(k, r) for r, k in enumerate(k for i, k in enumerate(pack.keys) if i not in pack.failed)
                    if k in wanted and k not in found]
            if not rows:
                continue
            try:
                data = pack.rows()
            except (OSError, ValueError, RuntimeError):
                continue
            damaged = set(pack.damaged(data, (r for _, r in rows)))
            if damaged:
                self._warn_damaged(pack, len(damaged), len(rows))
            found.update((k, (data, r)) for k, r in rows if r not in damaged)
        return found

    def _build(self, folder: Path | None, group: str, keys: list[str], row_shape: tuple[int, ...],
               dtype: torch.dtype, produce: Produce, source: str,
               progress: Callable[[int], None] | None) -> Rows:
        name = dtype_name(dtype)
        old = read_pack(folder / f"{group}.json") if folder is not None else None
        if folder is not None:
            for stale in folder.glob(f"{group}.*.tmp-*"):  # a killed build's (we hold the set's lock)
                with contextlib.suppress(OSError):
                    stale.unlink()
        sources = self._sources(set(keys), row_shape, name) if folder is not None else {}
        missing = [i for i, k in enumerate(keys) if k not in sources]
        build = uuid.uuid4().hex[:12]
        writer = RowWriter(folder, f"{group}.{build}", len(keys), row_shape, dtype)
        kept, failed = [], {}
        try:
            made = produce(missing)
            for i, key in enumerate(keys):
                if key in sources:
                    data, r = sources[key]
                    row: torch.Tensor | str = data[r]
                else:
                    j, produced = next(made)
                    assert j == i, (j, i)  # produce yields the missing indices in order
                    row = torch.from_numpy(produced) if isinstance(produced, np.ndarray) else produced
                if isinstance(row, str):
                    failed[i] = row
                else:
                    writer.add(row)
                    kept.append(i)
                if progress is not None:
                    progress(1)
            data_file = folder / f"{group}.{build}.rows" if folder is not None else None
            if data_file is not None:
                writer.finish(data_file)
        except BaseException:
            writer.discard()
            raise
        if writer.memory is not None:
            return Rows(writer.memory[:len(kept)], kept, failed, reused=len(keys) - len(missing))
        assert folder is not None and data_file is not None
        pack = Pack(folder / f"{group}.json", data_file, keys, failed, row_shape, name, {"source": source},
                     writer.crcs)
        data = pack.rows()  # mapped before the index names it: what this run reads is what it wrote
        try:
            self._publish(pack, old)
        except OSError as exc:
            log.warning("photo cache: cannot write in %s (%s): the next run decodes these photos again", folder,
                        exc.strerror or exc)
            with contextlib.suppress(OSError):
                data_file.unlink()  # (this run's mapping keeps it until the run ends)
        return Rows(data, kept, failed, reused=len(keys) - len(missing), where=data_file)

    def _publish(self, pack: Pack, old: Pack | None) -> None:
        """The index of the new ``pack`` put in place (atomically); the pack it replaces retired."""
        write_index(pack)
        if old is not None and old.data != pack.data:
            self._retired.append(old)  # its rows may still serve a set built next (a photo moved from train to val)

    def tidy(self) -> None:
        """Remove the data files of the packs this process replaced (a run reading one keeps its mapping: the file
        goes when that run ends)."""
        for pack in self._retired:
            with contextlib.suppress(OSError):
                pack.data.unlink()
        self._retired = []
