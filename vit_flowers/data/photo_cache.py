"""Decoded photos (and a hybrid's trunk outputs) kept on disk and read back through a memory map, so that a run's
anonymous memory does not grow with its number of photos and a second run on the same folder decodes nothing.

A *set* (a run's training photos at 224 px, its validation photos, their trunk outputs) is one *pack*: a data file of
fixed-size rows, one a photo that could be read, in the set's order, and an index (JSON) naming each row's key. A
row's key is a digest of what its content depends on: for a decoded photo the file's resolved path, size,
modification time (ns), inode and status-change time (ns: rewritten bytes with the size and mtime put back still
change it) and the decode size; for a trunk output that key and the trunk's signature (its weights'
hash, the input size, the precision). A set is read back when its index lists exactly the keys asked for, in order;
otherwise it is built again, each row copied from any pack of the folder that holds its key (another split of the
same photos, the photos of a folder that gained one) and the rest produced (decoded, or passed through the trunk).

Each row's CRC-32 is written in the index and checked whenever the row is read: a data file overwritten in place
(random bytes or zeros of the same size, a bad disk) is never read back as photos. A set with damaged rows is built
again, its good rows copied and the damaged ones produced anew: one warning line naming the pack. (CRC-32 runs at
about 2.6 GB/s on one core: a second of checking for 10,000 photos at 224 px, against minutes to decode them.)

Writing is atomic: rows go to a temporary file, renamed once complete, and the index (which names the data file and
its size) is replaced after it; a killed run leaves a temporary file (removed by the next build of that set), a
truncated or missing data file, an index of another version or an unreadable one are a rebuild. A set is built
under a lock file (POSIX ``flock``), so a second run on the same folder waits for the first and then reads its
pack. Where the folder cannot be written (read-only, a full disk), the rows stay in memory: one warning line.

The folder: ``cache_dir`` (config key, ``--cache-dir``), else ``$XDG_CACHE_HOME/vit_flowers``
(``~/.cache/vit_flowers``); packs are in its ``packs-v{VERSION}/``. ``vit-flowers cache`` lists and clears them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import socket
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["VERSION", "user_cache_dir", "PhotoCache", "Rows", "Produce", "file_key", "set_name", "derived_key",
           "decode_rows", "human_bytes", "PackEntry"]

log = logging.getLogger(__name__)

# the layout of a pack (2: each row's CRC-32 in the index, the photo's inode and ctime in its key); another version's
# packs are ignored (and listed as such by `vit-flowers cache`)
VERSION = 2
_DTYPES = {"uint8": torch.uint8, "float16": torch.float16}
# what a build produces: for each index asked for, in order, its row or the reason it could not be made
Produce = Callable[[list[int]], Iterator[tuple[int, "np.ndarray | str"]]]


def user_cache_dir() -> Path:
    """The user's cache folder of the project: ``$XDG_CACHE_HOME/vit_flowers``, ``~/.cache/vit_flowers`` by
    default."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "vit_flowers"


