"""Tests for vit_flowers.evaluate: report files, metrics against sklearn, class mismatches."""

from __future__ import annotations

import csv
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import IMAGE_SIZE, predict_dataset, write_class_folders
from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support, top_k_accuracy_score

from vit_flowers.data.datasets import TensorImageDataset, load_synthetic
from vit_flowers.data.synthetic import CLASSES
from vit_flowers.evaluate import main
from vit_flowers.reporting.evaluation import ClassMismatchError, evaluate_dataset, match_classes
from vit_flowers.runs.checkpoint import load_model

REPORT_FILES = ["metrics.json", "confusion_matrix.png", "confusion_matrix.csv", "classification_report.txt",
                "misclassified.png", "report.md", "report.html", "predictions.csv"]


@pytest.fixture(scope="module")
def run(micro_run) -> Path:
    return micro_run  # this module's copy of the session's trained micro run


def _read_predictions(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _confusion(path: Path) -> np.ndarray:
    rows = list(csv.reader(path.open()))
    return np.array([[int(v) for v in r[1:]] for r in rows[1:]])


def test_no_arguments_evaluates_the_newest_run_on_its_validation_set(run, monkeypatch):
    monkeypatch.chdir(run.parent.parent)  # the folder holding checkpoints/
    assert main([]) == 0
    out = run / "eval-val"
    for name in REPORT_FILES + ["training_curves.png"]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    metrics = json.loads((out / "metrics.json").read_text())
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    n = len(CLASSES) * cfg["synthetic_val_per_class"]
    assert metrics["n_images"] == n and metrics["classes"] == list(CLASSES)
    assert _confusion(out / "confusion_matrix.csv").sum() == n

    # every number agrees with sklearn, computed here from the model's own outputs on the same images
    model, ckpt = load_model(run / "best.pt")
    val = load_synthetic(image_size=IMAGE_SIZE, train_per_class=0, val_per_class=cfg["synthetic_val_per_class"],
                         seed=cfg["seed"]).val
    probs = torch.softmax(model(torch.stack([(im / 255.0 - torch.tensor(ckpt["mean"]).view(3, 1, 1))
                                             / torch.tensor(ckpt["std"]).view(3, 1, 1) for im in val.images])), -1)
    y_true, y_pred = val.labels.numpy(), probs.argmax(1).numpy()
    rows = _read_predictions(out / "predictions.csv")
    assert [CLASSES.index(r["predicted"]) for r in rows] == y_pred.tolist()
    assert [CLASSES.index(r["true"]) for r in rows] == y_true.tolist()
    assert metrics["accuracy"] == pytest.approx(accuracy_score(y_true, y_pred))
    assert metrics["top_k"] == 2
    assert metrics["top_k_accuracy"] == pytest.approx(top_k_accuracy_score(y_true, probs.detach().numpy(), k=2))
    p, r, f, s = precision_recall_fscore_support(y_true, y_pred, labels=range(5), zero_division=0)
    for i, name in enumerate(CLASSES):
        got = metrics["per_class"][name]
        assert (got["precision"], got["recall"], got["f1"]) == pytest.approx((p[i], r[i], f[i]))
        assert got["support"] == s[i]
    assert metrics["macro_avg"]["f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro", zero_division=0))
    assert metrics["weighted_avg"]["f1"] == pytest.approx(f1_score(y_true, y_pred, average="weighted",
                                                                   zero_division=0))
    assert metrics["images_per_second"] > 0
    assert f"{metrics['accuracy']:.1%}" in (out / "report.md").read_text()
    assert "data:image/png;base64," in (out / "report.html").read_text()


