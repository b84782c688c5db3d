"""``vit-flowers export --tflite FILE`` (vit_flowers/inference/tflite_export.py): the LiteRT model converted by
litert-torch, run by the ai-edge-litert interpreter on photos next to PyTorch: the same top-1, logits within the
export's tolerance (fp32); the int8 copy's top-1 against fp32; the JSON beside it; the bad inputs.

Skipped, with the reason, without the tflite extra (pip install -e ".[tflite]"; large, so not in dev) or the onnx
extra."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("litert_torch", reason='the tflite extra is not installed: pip install -e ".[tflite]"')
pytest.importorskip("ai_edge_litert", reason='the tflite extra is not installed: pip install -e ".[tflite]"')

from helpers import IMAGE_SIZE

from vit_flowers.data.augment import eval_transform
from vit_flowers.data.synthetic import make_synthetic_flowers
from vit_flowers.export import main as export_main
from vit_flowers.inference.tflite_export import TfliteModel
from vit_flowers.runs.checkpoint import load_model


@pytest.fixture(scope="module")
def exported(micro_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tflite") / "flowers.tflite"
    assert export_main(["--checkpoint", str(micro_run), "--tflite", str(out), "--int8", "--force", "--quiet"]) == 0
    return out


def test_the_litert_model_answers_as_pytorch(exported, micro_run):
    model, ckpt = load_model(micro_run / "best.pt")
    images, _ = make_synthetic_flowers(4, 48, seed=9)
    x = eval_transform(images, IMAGE_SIZE, ckpt["mean"], ckpt["std"])
    with torch.no_grad():
        reference = model(x).numpy()
    fp32 = TfliteModel(exported).logits(x.numpy())
    assert (fp32.argmax(1) == reference.argmax(1)).all()
    np.testing.assert_allclose(fp32, reference, atol=1e-4, rtol=0)
    int8 = TfliteModel(exported.with_name("flowers.int8.tflite")).logits(x.numpy())
    assert (int8.argmax(1) == reference.argmax(1)).sum() >= len(x) - 1
    assert exported.with_name("flowers.int8.tflite").stat().st_size < exported.stat().st_size / 2
    assert not (micro_run / "model.onnx").exists()  # --tflite without --output: no .onnx beside the run


def test_the_json_beside_it_says_classes_preprocessing_and_rule(exported, micro_run):
    _, ckpt = load_model(micro_run / "best.pt")
    facts = json.loads(exported.with_suffix(".json").read_text())
    assert facts["classes"] == list(ckpt["classes"]) and facts["image_size"] == IMAGE_SIZE
    assert facts["outputs"] == ["logits", "features"] and facts["unknown"]["rule"] == "mahalanobis"
    assert np.asarray(facts["unknown"]["precision"], dtype=np.float32).shape[0] == len(facts["unknown"]["means"][0])
    assert json.loads(exported.with_name("flowers.int8.json").read_text())["precision"] == "int8"


def test_bad_names_and_existing_files_are_refused_before_any_work(exported, micro_run, tmp_path, caplog):
    assert export_main(["--checkpoint", str(micro_run), "--tflite", str(tmp_path / "model.onnx")]) == 1
    assert "use a file name ending in .tflite" in caplog.text
    assert export_main(["--checkpoint", str(micro_run), "--tflite", str(exported)]) == 1
    assert f"--tflite {exported} already exists" in caplog.text
