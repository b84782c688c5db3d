"""Check a folder of labelled photos before training: duplicates, leaks between train and val, likely wrong
labels, unreadable and tiny photos, class counts. It only reads the photos; moving the ones you agree with is
a separate, explicit step that one command undoes.

    # look: writes DIR/duplicates.csv, DIR/label_issues.csv and DIR/report.html (open it in a browser)
    vit-flowers check photos/ --output photos-check
    vit-flowers check photos/ --output photos-check --split checkpoints/my-run/split.json   # leaks of that split

    # act: move the flagged photos (edit the two CSVs first to keep only the rows you agree with) into a
    # quarantine folder, class folders kept; Q/moved.csv records every move
    vit-flowers check photos/ --from photos-check --move-to Q
    vit-flowers check --undo Q/moved.csv            # every photo back where it was

Of each group of duplicates the first photo (path_a) stays and the others move; every photo of
label_issues.csv moves. Every row is checked before the first move (a photo of PHOTOS, a destination inside Q, Q
outside PHOTOS: :mod:`vit_flowers.checking.moves`); one that is not refuses them all. The same check runs as
`python -m vit_flowers.check`.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .checking.moves import plan_moves, refuse_quarantine_inside
from .checking.photo_check import (
    FEATURE_SIZE,
    TINY_SIDE,
    CheckResult,
    LabelIssue,
    Photos,
    find_duplicates,
    label_issues,
    out_of_sample_probabilities,
    tiny_photos,
    trunk_features,
)
from .cli import command_parser, setup_logging
from .data.duplicates import hash_files, union_groups
from .data.splits import check_same_classes, find_split_dirs, load_split, scan_class_folders
from .inference.runtime import keep_freed_memory
from .models.efficientnet import ImageNetWeightsError

__all__ = ["Photos", "CheckResult", "find_photos", "check_photos", "refuse_existing_check", "write_check",
           "flagged_files", "move_flagged", "undo_moves", "main"]

log = logging.getLogger("vit_flowers.check")

DUPLICATES_CSV, LABELS_CSV, REPORT_HTML, MOVED_CSV = "duplicates.csv", "label_issues.csv", "report.html", "moved.csv"


def find_photos(root: str | os.PathLike, split_file: str | os.PathLike | None = None) -> Photos:
    """The photos of ``root``: its class folders, or those of its own train/ val/ (test/) folders (each photo's
    side then is its folder's role); ``split_file`` (a run's split.json, paths relative to ``root``) gives the
    sides of a folder split by training."""
    root = Path(root)
    dirs = find_split_dirs(root) if root.is_dir() else {}
    if dirs:
        classes: list[str] | None = None
        samples: list[tuple[Path, int]] = []
        roles: list[str | None] = []
        for role, folder in dirs.items():
            found, part = scan_class_folders(folder)
            if classes is not None:
                check_same_classes(classes, found, str(folder), f"{dirs['train']}")
            classes = found
            samples += part
            roles += [role] * len(part)
        sides: list[str | None] | None = roles
    else:
        classes, samples = scan_class_folders(root)
        sides = None
    if split_file is not None:
        split = load_split(split_file)
        side_of = {**dict.fromkeys(split["train"], "train"), **dict.fromkeys(split["val"], "val")}
        sides = [side_of.get(p.relative_to(root).as_posix()) for p, _ in samples]
        if not any(sides):
            raise ValueError(f"split file {split_file} names none of the photos of {root} (paths relative to "
                             f"{split.get('root', 'its folder')})")
    return Photos(root, [p for p, _ in samples], np.array([y for _, y in samples]),
                  list(classes or ()), sides)  # (classes is set: dirs names at least one folder)


def check_photos(photos: Photos, *, image_size: int, batch_size: int, folds: int, progress: bool) -> CheckResult:
    """Run every check on ``photos`` (features, hashes, cross-validation): :mod:`vit_flowers.checking.photo_check`."""
    started = time.perf_counter()
    log.info("%s: %d photos in %d classes; features of EfficientNet-Lite0 (ImageNet) at %d px", photos.root,
             len(photos.paths), len(photos.classes), image_size)
    feats, ok, unreadable = trunk_features(photos.paths, image_size, batch_size, progress)
    hashes = hash_files(photos.paths)
    pairs = find_duplicates(feats, ok, hashes, photos.labels.tolist(), photos.sides)
    issues = None
    readable = np.flatnonzero(ok)
    labels = photos.labels[readable]
    if len(np.unique(labels)) == len(photos.classes):
        probs = out_of_sample_probabilities(feats[readable], labels, folds)
        if probs is not None:
            issues = [LabelIssue(int(readable[x.index]), x.given, x.suggested, x.score)
                      for x in label_issues(probs, labels)]
    if issues is None:
        log.warning("likely wrong labels not looked for: every class needs 2 or more readable photos")
    return CheckResult(photos, pairs, issues, unreadable, tiny_photos(photos.paths, ok),
                       time.perf_counter() - started)


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    with open(path, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def refuse_existing_check(out: Path, overwrite: bool) -> None:
    """FileExistsError when ``out`` holds a check (whose CSVs may have been edited by hand) and not ``overwrite``."""
    existing = [name for name in (DUPLICATES_CSV, LABELS_CSV, REPORT_HTML) if (out / name).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{out} already holds a check ({', '.join(existing)}): choose another --output, or "
                              f"--overwrite to replace it")


def write_check(result: CheckResult, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """DIR/duplicates.csv, DIR/label_issues.csv and DIR/report.html of ``result``; refuses a folder that holds
    a check already (its CSVs may be edited by hand for ``--move-to``) unless ``overwrite``."""
    from .checking.check_report import write_check_html

    out = Path(out_dir)
    refuse_existing_check(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    photos, names = result.photos, result.photos.classes
    _write_csv(out / DUPLICATES_CSV, ("path_a", "path_b", "kind", "similarity", "match"),
               [(photos.rel(p.a), photos.rel(p.b), p.kind, f"{p.similarity:.4f}", p.match) for p in result.pairs])
    _write_csv(out / LABELS_CSV, ("path", "given_label", "suggested_label", "score"),
               [(photos.rel(x.index), names[x.given], names[x.suggested], f"{x.score:.4f}")
                for x in result.issues or ()])
    write_check_html(result, out / REPORT_HTML)
    return out


def _log_summary(result: CheckResult, out: Path) -> None:
    kinds = {kind: sum(p.kind == kind for p in result.pairs) for kind in ("within_class", "across_classes",
                                                                          "across_split")}
    counts = np.bincount(result.photos.labels, minlength=len(result.photos.classes))
    log.info("duplicates: %d pairs (%s; %d byte-identical)", len(result.pairs),
             ", ".join(f"{n} {kind}" for kind, n in kinds.items()), sum(p.match == "bytes" for p in result.pairs))
    log.info("likely wrong labels: %s", "not looked for" if result.issues is None else len(result.issues))
    log.info("unreadable: %d, tiny (under %d px): %d; photos per class %d-%d (imbalance %.1fx)",
             len(result.unreadable), TINY_SIDE, len(result.tiny), counts.min(), counts.max(),
             counts.max() / max(counts.min(), 1))
    log.info("checked in %.0f s; open %s (nothing was moved: --move-to Q --from %s does, once you agree)",
             result.seconds, out / REPORT_HTML, out)


def _read_csv(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    """The rows of a CSV that check wrote (perhaps edited since); ValueError naming the file when a column is
    missing."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `vit-flowers check PHOTOS --output {path.parent}` first")
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(missing)} (expected {', '.join(columns)})")
        return list(reader)


