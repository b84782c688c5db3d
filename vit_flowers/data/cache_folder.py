"""The photo cache's folder as a whole, as ``vit-flowers cache`` lists and clears it: each pack with its photos, size
and last use, the bytes of everything else (another version's packs, a killed build's temporary files, data files
no index names), and every pack removed. The packs themselves: :mod:`vit_flowers.data.cache_format`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from .cache_format import packs_folder, read_packs

__all__ = ["PackEntry", "listing", "cache_size", "clear", "human_bytes"]


@dataclass(frozen=True)
class PackEntry:
    """One pack as ``vit-flowers cache`` lists it."""

    source: str
    rows: int
    dtype: str
    row_shape: tuple[int, ...]
    bytes: int
    used: float  # when last read or written (seconds since the epoch)


def _all_files(root: Path) -> list[Path]:
    """Every file of the packs' folders of the cache folder ``root``, all versions."""
    if not root.is_dir():
        return []
    return [f for d in root.glob("packs-v*") if d.is_dir() for f in d.iterdir() if f.is_file()]


def cache_size(root: Path) -> int:
    """Bytes the packs of the cache folder ``root`` hold (all versions)."""
    return sum(_size(f) for f in _all_files(root))


def listing(root: Path) -> tuple[list[PackEntry], int]:
    """Each readable pack of this version in the cache folder ``root``, newest use first, and the bytes of everything
    else (other versions, a killed build's temporary files, data files no index names)."""
    packs = read_packs(packs_folder(root))
    entries = [PackEntry(p.info.get("source", "?"), len(p.keys) - len(p.failed), str(p.info.get("dtype")),
                         tuple(p.row_shape), _size(p.data) + _size(p.index), _mtime(p.index)) for p in packs]
    named = {p.data for p in packs} | {p.index for p in packs}
    other = sum(_size(f) for f in _all_files(root) if f not in named and f.suffix != ".lock")
    return sorted(entries, key=lambda e: -e.used), other


def clear(root: Path) -> int:
    """Remove every pack of the cache folder ``root`` (all versions); the bytes freed. A run reading one keeps its
    mapping until it ends."""
    freed = 0
    for f in _all_files(root):
        size = _size(f)
        with contextlib.suppress(OSError):
            f.unlink()
            freed += size
    return freed


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


def human_bytes(n: float) -> str:
    """``n`` bytes as a person reads them: 412 MB, 1.4 GB, 150 KB."""
    units = ("B", "KB", "MB", "GB", "TB")
    step = 0
    while n >= 1000 and step < len(units) - 1:
        n, step = n / 1000, step + 1
    return f"{n:.1f} {units[step]}" if step >= 3 and n < 100 else f"{n:.0f} {units[step]}"
