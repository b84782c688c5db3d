"""Tests for vit_flowers.export and vit_flowers.inference.onnx_export (ONNX export checked against PyTorch, int8)
and vit_flowers.inference.onnx_runtime (predict and evaluate through ONNX Runtime, torch-free pixels, bad .onnx
files)."""

from __future__ import annotations

import csv
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

onnxruntime = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from helpers import IMAGE_SIZE, MICRO, write_class_folders, write_messy_folder

from vit_flowers import cli, evaluate, predict
from vit_flowers.data.augment import eval_transform
from vit_flowers.data.datasets import Photos
from vit_flowers.data.image_files import list_images
from vit_flowers.data.images import decode_file
from vit_flowers.data.synthetic import CLASSES, make_synthetic_flowers
from vit_flowers.export import main as export_main
from vit_flowers.inference.onnx_export import export_onnx, onnx_metadata, quantize_int8
from vit_flowers.inference.onnx_runtime import decode_image, load_onnx
from vit_flowers.models.layers import Attention
from vit_flowers.models.taught import with_gate
from vit_flowers.models.vit import create_vit, logits_and_features
from vit_flowers.runs.checkpoint import CheckpointError, load_model, make_checkpoint

REAL_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "flowers5"


@pytest.fixture(scope="module")
def run(micro_run) -> Path:
    return micro_run  # this module's copy of the session's trained micro run


@pytest.fixture(scope="module")
def exported(run) -> tuple[Path, Path]:
    """(model.onnx, model.int8.onnx) of the micro run, written by the command (--force: int8 may flip one of the
    micro run's 50 validation flowers, 2 points, where the command refuses: tested by
    test_an_int8_copy_that_loses_too_much_is_refused_unless_force)."""
    assert export_main(["--checkpoint", str(run), "--int8", "--force", "--quiet"]) == 0
    return run / "model.onnx", run / "model.int8.onnx"


@pytest.fixture(scope="module")
def messy(tmp_path_factory) -> tuple[Path, list[str], list[str]]:
    root = tmp_path_factory.mktemp("messy") / "photos"
    good, bad = write_messy_folder(root)
    return root, good, bad


def _torch_logits(run: Path, x: torch.Tensor) -> np.ndarray:
    model, _ = load_model(run / "best.pt")
    with torch.no_grad():
        return model(x).numpy()


def test_export_round_trips_logits_and_metadata(run, exported):
    onnx_path, _ = exported
    model = load_onnx(onnx_path)
    _, ckpt = load_model(run / "best.pt")
    assert (model.classes, model.image_size, model.mean, model.std) == (ckpt["classes"], ckpt["image_size"],
                                                                        ckpt["mean"], ckpt["std"])
    assert model.metadata["source_checkpoint"] == str(run / "best.pt") and model.metadata["precision"] == "fp32"
    assert json.loads(model.metadata["model_config"]) == ckpt["model_config"]
    for batch in (1, 7):  # the batch axis is dynamic
        x = torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE)
        np.testing.assert_allclose(model.logits(x.numpy()), _torch_logits(run, x), atol=1e-4, rtol=0)


def test_export_prints_what_it_checked(run, tmp_path, caplog):
    out = tmp_path / "flowers.onnx"
    with caplog.at_level(logging.INFO):
        assert export_main(["--checkpoint", str(run / "best.pt"), "--output", str(out)]) == 0
    text = caplog.text
    assert f"wrote {out}" in text and "dynamic batch" in text
    n = MICRO["synthetic_val_per_class"] * len(CLASSES)
    assert f"checked against PyTorch on {n} images (synthetic flowers, validation set" in text
    assert f"the same top-1 on {n} of {n}" in text


def test_export_fails_naming_the_largest_difference(run, tmp_path, caplog):
    out = tmp_path / "strict.onnx"
    assert export_main(["--checkpoint", str(run), "--output", str(out), "--tolerance", "1e-12"]) == 1
    assert "disagrees with PyTorch: largest logit difference" in caplog.text and "image " in caplog.text
    assert not out.exists()  # nothing written
    assert export_main(["--checkpoint", str(run), "--output", str(tmp_path / "model.pt")]) == 1
    assert "ending in .onnx" in caplog.text


