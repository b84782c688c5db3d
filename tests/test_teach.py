"""teach: a new class from a few photos, without retraining; the trained run is never changed."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import numpy as np
import pytest
from helpers import smoke_config, write_class_folders
from PIL import Image

from vit_flowers import train as train_mod
from vit_flowers.data.synthetic import CLASSES
from vit_flowers.evaluate import main as evaluate_main
from vit_flowers.inference.prototypes import TEACH_INPUT, TEACH_PER_CLASS
from vit_flowers.predict import main as predict_main
from vit_flowers.runs.checkpoint import load_checkpoint
from vit_flowers.teach import main as teach_main

skimage_data = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return train_mod.train(smoke_config(tmp_path_factory.mktemp("teach"), run_name="s")).run_dir


def _crops(name: str, folder: Path, count: int, seed: int) -> Path:
    """``count`` random 40% crops of scikit-image's ``name`` photo, as PNGs in ``folder``: a class of its own."""
    image = getattr(skimage_data, name)()
    h, w = image.shape[:2]
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(count):
        y, x = rng.integers(0, h - int(0.4 * h)), rng.integers(0, w - int(0.4 * w))
        Image.fromarray(image[y:y + int(0.4 * h), x:x + int(0.4 * w)]).save(folder / f"{name}_{i}.png")
    return folder


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _labels(csv_path: Path) -> list[str]:
    with open(csv_path, newline="") as f:
        return [r["label"] for r in csv.DictReader(f)]


def test_teach_makes_a_run_that_predicts_the_new_class_and_leaves_the_run_alone(run, tmp_path):
    before = _digest(run)
    taught = _crops("brick", tmp_path / "teach" / "brick", 8, seed=0)
    held_out = _crops("brick", tmp_path / "held" / "brick", 12, seed=1)
    new = tmp_path / "new"
    assert teach_main([str(run), "--add", f"brick={taught}", "--output", str(new)]) == 0
    ckpt = load_checkpoint(new / "best.pt")
    assert ckpt["classes"] == [*CLASSES, "brick"] and ckpt["class_means"]["counts"][-1] == 8
    trained = load_checkpoint(run / "best.pt")["unknown"]
    assert ckpt["unknown"]["threshold"] == trained["threshold"] and ckpt["unknown"]["rule"] == trained["rule"]
    assert ckpt["unknown"]["means"].shape[0] == len(CLASSES) + 1  # the rule measures the new class too
    out = tmp_path / "p.csv"
    assert predict_main([str(held_out), "--checkpoint", str(new), "--output", str(out), "--quiet",
                         "--no-unknown"]) == 0
    assert _labels(out).count("brick") >= 10
    flowers = write_class_folders(tmp_path / "flowers", per_class=4)
    assert predict_main([str(flowers), "--recursive", "--checkpoint", str(new), "--output", str(tmp_path / "f.csv"),
                         "--quiet", "--no-unknown"]) == 0
    assert _labels(tmp_path / "f.csv").count("brick") <= 2  # the old classes keep their photos
    assert _digest(run) == before


def test_evaluate_and_export_take_the_taught_run(run, tmp_path):
    pytest.importorskip("onnxruntime")
    from vit_flowers.export import export_checkpoint
    from vit_flowers.inference.onnx_runtime import load_onnx

    data = write_class_folders(tmp_path / "data", per_class=3)
    _crops("brick", data / "brick", 4, seed=2)
    new = tmp_path / "new"
    assert teach_main([str(run), "--add", f"brick={_crops('brick', tmp_path / 'c', 8, seed=0)}", "--output",
                       str(new)]) == 0
    assert evaluate_main(["--checkpoint", str(new), "--data", str(data), "--output", str(tmp_path / "e"),
                          "--quiet"]) == 0
    exported = load_onnx(export_checkpoint(new, output=tmp_path / "m.onnx"))
    assert exported.classes[-1] == "brick" and exported.gives_features


def test_teach_refuses_an_existing_run_and_the_run_itself(run, tmp_path, caplog):
    photos = _crops("brick", tmp_path / "c", 5, seed=0)
    new = tmp_path / "new"
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(new)]) == 0
    first = _digest(new)
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(new)]) == 1
    assert "already holds a run" in caplog.text and _digest(new) == first
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(run), "--overwrite"]) == 1
    assert "never changes it" in caplog.text and (run / "last.pt").is_file()
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(new), "--overwrite"]) == 0
    assert teach_main([str(run), "--add", "brick", "--output", str(tmp_path / "x")]) == 1
    assert "NAME=FOLDER" in caplog.text and not (tmp_path / "x").exists()


