"""Run folders written by older vit_flowers (tests/data/runs/, see its README.md) still predict, evaluate, export
to ONNX and are taught a new class with today's code, and none of these commands changes a byte of the folder."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import file_digests, write_class_folders, write_crops

from vit_flowers.data.synthetic import CLASSES
from vit_flowers.evaluate import main as evaluate_main
from vit_flowers.inference.unknown import UNKNOWN
from vit_flowers.predict import main as predict_main
from vit_flowers.runs.checkpoint import FORMAT, VERSION, load_checkpoint
from vit_flowers.teach import main as teach_main

OLD_RUNS = Path(__file__).resolve().parent / "data" / "runs"
FOLDERS = sorted(p.name for p in OLD_RUNS.iterdir() if p.is_dir())  # v1-<commit>, v2-<commit>, ...
RUN_FILES = ["best.pt", "config.yaml", "metrics.csv"]  # what each folder keeps of its run




def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(params=FOLDERS)
def old_run(request, tmp_path) -> Path:
    """A test's own copy of one old run folder (the committed folder is never written to)."""
    return Path(shutil.copytree(OLD_RUNS / request.param, tmp_path / "runs" / request.param))


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """Two synthetic flowers of each class, as PNG files in class folders."""
    return write_class_folders(tmp_path_factory.mktemp("photos") / "p", per_class=2, seed=4)


def test_the_old_runs_are_what_their_readme_says():
    """Each folder holds a run's files, its best.pt of the format its name gives (v1: ``vit_flowers/1``), none newer
    than today's."""
    assert len(FOLDERS) >= 2
    for name in FOLDERS:
        assert sorted(p.name for p in (OLD_RUNS / name).iterdir()) == sorted(RUN_FILES)
        raw = torch.load(OLD_RUNS / name / "best.pt", map_location="cpu", weights_only=False)
        version = int(name.split("-")[0].removeprefix("v"))
        assert raw["format"] == f"vit_flowers/{version}" and version <= VERSION


def test_an_old_run_loads_as_todays_checkpoint(old_run):
    before = file_digests(old_run)
    ckpt = load_checkpoint(old_run / "best.pt")
    assert ckpt["format"] == FORMAT and ckpt["classes"] == list(CLASSES) and ckpt["image_size"] == 32
    assert ckpt["model_config"]["dim"] == 32 and ckpt["model_config"]["depth"] == 1
    assert file_digests(old_run) == before  # loading migrates in memory, never on disk


def test_an_old_run_predicts(old_run, photos, tmp_path):
    before = file_digests(old_run)
    out = tmp_path / "p.csv"
    assert predict_main([str(photos), "--recursive", "--checkpoint", str(old_run), "--output", str(out),
                         "--quiet"]) == 0
    rows = _rows(out)
    assert len(rows) == 2 * len(CLASSES)
    assert {r["label"] for r in rows} <= {*CLASSES, UNKNOWN}
    assert all(0 < float(r["confidence"]) <= 1 for r in rows)
    assert file_digests(old_run) == before


def test_an_old_run_evaluates(old_run, tmp_path):
    """On its own validation flowers (the synthetic ones, drawn again from its config)."""
    before = file_digests(old_run)
    out = tmp_path / "e"
    assert evaluate_main(["--checkpoint", str(old_run), "--output", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_images"] == 6 * len(CLASSES)  # smoke.yaml's synthetic_val_per_class
    predictions = _rows(out / "predictions.csv")
    assert len(predictions) == metrics["n_images"]
    assert metrics["classes"] == list(CLASSES) and {r["true"] for r in predictions} == set(CLASSES)
    assert metrics["accuracy"] == pytest.approx(np.mean([r["true"] == r["predicted"] for r in predictions]))
    assert f"{metrics['accuracy']:.1%}" in (out / "report.md").read_text()
    assert file_digests(old_run) == before


def test_an_old_run_exports_to_onnx(old_run, photos, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from vit_flowers.export import main as export_main

    before = file_digests(old_run)
    onnx_path = tmp_path / "old.onnx"
    assert export_main(["--checkpoint", str(old_run), "--output", str(onnx_path), "--quiet"]) == 0
    by_torch, by_onnx = tmp_path / "t.csv", tmp_path / "o.csv"
    for model, out in ((old_run, by_torch), (onnx_path, by_onnx)):
        assert predict_main([str(photos), "--recursive", "--checkpoint", str(model), "--output", str(out),
                             "--quiet", "--no-unknown"]) == 0
    torch_rows, onnx_rows = _rows(by_torch), _rows(by_onnx)
    assert len(onnx_rows) == 2 * len(CLASSES) and {r["label"] for r in onnx_rows} <= set(CLASSES)
    assert [r["label"] for r in onnx_rows] == [r["label"] for r in torch_rows]
    assert file_digests(old_run) == before




def test_an_old_run_is_taught_a_new_class(old_run, photos, tmp_path):
    before = file_digests(old_run)
    new = tmp_path / "new"
    bricks = write_crops("brick", tmp_path / "brick", 8, seed=0)
    assert teach_main([str(old_run), "--add", f"brick={bricks}", "--output", str(new)]) == 0
    ckpt = load_checkpoint(new / "best.pt")
    assert ckpt["classes"] == [*CLASSES, "brick"] and ckpt["class_means"]["counts"][-1] == 8
    held_out = write_crops("brick", tmp_path / "held" / "brick", 6, seed=1)
    out = tmp_path / "p.csv"
    assert predict_main([str(held_out), "--checkpoint", str(new), "--output", str(out), "--quiet",
                         "--no-unknown"]) == 0
    assert [r["label"] for r in _rows(out)].count("brick") >= 4
    assert file_digests(old_run) == before