def _size_but_metadata(path: Path) -> int:
    """Bytes of an .onnx file less its metadata (the run's class means and unknown rule, which int8 does not
    shrink)."""
    return path.stat().st_size - sum(len(p.key) + len(p.value) for p in onnx.load(str(path)).metadata_props)


def test_int8_keeps_the_top1_of_fp32_on_most_images(run, exported):
    fp32, int8 = (load_onnx(p) for p in exported)
    assert int8.metadata["precision"] == "int8" and int8.classes == fp32.classes
    assert _size_but_metadata(exported[1]) < 0.6 * _size_but_metadata(exported[0])
    images, _ = make_synthetic_flowers(20, IMAGE_SIZE, seed=77)  # 100 images it was not calibrated on
    same = fp32.probabilities(images.numpy()).argmax(1) == int8.probabilities(images.numpy()).argmax(1)
    assert same.mean() >= 0.9


@pytest.fixture(scope="module")
def conv_stem_export() -> tuple[torch.nn.Module, dict, bytes]:
    """(a vit_micro with a conv stem, its checkpoint fields, its fp32 export)."""
    torch.manual_seed(0)
    model = create_vit("vit_micro", 5, patch_embed="conv").eval()
    ckpt = make_checkpoint(model, classes=list(CLASSES), image_size=32, mean=[0.5] * 3, std=[0.25] * 3, config={},
                           epoch=1, best_accuracy=0.5)
    return model, ckpt, export_onnx(model, onnx_metadata(ckpt, "test.pt"))


def test_export_folds_the_attention_scale_into_a_copy(conv_stem_export):
    model, ckpt, fp32 = conv_stem_export
    assert all(m.scale == m.dim_head**-0.5 for m in model.modules() if isinstance(m, Attention))  # model unchanged
    ops = [n.op_type for n in onnx.load_from_string(fp32).graph.node]
    assert "Sqrt" not in ops  # no scale computed from the shapes at run time
    x = eval_transform(make_synthetic_flowers(4, 32, seed=3)[0], 32, ckpt["mean"], ckpt["std"])
    with torch.no_grad():
        reference = model(x).numpy()
    session = onnxruntime.InferenceSession(fp32, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"images": x.numpy()})[0], reference, atol=1e-4, rtol=1e-4)


def test_int8_fuses_relus_and_keeps_the_first_layer_and_matmul_outputs_in_float(conv_stem_export):
    _, ckpt, fp32 = conv_stem_export
    images, labels = make_synthetic_flowers(8, 32, seed=3)
    int8 = quantize_int8(fp32, Photos(images, labels.numpy(), [""] * len(images), "synthetic"), ckpt,
                         onnx_metadata(ckpt, "test.pt"))
    before = [n.op_type for n in onnx.load_from_string(fp32).graph.node]
    graph = onnx.load_from_string(int8).graph
    ops = [n.op_type for n in graph.node]
    assert before.count("Relu") == 3 and ops.count("Conv") == before.count("Conv")
    assert ops.count("Relu") == 1  # the float first layer's; each other ReLU's range is given to its convolution
    first = next(n for n in graph.node if n.op_type == "Conv")
    assert first.input[0] == "images"  # the first layer reads the image in float
    matmul_outputs = {n.output[0] for n in graph.node if n.op_type == "MatMul"}
    assert matmul_outputs and not any(n.input[0] in matmul_outputs for n in graph.node if n.op_type == "QuantizeLinear")