def test_evaluate_dataset_api_for_train(run, tmp_path):
    model, ckpt = load_model(run / "best.pt")
    images = torch.randint(0, 256, (12, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=torch.uint8)
    labels = torch.arange(12) % 5
    dataset = TensorImageDataset(images, labels, list(CLASSES))
    metrics = evaluate_dataset(model, dataset, ckpt, tmp_path / "report", run_dir=run, top_k=3)
    on_disk = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert on_disk["accuracy"] == pytest.approx(metrics["accuracy"])
    assert metrics["n_images"] == 12 and metrics["top_k"] == 3
    pred = predict_dataset(model, dataset, ckpt["mean"], ckpt["std"], "cpu").argmax(1)
    assert metrics["accuracy"] == pytest.approx((pred == labels).float().mean().item())
    assert _confusion(tmp_path / "report" / "confusion_matrix.csv").sum() == 12
    for name in REPORT_FILES + ["training_curves.png"]:
        assert (tmp_path / "report" / name).stat().st_size > 0, name


def test_folder_with_an_unreadable_file(run, tmp_path):
    data = write_class_folders(tmp_path / "photos", per_class=3)
    (data / "rose" / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    out = tmp_path / "out"
    assert main(["--checkpoint", str(run), "--data", str(data), "--output", str(out), "--batch-size", "4"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_images"] == 15 and metrics["n_failed"] == 1
    assert _confusion(out / "confusion_matrix.csv").sum() == 15
    rows = _read_predictions(out / "predictions.csv")
    assert {Path(r["path"]).parent.name for r in rows[:15]} == set(CLASSES)
    assert all(Path(r["path"]).parent.name == r["true"] for r in rows[:15])
    assert rows[-1]["path"].endswith("broken.jpg") and rows[-1]["correct"].startswith("error")
    for name in REPORT_FILES:
        assert (out / name).stat().st_size > 0, name


def test_tta_scales_evaluates_every_photo_at_two_sizes(run, tmp_path):
    data = write_class_folders(tmp_path / "photos", per_class=3)
    for flag, name in (("--tta", "flip"), ("--tta-scales", "scales")):
        assert main(["--checkpoint", str(run), "--data", str(data), "--output", str(tmp_path / name), flag,
                     "--quiet"]) == 0
    flip, scales = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("flip", "scales"))
    assert flip["n_images"] == scales["n_images"] == 15
    assert "scales" in (tmp_path / "scales" / "report.md").read_text()  # the report says how it was made
    flip_rows, scale_rows = (_read_predictions(tmp_path / n / "predictions.csv") for n in ("flip", "scales"))
    assert [r["path"] for r in flip_rows] == [r["path"] for r in scale_rows]
    assert [r["confidence"] for r in flip_rows] != [r["confidence"] for r in scale_rows]  # the larger size counted


def test_default_output_is_next_to_the_checkpoint(run, tmp_path):
    data = write_class_folders(tmp_path / "garden", per_class=1)
    assert main(["--checkpoint", str(run / "best.pt"), "--data", str(data), "--quiet"]) == 0
    assert (run / "eval-garden" / "report.html").is_file()


def test_class_mismatch_is_a_clear_error(run, tmp_path, caplog):
    data = write_class_folders(tmp_path / "photos", per_class=2, classes=["daisy", "rose", "sunflower"],
                               names={"rose": "roses"})
    (data / "orchid").mkdir()
    shutil.copy(next((data / "daisy").iterdir()), data / "orchid" / "o.png")
    caplog.set_level(logging.ERROR)
    assert main(["--checkpoint", str(run), "--data", str(data), "--output", str(tmp_path / "out")]) == 1
    message = caplog.text
    assert "only in the data:       orchid, roses" in message
    assert "only in the checkpoint: dandelion, rose, tulip" in message
    assert "'roses' -> 'rose'?" in message
    assert "--shared-classes" in message
    assert not (tmp_path / "out").exists()


def test_shared_classes(run, tmp_path):
    data = write_class_folders(tmp_path / "photos", per_class=3, classes=["daisy", "rose", "tulip"])
    (data / "orchid").mkdir()
    shutil.copy(next((data / "daisy").iterdir()), data / "orchid" / "o.png")
    out = tmp_path / "out"
    assert main(["--checkpoint", str(run), "--data", str(data), "--output", str(out), "--shared-classes"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["classes"] == ["daisy", "rose", "tulip"]
    assert metrics["n_images"] == 9  # the orchid is not evaluated
    assert metrics["excluded_classes"] == {"checkpoint_only": ["dandelion", "sunflower"], "data_only": ["orchid"]}
    assert 0 <= metrics["predicted_outside_shared"] <= 9
    cm = _confusion(out / "confusion_matrix.csv")
    assert cm.shape == (3, 3) and cm.sum() == 9
    assert "dandelion" in (out / "report.md").read_text()  # the report says what was left out


def test_match_classes():
    assert match_classes(["b", "a"], ["a", "b"]) == ["a", "b"]  # order of the checkpoint
    assert match_classes(["a", "c"], ["a", "b", "c"], shared=True) == ["a", "c"]
    with pytest.raises(ClassMismatchError, match="no class"):
        match_classes(["x"], ["a", "b"], shared=True)
    with pytest.raises(ClassMismatchError, match="point --data at one of them"):
        match_classes(["train", "val"], ["a", "b"])


def test_folder_run_uses_its_split_json(run, tmp_path):
    data = write_class_folders(tmp_path / "photos", per_class=4)
    files = sorted(p.relative_to(data).as_posix() for p in data.rglob("*.png"))
    held_out = files[::4]
    folder_run = tmp_path / "runs" / "folder-run"
    folder_run.mkdir(parents=True)
    shutil.copy(run / "best.pt", folder_run / "best.pt")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg.update(dataset="folder", data=str(data))
    (folder_run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (folder_run / "split.json").write_text(json.dumps({"root": str(data), "classes": list(CLASSES),
                                                       "train": [f for f in files if f not in held_out],
                                                       "val": held_out}))
    assert main(["--checkpoint", str(folder_run)]) == 0
    rows = _read_predictions(folder_run / "eval-val" / "predictions.csv")
    assert sorted(Path(r["path"]).relative_to(data).as_posix() for r in rows) == held_out


def test_bad_checkpoint_and_arguments(tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    assert main(["--checkpoint", str(tmp_path / "missing.pt")]) == 1
    assert "missing.pt" in caplog.text
    assert main(["--runs", str(tmp_path)]) == 1  # no run at all
    assert "no trained run" in caplog.text
    assert main(["--top-k", "0"]) == 2


def test_a_second_evaluation_refuses_to_replace_the_first_report_unless_overwrite(run, tmp_path, caplog):
    out = tmp_path / "rep"
    args = ["--checkpoint", str(run), "--output", str(out), "--quiet"]
    assert main(args) == 0
    (out / "metrics.json").write_text("the first report\n")  # so that a replacement would show
    with caplog.at_level(logging.ERROR):
        assert main(args + ["--tta"]) == 1
    assert f"--output {out} already exists: pass --overwrite" in caplog.text
    assert (out / "metrics.json").read_text() == "the first report\n"
    assert main(args + ["--overwrite"]) == 0
    assert json.loads((out / "metrics.json").read_text())["n_images"] > 0
    (tmp_path / "empty").mkdir()  # an empty folder holds nothing to lose
    assert main(["--checkpoint", str(run), "--output", str(tmp_path / "empty"), "--quiet"]) == 0
