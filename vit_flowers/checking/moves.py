"""The moves of ``vit-flowers check --move-to`` and their ``--undo``; which of them are safe: every one is checked
before the first file moves.

The rows of a check's CSVs are meant to be edited by hand, so they are not trusted: a row must name one of the
photos that listing PHOTOS finds (:func:`vit_flowers.data.splits.scan_class_folders`, whose rule for links is the
only one), which keeps out ``rose/../../elsewhere/file``, an absolute path, a path through a link out of its class
folder (into another class, or outside PHOTOS), and any file that is not a photo of a class folder. Its
destination must lie inside the quarantine (after links) and be another file than its source; the quarantine
itself must lie outside PHOTOS and outside the real folder of each of its class folders (else the next check or
training finds it as a class, or inside one). The copy of a group of duplicates that stays is checked the same way
(one of the photos, and there): else moving the others would leave no copy in PHOTOS. One refused row refuses them
all, named, before anything moves.
"""

from __future__ import annotations

import csv
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..data.image_files import inside_folder, printable_name
from .check_files import flagged_files, read_csv, write_csv
from .photo_check import find_photos

__all__ = ["MOVED_CSV", "Move", "MoveRefused", "photo_folders", "refuse_quarantine_inside", "plan_moves",
           "move_flagged", "undo_moves"]

log = logging.getLogger(__name__)

MOVED_CSV = "moved.csv"  # QUARANTINE/moved.csv: every move made, what --undo reads
SHOWN = 10  # refused rows named in the error (the rest counted)


class MoveRefused(ValueError):
    """A move that ``--move-to`` will not make; the message names the row(s) and why, and says nothing moved."""


@dataclass(frozen=True)
class Move:
    """One photo to move: ``source`` (in PHOTOS) and ``target`` (in the quarantine), absolute below the real paths of
    PHOTOS and the quarantine, the file's own name kept (a file that is a link moves as the link); and ``why``."""

    source: Path
    target: Path
    why: str


def photo_folders(photos: str | os.PathLike, listed: Iterable[Path]) -> set[str]:
    """The real paths of PHOTOS and of every folder between it and one of its ``listed`` photos (a class folder
    that is a link to a folder elsewhere included): where a quarantine must not be."""
    root = os.path.abspath(photos)
    folders = {os.path.realpath(root)}
    for parent in {os.path.dirname(os.path.abspath(p)) for p in listed}:
        while inside_folder(parent, root) and parent != root:
            folders.add(os.path.realpath(parent))
            parent = os.path.dirname(parent)
    return folders


def refuse_quarantine_inside(photos: str | os.PathLike, quarantine: str | os.PathLike,
                             folders: Iterable[str] = ()) -> None:
    """MoveRefused when the quarantine lies inside PHOTOS or one of its photo ``folders`` (real paths, from
    :func:`photo_folders`; after links): it would become a class, or hold a moved.csv inside one; or when PHOTOS
    lies inside it (the class folders it makes would land beside PHOTOS's own)."""
    top, q = Path(photos).resolve(), Path(quarantine).resolve()
    outside = top.parent / (top.name + "-quarantine")
    if any(inside_folder(q, folder) for folder in {str(top), *folders}):
        raise MoveRefused(f"--move-to {quarantine} lies inside the photo folder {photos}: the next check or training "
                          f"would find it as a class (or inside one); choose a folder outside {photos}, e.g. "
                          f"{outside}")
    if inside_folder(top, q):
        raise MoveRefused(f"the photo folder {photos} lies inside --move-to {quarantine}: choose a folder outside "
                          f"{photos} and not above it, e.g. {outside}")


def _why_not_listed(source: Path, top: Path) -> str:
    """Why ``source`` (which exists, inside PHOTOS as written) is not one of PHOTOS's photos."""
    real = source.resolve()
    if not inside_folder(real, top):
        return f"it leads outside the photo folder (to {printable_name(real)})"
    if source.parent.resolve() != top / source.parent.relative_to(top) or source.is_symlink():
        return "it is reached through a link that leads out of its class folder (links are not followed)"
    return "it is not a photo of a class folder of the photo folder"


def _outside(rel: str) -> bool:
    """Whether the row's path ``rel`` names no path below PHOTOS as written (empty, absolute, or up by ``..``)."""
    norm = os.path.normpath(rel) if rel else ""
    return not norm or os.path.isabs(norm) or norm == ".." or norm.startswith(".." + os.sep)


def _check_kept(rel: str, top: Path, listed: set[Path]) -> str | None:
    """Why the copy of a group of duplicates that stays (``rel``) refuses the move of the others, or None: it must
    be one of PHOTOS's photos, else the move would leave no copy in PHOTOS."""
    if _outside(rel):
        return "the copy that stays names a path outside the photo folder: no copy would be left in it"
    kept = top / os.path.normpath(rel)
    if not os.path.lexists(kept):
        return "the copy that stays is missing: no copy would be left in the photo folder"
    return None if kept in listed else f"the copy that stays is not one of the photos: {_why_not_listed(kept, top)}"


def _check_row(rel: str, why: str, top: Path, q: Path, listed: set[Path]) -> Move | tuple[str, str]:
    """The move of one row, or ("refused", why) or ("skipped", why)."""
    if _outside(rel):
        return "refused", "it names a path outside the photo folder"
    norm = os.path.normpath(rel)
    source, target = top / norm, q / norm
    if not os.path.lexists(source):
        return "skipped", "missing"
    if source not in listed:
        return "refused", _why_not_listed(source, top)
    if not inside_folder(target.parent.resolve(), q):
        return "refused", f"its destination {printable_name(target)} leads outside the quarantine (through a link)"
    if target.resolve() == source.resolve() or (target.exists() and os.path.samefile(target, source)):
        return "refused", f"its source and destination are the same file ({printable_name(source.resolve())})"
    if os.path.lexists(target):
        return "skipped", f"{printable_name(target)} exists"
    return Move(source, target, why)


