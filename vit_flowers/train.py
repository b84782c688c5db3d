"""Train a ViT flower classifier.

Examples:

    # offline quick start: the built-in synthetic flowers, a 3-minute training budget
    python -m vit_flowers.train

    # your own photos (one folder per class, or train/ and val/ folders): the hybrid ViT from ImageNet weights
    python -m vit_flowers.train --data path/to/photos
    python -m vit_flowers.train --config configs/flowers5.yaml --data ../shared/data/flowers5

    # as many epochs as fit in 15 minutes (the cosine schedule follows the clock), bf16 where the hardware has it
    python -m vit_flowers.train --data path/to/photos --time-budget 15 --precision auto

    # public datasets (downloaded into data/ when online)
    python -m vit_flowers.train --config configs/flowers102.yaml
    python -m vit_flowers.train --dataset flower_photos

    # fine-tune timm's pretrained ViT-Ti/16 (a timm name when online, or a local weights file)
    python -m vit_flowers.train --data photos --model vit_ti16 --image-size 224 --pretrained vit_tiny_patch16_224

    # the pure ViT from scratch on your photos (no pretrained part)
    python -m vit_flowers.train --config configs/flowers5.yaml --data path/to/photos

    # continue the newest run where it stopped
    python -m vit_flowers.train --resume auto

    # two processes with DistributedDataParallel (gloo on CPU, nccl on GPU)
    torchrun --nproc_per_node 2 -m vit_flowers.train --config configs/smoke.yaml

Every run writes checkpoints/<run>/ : last.pt, best.pt, config.yaml, metrics.csv,
curves.png, split.json (folder datasets) and the evaluation report of best.pt.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import torch

from .cli import command_parser, setup_logging
from .inference.runtime import keep_freed_memory
from .models.vit import ViT
from .runs import folders as runs
from .runs.checkpoint import CheckpointError
from .training.config import (
    PHOTO_RECIPE,
    ConfigError,
    TrainConfig,
    add_config_arguments,
    config_defaults,
    config_from_args,
    shipped_recipe,
)
from .training.distributed import close_distributed, init_distributed
from .training.trainer import TrainingError, final_report, fit, refit_best, start_run

__all__ = ["PHOTO_DEFAULTS", "QUICK_START_DEFAULTS", "TrainResult", "TrainingError", "RunInterrupted", "train",
           "main"]

log = logging.getLogger("vit_flowers.train")

# What `--data PHOTOS` trains when no --config is given: the most accurate model that fits 14 minutes of a laptop
# CPU, the hybrid ViT from ImageNet weights (benchmarks/README.md). Its one home is configs/flowers5-imagenet.yaml,
# shipped inside the package; the synthetic quick start is TrainConfig's defaults with configs/default.yaml's changes
# (a clock, not an epoch count, so that the demo takes minutes on any 2-core CPU).
PHOTO_DEFAULTS: dict[str, Any] = shipped_recipe(PHOTO_RECIPE)
QUICK_START_DEFAULTS: dict[str, Any] = shipped_recipe("default.yaml")


@dataclasses.dataclass
class TrainResult:
    run_dir: Path  # the run folder (checkpoints, metrics, report)
    model: ViT  # the trained model (raw weights of the last epoch)
    best_accuracy: float  # best validation accuracy (raw or EMA weights)
    time_budget: float = 0.0  # the run's time_budget (minutes; a resumed run's own), 0 for none


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`train`, with what the line that reports it needs: the run (None: stopped before the run
    started, nothing written) and its config."""

    def __init__(self, run_dir: Path | None, cfg: TrainConfig) -> None:
        super().__init__()
        self.run_dir, self.cfg = run_dir, cfg

    def message(self) -> str:
        """The one line for the user: a command that continues the run where one can, what to do where none can."""
        if self.run_dir is None:
            return "interrupted before training started: nothing was saved; run the same command again"
        if not (self.run_dir / runs.LAST).is_file():
            return "interrupted in the first epoch: nothing to resume; run the same command again to start afresh"
        command = ["python", "-m", "vit_flowers.train", "--resume", str(self.run_dir)]
        if self.cfg.data.path and self.cfg.data.dataset == "folder":  # (as the run was given it, from this shell)
            command += ["--data", self.cfg.data.path]
        return f"interrupted: the last completed epoch is saved; continue with `{shlex.join(command)}`"


