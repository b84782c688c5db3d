"""The shared micro run (tests/helpers.py's train_micro_run, conftest's micro_run) is the real trainer's run:
the files a user's run writes, its metrics those of its model."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from helpers import MICRO, MICRO_MIN_ACCURACY, SEED

from vit_flowers.data.synthetic import CLASSES
from vit_flowers.runs.checkpoint import FORMAT, load_checkpoint
from vit_flowers.training.config import load_config


def _metrics(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_the_micro_run_is_a_trainer_run_of_smoke_yaml(micro_run):
    names = {p.name for p in micro_run.iterdir()}
    assert {"best.pt", "last.pt", "config.yaml", "metrics.csv", "curves.png", "report"} <= names
    assert os.readlink(micro_run.parent / "latest") == micro_run.name
    cfg = load_config(micro_run / "config.yaml")
    flat = cfg.flat()
    assert {k: flat[k] for k in MICRO} == MICRO and flat["seed"] == SEED and flat["precision"] == "fp32"
    assert flat["model"] == "vit_micro" and flat["dataset"] == "synthetic"
    ckpt = load_checkpoint(micro_run / "best.pt")
    assert ckpt["format"] == FORMAT and ckpt["classes"] == list(CLASSES)
    assert ckpt["unknown"] is not None and ckpt["class_means"] is not None and ckpt["teach_sample"] is not None


def test_the_micro_runs_metrics_are_its_models(micro_run):
    """metrics.csv has a row per epoch; best.pt holds the best of its validation accuracies (raw or EMA), and the
    report scores best.pt on the same validation flowers."""
    rows = _metrics(micro_run)
    assert [int(r["epoch"]) for r in rows] == list(range(1, MICRO["epochs"] + 1))
    best = max(max(float(r["val_acc"]), float(r["val_acc_ema"])) for r in rows)
    ckpt = load_checkpoint(micro_run / "best.pt")
    assert ckpt["best_accuracy"] == best > MICRO_MIN_ACCURACY
    report = json.loads((micro_run / "report" / "metrics.json").read_text())
    assert report["n_images"] == MICRO["synthetic_val_per_class"] * len(CLASSES)
    assert abs(report["accuracy"] - best) < 1e-6
