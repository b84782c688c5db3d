"""Teach a trained run a new flower from a few photos, without retraining: a new run that predicts every class.

    python -m vit_flowers.teach checkpoints/my-run --add lily=photos/lily --output checkpoints/my-run-lily
    vit-flowers teach checkpoints/my-run --add lily=photos/lily --add orchid=photos/orchid --output runs/more
    vit-flowers teach checkpoints/my-run --add rose=photos/more-roses --output runs/better-roses   # more photos

The new run's head is a logistic regression (:func:`vit_flowers.training.calibration.fit_head`, seconds) on the features
of the existing classes' training photos (up to 200 a class and their mirror images, kept in best.pt at the end of
training as ``teach_sample``; for an older run, read again from its training photos) and of the photos given
(5-20 to start, and their mirror images), each class weighted alike. It reads the CLS token and the mean of the
patch tokens (``head_input`` "cls+patches", each L2-normalised): the new run predicts, evaluates, exports to ONNX
and serves the app like any other, and keeps what it was fitted on, so it can be taught again. Its "none of these"
rule keeps the trained run's threshold, now measured against every class's mean. Photos of a class the run already
has are added to that class's.

The trunk does not change: a flower that its features do not tell apart from the others (a new species very
like a known one) needs a real fine-tune on a folder with the new class (``train --data``, from ImageNet
weights: ``--resume`` continues a run on its own classes only and refuses new ones). RUN is never changed;
NEW_RUN must not hold a run (or ``--overwrite``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .cli import command_parser, setup_logging
from .runs.checkpoint import CheckpointError
from .training.config import ConfigError
from .training.teaching import teach

__all__ = ["parse_add", "build_parser", "main"]

log = logging.getLogger(__name__)


def parse_add(text: str) -> tuple[str, Path]:
    """``NAME=FOLDER`` -> (name, folder); ValueError naming what is wrong."""
    name, sep, folder = text.partition("=")
    if not sep or not name.strip() or not folder.strip():
        raise ValueError(f"--add {text!r}: write it as NAME=FOLDER, e.g. --add lily=photos/lily")
    return name.strip(), Path(folder.strip())


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("teach", __doc__)
    p.add_argument("run", metavar="RUN", help="the trained run (a folder or a checkpoint file); never changed")
    p.add_argument("--add", action="append", required=True, metavar="NAME=FOLDER",
                   help="a class and a folder of its photos (5-20 are enough to start); repeat for more classes; "
                        "a class RUN already has gets the photos added to its own")
    p.add_argument("--output", required=True, metavar="NEW_RUN", help="the new run's folder (must not hold a run)")
    p.add_argument("--overwrite", action="store_true", help="let NEW_RUN replace a run in that folder")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    start = time.perf_counter()
    try:
        adds = [parse_add(text) for text in args.add]
        path = teach(args.run, adds, args.output, args.overwrite)
    except (CheckpointError, ConfigError, ValueError, OSError) as exc:
        log.error("error: %s", exc)
        return 1
    log.info("wrote %s in %.1f s; predict with `vit-flowers predict PHOTOS --checkpoint %s`", path,
             time.perf_counter() - start, path.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