def _group(node) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def test_int8_fuses_the_hybrids_relu6s_and_keeps_its_depthwise_convolutions_in_int8():
    """EfficientNet's ReLU6 (Clip) is given to its convolution, as ReLU is; the Clips of the trunk's "same" padding
    arithmetic stay float; the depthwise convolutions run int8 (in float they cost the speed); the stem in float."""
    torch.manual_seed(0)
    model = create_vit("vit_micro", 5, image_size=32, patch_size=8, patch_embed="lite0").eval()
    ckpt = make_checkpoint(model, classes=list(CLASSES), image_size=32, mean=[0.485, 0.456, 0.406],
                           std=[0.229, 0.224, 0.225], config={}, epoch=1, best_accuracy=0.5)
    fp32 = export_onnx(model, onnx_metadata(ckpt, "test.pt"))
    images, labels = make_synthetic_flowers(8, 32, seed=3)
    int8 = quantize_int8(fp32, Photos(images, labels.numpy(), [""] * len(images), "synthetic"), ckpt,
                         onnx_metadata(ckpt, "test.pt"))

    def clips(graph) -> tuple[int, int]:
        """(ReLU6s: Clips of a convolution's output, quantized or not; other Clips: the padding arithmetic's)."""
        producer = {o: n.op_type for n in graph.node for o in n.output}
        after_conv = [producer.get(n.input[0]) in ("Conv", "DequantizeLinear") for n in graph.node
                      if n.op_type == "Clip"]
        return sum(after_conv), len(after_conv) - sum(after_conv)

    before, graph = onnx.load_from_string(fp32).graph, onnx.load_from_string(int8).graph
    (relu6_before, padding_before), (relu6_after, padding_after) = clips(before), clips(graph)
    assert relu6_before == 10 and padding_before > 0  # the trunk at stride 8: stem + 3 stages
    assert relu6_after == 1 and padding_after == padding_before  # only the float stem keeps its ReLU6
    producer = {o: n.op_type for n in graph.node for o in n.output}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    depthwise = [n for n in convs if _group(n) > 1]
    assert len(convs) == len([n for n in before.node if n.op_type == "Conv"]) and len(depthwise) == 5
    assert all(producer[n.input[0]] == "DequantizeLinear" for n in depthwise)
    assert producer[convs[0].input[0]] != "DequantizeLinear"  # the stem reads the image in float


def test_a_model_with_taught_classes_exports_its_gate():
    """A hybrid with taught classes (a gate on the pooled trunk output, mixed with the trained head): the graph
    computes the logits PyTorch does, with the unknown rule's features as its second output."""
    torch.manual_seed(0)
    trained = create_vit("vit_micro", 4, image_size=32, patch_size=32, patch_embed="lite0")
    model = with_gate(trained, torch.randn(6, 320), torch.randn(6), 1.0).eval()
    ckpt = make_checkpoint(model, classes=[*CLASSES, "brick"], image_size=32, mean=[0.485, 0.456, 0.406],
                           std=[0.229, 0.224, 0.225], config={}, epoch=1, best_accuracy=0.5)
    session = onnxruntime.InferenceSession(export_onnx(model, onnx_metadata(ckpt, "test.pt"), features=True))
    x = torch.randn(5, 3, 32, 32)
    logits, features = session.run(None, {"images": x.numpy()})
    with torch.no_grad():
        expected, expected_features = logits_and_features(model, x)
    assert logits.shape == (5, 6)
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(features, expected_features.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.exp(logits).sum(1), 1.0, atol=1e-5)


def _csv_rows(path: Path) -> dict[str, dict]:
    with open(path, newline="") as f:
        return {Path(r["path"]).name: r for r in csv.DictReader(f)}


def test_predict_with_onnx_gives_the_rows_of_pytorch(run, exported, messy, tmp_path):
    root, good, bad = messy
    outs = {}
    for name, ckpt in (("pt", run / "best.pt"), ("onnx", exported[0])):
        outs[name] = tmp_path / f"{name}.csv"
        assert predict.main([str(root), "--recursive", "--checkpoint", str(ckpt), "--output", str(outs[name]),
                             "--quiet"]) == 0
    pt, ort = _csv_rows(outs["pt"]), _csv_rows(outs["onnx"])
    assert list(pt) == list(ort) and len(pt) == len(good) + len(bad) + 1  # same files, same order; + README.txt's
    assert "skipped" in pt["README.txt"]["error"]  # row: a folder's non-image file is listed, not predicted
    for name, row in pt.items():
        assert ort[name]["error"] == row["error"]  # the same reasons for the same bad files
        assert ort[name]["label"] == row["label"], name
        if row["confidence"]:
            assert abs(float(ort[name]["confidence"]) - float(row["confidence"])) < 2e-3
    tta = tmp_path / "tta.json"
    assert predict.main([str(root), "--checkpoint", str(exported[0]), "--tta", "--output", str(tta), "--quiet"]) == 0
    assert {Path(r["path"]).name for r in json.loads(tta.read_text())} == {Path(n).name for n in good + bad
                                                                           if "/" not in n} | {"README.txt"}
    assert predict.main([str(root), "--checkpoint", str(exported[0]), "--tta-scales", "--quiet"]) == 1
    assert not tta.with_name("none.json").exists()


