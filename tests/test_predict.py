"""Tests for vit_flowers.predict and the shared batching of vit_flowers.inference.batches."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import IMAGE_SIZE, predict_dataset, write_messy_folder
from PIL import Image

from vit_flowers.data.datasets import TensorImageDataset
from vit_flowers.data.image_files import IMAGE_EXTENSIONS
from vit_flowers.data.synthetic import CLASSES, make_synthetic_flowers
from vit_flowers.inference import batches as inference
from vit_flowers.inference.batches import iter_image_batches
from vit_flowers.inference.device import pick_device
from vit_flowers.inference.predictions import collect_files
from vit_flowers.inference.unknown import UNKNOWN
from vit_flowers.predict import main
from vit_flowers.runs.checkpoint import load_model


@pytest.fixture(scope="module")
def run(micro_run) -> Path:
    return micro_run  # this module's copy of the session's trained micro run


@pytest.fixture(scope="module")
def messy(tmp_path_factory) -> tuple[Path, list[str], list[str]]:
    root = tmp_path_factory.mktemp("messy") / "photos"
    good, bad = write_messy_folder(root)
    return root, good, bad


def _rel(rows: list[dict], root: Path) -> dict[str, dict]:
    return {Path(r["path"]).relative_to(root).as_posix(): r for r in rows}


def test_every_image_predicted_every_bad_file_reported(run, messy, tmp_path, capsys):
    root, good, bad = messy
    out = tmp_path / "predictions.csv"
    assert main([str(root), "--recursive", "--checkpoint", str(run), "--output", str(out), "--batch-size", "3"]) == 0
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == ["path", "label", "confidence", "label_2", "confidence_2", "label_3",
                                 "confidence_3", "best_class", "known_score", "error"]  # the run's unknown rule
    by_name = _rel(rows, root)
    assert by_name.pop("README.txt")["error"].startswith("skipped: not an image file by its extension (.txt")
    assert sorted(by_name) == sorted(good + bad)
    read = [r["path"] for r in rows if not r["error"].startswith("skipped")]  # (the skipped ones come last)
    assert read == sorted(read) and rows[-1]["path"].endswith("README.txt")  # input order kept across batches
    for name in good:
        r = by_name[name]
        assert r["error"] == "" and r["best_class"] in CLASSES and r["label"] in (r["best_class"], UNKNOWN), name
        assert np.isfinite(float(r["known_score"])), name
        probs = [float(r["confidence"]), float(r["confidence_2"]), float(r["confidence_3"])]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-5
        assert len({r["label"], r["label_2"], r["label_3"]}) == 3
    for name in bad:
        assert by_name[name]["label"] == "" and by_name[name]["error"], name
    assert "empty" in by_name["empty.jpg"]["error"]
    table = capsys.readouterr().out
    assert "ERROR: empty file" in table and "rgba.png" in table and "inner.png" in table


@pytest.mark.parametrize("rule", [[], ["--no-unknown"]], ids=["the run's unknown rule", "no-unknown"])
def test_json_output_and_not_recursive(run, messy, tmp_path, rule):
    root, good, bad = messy
    out = tmp_path / "p.json"
    assert main([str(root), "--checkpoint", str(run), "--output", str(out), "--top-k", "2", "--quiet", *rule]) == 0
    rows = json.loads(out.read_text())
    by_name = _rel(rows, root)
    assert by_name.pop("README.txt")["error"].startswith("skipped: not an image file")  # a row, not a prediction
    assert sorted(by_name) == sorted([g for g in good if "/" not in g] + bad)  # nested/ not searched
    for name in good:
        if "/" in name:
            continue
        r = by_name[name]
        best = r["top_k"][0]["label"]
        assert r["error"] is None and (r["label"] == best if rule else r["label"] in (best, UNKNOWN))
        assert r["confidence"] == r["top_k"][0]["probability"] and len(r["top_k"]) == 2
        assert (r["known_score"] is not None) == (not rule)
    assert by_name["notes.jpg"]["label"] is None and "not an image" in by_name["notes.jpg"]["error"]


def test_exit_code_when_nothing_can_be_predicted(run, messy, tmp_path):
    root, _, bad = messy
    assert main([str(root / b) for b in bad] + ["--checkpoint", str(run), "--quiet"]) == 1
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--checkpoint", str(run), "--quiet"]) == 1
    assert main([str(tmp_path / "missing.jpg"), str(root / "plain.jpg"), "--checkpoint", str(run), "--quiet"]) == 0
    assert main([str(root / "plain.jpg"), "--checkpoint", str(tmp_path / "nope.pt")]) == 1
    assert main([str(root / "plain.jpg"), "--checkpoint", str(run), "--output", str(tmp_path / "p.txt")]) == 1


def test_output_onto_an_existing_file_refuses_unless_overwrite(run, messy, tmp_path, caplog):
    root, _, _ = messy
    out = tmp_path / "predictions.csv"
    out.write_text("last week's predictions\n")
    args = [str(root / "plain.jpg"), "--checkpoint", str(run), "--output", str(out), "--quiet"]
    assert main(args) == 1
    assert out.read_text() == "last week's predictions\n"
    assert f"--output {out} already exists: pass --overwrite to replace it, or choose another file" in caplog.text
    assert main(args + ["--overwrite"]) == 0
    assert out.read_text().startswith("path,label,confidence")


def test_folder_messages_count_the_skipped_files_and_suggest_recursive_only_with_sub_folders(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="vit_flowers.inference.predictions")
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in ("README.txt", "notes.md", "holiday.mov"):
        (flat / name).write_text("not a photo")
    assert collect_files([flat]) == []
    extensions = " ".join(sorted(IMAGE_EXTENSIONS))  # what counts as an image: .bmp .gif .jpeg .jpg ...
    assert f"flat: skipped 3 non-image file(s) (not {extensions}): README.txt, holiday.mov, notes.md" in caplog.text
    assert "no images found in" in caplog.text and "--recursive" not in caplog.text  # no sub-folder to search
    caplog.clear()
    (tmp_path / "trip" / "day1").mkdir(parents=True)
    Image.new("RGB", (40, 40)).save(tmp_path / "trip" / "day1" / "a.png")
    assert collect_files([tmp_path / "trip"]) == []
    assert "(it has sub-folders: add --recursive to search them)" in caplog.text and "skipped" not in caplog.text
    assert collect_files([tmp_path / "trip"], recursive=True) == [tmp_path / "trip" / "day1" / "a.png"]


def test_top_k_above_the_class_count_says_it_is_capped(run, messy, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="vit_flowers.predict")
    root, _, _ = messy
    out = tmp_path / "p.json"
    assert main([str(root / "plain.jpg"), "--checkpoint", str(run), "--top-k", "50", "--output", str(out),
                 "--quiet"]) == 0
    assert f"--top-k 50 is more than the model's {len(CLASSES)} classes: showing all {len(CLASSES)}" in caplog.text
    assert len(json.loads(out.read_text())[0]["top_k"]) == len(CLASSES)


def test_exif_rotation_is_applied(run, tmp_path):
    img = Image.fromarray(make_synthetic_flowers(1, 48, seed=9)[0][2].permute(1, 2, 0).numpy())
    img = img.resize((48, 72))  # portrait, so that the centre crop differs when rotated
    img.save(tmp_path / "upright.png")
    exif = Image.Exif()
    exif[0x0112] = 8  # "rotate 90 clockwise to display": stored turned the other way
    img.transpose(Image.Transpose.ROTATE_270).save(tmp_path / "stored_sideways.png", exif=exif.tobytes())
    out = tmp_path / "p.json"
    main([str(tmp_path / "upright.png"), str(tmp_path / "stored_sideways.png"), "--checkpoint", str(run),
          "--output", str(out), "--top-k", "5", "--quiet"])
    a, b = ({t["label"]: t["probability"] for t in r["top_k"]} for r in json.loads(out.read_text()))
    assert a == pytest.approx(b, abs=1e-4)


def test_attention_option(run, messy, tmp_path):
    root, _, _ = messy
    out = tmp_path / "att"
    assert main([str(root / "plain.jpg"), str(root / "rotated.jpg"), str(root / "empty.jpg"), "--checkpoint",
                 str(run), "--attention", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["plain_attention.png", "rotated_attention.png"]


@pytest.mark.parametrize("read_ahead", [True, False])
def test_batches_cover_every_file_once_and_stay_lazy(messy, monkeypatch, read_ahead):
    root, good, bad = messy
    paths = [root / n for n in good + bad]
    calls = []
    real = inference.decode_pixels
    monkeypatch.setattr(inference, "decode_pixels", lambda p, s: calls.append(p) or real(p, s))
    batches = iter_image_batches(paths, IMAGE_SIZE, batch_size=2, num_threads=2, read_ahead=read_ahead)
    first = next(batches)
    # this chunk and (reading ahead) the next one only: memory stays bounded
    assert len(calls) <= 4 if read_ahead else sorted(calls) == sorted(paths[:2])
    seen_ok, seen_err = list(first.indices), [e.index for e in first.errors]
    for batch in batches:
        assert batch.images.shape == (len(batch.paths), 3, IMAGE_SIZE, IMAGE_SIZE)
        assert batch.images.dtype == torch.uint8 and len(batch.paths) + len(batch.errors) <= 2
        assert [paths[i] for i in batch.indices] == batch.paths
        seen_ok += batch.indices
        seen_err += [e.index for e in batch.errors]
    assert sorted(seen_ok + seen_err) == list(range(len(paths)))
    assert sorted(seen_err) == list(range(len(good), len(paths)))


def test_predict_dataset_matches_the_model(run):
    model, ckpt = load_model(run / "best.pt")
    images, labels = make_synthetic_flowers(2, IMAGE_SIZE, seed=4)
    probs = predict_dataset(model, TensorImageDataset(images, labels, list(CLASSES)), ckpt["mean"], ckpt["std"],
                            "cpu", batch_size=3)
    assert probs.shape == (10, 5)
    torch.testing.assert_close(probs.sum(1), torch.ones(10))
    x = (images / 255.0 - torch.tensor(ckpt["mean"]).view(1, 3, 1, 1)) / torch.tensor(ckpt["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(probs, model(x).softmax(-1), atol=1e-5, rtol=1e-4)


def test_pick_device():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type in ("cpu", "cuda", "mps")
    with pytest.raises(ValueError, match="unknown device"):
        pick_device("tpu-please")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            pick_device("cuda")


def test_flip_tta_averages_the_logits_of_the_image_and_its_mirror(run):
    model, ckpt = load_model(run / "best.pt")
    images, labels = make_synthetic_flowers(2, IMAGE_SIZE, seed=5)
    ds = TensorImageDataset(images, labels, list(CLASSES))
    plain = predict_dataset(model, ds, ckpt["mean"], ckpt["std"], "cpu")
    tta = predict_dataset(model, ds, ckpt["mean"], ckpt["std"], "cpu", tta=True)
    mirrored = predict_dataset(model, TensorImageDataset(images.flip(-1), labels, list(CLASSES)), ckpt["mean"],
                               ckpt["std"], "cpu")
    expected = ((plain.log() + mirrored.log()) / 2).softmax(-1)  # log-softmax differs from logits by a constant
    torch.testing.assert_close(tta, expected, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(tta, plain, atol=1e-4)  # the synthetic flowers are not mirror-symmetric


def test_tta_option_of_the_cli(run, messy, tmp_path):
    root, good, _ = messy
    plain, tta = tmp_path / "plain.json", tmp_path / "tta.json"
    assert main([str(root), "--checkpoint", str(run), "--output", str(plain), "--quiet"]) == 0
    assert main([str(root), "--checkpoint", str(run), "--tta", "--output", str(tta), "--quiet"]) == 0
    a, b = _rel(json.loads(plain.read_text()), root), _rel(json.loads(tta.read_text()), root)
    assert sorted(a) == sorted(b)
    confidences = [(a[n]["confidence"], b[n]["confidence"]) for n in good if "/" not in n]
    assert confidences and any(abs(x - y) > 1e-4 for x, y in confidences)  # the mirror images were used


def test_two_scale_tta_averages_the_mirrors_at_the_model_size_and_one_patch_more(run):
    model, _ = load_model(run / "best.pt")  # vit_micro: 32 px, patch 8
    two = inference.TwoScaleTTA(model)
    assert two.image_size == 40 and model.at_image_size(32) is model
    larger = two.larger
    assert larger.pos_embedding.shape[1] == 1 + 5 * 5 and larger.image_size == 40
    torch.testing.assert_close(larger.pos_embedding[:, 0], model.pos_embedding[:, 0])  # CLS kept, the grid resampled
    torch.manual_seed(0)
    x = torch.randn(3, 3, 40, 40)
    small = torch.nn.functional.interpolate(x, size=(32, 32), mode="bilinear", antialias=True, align_corners=False)
    with torch.no_grad():
        expected = (model(small) + model(small.flip(-1)) + larger(x) + larger(x.flip(-1))) / 4
        torch.testing.assert_close(two(x), expected)
        assert not torch.allclose(two(x), (model(small) + model(small.flip(-1))) / 2, atol=1e-4)  # both sizes count


def test_tta_scales_option_of_the_cli_and_its_attention_maps(run, messy, tmp_path):
    root, good, _ = messy
    flip, scales = tmp_path / "flip.json", tmp_path / "scales.json"
    assert main([str(root), "--checkpoint", str(run), "--tta", "--output", str(flip), "--quiet"]) == 0
    assert main([str(root), "--checkpoint", str(run), "--tta-scales", "--output", str(scales), "--quiet",
                 "--attention", str(tmp_path / "maps")]) == 0
    a, b = _rel(json.loads(flip.read_text()), root), _rel(json.loads(scales.read_text()), root)
    assert sorted(a) == sorted(b)
    confidences = [(a[n]["confidence"], b[n]["confidence"]) for n in good if "/" not in n]
    assert confidences and any(abs(x - y) > 1e-4 for x, y in confidences)  # the larger size was used
    assert len(list((tmp_path / "maps").glob("*.png"))) == len(confidences)  # maps of the ViT inside


@pytest.mark.parametrize("read_ahead", [True, False])
def test_a_decoder_crash_costs_only_its_own_file(messy, monkeypatch, read_ahead):
    root, good, _ = messy
    paths = [root / n for n in good]
    real = inference.decode_pixels

    def flaky(path, size):
        if path == paths[1]:
            raise RuntimeError("boom")
        return real(path, size)

    monkeypatch.setattr(inference, "decode_pixels", flaky)
    batches = list(iter_image_batches(paths, IMAGE_SIZE, batch_size=3, num_threads=2, read_ahead=read_ahead))
    errors = [e for b in batches for e in b.errors]
    assert [(e.index, e.reason) for e in errors] == [(1, "RuntimeError: boom")]
    assert [i for b in batches for i in b.indices] == [i for i in range(len(paths)) if i != 1]


def test_heic_photos_are_predicted_and_every_skipped_file_gets_a_row_in_the_csv(run, tmp_path):
    """An iPhone folder: HEIC photos, a JPEG, an edit sidecar (.AAE) and a video. Each file gets a row: the photos a
    label, the others the reason they were skipped (before, the HEIC and the rest were on stderr only)."""
    pytest.importorskip("pillow_heif").register_heif_opener()  # to write them
    folder = tmp_path / "iphone"
    folder.mkdir()
    images, _ = make_synthetic_flowers(1, 48, seed=4)
    photo = Image.fromarray(images[0].permute(1, 2, 0).numpy())
    photo.save(folder / "IMG_0001.HEIC", quality=90)
    photo.save(folder / "IMG_0002.jpg", quality=95)
    (folder / "IMG_0001.AAE").write_text("<plist/>")
    (folder / "IMG_0003.MOV").write_bytes(b"\x00\x00\x00\x14ftypqt  ")
    out = tmp_path / "p.csv"
    assert main([str(folder), "--checkpoint", str(run), "--output", str(out), "--quiet"]) == 0
    with open(out, newline="") as f:
        rows = {Path(r["path"]).name: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["IMG_0001.AAE", "IMG_0001.HEIC", "IMG_0002.jpg", "IMG_0003.MOV"]
    assert rows["IMG_0001.HEIC"]["error"] == "" and rows["IMG_0001.HEIC"]["label"] == rows["IMG_0002.jpg"]["label"]
    for name, ext in (("IMG_0001.AAE", ".AAE"), ("IMG_0003.MOV", ".MOV")):
        assert rows[name]["label"] == "" and rows[name]["error"].startswith(
            f"skipped: not an image file by its extension ({ext}; images are "), rows[name]