def flagged_files(from_dir: str | os.PathLike) -> dict[str, str]:
    """{relative path: why} of the photos a check's (possibly edited) CSVs flag: every photo of a group of
    duplicates but its first (in path order), and every photo of label_issues.csv."""
    pairs = [(r["path_a"], r["path_b"], r["kind"]) for r in _read_csv(Path(from_dir) / DUPLICATES_CSV,
                                                                       ("path_a", "path_b", "kind"))]
    names = sorted({p for a, b, _ in pairs for p in (a, b)})
    index = {p: i for i, p in enumerate(names)}
    kind_of = {p: kind for a, b, kind in pairs for p in (a, b)}
    why = {names[i]: f"duplicate ({kind_of[names[i]]}) of {names[group[0]]}"
           for group in union_groups(len(names), [(index[a], index[b]) for a, b, _ in pairs]) for i in group[1:]}
    for row in _read_csv(Path(from_dir) / LABELS_CSV, ("path", "given_label", "suggested_label")):
        why.setdefault(row["path"], f"label {row['given_label']}, looks like {row['suggested_label']}")
    return why


def move_flagged(root: str | os.PathLike, from_dir: str | os.PathLike, quarantine: str | os.PathLike) -> Path:
    """Move the photos :func:`flagged_files` names from ``root`` into ``quarantine``, keeping their class
    folders; returns QUARANTINE/moved.csv (source, destination, reason: one row written per move as it happens,
    so an interrupted move is undone as well). Every row is checked before the first move
    (:func:`vit_flowers.checking.moves.plan_moves`: a photo of ``root``, a destination inside the quarantine, a
    quarantine outside ``root``); refuses a quarantine that holds a moved.csv already."""
    root, quarantine = Path(root), Path(quarantine)
    record = quarantine / MOVED_CSV
    refuse_quarantine_inside(root, quarantine)
    if record.exists():
        raise FileExistsError(f"{record} exists: undo it first (vit-flowers check --undo {record}) or choose "
                              f"another --move-to folder")
    flagged = flagged_files(from_dir)
    moves = plan_moves(root, find_photos(root).paths, flagged, quarantine, from_dir)
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
    rows = _read_csv(record, ("source", "destination"))
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
        _write_csv(record, list(rows[0]), [list(r.values()) for r in left])
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


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("check", __doc__)
    p.add_argument("photos", nargs="?", help="a folder of class folders (or of train/ val/ folders of them)")
    p.add_argument("--output", help="the folder the CSVs and report.html are written to")
    p.add_argument("--split", help="a run's split.json: pairs with one photo in train and one in val are leaks")
    p.add_argument("--overwrite", action="store_true", help="replace the check already in --output")
    p.add_argument("--image-size", type=int, default=FEATURE_SIZE,
                   help="the network's input size (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="photos the network runs on at once "
                                                              "(default: %(default)s)")
    p.add_argument("--folds", type=int, default=5, help="folds of the cross-validation that scores the labels "
                                                        "(default: %(default)s)")
    p.add_argument("--move-to", metavar="QUARANTINE", help="move the photos flagged in --from's CSVs from PHOTOS "
                                                           "into this folder (outside PHOTOS; class folders kept), "
                                                           "nothing else")
    p.add_argument("--from", dest="from_dir", metavar="DIR", help="the --output of an earlier check, for --move-to")
    p.add_argument("--undo", metavar="MOVED_CSV", help="move every photo of a --move-to's moved.csv back")
    p.add_argument("--quiet", action="store_true", help="print warnings only, without the progress bar")
    return p


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.undo:
        undo_moves(args.undo)
    elif args.move_to:
        if not (args.photos and args.from_dir):
            parser.error("--move-to needs PHOTOS and --from DIR (the --output of a check of PHOTOS)")
        move_flagged(args.photos, args.from_dir, args.move_to)
    else:
        if not (args.photos and args.output):
            parser.error("give PHOTOS and --output DIR (or --move-to / --undo)")
        if min(args.image_size, args.batch_size) <= 0 or args.folds < 2:
            parser.error("--image-size and --batch-size must be positive, --folds at least 2")
        out = Path(args.output)
        refuse_existing_check(out, args.overwrite)  # before minutes of work, not after
        result = check_photos(find_photos(args.photos, args.split), image_size=args.image_size,
                              batch_size=args.batch_size, folds=args.folds, progress=not args.quiet)
        _log_summary(result, write_check(result, out, args.overwrite))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(quiet=args.quiet)
    keep_freed_memory()
    try:
        _run(args, parser)
    except (OSError, ValueError, ImageNetWeightsError) as exc:  # a missing folder, an existing check, a bad CSV
        log.error("error: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
