"""List or clear the photo cache: the decoded photos and trunk outputs that training keeps on disk
(:mod:`vit_flowers.data.photo_cache`; listed and cleared by :mod:`vit_flowers.data.cache_folder`), so that a second
run on the same photos decodes none of them.

    vit-flowers cache                      # each kept set: what it is, its photos, its size, when last used
    vit-flowers cache --clear              # remove them all (the next run decodes its photos again)
    vit-flowers cache --cache-dir DIR      # another cache folder (train's --cache-dir)

The folder is $XDG_CACHE_HOME/vit_flowers (~/.cache/vit_flowers) unless --cache-dir says otherwise; only its
packs-v*/ folders are listed or cleared (precision auto's verdicts beside them stay). The same command runs as
`python -m vit_flowers.cache`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .cli import command_parser, setup_logging
from .data.cache_folder import cache_size, clear, human_bytes, listing
from .data.cache_format import packs_folder, user_cache_dir

__all__ = ["build_parser", "main"]

log = logging.getLogger("vit_flowers.cache")


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("cache", __doc__)
    p.add_argument("--cache-dir", help="the cache folder (default: $XDG_CACHE_HOME/vit_flowers, "
                                       "~/.cache/vit_flowers)")
    p.add_argument("--clear", action="store_true", help="remove every kept set")
    return p


def _ago(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f} {unit} ago"
    return "just now"


def list_cache(root: Path) -> None:
    """Each pack of the cache folder ``root`` on a line, then the total."""
    entries, other = listing(root)
    now = time.time()
    for e in entries:
        what = "trunk outputs" if e.dtype == "float16" else "photos"
        log.info("%9s  %7d %-13s  used %-12s  %s", human_bytes(e.bytes), e.rows, what, _ago(now - e.used), e.source)
    if other:
        log.info("%9s  in other files (an older version's, a killed run's): --clear removes them", human_bytes(other))
    log.info("%s: %d sets, %s in all%s", packs_folder(root), len(entries), human_bytes(cache_size(root)),
             "" if not entries else " (vit-flowers cache --clear removes them)")


def _not_a_cache_folder(root: Path, given: bool) -> str | None:
    """Why ``root`` cannot be a cache folder (None: it can): a file; a --cache-dir that does not exist. The default
    folder may be missing: no run has kept photos yet."""
    if root.exists() and not root.is_dir():
        return f"the cache folder {root} is a file, not a folder: give the folder train's --cache-dir named"
    if given and not root.exists():
        return f"no cache folder at {root}: give the folder train's --cache-dir named"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    root = Path(args.cache_dir) if args.cache_dir else user_cache_dir()
    problem = _not_a_cache_folder(root, given=bool(args.cache_dir))
    if problem:  # (listed as empty, or "cleared: 0 B freed", a mistyped folder would pass for an empty cache)
        log.error("error: %s", problem)
        return 2
    try:
        if args.clear:
            log.info("cleared %s: %s freed", packs_folder(root), human_bytes(clear(root)))
        else:
            list_cache(root)
    except OSError as exc:
        log.error("error: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