def _digest(*parts: object) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(os.fsencode(part) if isinstance(part, (str, os.PathLike)) else repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def file_key(path: str | os.PathLike, spec: str) -> str:
    """A photo file's row key for ``spec`` (how it is decoded, e.g. "photo 224"): its resolved path, size,
    modification time, inode and status-change time (a file rewritten with its size and mtime restored, or replaced
    by another, has another inode or ctime); a file that cannot be read gets a key of its own that no pack holds (a
    failure is not kept)."""
    try:
        resolved = os.path.realpath(path)
        st = os.stat(resolved)
    except (OSError, ValueError):
        return _digest("unreadable", path, uuid.uuid4().hex)
    return _digest(spec, resolved, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def set_name(*parts: object) -> str:
    """The name of a set's pack, from what identifies the set (e.g. its folder, its role, how it is decoded): a
    set of that name built again replaces the earlier one."""
    return _digest("set", *parts)


def derived_key(key: str, spec: str) -> str:
    """The key of a row computed from the row ``key`` by ``spec`` (e.g. a trunk's output of a photo)."""
    return _digest(spec, key)


@dataclass
class Rows:
    """A built or read set: ``data`` (kept, *row_shape) memory-mapped (or in memory), ``kept`` the indices of the
    keys asked for that it holds, in order, and why each of the others could not be made."""

    data: torch.Tensor
    kept: list[int]
    failed: dict[int, str] = field(default_factory=dict)
    reused: int = 0  # rows read from a pack rather than produced
    where: Path | None = None  # the data file (None: in memory)


@dataclass
class _Pack:
    index: Path
    data: Path
    keys: list[str]  # every key asked for, in order
    failed: dict[int, str]
    row_shape: tuple[int, ...]
    dtype: str
    info: dict[str, Any]
    crcs: list[int]  # each row's CRC-32, in the data file's order

    def kept(self) -> list[int]:
        return [i for i in range(len(self.keys)) if i not in self.failed]

    def rows(self) -> torch.Tensor:
        """The data file as a (rows, *row_shape) tensor mapped privately (read-only pages: the OS page cache's);
        OSError / ValueError when it is missing or has not the size the index says."""
        n, shape, dtype = len(self.keys) - len(self.failed), self.row_shape, _DTYPES[self.dtype]
        count = n * int(np.prod(shape))
        if os.path.getsize(self.data) != count * dtype.itemsize:
            raise ValueError(f"{self.data.name} has {os.path.getsize(self.data)} bytes, not {count * dtype.itemsize}")
        if n == 0:
            return torch.empty((0, *shape), dtype=dtype)
        return torch.from_file(str(self.data), shared=False, size=count, dtype=dtype).view(n, *shape)

    def damaged(self, data: torch.Tensor, rows: Iterable[int] | None = None) -> list[int]:
        """The rows of ``data`` (:meth:`rows`; all, or those of ``rows``) whose bytes no longer have the CRC-32
        written with them: the file was overwritten in place, so its size says nothing."""
        return [r for r in (range(len(data)) if rows is None else rows) if _crc(data[r]) != self.crcs[r]]


def _crc(row: torch.Tensor) -> int:
    """The CRC-32 of one row's bytes (read in place: a mapped row is not copied)."""
    return zlib.crc32(row.contiguous().numpy().view(np.uint8).data)


def _read_pack(index: Path) -> _Pack | None:
    """The pack that ``index`` describes; None when it is not one of this version (or not readable)."""
    try:
        info = json.loads(index.read_text())
        data = str(info["data"])
        # only a data file of its own set, beside it: a hand-edited index never names another file (it may be removed)
        if info.get("version") != VERSION or info["dtype"] not in _DTYPES or not (
                data.startswith(f"{index.stem}.") and data.endswith(".rows") and Path(data).name == data):
            return None
        pack = _Pack(index, index.parent / data, [str(k) for k in info["keys"]],
                     {int(i): str(r) for i, r in info["failed"].items()}, tuple(int(s) for s in info["row_shape"]),
                     str(info["dtype"]), info, [int(c) for c in info["crc32"]])
        return pack if len(pack.crcs) == len(pack.keys) - len(pack.failed) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class _Writer:
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
        where = self.tmp.parent if self.tmp is not None else "?"
        why = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        log.warning("photo cache: cannot write in %s (%s): this run keeps its photos in memory", where, why)
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
        self.crcs.append(_crc(row))
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
def _locked(path: Path, what: str) -> Iterator[None]:
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


class PhotoCache:
    """The packs of one cache folder (``root``; None: nothing is kept, every set is built in memory)."""

    def __init__(self, root: str | os.PathLike | None) -> None:
        self.root = Path(root) if root is not None else None
        self.folder = self.root / f"packs-v{VERSION}" if self.root is not None else None
        self._retired: list[_Pack] = []  # packs replaced by this process, read from until :meth:`tidy`
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
            log.warning("photo cache: cannot write in %s (%s): this run keeps its photos in memory",
                        self.folder, exc.strerror or exc)
            self.folder = None
            return None
        return self.folder

    def packs(self) -> list[_Pack]:
        """The readable packs of this version."""
        if self.folder is None or not self.folder.is_dir():
            return []
        return [p for p in map(_read_pack, sorted(self.folder.glob("*.json"))) if p is not None]

    def rows(self, group: str, keys: list[str], row_shape: tuple[int, ...], dtype: torch.dtype, produce: Produce,
             source: str, progress: Callable[[int], None] | None = None) -> Rows:
        """The set ``group`` (a name for the set, e.g. a digest of its folder, role and spec) of the rows ``keys``:
        read from its pack when that holds exactly those keys, else built (rows copied from the folder's packs or
        ``produce``d) and kept as its pack. ``progress`` is called with the rows done."""
        dtype_name = next(k for k, v in _DTYPES.items() if v == dtype)
        found = self._read(group, keys, row_shape, dtype_name)
        if found is not None:
            if progress is not None:
                progress(len(keys))
            return found
        folder = self._writable()
        if folder is None:
            return self._build(None, group, keys, row_shape, dtype, produce, source, progress)
        with _locked(folder / f"{group}.lock", source):
            found = self._read(group, keys, row_shape, dtype_name)  # built by the run this one waited for
            if found is not None:
                if progress is not None:
                    progress(len(keys))
                return found
            return self._build(folder, group, keys, row_shape, dtype, produce, source, progress)

    def lookup(self, group: str, keys: list[str], row_shape: tuple[int, ...], dtype: torch.dtype) -> Rows | None:
        """The set ``group`` when its pack holds exactly ``keys``; None otherwise (nothing is built)."""
        return self._read(group, keys, row_shape, next(k for k, v in _DTYPES.items() if v == dtype))

    def _read(self, group: str, keys: list[str], row_shape: tuple[int, ...], dtype: str) -> Rows | None:
        if self.folder is None:
            return None
        pack = _read_pack(self.folder / f"{group}.json")
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

    def _warn_damaged(self, pack: _Pack, damaged: int, rows: int) -> None:
        if pack.data not in self._warned:
            self._warned.add(pack.data)
            log.warning("photo cache: %d of %d rows of %s (%s) do not match their checksums (the file was changed "
                        "in place): producing them again", damaged, rows, pack.info.get("source", "?"), pack.data)

    def _sources(self, wanted: set[str], row_shape: tuple[int, ...], dtype: str) -> dict[str, tuple[torch.Tensor, int]]:
        """Each key of ``wanted`` that a readable pack holds: (that pack's rows, the row)."""
        found: dict[str, tuple[torch.Tensor, int]] = {}
        for pack in self.packs() + self._retired:
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
        dtype_name = next(k for k, v in _DTYPES.items() if v == dtype)
        old = _read_pack(folder / f"{group}.json") if folder is not None else None
        if folder is not None:
            for stale in folder.glob(f"{group}.*.tmp-*"):  # a killed build's (we hold the set's lock)
                with contextlib.suppress(OSError):
                    stale.unlink()
        sources = self._sources(set(keys), row_shape, dtype_name) if folder is not None else {}
        missing = [i for i, k in enumerate(keys) if k not in sources]
        build = uuid.uuid4().hex[:12]
        writer = _Writer(folder, f"{group}.{build}", len(keys), row_shape, dtype)
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
        pack = _Pack(folder / f"{group}.json", data_file, keys, failed, row_shape, dtype_name, {"source": source},
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

    def _publish(self, pack: _Pack, old: _Pack | None) -> None:
        """The index of the new ``pack`` put in place (atomically); the pack it replaces retired."""
        info = {"version": VERSION, "data": pack.data.name, "row_shape": list(pack.row_shape), "dtype": pack.dtype,
                "source": pack.info["source"], "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "keys": pack.keys, "failed": {str(i): r for i, r in pack.failed.items()}, "crc32": pack.crcs}
        _write_whole(pack.index, json.dumps(info).encode())
        if old is not None and old.data != pack.data:
            self._retired.append(old)  # its rows may still serve a set built next (a photo moved from train to val)

    def tidy(self) -> None:
        """Remove the data files of the packs this process replaced (a run reading one keeps its mapping: the file
        goes when that run ends)."""
        for pack in self._retired:
            with contextlib.suppress(OSError):
                pack.data.unlink()
        self._retired = []

    def size(self) -> int:
        """Bytes the cache folder's packs hold (all versions)."""
        return sum(_size(f) for f in self._all_files())

    def _all_files(self) -> list[Path]:
        if self.root is None or not self.root.is_dir():
            return []
        return [f for d in self.root.glob("packs-v*") if d.is_dir() for f in d.iterdir() if f.is_file()]

    def listing(self) -> tuple[list[PackEntry], int]:
        """Each readable pack of this version, newest use first, and the bytes of everything else (other versions,
        a killed build's temporary files, data files no index names)."""
        packs = self.packs()
        entries = [PackEntry(p.info.get("source", "?"), len(p.keys) - len(p.failed), str(p.info.get("dtype")),
                             tuple(p.row_shape), _size(p.data) + _size(p.index), _mtime(p.index)) for p in packs]
        named = {p.data for p in packs} | {p.index for p in packs}
        other = sum(_size(f) for f in self._all_files() if f not in named and f.suffix != ".lock")
        return sorted(entries, key=lambda e: -e.used), other

    def clear(self) -> int:
        """Remove every pack (all versions); the bytes freed. A run reading one keeps its mapping until it ends."""
        freed = 0
        for f in self._all_files():
            size = _size(f)
            with contextlib.suppress(OSError):
                f.unlink()
                freed += size
        return freed


@dataclass(frozen=True)
class PackEntry:
    """One pack as ``vit-flowers cache`` lists it."""

    source: str
    rows: int
    dtype: str
    row_shape: tuple[int, ...]
    bytes: int
    used: float  # when last read or written (seconds since the epoch)


def _write_whole(path: Path, data: bytes) -> None:
    """``data`` as ``path``, atomically: a temporary file in the same folder, on disk, then renamed over it."""
    tmp = path.with_name(f"{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def decode_rows(paths: list[Path], size: int, decode: Callable[[Path, int], torch.Tensor | str],
                threads: int) -> Produce:
    """What :meth:`PhotoCache.rows` produces for photos: ``decode`` of the files asked for, on ``threads`` threads,
    a bounded number of them in flight (memory does not grow with the photos)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    def produce(indices: list[int]) -> Iterator[tuple[int, np.ndarray | str]]:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            window: list[tuple[int, Future[torch.Tensor | str]]] = []
            pending = iter(indices)
            for i in _take(pending, 4 * threads):
                window.append((i, pool.submit(decode, paths[i], size)))
            while window:
                i, future = window.pop(0)
                result = future.result()
                for j in _take(pending, 1):
                    window.append((j, pool.submit(decode, paths[j], size)))
                yield i, result if isinstance(result, str) else result.numpy()

    return produce


def _take(items: Iterator[int], n: int) -> Iterable[int]:
    for _ in range(n):
        try:
            yield next(items)
        except StopIteration:
            return


def human_bytes(n: float) -> str:
    """``n`` bytes as a person reads them: 412 MB, 1.4 GB, 150 KB."""
    units = ("B", "KB", "MB", "GB", "TB")
    step = 0
    while n >= 1000 and step < len(units) - 1:
        n, step = n / 1000, step + 1
    return f"{n:.1f} {units[step]}" if step >= 3 and n < 100 else f"{n:.0f} {units[step]}"