def train(cfg: TrainConfig, given: frozenset[str] | None = None, started: float | None = None) -> TrainResult:
    """Train according to ``cfg``: set up (or resume) the run, fit it, write the report of its best.pt. ``given``: the
    keys the user set (:func:`~vit_flowers.training.config.read_config`), which a resumed run takes over its own.
    ``started``: when the command started (``time.perf_counter()``; default: now), where the time budget's clock
    starts: setting up, training and the report all count."""
    started = time.perf_counter() if started is None else started
    ctx, device = init_distributed(cfg.run.device)
    run, threads = None, torch.get_num_threads()  # (the head start may run, and the run end, on one)
    try:
        run = start_run(cfg, ctx, device, given)
        fit(run, started)
        if ctx.main and cfg.run.report and not run.stopped_early:
            final_report(run)
        if not run.stopped_early:
            refit_best(run)
        return TrainResult(run.run_dir, run.model, run.kept.best_acc, run.cfg.optim.time_budget)
    except KeyboardInterrupt as exc:
        if isinstance(exc, RunInterrupted):
            raise
        raise RunInterrupted(run.run_dir if run is not None else None, run.cfg if run is not None else cfg) from exc
    finally:
        torch.set_num_threads(threads)
        close_distributed(ctx)


def photo_defaults_help() -> str:
    """What ``--help`` says about PHOTO_DEFAULTS: the keys in which they differ from TrainConfig's."""
    typed = config_defaults()
    changed = ", ".join(f"{k} {v}" for k, v in PHOTO_DEFAULTS.items() if typed[k] != v)
    return textwrap.fill(f"--data PATH without --config (a new run on a folder of photos) changes these defaults: "
                         f"{changed} (the defaults above are those of the synthetic quick start)", width=100)


def build_parser() -> argparse.ArgumentParser:
    """train's options: --config and one option per config key; its --help ends with what PHOTO_DEFAULTS
    change."""
    parser = command_parser("train", __doc__)
    parser.epilog = photo_defaults_help()
    parser.add_argument("--config", help="a YAML file of config keys (see configs/); the options given here "
                                         "override it")
    add_config_arguments(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def run_command(args: argparse.Namespace, defaults: dict | None = None, started: float | None = None) -> int:
    """Train from parsed arguments (over a command's own ``defaults``); the exit status of the CLI. ``started``: when
    the command started (default: now), the time budget's clock and the last line's."""
    started = time.perf_counter() if started is None else started
    rank = int(os.environ.get("RANK", "0"))
    if rank:
        logging.getLogger().setLevel(logging.WARNING)
    try:
        cfg, given = config_from_args(args, defaults)
        result = train(cfg, given, started)
    except (ConfigError, CheckpointError, TrainingError, OSError, ValueError) as exc:  # OSError: e.g. a full disk
        log.error("%s", exc)
        return 2
    except RunInterrupted as exc:
        log.error("%s", exc.message())
        return 130
    except KeyboardInterrupt:  # (while the config was read)
        log.error("interrupted")
        return 130
    if rank == 0:
        minutes = (time.perf_counter() - started) / 60
        against = f" of its {result.time_budget:g}-min time budget" if result.time_budget else ""
        log.info("done: evaluate with `python -m vit_flowers.evaluate --checkpoint %s`", result.run_dir / runs.BEST)
        log.info("the whole command took %.1f min%s", minutes, against)  # the last line: what the budget promised
    return 0


def command_defaults(args: argparse.Namespace) -> dict[str, Any] | None:
    """PHOTO_DEFAULTS under a new run on a folder of photos given without --config; QUICK_START_DEFAULTS for the
    bare command (no data, dataset, config or resume); else TrainConfig's own."""
    if args.config or args.resume:
        return None
    if args.data and args.dataset in (None, "folder"):
        return PHOTO_DEFAULTS
    return QUICK_START_DEFAULTS if not args.data and args.dataset in (None, "synthetic") else None


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the time budget's clock (the imports before it: a second or two)
    setup_logging(timestamps=True)
    keep_freed_memory()
    args = parse_args(argv)
    return run_command(args, command_defaults(args), started)


if __name__ == "__main__":
    sys.exit(main())