def test_predict_with_onnx_imports_neither_torch_nor_torchvision(exported, messy):
    root, _, _ = messy
    code = ("import sys; from vit_flowers.predict import main; "
            f"rc = main([{str(root / 'plain.jpg')!r}, '--checkpoint', {str(exported[0])!r}, '--quiet']); "
            "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[-2] == "0 []", out.stdout + out.stderr


@pytest.mark.parametrize("folder", [False, True], ids=["run-split", "folder-with-a-bad-file"])
def test_evaluate_with_onnx_writes_the_same_report(run, exported, tmp_path, folder):
    data = []
    if folder:
        root = write_class_folders(tmp_path / "photos", per_class=3)
        (root / "rose" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
        data = ["--data", str(root)]
    reports = {}
    for name, ckpt in (("pt", run / "best.pt"), ("onnx", exported[0])):
        reports[name] = tmp_path / name
        assert evaluate.main(["--checkpoint", str(ckpt), "--output", str(reports[name]), "--quiet", *data]) == 0
    pt, ort = (json.loads((reports[n] / "metrics.json").read_text()) for n in ("pt", "onnx"))
    assert ort["device"] == "onnxruntime (cpu)" and ort["precision"] == "fp32"
    assert (ort["accuracy"], ort["n_images"], ort["per_class"]) == (pt["accuracy"], pt["n_images"], pt["per_class"])
    assert sorted(p.name for p in reports["onnx"].iterdir()) == sorted(p.name for p in reports["pt"].iterdir())
    rows = {}
    for name, report in reports.items():
        with open(report / "predictions.csv", newline="") as f:
            rows[name] = [(r.get("path", r.get("index")), r["true"], r["predicted"], r["correct"])
                          for r in csv.DictReader(f)]
    assert rows["onnx"] == rows["pt"]  # the same images, labels and (folder) the same error row for broken.png
    assert ort["n_failed"] == pt["n_failed"] == int(folder)


def _with_metadata(src: Path, dst: Path, drop: str | None = None, **changes: str) -> Path:
    proto = onnx.load(str(src))
    meta = {p.key: p.value for p in proto.metadata_props if p.key != drop}
    del proto.metadata_props[:]
    for key, value in {**meta, **changes}.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(dst))
    return dst


def test_bad_onnx_files_get_one_line_naming_the_file(exported, messy, tmp_path, caplog):
    root, _, _ = messy
    noise = tmp_path / "noise.onnx"
    noise.write_bytes(np.random.default_rng(0).bytes(3000))
    other = tmp_path / "other.onnx"  # another model's graph (an identity on (1, 3, 8, 8)), no metadata
    h = onnx.helper
    graph = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "other",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 8, 8])])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(other))
    cases = {
        noise: "not an ONNX file, or damaged",
        other: "is not a vit_flowers ONNX model",
        _with_metadata(exported[0], tmp_path / "no-classes.onnx", drop="classes"): "its metadata lacks classes",
        _with_metadata(exported[0], tmp_path / "bad-json.onnx", std="[0.2,"): "unreadable metadata",
        _with_metadata(exported[0], tmp_path / "sizes.onnx", image_size="64"): "not the (N, 3, 64, 64) float images",
        _with_metadata(other, tmp_path / "other-meta.onnx", **load_onnx(exported[0]).metadata): "its graph takes",
        tmp_path / "missing.onnx": "ONNX model not found",
    }
    for path, reason in cases.items():
        with pytest.raises(CheckpointError, match=re.escape(reason)) as exc:
            load_onnx(path)
        assert str(path) in str(exc.value) and "\n" not in str(exc.value)
        caplog.clear()
        assert predict.main([str(root), "--checkpoint", str(path), "--quiet"]) == 1
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and str(path) in errors[0] and reason.split("(")[0] in errors[0], errors
    assert evaluate.main(["--checkpoint", str(noise), "--quiet"]) == 1


