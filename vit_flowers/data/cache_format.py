"""The photo cache's format: where its packs are, what a row's key is, and a pack's files (read and written by
:mod:`vit_flowers.data.photo_cache`, listed and cleared by :mod:`vit_flowers.data.cache_folder`).

A *set* (a run's training photos at 224 px, its validation photos, their trunk outputs) is one *pack*: a data file of
fixed-size rows, one a photo that could be read, in the set's order, and an index (JSON) naming each row's key. A
row's key is a digest of what its content depends on: for a decoded photo the file's resolved path, size,
modification time (ns), inode and status-change time (ns: rewritten bytes with the size and mtime put back still
change it) and the decode size; for a trunk output that key and the trunk's signature (its weights'
hash, the input size, the precision).

Each row's CRC-32 is written in the index and checked whenever the row is read: a data file overwritten in place
(random bytes or zeros of the same size, a bad disk) is never read back as photos. (CRC-32 runs at about 2.6 GB/s
on one core: a second of checking for 10,000 photos at 224 px, against minutes to decode them.) An index of another
version, an unreadable one, or one that names a file other than its own set's data file is no pack.

The folder: ``cache_dir`` (config key, ``--cache-dir``), else ``$XDG_CACHE_HOME/vit_flowers``
(``~/.cache/vit_flowers``); packs are in its ``packs-v{VERSION}/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["VERSION", "DTYPES", "dtype_name", "user_cache_dir", "packs_folder", "file_key", "set_name", "derived_key",
           "Pack", "crc", "read_pack", "read_packs", "write_index"]

# the layout of a pack (2: each row's CRC-32 in the index, the photo's inode and ctime in its key); another version's
# packs are ignored (and listed as such by `vit-flowers cache`)
VERSION = 2
DTYPES = {"uint8": torch.uint8, "float16": torch.float16}  # a pack's dtype, as its index names it


def user_cache_dir() -> Path:
    """The user's cache folder of the project: ``$XDG_CACHE_HOME/vit_flowers``, ``~/.cache/vit_flowers`` by
    default."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "vit_flowers"


def dtype_name(dtype: torch.dtype) -> str:
    """``dtype`` as a pack's index names it (one of :data:`DTYPES`)."""
    return next(name for name, d in DTYPES.items() if d == dtype)


def packs_folder(root: Path) -> Path:
    """Where the packs of this version are in the cache folder ``root``."""
    return root / f"packs-v{VERSION}"


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
class Pack:
    """One pack: its index (``{group}.json``) and data file, every key asked for in order (``failed``: those that
    could not be made, and why), the rows' shape and dtype, what the index says of it (``info``: its source) and
    each row's CRC-32, in the data file's order."""

    index: Path
    data: Path
    keys: list[str]
    failed: dict[int, str]
    row_shape: tuple[int, ...]
    dtype: str
    info: dict[str, Any]
    crcs: list[int]

    def kept(self) -> list[int]:
        return [i for i in range(len(self.keys)) if i not in self.failed]

    def rows(self) -> torch.Tensor:
        """The data file as a (rows, *row_shape) tensor mapped privately (read-only pages: the OS page cache's);
        OSError / ValueError when it is missing or has not the size the index says."""
        n, shape, dtype = len(self.keys) - len(self.failed), self.row_shape, DTYPES[self.dtype]
        count = n * int(np.prod(shape))
        if os.path.getsize(self.data) != count * dtype.itemsize:
            raise ValueError(f"{self.data.name} has {os.path.getsize(self.data)} bytes, not {count * dtype.itemsize}")
        if n == 0:
            return torch.empty((0, *shape), dtype=dtype)
        return torch.from_file(str(self.data), shared=False, size=count, dtype=dtype).view(n, *shape)

    def damaged(self, data: torch.Tensor, rows: Iterable[int] | None = None) -> list[int]:
        """The rows of ``data`` (:meth:`rows`; all, or those of ``rows``) whose bytes no longer have the CRC-32
        written with them: the file was overwritten in place, so its size says nothing."""
        return [r for r in (range(len(data)) if rows is None else rows) if crc(data[r]) != self.crcs[r]]


def crc(row: torch.Tensor) -> int:
    """The CRC-32 of one row's bytes (read in place: a mapped row is not copied)."""
    return zlib.crc32(row.contiguous().numpy().view(np.uint8).data)


def read_pack(index: Path) -> Pack | None:
    """The pack that ``index`` describes; None when it is not one of this version (or not readable)."""
    try:
        info = json.loads(index.read_text())
        data = str(info["data"])
        # only a data file of its own set, beside it: a hand-edited index never names another file (it may be removed)
        if info.get("version") != VERSION or info["dtype"] not in DTYPES or not (
                data.startswith(f"{index.stem}.") and data.endswith(".rows") and Path(data).name == data):
            return None
        pack = Pack(index, index.parent / data, [str(k) for k in info["keys"]],
                    {int(i): str(r) for i, r in info["failed"].items()}, tuple(int(s) for s in info["row_shape"]),
                    str(info["dtype"]), info, [int(c) for c in info["crc32"]])
        return pack if len(pack.crcs) == len(pack.keys) - len(pack.failed) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def read_packs(folder: Path | None) -> list[Pack]:
    """The readable packs of this version in ``folder`` (a :func:`packs_folder`; none when it is None or absent)."""
    if folder is None or not folder.is_dir():
        return []
    return [p for p in map(read_pack, sorted(folder.glob("*.json"))) if p is not None]


def write_index(pack: Pack) -> None:
    """The index of ``pack`` (whose data file is whole on disk) put in place, atomically."""
    info = {"version": VERSION, "data": pack.data.name, "row_shape": list(pack.row_shape), "dtype": pack.dtype,
            "source": pack.info["source"], "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "keys": pack.keys, "failed": {str(i): r for i, r in pack.failed.items()}, "crc32": pack.crcs}
    _write_whole(pack.index, json.dumps(info).encode())


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
