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
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .checking.check_files import REPORT_HTML, refuse_existing_check, write_check
from .checking.moves import move_flagged, undo_moves
from .checking.photo_check import FEATURE_SIZE, TINY_SIDE, CheckResult, check_photos, find_photos
from .cli import command_parser, setup_logging
from .inference import INFERENCE_BATCH
from .inference.runtime import keep_freed_memory
from .models.efficientnet import ImageNetWeightsError

__all__ = ["build_parser", "main"]

log = logging.getLogger("vit_flowers.check")


def _log_summary(result: CheckResult, out: Path) -> None:
    """What the check found, in four lines of the log."""
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


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("check", __doc__)
    p.add_argument("photos", nargs="?", help="a folder of class folders (or of train/ val/ folders of them)")
    p.add_argument("--output", help="the folder the CSVs and report.html are written to")
    p.add_argument("--split", help="a run's split.json: pairs with one photo in train and one in val are leaks")
    p.add_argument("--overwrite", action="store_true", help="replace the check already in --output")
    p.add_argument("--image-size", type=int, default=FEATURE_SIZE,
                   help="the network's input size (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=INFERENCE_BATCH, help="photos the network runs on at once "
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
