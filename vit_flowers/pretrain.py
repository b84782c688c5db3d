"""Pretrain a ViT on images drawn from formulas (fractals), then fine-tune it on photos.

No natural image and no downloaded weight: every pixel comes from iterated function systems drawn by
``vit_flowers/data/fractals.py``, and the labels are the formulas themselves. The run folder is a training
run like any other (resume, time budget, precision, torchrun and a GPU all work as for ``train``); its
``best.pt`` is what ``train --pretrained`` starts from.

Examples:

    # pretrain for two hours on this machine, in chunks of 40 minutes (resume continues on the same schedule)
    python -m vit_flowers.pretrain --config configs/pretrain-fractals.yaml --time-budget 120 --stop-after 40
    python -m vit_flowers.pretrain --config configs/pretrain-fractals.yaml --resume auto

    # fine-tune on your photos from that run, or from the weights that ship with the package
    python -m vit_flowers.train --config configs/flowers5-pretrained.yaml --data photos \\
        --pretrained checkpoints/pretrain-fractals/best.pt
    python -m vit_flowers.train --config configs/flowers5-pretrained.yaml --data photos   # --pretrained fractal

    # write a run's weights as the shipped file (fp16 safetensors, with how they were made)
    python -m vit_flowers.pretrain --export checkpoints/latest --output vit_flowers/weights/fractal-....safetensors
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from pathlib import Path
from typing import Any

from .cli import command_prog, setup_logging
from .inference.runtime import keep_freed_memory
from .runs import folders as runs

__all__ = ["PRETRAIN_DEFAULTS", "export_weights", "main"]

log = logging.getLogger("vit_flowers.pretrain")

# The command's own defaults, under --config and --key value: the recipe model's shape, fractal data, no
# evaluation report (a confusion matrix of 1,000 formulas says little).
PRETRAIN_DEFAULTS: dict[str, Any] = {
    "dataset": "fractals", "image_size": 96, "cache_size": 112, "model": "vit_tiny_cpu", "patch_size": 16,
    "patch_embed": "conv_deep", "augment": "none", "batch_size": 128, "lr": 1e-3, "warmup_epochs": 1,
    "epochs": 1000, "report": False,
}


def export_weights(run: str | Path, output: str | Path, half: bool = True) -> Path:
    """Write a pretraining run's best weights to ``output`` (safetensors) with a record of how they were made."""
    from .runs.checkpoint import load_model, resolve_checkpoint, save_safetensors

    path = resolve_checkpoint(run, name=runs.BEST)
    model, ckpt = load_model(path)
    cfg = ckpt.get("config", {})
    history = _history(path.parent)[:ckpt["epoch"]]  # the epochs up to the exported weights
    record = {
        "source": "formula-driven pretraining (vit_flowers.data.fractals): no natural image, no downloaded weight",
        "dataset": cfg.get("dataset"), "categories": str(cfg.get("fractal_classes")),
        "instances_per_category": str(cfg.get("fractal_train_per_class")), "seed": str(cfg.get("seed")),
        "epochs": str(ckpt["epoch"]), "images_seen": str(sum(int(r["images"]) for r in history)),
        "hours": f"{(history[-1]['elapsed'] / 3600) if history else 0:.2f}",
        "val_accuracy": f"{ckpt['best_accuracy']:.4f}", "hardware": _cpu_name(),
        "config": json.dumps(cfg),
    }
    out = save_safetensors(model, output, half=half, extra=record)
    log.info("wrote %s (%.1f MB, %s) from %s: %s", out, out.stat().st_size / 2**20, "fp16" if half else "fp32",
             path, {k: v for k, v in record.items() if k != "config"})
    return out


def _cpu_name() -> str:
    """This machine's CPU model, as /proc/cpuinfo names it (where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _history(run_dir: Path) -> list[dict[str, float]]:
    """The run's metrics.csv rows (none when it has none), with the images each epoch saw: its training time at its
    throughput."""
    metrics = run_dir / runs.METRICS
    rows = runs.read_metrics(metrics) if metrics.is_file() else []
    for row in rows:
        row["images"] = round(row["seconds"] * row["images_per_s"])
    return rows


def build_parser() -> argparse.ArgumentParser:
    """train's options, with this command's description and defaults (--export has a parser of its own)."""
    from .train import build_parser as train_parser

    return train_parser("pretrain", __doc__, PRETRAIN_DEFAULTS)


def main(argv: list[str] | None = None) -> int:
    from .train import run_command

    setup_logging(timestamps=True)
    keep_freed_memory()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--export" in argv:
        p = argparse.ArgumentParser(prog=command_prog("pretrain") + " --export",
                                    description="write a pretraining run's weights as a .safetensors file")
        p.add_argument("--export", required=True, metavar="RUN", help="a pretraining run folder or checkpoint")
        p.add_argument("--output", required=True, help="the .safetensors file to write")
        p.add_argument("--fp32", action="store_true", help="keep fp32 weights (default: fp16, half the size)")
        args = p.parse_args(argv)
        try:
            export_weights(args.export, args.output, half=not args.fp32)
        except (OSError, ValueError, RuntimeError) as exc:
            log.error("%s", exc)
            return 2
        return 0
    return run_command(build_parser().parse_args(argv), defaults=PRETRAIN_DEFAULTS)


if __name__ == "__main__":
    sys.exit(main())
