"""Teach a trained run a new flower from a few photos, without retraining: a new run that predicts every class.

    python -m vit_flowers.teach checkpoints/my-run --add lily=photos/lily --output checkpoints/my-run-lily
    vit-flowers teach checkpoints/my-run --add lily=photos/lily --add orchid=photos/orchid --output runs/more
    vit-flowers teach checkpoints/my-run --add rose=photos/more-roses --output runs/better-roses   # more photos

The new run keeps what the run knows and adds the new classes (seconds): for a hybrid (EfficientNet-Lite's
pretrained stages as its patch embedding, as the recipes train), its trained head scores the trained classes and a
gate, a logistic regression over every class on the trunk's pooled output (:mod:`vit_flowers.teaching.gate`),
shares the probability between them and the taught ones; for another model, the head is refitted as a logistic
regression on the CLS token and the patch mean (``head_input`` "cls+patches"). Either is fitted on the features of
the existing classes' training photos (up to 200 a class and their mirror images, kept in best.pt at the end of
training as ``teach_sample``; for an older run, read again from its training photos) and of the photos given (5-20
to start, and their mirror images), each class weighted alike. The new run predicts, evaluates, exports to ONNX and
serves the app like any other, and keeps what it was fitted on, so it can be taught again. Photos of a class the
run already has are added to that class's (a hybrid's trained class: to its mean and kept features alone, for later
teaches; nothing is fitted, so nothing is estimated).

Before writing, it estimates how often each taught class will be recognised: each photo given is predicted by the new
run's classifier fitted without it (leave-one-out; 10 folds beyond ten photos; a hybrid's: its trained head mixed
with a gate fitted without it) and
judged by the "none of these" rule made without it, with a range (an 80% interval: ten photos say little more), and
the log says what the misses were called and what would help ("tulip: about 60% will be recognised, likely 40% to
77% ... called rose in 4 of 10: add photos ..."); best.pt keeps the estimate (``taught``). Its "none of these" rule is
measured again with the taught classes in: their means, the shared covariance with their photos' spread, and an
allowance per taught class chosen so that its photos, each left out of its class's mean, are accepted as often as
held-out photos of the old classes (:mod:`vit_flowers.teaching.rule`).

The trunk does not change: a flower that its features do not tell apart from the others (a new species very
like a known one) needs a real fine-tune on a folder with the new class (``train --data``, from ImageNet
weights: ``--resume`` continues a run on its own classes only and refuses new ones). A class name has 1 to 64
characters, no '/', '\\' or newline, and is not '.', '..' or 'unknown'. RUN is never changed; NEW_RUN must not be
inside it, hold a run (or ``--overwrite``) or hold other files, and is written in one go at the end: an error or
Ctrl-C leaves nothing of it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .cli import command_parser, setup_logging
from .data.class_names import check_class_name
from .data.config import ConfigError
from .runs.checkpoint import CheckpointError
from .teaching.teach import teach

__all__ = ["parse_add", "build_parser", "main"]

log = logging.getLogger(__name__)


def parse_add(text: str) -> tuple[str, Path]:
    """``NAME=FOLDER`` -> (name, folder); ValueError naming what is wrong (the name's rule:
    :func:`vit_flowers.data.class_names.check_class_name`, which the app applies too)."""
    name, sep, folder = text.partition("=")
    if not sep or not folder.strip():
        raise ValueError(f"--add {text!r}: write it as NAME=FOLDER, e.g. --add lily=photos/lily")
    return check_class_name(name), Path(folder.strip())


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
        result = teach(args.run, adds, args.output, args.overwrite)
    except (CheckpointError, ConfigError, ValueError, OSError) as exc:
        log.error("error: %s", exc)
        return 1
    except KeyboardInterrupt:
        log.error("interrupted: %s was not written", args.output)
        return 130
    log.info("wrote %s (%d classes) in %.1f s; predict with `vit-flowers predict PHOTOS --checkpoint %s`",
             result.best, len(result.classes), time.perf_counter() - start, result.best.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
