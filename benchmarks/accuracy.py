"""Accuracy of configs/flowers5.yaml from scratch on a CPU, on photos it never trained or tuned on.

flowers5 (one folder per species) is split once, stratified, with a fixed seed: a **test** share that no
run trains or tunes on, a **val** share (per-epoch validation, best.pt selection, all tuning) and the rest
for training. Every variant (the recipe, or the recipe with one ingredient changed) trains with
``vit_flowers.train`` on exactly that split; its best.pt is then scored once on test, with and without
horizontal-flip test-time augmentation (TTA: the mean of the logits of the image and its mirror), and with
"TTA2" (predict's ``--tta-scales``): flip TTA at the training size and at one patch more a side.

    # the recipe and its ablations (each variant trains as configured: ~15 min on 2 CPU cores)
    python benchmarks/accuracy.py --data /work/shared/data/flowers5
    # some variants only, shorter (ablations at a fixed number of epochs)
    python benchmarks/accuracy.py --data /work/shared/data/flowers5 --variants linear no_ema --epochs 20
    # redraw the table and the time-to-accuracy curve from the saved results (all, or some runs)
    python benchmarks/accuracy.py --plot-only
    python benchmarks/accuracy.py --plot-only --show recipe_s2 linear_s2

Writes <out>/<variant>/ (the run folder: metrics.csv, best.pt, ...), <out>/results.json (one entry per
variant), <out>/results.md (the table) and <out>/time_to_accuracy.png (val accuracy of the better of raw
and EMA weights vs. the run's wall clock, test accuracy marked at the end of each run).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from harness import ROOT, make_split, split_photos

from vit_flowers.data.augment import eval_transform
from vit_flowers.data.splits import save_split
from vit_flowers.inference.batches import TwoScaleTTA
from vit_flowers.inference.runtime import keep_freed_memory
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import load_model
from vit_flowers.train import train
from vit_flowers.training.config import load_config

log = logging.getLogger("benchmarks.accuracy")

# The config keys shown in the results table (the full config is in each run's config.yaml).
SETTINGS = ("patch_embed", "image_size", "patch_size", "augment", "crop_scale_min", "lr", "batch_size", "threads",
            "precision", "time_budget")

# Overrides of configs/flowers5.yaml; "recipe" is the config as it is, the others change one ingredient.
VARIANTS: dict[str, dict[str, Any]] = {
    "recipe": {},
    "linear": {"patch_embed": "linear"},  # the paper's linear patch embedding instead of the conv stem
    "no_ema": {"ema": False},
    "no_label_smoothing": {"label_smoothing": 0.0},
    "no_drop_path": {"drop_path": 0.0},
    "crop_flip_only": {"augment": "none"},  # no TrivialAugment
    "randaugment": {"augment": "randaugment"},
    "mixup_cutmix": {"mixup": 0.8, "cutmix": 1.0},
}


@torch.inference_mode()
def accuracy(model: torch.nn.Module, images_uint8: torch.Tensor, labels: torch.Tensor, mean: list[float],
             std: list[float], tta: bool, batch_size: int = 256) -> float:
    """Top-1 accuracy; with ``tta`` the logits of each image and its horizontal mirror are averaged."""
    correct = 0
    for images, y in zip(images_uint8.split(batch_size), labels.split(batch_size)):
        x = eval_transform(images, model.image_size, mean, std)  # (B, 3, S, S)
        logits = model(x)
        if tta:
            logits = (logits + model(x.flip(-1))) / 2
        correct += (logits.argmax(-1) == y).sum().item()
    return correct / len(labels)


def score(run_dir: Path, split: dict[str, Any], data: Path) -> dict[str, float]:
    """best.pt of ``run_dir`` on the val and test lists, with and without flip TTA, and with TTA2 (predict's
    ``--tta-scales``: flip TTA at the training size and at one patch more a side, the photos decoded at the
    larger size)."""
    model, ckpt = load_model(run_dir / runs.BEST)
    two_scales = TwoScaleTTA(model)
    out: dict[str, float] = {"best_epoch": ckpt["epoch"], "weights": ckpt.get("weights", "raw")}
    for name in ("val", "test"):
        ds = split_photos(split, name, data, model.image_size)
        for tta in (False, True):
            out[f"{name}_acc{'_tta' if tta else ''}"] = accuracy(model, ds.images, ds.labels, ckpt["mean"],
                                                                  ckpt["std"], tta)
        big = split_photos(split, name, data, two_scales.image_size)
        out[f"{name}_acc_tta2"] = accuracy(two_scales, big.images, big.labels, ckpt["mean"], ckpt["std"], tta=False)
    return out


def run_variant(name: str, args: argparse.Namespace, split: dict[str, Any]) -> dict[str, Any]:
    extra = dict(item.split("=", 1) for item in args.set)
    changes = {**VARIANTS[name], **{k: yaml.safe_load(v) for k, v in extra.items()}}
    run_name = name + args.tag
    run_dir = args.out / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in runs.RESULTS:  # a rerun starts from scratch (train refuses a folder that holds a run)
        (run_dir / stale).unlink(missing_ok=True)
    save_split(run_dir / runs.SPLIT, split)  # train.py reuses a split.json found in its run folder
    overrides: dict[str, Any] = {**changes, "data": str(args.data), "dataset": "folder",
                                 "out_dir": str(args.out), "run_name": run_name, "threads": args.threads,
                                 "progress": False}
    if args.epochs:
        overrides["epochs"] = args.epochs
    cfg = load_config(args.config, overrides)
    start = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - start
    rows = runs.read_metrics(run_dir / runs.METRICS)
    settings = {k: cfg.get(k) for k in SETTINGS}
    result = {"variant": run_name, "overrides": changes, "settings": settings, "split_seed": split["seed"],
              "epochs": len(rows), "wall_s": wall,
              "train_s": sum(r["seconds"] for r in rows), **score(run_dir, split, args.data)}
    log.info("%s: %s", name, json.dumps(result))
    return result


def write_table(results: dict[str, dict[str, Any]], path: Path) -> None:
    lines = ["| variant | settings | epochs | train min | wall min | val | val+TTA | test | test+TTA | test+TTA2 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results.values():
        change = ", ".join(f"{k}={v}" for k, v in r.get("settings", r["overrides"]).items())
        tta2 = f"{100 * r['test_acc_tta2']:.1f}" if "test_acc_tta2" in r else ""  # runs scored before TTA2
        lines.append(f"| {r['variant']} | {change} | {r['epochs']} | {r['train_s'] / 60:.1f} | {r['wall_s'] / 60:.1f} "
                     f"| {100 * r['val_acc']:.1f} | {100 * r['val_acc_tta']:.1f} | {100 * r['test_acc']:.1f} "
                     f"| {100 * r['test_acc_tta']:.1f} | {tta2} |")
    path.write_text("\n".join(lines) + "\n")


def plot(results: dict[str, dict[str, Any]], out: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        t, acc = 0.0, []
        for row in runs.read_metrics(out / name / runs.METRICS):
            elapsed = row.get("elapsed", math.nan)  # the run's wall clock (validation included) where recorded
            t = elapsed if math.isfinite(elapsed) else t + row["seconds"]
            ema = row["val_acc_ema"]
            acc.append((t / 60, 100 * max(row["val_acc"], ema if ema == ema else 0.0)))
        (line,) = ax.plot(*zip(*acc), label=f"{name} (test {100 * r['test_acc']:.1f}%)")
        ax.plot([acc[-1][0]], [100 * r["test_acc"]], marker="*", markersize=10, color=line.get_color())
    ax.axhline(85, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training wall-clock minutes (per-epoch validation included)")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title("flowers5 from scratch: val accuracy per epoch (line), held-out test (star)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/flowers5"), help="flowers5 folder")
    parser.add_argument("--config", default=str(ROOT / "configs" / "flowers5.yaml"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--epochs", type=int, default=0, help="override the config's epochs (0 = keep)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra config overrides for every variant run now (for tuning on val)")
    parser.add_argument("--tag", default="", help="suffix of the run names (e.g. to keep tuning runs apart)")
    parser.add_argument("--test-fraction", type=float, default=0.15)
    parser.add_argument("--val-fraction", type=float, default=0.10)
    parser.add_argument("--split-seed", type=int, default=2024)
    parser.add_argument("--out", type=Path, default=ROOT / "checkpoints" / "accuracy")
    parser.add_argument("--plot-only", action="store_true", help="only redraw results.md and the PNG")
    parser.add_argument("--show", nargs="+", metavar="RUN", help="runs (variant + tag) to put in the table and the "
                        "PNG (default: every run in results.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    keep_freed_memory()  # as `python -m vit_flowers.train` does: without it page faults cost a 224-px hybrid ~half
    results_file = args.out / "results.json"
    results: dict[str, dict[str, Any]] = json.loads(results_file.read_text()) if results_file.is_file() else {}
    if not args.plot_only:
        if not args.data.is_dir():
            log.error("data folder not found: %s", args.data)
            return 2
        split = make_split(args.data, args.test_fraction, args.val_fraction, args.split_seed)
        args.out.mkdir(parents=True, exist_ok=True)
        save_split(args.out / runs.SPLIT, split)
        log.info("split: %d train, %d val, %d test", len(split["train"]), len(split["val"]), len(split["test"]))
        for name in args.variants:
            result = run_variant(name, args, split)
            results[result["variant"]] = result
            results_file.write_text(json.dumps(results, indent=1) + "\n")
    if not results:
        log.error("no results in %s", results_file)
        return 2
    if args.show:
        missing = [name for name in args.show if name not in results]
        if missing:
            log.error("not in %s: %s (there: %s)", results_file, ", ".join(missing), ", ".join(results))
            return 2
        results = {name: results[name] for name in args.show}
    write_table(results, args.out / "results.md")
    plot(results, args.out, args.out / "time_to_accuracy.png")
    log.info("wrote %s and %s", args.out / "results.md", args.out / "time_to_accuracy.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
