"""Label a folder of unlabelled photos with a run's help: the run suggests a class for every photo not labelled yet
(a CSV to check and edit), the accepted rows become training photos (copied into the run's class-folder tree of
photos; the folder itself is only read), and a new run trained on the grown photos suggests the rest better.

The labels live in one file beside the training photos (`PHOTOS.labels.json`, written atomically): which photo
(by its content's SHA-256 and its path) is labelled what, by the user or as an accepted suggestion, in which round.
A photo whose content is labelled already (a copy under another name) is labelled once; files that are not photos,
or cannot be read, are listed and skipped. The web page's Label tab (`vit-flowers app`) reads and writes the same
file.

    vit-flowers label ~/summer --run checkpoints/latest                     # suggestions: PHOTOS-suggestions-1.csv
    vit-flowers label ~/summer --run checkpoints/latest --accept PHOTOS-suggestions-1.csv   # (after editing it)
    vit-flowers label ~/summer --run checkpoints/latest --accept edited.csv --train 3     # and retrain, 3 minutes
    vit-flowers label ~/summer --run checkpoints/latest --order uncertain   # the least certain first (most useful)
    vit-flowers label ~/summer --run checkpoints/latest --rename rose=garden_rose    # a class renamed mid-way

`--photos DIR` names the training photos when the run was not trained on a folder (default: the run's --data).
"""

from __future__ import annotations

import argparse
import csv
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .cli import command_parser, open_model, setup_logging
from .data.image_files import printable_name
from .inference import INFERENCE_BATCH
from .labelling.loop import (
    ORDERS,
    Accepted,
    accept_csv,
    check_places,
    next_round,
    ordered,
    rename_class,
    run_photos,
    scan_folder,
    suggest,
    train_argv,
    train_command,
)
from .labelling.state import LabelState, StateError, open_state, save_state
from .runs import folders as runs
from .runs.errors import CheckpointError

__all__ = ["build_parser", "main", "write_suggestions"]

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("label", __doc__)
    p.add_argument("folder", metavar="FOLDER", help="the folder of photos to label (sub-folders included; only read)")
    p.add_argument("--run", required=True, help="the run that suggests (a run folder or checkpoint)")
    p.add_argument("--photos", help="the class-folder tree of training photos the accepted photos are copied into "
                                    "(default: the folder the run was trained on)")
    p.add_argument("--accept", metavar="CSV", help="accept the rows of this CSV (path, label columns: the "
                                                    "suggestions, edited, or predict --output's) as labels")
    p.add_argument("--train", type=float, metavar="MINUTES",
                   help="with --accept: then train a new run on the grown photos for MINUTES")
    p.add_argument("--rename", metavar="OLD=NEW", help="rename a class mid-way: its training photos' folder, its "
                                                        "labels, and the run's suggestions of it from now on")
    p.add_argument("--output", help="where the suggestions CSV goes (default: beside the photos, "
                                    "PHOTOS-suggestions-ROUND.csv)")
    p.add_argument("--order", choices=ORDERS, default="confident",
                   help="the suggestions' order within each class: confident (go fast) or uncertain (the most useful "
                        "labels first) (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=INFERENCE_BATCH, help="photos run at once (default: %(default)s)")
    p.add_argument("--device", default="auto", help="where the run predicts (default: %(default)s)")
    return p


def write_suggestions(state: LabelState, path: Path, order: str = "confident") -> int:
    """The suggestions as a CSV that ``--accept`` reads back (``path``, ``label``, ``confidence``, the runner-up),
    class by class in ``order``; written whole or not at all. Returns the rows written."""
    import io

    from .runs.checkpoint import atomic_write_text

    buf = io.StringIO()
    out = csv.writer(buf)
    out.writerow(["path", "label", "confidence", "label_2", "confidence_2"])
    n = 0
    for cls in state.classes:
        for _, s in ordered(state, cls, order):
            out.writerow([s.path, s.label, f"{s.confidence:.6f}", s.second, f"{s.second_confidence:.6f}"])
            n += 1
    atomic_write_text(path, buf.getvalue())
    return n


def _report_accept(result: Accepted) -> None:
    logger.info("labelled %d photo(s) (%d copied into the training photos)%s%s", result.labelled, result.copied,
                f"; {result.already} labelled already (by content)" if result.already else "",
                f"; new class(es): {', '.join(result.new_classes)}" if result.new_classes else "")
    for path, why in list(result.refused.items())[:20]:
        logger.warning("not labelled: %s: %s", printable_name(path), why)
    if len(result.refused) > 20:
        logger.warning("... and %d more not labelled", len(result.refused) - 20)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    folder = Path(args.folder).expanduser()
    try:
        loaded = open_model(args.run, device=args.device, command="label")
        photos = Path(args.photos) if args.photos else run_photos(loaded)
        if photos is None:
            raise ValueError(f"{args.run} was not trained on a folder of photos: name the training photos with "
                             f"--photos DIR (a class-folder tree; made when missing)")
        check_places(photos, folder)
        state = open_state(photos, folder=folder, run=str(Path(loaded.path).resolve().parent),
                           classes=list(loaded.ckpt["classes"]))
        if args.rename:
            old, _, new = args.rename.partition("=")
            rename_class(state, old.strip(), new.strip())
            save_state(state)
            logger.info("renamed %s to %s: labels %s", old.strip(), new.strip(),
                        ", ".join(f"{k} {v}" for k, v in state.counts().items()))
            return 0
        if args.accept:
            result = accept_csv(state, Path(args.accept))
            save_state(state)
            _report_accept(result)
            logger.info("labels: %s (%s)", ", ".join(f"{k} {v}" for k, v in state.counts().items()), state.path)
            if args.train is None:
                logger.info("next: train on the grown photos, then label again with the new run:\n  %s",
                            train_command(state, 3))
                return 0
            code = subprocess.call([sys.executable, "-m", "vit_flowers.train", *train_argv(state, args.train)])
            if code == 0:
                logger.info("next: label again with the new run: vit-flowers label %s --run %s/%s", args.folder,
                            runs.RUNS_HOME, runs.LATEST)
            return code
        from .inference.precision import inference_dtype

        todo = scan_folder(state)
        next_round(state)
        n = suggest(state, loaded, todo, batch_size=args.batch_size, bar=True,
                    amp_dtype=inference_dtype(loaded, len(todo), precision="auto", batch_size=args.batch_size))
        save_state(state)
        out = Path(args.output) if args.output else photos.parent / f"{photos.name}-suggestions-{state.round}.csv"
        write_suggestions(state, out, args.order)
    except (CheckpointError, StateError, ValueError, OSError) as exc:
        logger.error("error: %s", exc)
        return 1
    by_class = {c: len(ordered(state, c)) for c in state.classes}
    logger.info("round %d: %d photo(s) to label, suggested: %s", state.round, n,
                ", ".join(f"{c} {k}" for c, k in by_class.items() if k))
    labelled = len(state.labelled_paths())
    logger.info("%d labelled already, %d duplicate(s) of a labelled photo, %d file(s) skipped (not a photo or "
                "unreadable)", labelled, len(state.duplicates), len(state.unreadable))
    for path, why in list(state.unreadable.items())[:10]:
        logger.info("  skipped %s: %s", printable_name(path), why)
    logger.info("wrote %s: check it (change a wrong label, delete a row you are not sure of, 'skip' for not a "
                "flower), then:\n  vit-flowers label %s --run %s --accept %s", out, args.folder, args.run, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
