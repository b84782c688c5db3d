"""The precision probe's verdicts, kept per machine in the user's cache folder, so that ``precision: auto`` times
fp32 against bf16 once per machine and model shape, not at the start of every run.

A verdict is the speedup the probe measured (bf16's speed over fp32's; the choice is made from it by
:data:`vit_flowers.inference.precision.MIN_SPEEDUP`), stored under what it depends on: the machine (the CPU's
model name and its bf16 flags, the torch version, the device type and the number of threads) and the probe (a
training step or a forward pass, the model's shape, how many of its parameters train, the batch shape). Any of
those changing makes a new entry: a new torch, another thread count, a frozen trunk or another preset probe again.

The file is ``$XDG_CACHE_HOME/vit_flowers/precision.json`` (``~/.cache/vit_flowers/precision.json`` without
that variable). Deleting it, or ``--precision-probe fresh`` (config key ``precision_probe``), times the probe
again; an unreadable file is ignored (a warning) and replaced by the next verdict. Writing is atomic and its
failure (a read-only home) only costs the next run its probe. Each of those warnings is said once a process for a
file: a ``train`` run looks up several verdicts (its training step, its objective's networks, a forward pass), and
the same line once for each says nothing more.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..data.cache_format import user_cache_dir
from ..runs.checkpoint import atomic_write_text

__all__ = ["cache_file", "lookup", "store"]

log = logging.getLogger(__name__)

VERSION = 1  # the file's layout
_warned: set[tuple[str, Path]] = set()  # (what failed: "read" / "write", the file) already said in this process


def _warn_once(what: str, path: Path, message: str, *args: object) -> None:
    """Log ``message`` as a warning the first time ``what`` fails on ``path`` in this process, later at debug."""
    level = logging.DEBUG if (what, path) in _warned else logging.WARNING
    _warned.add((what, path))
    log.log(level, message, *args)


def cache_file() -> Path:
    """Where the verdicts are kept: ``$XDG_CACHE_HOME/vit_flowers/precision.json``, ``~/.cache/...`` by default."""
    return user_cache_dir() / "precision.json"


def _read(path: Path) -> list[dict[str, Any]]:
    """The verdicts in ``path``; none when it is absent, or unreadable (a warning: it is replaced when written)."""
    try:
        found = json.loads(path.read_text())
        if found.get("version") != VERSION or not isinstance(found.get("verdicts"), list):
            raise ValueError(f"not a version-{VERSION} verdict file")
        return [v for v in found["verdicts"] if isinstance(v, dict) and "key" in v and "speedup" in v]
    except (FileNotFoundError, NotADirectoryError):  # (a file where the cache folder should be: nothing kept there)
        return []
    except (OSError, ValueError, AttributeError) as exc:
        _warn_once("read", path, "precision auto: ignoring %s (%s); the next probe's verdict replaces it", path, exc)
        return []


def _canonical(key: dict[str, Any]) -> dict[str, Any]:
    """``key`` as it reads back from JSON (tuples become lists), so that a stored key compares equal."""
    return json.loads(json.dumps(key, sort_keys=True))


def lookup(key: dict[str, Any], path: Path | None = None) -> dict[str, Any] | None:
    """The stored verdict of ``key`` (``speedup``, ``measured``: when), or None."""
    key = _canonical(key)
    return next((v for v in _read(path or cache_file()) if v["key"] == key), None)


def store(key: dict[str, Any], speedup: float, path: Path | None = None) -> None:
    """Keep ``speedup`` as the verdict of ``key`` (replacing an older one of the same key); a failure to write
    is logged, never raised."""
    path = path or cache_file()
    key = _canonical(key)
    kept = [v for v in _read(path) if v["key"] != key]
    kept.append({"key": key, "speedup": round(float(speedup), 4),
                 "measured": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"version": VERSION, "verdicts": kept}, indent=1) + "\n")
    except OSError as exc:
        _warn_once("write", path, "precision auto: could not keep the verdict in %s (%s); the next run probes again",
                   path, exc)