def test_torch_free_pixels_match_the_pytorch_path(messy, tmp_path):
    """decode_image (PIL's resize) against decode_file (PyTorch's): within 2 grey levels, the same errors."""
    root, good, bad = messy
    from PIL import Image

    Image.new("RGB", (400, 30), (200, 40, 90)).save(root / "strip.png")  # cut to its centre square first
    Image.new("RGB", (300, 200), (10, 120, 250)).save(root / "big.png")  # resized before the batch
    for name in good + bad + ["strip.png", "big.png"]:
        for size in (IMAGE_SIZE, 48):
            ours, theirs = decode_image(root / name, size), decode_file(root / name, size)
            if isinstance(theirs, str):
                assert ours == theirs, name
                continue
            diff = np.abs(ours.astype(int) - theirs.numpy().astype(int))
            assert ours.shape == (3, size, size) and diff.max() <= 2 and diff.mean() < 0.5, (name, size)


def test_the_vit_flowers_command_has_export():
    assert cli.COMMANDS["export"][0] == "vit_flowers.export"


@pytest.mark.slow
@pytest.mark.skipif(not REAL_PHOTOS.is_dir(), reason=f"real photos not found at {REAL_PHOTOS}")
def test_real_photos_torch_free_pixels_and_onnx_top1(run, exported):
    """On every real photo: the torch-free pixels within 2 grey levels of PyTorch's, and ONNX Runtime on them gives
    PyTorch's top-1 on all but a handful (the micro model is unsure about real photos)."""
    files, _ = list_images(REAL_PHOTOS)
    model = load_onnx(exported[0])
    pt_model, ckpt = load_model(run / "best.pt")
    ours = np.stack([decode_image(f, IMAGE_SIZE) for f in files])
    theirs = torch.stack([decode_file(f, IMAGE_SIZE) for f in files])
    assert np.abs(ours.astype(int) - theirs.numpy().astype(int)).max() <= 2
    from vit_flowers.data.augment import eval_transform

    with torch.no_grad():
        reference = pt_model(eval_transform(theirs, IMAGE_SIZE, ckpt["mean"], ckpt["std"])).argmax(1).numpy()
    assert (model.probabilities(ours).argmax(1) == reference).mean() >= 0.99


def test_calibration_uses_the_runs_training_photos(run, tmp_path):
    """A folder-trained run calibrates on its training split, never on its validation photos."""
    from vit_flowers.data.splits import folder_samples, save_split
    from vit_flowers.inference.run_data import training_photos, validation_photos
    from vit_flowers.training.config import load_config, save_config

    root = write_class_folders(tmp_path / "photos", per_class=10)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(None, {"dataset": "folder", "data": str(root), "val_fraction": 0.2})
    save_config(cfg, run_dir / "config.yaml")
    split = folder_samples(root, cfg.data.val_fraction, cfg.data.split_seed).split
    save_split(run_dir / "split.json", split)  # as train does
    _, ckpt = load_model(run / "best.pt")
    train = training_photos(ckpt, run_dir, limit=30)
    val = validation_photos(ckpt, run_dir, None, 2000)
    assert len(train.names) == 30 and train.source == f"training photos of {root}" and (train.labels >= 0).all()
    assert len(val.names) == 10 and not set(train.names) & set(val.names)


def test_evaluating_the_exports_and_best_pt_keeps_every_report(run, exported):
    """The issue's case: an int8 evaluation, then a plain one of the same run, each in its own default folder."""
    reports = {}
    for ckpt, folder in ((exported[1], "eval-val-int8"), (exported[0], "eval-val-onnx"), (run, "eval-val")):
        assert evaluate.main(["--checkpoint", str(ckpt), "--quiet"]) == 0
        reports[folder] = json.loads((run / folder / "metrics.json").read_text())
    assert [r["checkpoint"] for r in reports.values()] == [str(exported[1]), str(exported[0]), str(run / "best.pt")]
    assert reports["eval-val-int8"]["precision"] == "int8" and reports["eval-val-onnx"]["precision"] == "fp32"
    assert evaluate.main(["--checkpoint", str(exported[1]), "--quiet"]) == 1  # and a second one is refused