def plan_moves(photos: str | os.PathLike, listed: Iterable[Path], flagged: dict[str, str],
               quarantine: str | os.PathLike, from_dir: str | os.PathLike = "the check",
               kept: dict[str, str] | None = None) -> list[Move]:
    """The moves of the ``flagged`` photos ({path relative to PHOTOS: why}, as the CSVs name them) from
    ``photos`` into ``quarantine``, every row checked first (module docstring), the copies that stay (``kept``:
    {path: a duplicate of it}) too. ``listed``: the photos that listing PHOTOS finds. A row whose photo is gone,
    or whose destination exists, is skipped with a warning (as it always was); any refused row (a kept copy that
    is not one of the photos included) raises MoveRefused naming them all, and nothing is moved."""
    listed = list(listed)
    refuse_quarantine_inside(photos, quarantine, photo_folders(photos, listed))
    top, q = Path(photos).resolve(), Path(quarantine).resolve()
    root = os.path.abspath(photos)
    known = {top / os.path.relpath(os.path.abspath(p), root) for p in listed}
    moves: dict[Path, Move] = {}
    refused = [f"{printable_name(rel)} (kept, with {printable_name(dup)}): {reason}"
               for rel, dup in sorted((kept or {}).items()) if (reason := _check_kept(rel, top, known)) is not None]
    for rel, why in sorted(flagged.items()):
        found = _check_row(rel, why, top, q, known)
        if isinstance(found, Move):
            moves.setdefault(found.source, found)  # (two spellings of one path move it once)
        elif found[0] == "refused":
            refused.append(f"{printable_name(rel)}: {found[1]}")
        else:
            log.warning("not moved: %s (%s)", printable_name(top / os.path.normpath(rel)), found[1])
    if refused:
        more = f"; and {len(refused) - SHOWN} more" if len(refused) > SHOWN else ""
        raise MoveRefused(f"nothing was moved: {len(refused)} row(s) of {from_dir}'s CSVs cannot be moved safely "
                          f"(remove them from its CSVs, or run a new check): " + "; ".join(refused[:SHOWN]) + more)
    return list(moves.values())


def move_flagged(root: str | os.PathLike, from_dir: str | os.PathLike, quarantine: str | os.PathLike) -> Path:
    """Move the photos :func:`vit_flowers.checking.check_files.flagged_files` names from ``root`` into
    ``quarantine``, keeping their class folders; returns QUARANTINE/moved.csv (source, destination, reason: one row
    written per move as it happens, so an interrupted move is undone as well). Every row is checked before the
    first move (:func:`plan_moves`: a photo of ``root``, a destination inside the quarantine, a quarantine outside
    ``root``); refuses a quarantine that holds a moved.csv already."""
    root, quarantine = Path(root), Path(quarantine)
    record = quarantine / MOVED_CSV
    refuse_quarantine_inside(root, quarantine)
    if record.exists():
        raise FileExistsError(f"{record} exists: undo it first (vit-flowers check --undo {record}) or choose "
                              f"another --move-to folder")
    flagged, kept = flagged_files(from_dir)
    moves = plan_moves(root, find_photos(root).paths, flagged, quarantine, from_dir, kept)
    quarantine.mkdir(parents=True, exist_ok=True)
    with open(record, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
        writer = csv.writer(f)
        writer.writerow(("source", "destination", "reason"))
        for move in moves:
            move.target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(move.source, move.target)
            writer.writerow((move.source, move.target, move.why))
            f.flush()
    log.info("moved %d of %d flagged photos into %s; undo: vit-flowers check --undo %s", len(moves), len(flagged),
             quarantine, record)
    return record


def undo_moves(record: str | os.PathLike) -> int:
    """Move every photo of a moved.csv back where it was (never over a file that is there now); returns how many.
    The record is deleted when all went back, else keeps the rows that did not."""
    record = Path(record)
    if not record.is_file():
        raise FileNotFoundError(f"{record} not found: nothing to undo (its quarantine was already restored: undo "
                                f"deletes moved.csv once every photo is back; or no --move-to wrote it)")
    rows = read_csv(record, ("source", "destination"))
    left = []
    for row in rows:
        source, target = Path(row["source"]), Path(row["destination"])
        there = os.path.lexists(source)  # (a photo that is a link moved as the link, perhaps dangling meanwhile)
        if there or not (target.is_file() or target.is_symlink()):
            log.warning("not moved back: %s (%s)", target, f"{source} exists" if there else "missing")
            left.append(row)
            continue
        source.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(target, source)
        _remove_empty_parents(target.parent, record.parent.resolve())
    if left:
        write_csv(record, list(rows[0]), [list(r.values()) for r in left])
    else:
        record.unlink()
    log.info("moved %d of %d photos back%s", len(rows) - len(left), len(rows),
             f"; {record} lists the {len(left)} left" if left else "")
    return len(rows) - len(left)


def _remove_empty_parents(folder: Path, top: Path) -> None:
    """Remove ``folder`` and its parents below ``top`` while they are empty (the class folders a move made)."""
    while folder != top and top in folder.parents and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