def test_photos_of_a_known_class_join_its_mean(run, tmp_path):
    roses = write_class_folders(tmp_path / "more", per_class=4, classes=["rose"], seed=21) / "rose"
    new = tmp_path / "new"
    assert teach_main([str(run), "--add", f"rose={roses}", "--output", str(new)]) == 0
    old, ckpt = load_checkpoint(run / "best.pt"), load_checkpoint(new / "best.pt")
    c = CLASSES.index("rose")
    assert ckpt["classes"] == list(CLASSES)
    assert ckpt["class_means"]["counts"][c] == old["class_means"]["counts"][c] + 4
    assert not np.allclose(ckpt["class_means"]["means"][c], old["class_means"]["means"][c])


def test_a_run_without_class_means_reads_its_training_photos(tmp_path):
    old = train_mod.train(smoke_config(tmp_path, report=False)).run_dir  # no report: no class means kept
    assert load_checkpoint(old / "best.pt")["class_means"] is None
    new = tmp_path / "new"
    assert teach_main([str(old), "--add", f"brick={_crops('brick', tmp_path / 'c', 5, seed=0)}",
                       "--output", str(new)]) == 0
    ckpt = load_checkpoint(new / "best.pt")
    assert ckpt["class_means"]["counts"] == [16] * len(CLASSES) + [5]  # smoke.yaml's 16 a class
    assert ckpt["unknown"] is None


def test_training_keeps_features_of_its_photos_for_teach(run):
    """best.pt keeps up to TEACH_PER_CLASS training photos' features a class (and their mirror images'): what teach
    refits a head on."""
    sample = load_checkpoint(run / "best.pt")["teach_sample"]
    counts = np.bincount(sample["labels"].numpy())
    assert sample["head_input"] == TEACH_INPUT and len(counts) == len(CLASSES)
    assert (counts > 0).all() and (counts <= 2 * TEACH_PER_CLASS).all() and (counts % 2 == 0).all()
    assert sample["features"].shape == (counts.sum(), 64 * len(TEACH_INPUT.split("+")))  # smoke.yaml's dim 64


def test_a_run_that_keeps_features_is_taught_without_its_training_photos(run, tmp_path, monkeypatch):
    from vit_flowers.training import teaching

    def refuse(*args, **kwargs):
        raise AssertionError("teach read the training photos again")

    monkeypatch.setattr(teaching, "_training_photos", refuse)
    photos = _crops("brick", tmp_path / "c", 6, seed=0)
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(tmp_path / "new")]) == 0
    ckpt = load_checkpoint(tmp_path / "new" / "best.pt")
    assert ckpt["model_config"]["head_input"] == TEACH_INPUT and ckpt["taught"]["head"].startswith("logistic")
    labels = ckpt["teach_sample"]["labels"].numpy()
    assert (labels == len(CLASSES)).sum() == 12  # the 6 photos and their mirror images
    # taught again: the first taught class stays in what the head is fitted on
    more = _crops("coffee", tmp_path / "d", 5, seed=3)
    assert teach_main([str(tmp_path / "new"), "--add", f"coffee={more}", "--output", str(tmp_path / "two")]) == 0
    two = load_checkpoint(tmp_path / "two" / "best.pt")
    assert two["classes"] == [*CLASSES, "brick", "coffee"]
    assert np.bincount(two["teach_sample"]["labels"].numpy())[-2:].tolist() == [12, 10]
    out = tmp_path / "p.csv"
    assert predict_main([str(_crops("coffee", tmp_path / "held", 8, seed=4)), "--checkpoint", str(tmp_path / "two"),
                         "--output", str(out), "--quiet", "--no-unknown"]) == 0
    assert _labels(out).count("coffee") >= 6


def test_the_taught_head_is_in_the_onnx_export(run, tmp_path):
    """The fitted head reads the CLS token and the patch mean: the export computes the same logits."""
    pytest.importorskip("onnxruntime")
    import torch

    from vit_flowers.export import export_checkpoint
    from vit_flowers.inference.onnx_runtime import load_onnx
    from vit_flowers.runs.checkpoint import load_model

    new = tmp_path / "new"
    assert teach_main([str(run), "--add", f"brick={_crops('brick', tmp_path / 'c', 6, seed=0)}", "--output",
                       str(new)]) == 0
    model, ckpt = load_model(new / "best.pt")
    exported = load_onnx(export_checkpoint(new, output=tmp_path / "m.onnx"))
    x = torch.randn(4, 3, ckpt["image_size"], ckpt["image_size"])
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(exported.logits(x.numpy()), expected, rtol=1e-3, atol=1e-3)