def test_an_int8_copy_that_loses_too_much_is_refused_unless_force(run, tmp_path, monkeypatch, caplog):
    """Calibrated on black images, every activation range is a sliver and the int8 copy loses far more than
    INT8_MAX_LOSS: the fp32 file is written, the int8 one only with --force, and the message says what it lost."""
    from vit_flowers import export

    black = Photos(torch.zeros(64, 3, IMAGE_SIZE, IMAGE_SIZE, dtype=torch.uint8), np.zeros(64, dtype=np.int64),
                   ["black"] * 64, "black images")
    monkeypatch.setattr(export, "training_photos", lambda *args, **kwargs: black)
    out = tmp_path / "m.onnx"
    args = ["--checkpoint", str(run), "--output", str(out), "--int8", "--quiet"]
    with caplog.at_level(logging.ERROR):
        assert export_main(args) == 1
    assert out.is_file() and not (tmp_path / "m.int8.onnx").exists()
    lost = re.search(r"int8 loses ([\d.]+) points, more than 2 \(onnx_export.INT8_MAX_LOSS\): accuracy ([\d.]+)% "
                     r"\(fp32 ([\d.]+)%", caplog.text)
    assert lost, caplog.text
    # each figure is printed to one decimal: the difference of two may sit up to 0.1 from the printed loss
    assert float(lost[1]) == pytest.approx(float(lost[3]) - float(lost[2]), abs=0.11) and float(lost[1]) > 2
    assert "calibrated on 64 black images" in caplog.text and "pass --force" in caplog.text
    assert "(with --overwrite, as" in caplog.text
    assert export_main(args + ["--force"]) == 1  # m.onnx was written: replacing it takes --overwrite
    assert export_main(args + ["--force", "--overwrite"]) == 0
    assert load_onnx(tmp_path / "m.int8.onnx").metadata["precision"] == "int8"


def test_export_never_replaces_an_onnx_file_unless_told(run, tmp_path, caplog):
    """A second export to the same file (or onto an existing int8 copy) is refused before any work, naming the
    file and --overwrite; the file keeps its bytes; --overwrite replaces it."""
    out = tmp_path / "m.onnx"
    assert export_main(["--checkpoint", str(run), "--output", str(out), "--quiet"]) == 0
    out.write_bytes(b"the user's file")
    (tmp_path / "n.int8.onnx").write_bytes(b"an int8 file")
    with caplog.at_level(logging.ERROR):
        assert export_main(["--checkpoint", str(run), "--output", str(out), "--quiet"]) == 1
        assert export_main(["--checkpoint", str(run), "--output", str(tmp_path / "n.onnx"), "--int8", "--quiet"]) == 1
    assert f"{out} already exists: pass --overwrite" in caplog.text
    assert f"{tmp_path / 'n.int8.onnx'} already exists" in caplog.text
    assert out.read_bytes() == b"the user's file" and not (tmp_path / "n.onnx").exists()
    assert export_main(["--checkpoint", str(run), "--output", str(out), "--overwrite", "--quiet"]) == 0
    assert load_onnx(out).metadata["precision"] == "fp32"


def test_an_int8_copy_that_loses_exactly_the_allowed_points_is_written(run, tmp_path, monkeypatch):
    """0.64 - 0.62 is 0.0200...02 in floats: a loss of exactly INT8_MAX_LOSS (2 points) is allowed, not refused."""
    from vit_flowers.inference import onnx_export

    scores = iter([0.64, 0.62, 0.64])  # the fp32 check's log line; then write_int8: the int8 copy first, then fp32
    monkeypatch.setattr(onnx_export, "accuracy", lambda logits, labels: next(scores))
    out = tmp_path / "m.onnx"
    assert export_main(["--checkpoint", str(run), "--output", str(out), "--int8", "--quiet"]) == 0
    assert (tmp_path / "m.int8.onnx").is_file()
