"""teach: a new class from a few photos, without retraining; the trained run is never changed."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import numpy as np
import pytest
from helpers import file_digests, smoke_config, write_class_folders, write_crops

from vit_flowers import train as train_mod
from vit_flowers.data.synthetic import CLASSES
from vit_flowers.evaluate import main as evaluate_main
from vit_flowers.inference.calibration import TEACH_INPUT, TEACH_PER_CLASS
from vit_flowers.predict import main as predict_main
from vit_flowers.runs.checkpoint import load_checkpoint
from vit_flowers.teach import main as teach_main

skimage_data = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return train_mod.train(smoke_config(tmp_path_factory.mktemp("teach"), run_name="s")).run_dir






def _labels(csv_path: Path) -> list[str]:
    with open(csv_path, newline="") as f:
        return [r["label"] for r in csv.DictReader(f)]


def test_teach_makes_a_run_that_predicts_the_new_class_and_leaves_the_run_alone(run, tmp_path):
    before = file_digests(run)
    taught = write_crops("brick", tmp_path / "teach" / "brick", 8, seed=0)
    held_out = write_crops("brick", tmp_path / "held" / "brick", 12, seed=1)
    new = tmp_path / "new"
    assert teach_main([str(run), "--add", f"brick={taught}", "--output", str(new)]) == 0
    ckpt = load_checkpoint(new / "best.pt")
    assert ckpt["classes"] == [*CLASSES, "brick"] and ckpt["class_means"]["counts"][-1] == 8
    trained = load_checkpoint(run / "best.pt")["unknown"]
    rule = ckpt["unknown"]  # measured again with the new class in (tests/test_unknown.py: by how much)
    assert rule["rule"] == trained["rule"] == "mahalanobis" and rule["means"].shape[0] == len(CLASSES) + 1
    assert rule["threshold"] <= trained["threshold"] and rule["offsets"].shape == (len(CLASSES) + 1,)
    assert (rule["offsets"][:-1] == 0).all() and rule["offsets"][-1] >= 0
    estimate = ckpt["taught"]["estimate"]
    assert [e["name"] for e in estimate] == ["brick"] and estimate[0]["photos"] == 8
    assert estimate[0]["correct"] + sum(estimate[0]["confused"].values()) == 8
    out = tmp_path / "p.csv"
    assert predict_main([str(held_out), "--checkpoint", str(new), "--output", str(out), "--quiet",
                         "--no-unknown"]) == 0
    assert _labels(out).count("brick") >= 10
    flowers = write_class_folders(tmp_path / "flowers", per_class=4)
    assert predict_main([str(flowers), "--recursive", "--checkpoint", str(new), "--output", str(tmp_path / "f.csv"),
                         "--quiet", "--no-unknown"]) == 0
    assert _labels(tmp_path / "f.csv").count("brick") <= 2  # the old classes keep their photos
    assert file_digests(run) == before


def test_evaluate_and_export_take_the_taught_run(run, tmp_path):
    pytest.importorskip("onnxruntime")
    from vit_flowers.export import export_checkpoint
    from vit_flowers.inference.onnx_runtime import load_onnx

    data = write_class_folders(tmp_path / "data", per_class=3)
    write_crops("brick", data / "brick", 4, seed=2)
    new = tmp_path / "new"
    assert teach_main([str(run), "--add", f"brick={write_crops('brick', tmp_path / 'c', 8, seed=0)}", "--output",
                       str(new)]) == 0
    assert evaluate_main(["--checkpoint", str(new), "--data", str(data), "--output", str(tmp_path / "e"),
                          "--quiet"]) == 0
    exported = load_onnx(export_checkpoint(new, output=tmp_path / "m.onnx"))
    assert exported.classes[-1] == "brick" and exported.gives_features


def test_teach_refuses_an_existing_run_and_the_run_itself(run, tmp_path, caplog):
    photos = write_crops("brick", tmp_path / "c", 5, seed=0)
    new = tmp_path / "new"
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(new)]) == 0
    first = file_digests(new)
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(new)]) == 1
    assert "already holds a run" in caplog.text and file_digests(new) == first
    assert "--overwrite" in caplog.text and "--run-name" not in caplog.text  # teach's options, not train's
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
    assert not np.allclose(ckpt["unknown"]["means"][c], old["unknown"]["means"][c])  # the rule's mean took them in


def test_a_run_without_class_means_reads_its_training_photos(tmp_path):
    old = train_mod.train(smoke_config(tmp_path, report=False)).run_dir  # no report: no class means kept
    assert load_checkpoint(old / "best.pt")["class_means"] is None
    new = tmp_path / "new"
    assert teach_main([str(old), "--add", f"brick={write_crops('brick', tmp_path / 'c', 5, seed=0)}",
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
    from vit_flowers.teaching import teach as teaching

    def refuse(*args, **kwargs):
        raise AssertionError("teach read the training photos again")

    monkeypatch.setattr(teaching, "_training_photos", refuse)
    photos = write_crops("brick", tmp_path / "c", 6, seed=0)
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(tmp_path / "new")]) == 0
    ckpt = load_checkpoint(tmp_path / "new" / "best.pt")
    assert ckpt["model_config"]["head_input"] == TEACH_INPUT and ckpt["taught"]["head"].startswith("logistic")
    labels = ckpt["teach_sample"]["labels"].numpy()
    assert (labels == len(CLASSES)).sum() == 12  # the 6 photos and their mirror images
    # taught again: the first taught class stays in what the head is fitted on
    more = write_crops("coffee", tmp_path / "d", 5, seed=3)
    assert teach_main([str(tmp_path / "new"), "--add", f"coffee={more}", "--output", str(tmp_path / "two")]) == 0
    two = load_checkpoint(tmp_path / "two" / "best.pt")
    assert two["classes"] == [*CLASSES, "brick", "coffee"]
    assert np.bincount(two["teach_sample"]["labels"].numpy())[-2:].tolist() == [12, 10]
    out = tmp_path / "p.csv"
    held = write_crops("coffee", tmp_path / "held", 8, seed=4)
    assert predict_main([str(held), "--checkpoint", str(tmp_path / "two"),
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
    assert teach_main([str(run), "--add", f"brick={write_crops('brick', tmp_path / 'c', 6, seed=0)}", "--output",
                       str(new)]) == 0
    model, ckpt = load_model(new / "best.pt")
    exported = load_onnx(export_checkpoint(new, output=tmp_path / "m.onnx"))
    x = torch.randn(4, 3, ckpt["image_size"], ckpt["image_size"])
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(exported.logits(x.numpy()), expected, rtol=1e-3, atol=1e-3)


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory) -> Path:
    """A smoke run of the hybrid (Lite0's ImageNet stages at stride 32: one token a photo)."""
    cfg = smoke_config(tmp_path_factory.mktemp("teach_hybrid"), run_name="h", pretrained="imagenet",
                       patch_embed="lite0", patch_size=32)
    return train_mod.train(cfg).run_dir


def test_a_hybrid_is_taught_through_a_gate_on_its_trunk(hybrid_run, tmp_path):
    """A hybrid keeps its trained head and gains a gate on the trunk's pooled output (fitted on the kept trunk
    outputs of its training photos, in best.pt, and the photos given): the new class is recognised, the trained
    classes keep the trained head's order among them, and teaching again refits the gate over every class."""
    import torch

    from vit_flowers.runs.checkpoint import load_model
    from vit_flowers.teaching.gate import GATE_BIAS

    sample = load_checkpoint(hybrid_run / "best.pt")["teach_sample"]
    assert sample["trunk"].shape == (len(sample["labels"]), 320)  # Lite0's stride-32 channels
    new = tmp_path / "new"
    assert teach_main([str(hybrid_run), "--add", f"brick={write_crops('brick', tmp_path / 'c', 8, seed=0)}",
                       "--output", str(new)]) == 0
    (old, _), (model, ckpt) = load_model(hybrid_run / "best.pt"), load_model(new / "best.pt")
    assert ckpt["classes"] == [*CLASSES, "brick"] and ckpt["model_config"]["taught"] == 1
    assert float(model.mlp_head.taught_bias) == GATE_BIAS and ckpt["taught"]["head"].startswith("the trained head")
    assert torch.equal(model.mlp_head.trained.weight, old.mlp_head.weight)
    out = tmp_path / "p.csv"
    assert predict_main([str(write_crops("brick", tmp_path / "held", 10, seed=1)), "--checkpoint", str(new), "--output",
                         str(out), "--quiet", "--no-unknown"]) == 0
    assert _labels(out).count("brick") >= 8
    x = torch.randn(6, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x)[:, :len(CLASSES)].argmax(1), old(x).argmax(1))
    more = write_crops("coffee", tmp_path / "d", 5, seed=3)
    assert teach_main([str(new), "--add", f"coffee={more}", "--output", str(tmp_path / "two")]) == 0
    two = load_checkpoint(tmp_path / "two" / "best.pt")
    assert two["model_config"]["taught"] == 2 and two["model"]["mlp_head.gate.weight"].shape == (len(CLASSES) + 2, 320)
    assert np.bincount(two["teach_sample"]["labels"].numpy())[-2:].tolist() == [16, 10]
    assert len(two["teach_sample"]["trunk"]) == len(two["teach_sample"]["labels"])


def test_photos_added_to_a_hybrids_trained_class_change_no_weight_and_get_no_estimate(hybrid_run, tmp_path, caplog):
    """More photos of a class a hybrid was trained on fit nothing (its trained head stays, no gate is added): the new
    run predicts as the run does, so teach neither says nor keeps an estimate (#55: it did, of a head it did not
    write); the photos join the class's mean and kept features, which a later teach fits on."""
    import torch

    from vit_flowers.teaching.teach import teach

    caplog.set_level("INFO")
    result = teach(hybrid_run, [(CLASSES[0], write_crops("brick", tmp_path / "c", 6, seed=0))], tmp_path / "new")
    old, new = load_checkpoint(hybrid_run / "best.pt"), load_checkpoint(result.best)
    assert new["model"].keys() == old["model"].keys()
    assert all(torch.equal(new["model"][k], v) for k, v in old["model"].items())
    assert result.estimates == [] and "estimate" not in new["taught"] and "estimate:" not in caplog.text
    assert new["class_means"]["counts"][0] == old["class_means"]["counts"][0] + 6
    assert len(new["teach_sample"]["labels"]) == len(old["teach_sample"]["labels"]) + 12  # and their mirror images


def test_a_hybrid_kept_without_trunk_outputs_reads_its_training_photos(hybrid_run, tmp_path, caplog):
    """A hybrid's best.pt from before the trunk outputs were kept: teach reads its training photos again."""
    import torch

    state = torch.load(hybrid_run / "best.pt", map_location="cpu", weights_only=True)
    del state["teach_sample"]["trunk"]
    old = tmp_path / "old"
    old.mkdir()
    for name in ("config.yaml", "split.json"):
        if (hybrid_run / name).is_file():
            (old / name).write_bytes((hybrid_run / name).read_bytes())
    torch.save(state, old / "best.pt")
    caplog.set_level("INFO")
    assert teach_main([str(old), "--add", f"brick={write_crops('brick', tmp_path / 'c', 5, seed=0)}",
                       "--output", str(tmp_path / "new")]) == 0
    assert "reading up to" in caplog.text
    assert "trunk" in load_checkpoint(tmp_path / "new" / "best.pt")["teach_sample"]


@pytest.mark.parametrize("name", ["a/b", "..", "../../etc", "li\nly", "unknown", "Unknown", " ", ""])
def test_a_bad_class_name_is_refused_in_one_line_and_nothing_is_written(run, tmp_path, caplog, name):
    """The rule of data/class_names.py, which the app applies too (tests/test_app_teach.py)."""
    photos = write_crops("brick", tmp_path / "c", 5, seed=0)
    before = file_digests(run)
    assert teach_main([str(run), "--add", f"{name}={photos}", "--output", str(tmp_path / "new")]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0] and "class name" in errors[0] and "'unknown'" in errors[0]
    assert not (tmp_path / "new").exists() and file_digests(run) == before
    assert teach_main([str(run), "--add", f"brick={photos}", "--add", f"brick={photos}", "--output",
                       str(tmp_path / "new")]) == 1
    assert "given twice" in caplog.text and not (tmp_path / "new").exists()


def test_photo_folders_are_checked_and_few_photos_get_a_warning_with_the_estimate(run, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "notes.txt").write_text("not a photo")
    (broken / "IMG_1.AAE").write_text("an iPhone's edits")
    (broken / "b.jpg").write_bytes(b"not a jpeg")
    assert teach_main([str(run), "--add", f"brick={broken}", "--output", str(tmp_path / "new")]) == 1
    assert f"--add brick={broken}: none of its 1 photo(s) could be read" in caplog.text
    assert "b.jpg" in caplog.text and "notes.txt" in caplog.text and "IMG_1.AAE" in caplog.text  # all named
    (broken / "b.jpg").unlink()
    assert teach_main([str(run), "--add", f"brick={broken}", "--output", str(tmp_path / "new")]) == 1
    assert "no photos in it (only 2 other file(s))" in caplog.text
    assert teach_main([str(run), "--add", f"brick={tmp_path / 'nowhere'}", "--output", str(tmp_path / "new")]) == 1
    assert "nowhere: not a folder" in caplog.text and not (tmp_path / "new").exists()
    caplog.clear()
    few = write_crops("brick", tmp_path / "few", 2, seed=0)
    (few / "notes.txt").write_text("not a photo")
    assert teach_main([str(run), "--add", f"brick={few}", "--output", str(tmp_path / "two")]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("only 2 photo(s)" in w for w in warnings) and any("notes.txt" in w for w in warnings)
    estimate = next(w for w in warnings if w.startswith("estimate: brick: about"))
    assert "of 2 photos" in estimate and "add photos" in estimate  # from 2 photos: what would help
    one = write_crops("brick", tmp_path / "one", 1, seed=0)
    assert teach_main([str(run), "--add", f"brick={one}", "--output", str(tmp_path / "one-run")]) == 0
    assert load_checkpoint(tmp_path / "one-run" / "best.pt")["taught"]["estimate"] == []  # none from 1 photo


def test_an_output_is_refused_where_it_would_change_the_run_or_a_users_files(run, tmp_path, caplog):
    photos = write_crops("brick", tmp_path / "c", 5, seed=0)
    before = file_digests(run)
    for output in (run, run / "sub", run / "report"):
        assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(output), "--overwrite"]) == 1
        assert "the run being taught" in caplog.text and "--run-name" not in caplog.text
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(mine)]) == 1
    assert "--output" in caplog.text and "notes.txt" in caplog.text and (mine / "notes.txt").read_text() == "mine"
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(tmp_path)]) == 1  # holds run folders
    assert file_digests(run) == before and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(empty)]) == 0
    first = file_digests(empty)
    assert teach_main([str(run), "--add", f"coffee={write_crops('coffee', tmp_path / 'd', 5, seed=1)}", "--output",
                       str(empty), "--overwrite"]) == 0
    assert file_digests(empty) != first and load_checkpoint(empty / "best.pt")["classes"][-1] == "coffee"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left


@pytest.mark.parametrize("where", ["fit", "write"])
def test_an_interrupted_teach_leaves_no_output_and_the_run_alone(run, tmp_path, monkeypatch, caplog, where):
    """Ctrl-C while the head is fitted, or while best.pt is written (in the staging folder): nothing is left, not
    even the output's parent folders that teach made; with --overwrite the old run stays."""
    from vit_flowers.teaching import output as teach_output
    from vit_flowers.teaching import teach as teaching

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    before = file_digests(run)
    photos = write_crops("brick", tmp_path / "c", 5, seed=0)
    kept = tmp_path / "kept"
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(kept)]) == 0
    first = file_digests(kept)
    monkeypatch.setattr(*((teaching, "fit_head") if where == "fit" else (teach_output, "save_checkpoint")),
                        interrupt)
    out = tmp_path / "deep" / "new"
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(out)]) == 130
    assert "was not written" in caplog.text and not (tmp_path / "deep").exists()
    assert teach_main([str(run), "--add", f"brick={photos}", "--output", str(kept), "--overwrite"]) == 130
    assert file_digests(kept) == first and file_digests(run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "kept"]  # no staging folder


def test_the_recalibrated_rule_accepts_held_out_taught_photos_more_and_old_ones_no_less(run, tmp_path):
    """On the smoke run: held-out photos of the taught class against the rule teach wrote before (#46: the class's
    mean under the old covariance and threshold), and the run's own validation photos."""
    from vit_flowers.inference.features import batch_outputs
    from vit_flowers.inference.run_data import evaluation_set
    from vit_flowers.inference.unknown import UnknownRule, rule_from_checkpoint
    from vit_flowers.runs.checkpoint import load_model
    from vit_flowers.teaching.teach import read_photos

    new = tmp_path / "new"
    assert teach_main([str(run), "--add", f"brick={write_crops('brick', tmp_path / 'c', 10, seed=0)}", "--output",
                       str(new)]) == 0
    model, ckpt = load_model(new / "best.pt")
    after, trained = rule_from_checkpoint(ckpt), rule_from_checkpoint(load_checkpoint(run / "best.pt"))
    assert after is not None and trained is not None and after.means is not None
    before = UnknownRule("mahalanobis", trained.threshold, after.means, trained.precision)
    held = read_photos(sorted((write_crops("brick", tmp_path / "held", 20, seed=5)).iterdir()), 32, "held")
    val = evaluation_set(load_checkpoint(run / "best.pt"), run).data.images  # (the old classes' photos)
    accepted = {}
    for name, images in (("taught", held), ("old", val)):
        out = batch_outputs(model, images, ckpt["mean"], ckpt["std"])
        accepted[name] = [~rule.rejects(rule.scores(out.logits, out.features)) for rule in (before, after)]
    # the smoke model's crops spread far wider than 10 photos show (0% before, 45% after when this was written)
    assert accepted["taught"][1].mean() >= accepted["taught"][0].mean() + 0.25
    assert (accepted["old"][1] >= accepted["old"][0]).all()  # no old photo turned away


def test_the_estimates_range_holds_the_true_recall_about_four_times_in_five():
    """recall_range (an 80% Wilson interval) over 10 photos: averaged over true recalls from 30% to 95%, the share of
    draws whose range holds the truth is near 80% (the exact binomial sum, no sampling); the range holds the point
    and narrows with more photos."""
    from scipy.stats import binom

    from vit_flowers.teaching.estimate import recall_range

    def held(n: int, p: float) -> float:
        ranges = [recall_range({"name": "x", "photos": n, "correct": k, "confused": {}}) for k in range(n + 1)]
        return sum(binom.pmf(k, n, p) for k, (low, high) in enumerate(ranges) if low <= p <= high)

    coverage = np.mean([held(10, p) for p in np.linspace(0.3, 0.95, 27)])
    assert 0.75 <= coverage <= 0.9, coverage
    ten, forty = (recall_range({"name": "x", "photos": n, "correct": 8 * n // 10, "confused": {}}) for n in (10, 40))
    assert ten[0] < 0.8 < ten[1] and ten[1] - ten[0] > forty[1] - forty[0] > 0
    assert 0.25 < ten[1] - ten[0] < 0.4  # about +/- 15 points from 10 photos
    for n in range(1, 12):  # every range holds its point (at 6 of 6 the upper end was rounded below 100%)
        for k in range(n + 1):
            low, high = recall_range({"name": "x", "photos": n, "correct": k, "confused": {}})
            assert low <= k / n <= high


def test_a_hybrids_estimate_predicts_through_the_mixture_with_its_bias():
    """The estimate cross-validates what is written: a hybrid's held-out photos go through the mixture of its
    trained head and the gate fitted without them, with the gate's bias. Features that the gate alone tells apart:
    with a bias far below zero the trained head's favourite takes them, far above they are recognised."""
    from vit_flowers.teaching.estimate import TaughtPhotos, cross_validate

    rng = np.random.default_rng(0)
    old_x = np.r_[rng.normal(-3, 1, (40, 4)), rng.normal(3, 1, (40, 4))].astype(np.float32)
    old_y = np.repeat([0, 1], 40)
    mine = rng.normal(0, 1, (9, 4)).astype(np.float32) + np.array([0, 0, 8, 0], np.float32)
    trained = np.tile([5.0, 0.0], (9, 1)).astype(np.float32)  # the trained head: class 0, whatever the photo
    mirrored = mine + rng.normal(0, 0.1, mine.shape).astype(np.float32)
    photos = [TaughtPhotos(2, mine, mirrored, trained)]
    names = ["a", "b", "new"]
    (low,) = cross_validate(old_x, old_y, photos, names, gate_bias=-30.0)
    (high,) = cross_validate(old_x, old_y, photos, names, gate_bias=30.0)
    assert (low["correct"], low["confused"]) == (0, {"a": 9})
    assert (high["correct"], high["confused"]) == (9, {})
    (alone,) = cross_validate(old_x, old_y, [TaughtPhotos(2, mine, mirrored)], names, gate_bias=-30.0)
    assert alone["correct"] == 9  # without the trained head's logits (another model's head): no mixture, no bias


def test_the_estimate_counts_a_photo_the_rule_turns_away_as_missed():
    """The new run's "none of these" rule, made of the photos each fold fits on (and those alone), judges the photos
    left out: one it turns away is not recognised, and the advice says so."""
    from vit_flowers.inference.unknown import UnknownRule
    from vit_flowers.teaching.estimate import TaughtPhotos, advice, cross_validate

    rng = np.random.default_rng(0)
    old_x = np.r_[rng.normal(-3, 1, (40, 4)), rng.normal(3, 1, (40, 4))].astype(np.float32)
    mine = (rng.normal(0, 1, (9, 4)) + [0, 0, 8, 0]).astype(np.float32)
    seen = []

    def rule_for(threshold):
        def make(fitted):
            seen.append({c: len(x) for c, x in fitted.items()})
            means = np.r_[np.zeros((2, 4)), fitted[2].mean(axis=0, keepdims=True)].astype(np.float32)
            return UnknownRule("distance", threshold, means=means)
        return make

    photos = [TaughtPhotos(2, mine, mine + 0.01, rule_x=mine)]
    (kept,) = cross_validate(old_x, np.repeat([0, 1], 40), photos, ["a", "b", "new"], rule_for=rule_for(-100.0))
    (away,) = cross_validate(old_x, np.repeat([0, 1], 40), photos, ["a", "b", "new"], rule_for=rule_for(0.0))
    assert kept["correct"] == 9 and (away["correct"], away["confused"]) == (0, {"unknown": 9})
    assert {c: n for fold in seen for c, n in fold.items()} == {2: 8}  # each fold's rule: the 8 photos fitted on (of 9)
    assert "turned away (none of these) in 9 of 9" in advice(away)


def test_a_hybrid_taught_five_times_in_a_row_stays_sane(hybrid_run, tmp_path):
    """Each teach reads the run the last one wrote (#55): nothing of the trained run drifts (its head, its classes'
    means in the rule, its kept rows: bit for bit), the rule's threshold is the trained one scaled by the photos
    taken in (each teach scales it by (N + n) / N, the product exact, not compounded rounding), its precision stays
    a precision, the allowances of classes taught before are kept, the gate's bias stays, and every estimate is a
    range about its point. The first class taught is still recognised after the fifth teach."""
    import torch

    from vit_flowers.inference.unknown import rule_from_checkpoint
    from vit_flowers.runs.checkpoint import load_model
    from vit_flowers.teaching.estimate import recall, recall_range
    from vit_flowers.teaching.gate import GATE_BIAS
    from vit_flowers.teaching.teach import teach

    first = load_checkpoint(hybrid_run / "best.pt")
    start = rule_from_checkpoint(first)
    assert start is not None and start.means is not None
    counts, source, offsets = sum(first["class_means"]["counts"]), hybrid_run, np.zeros(0)
    names = ["brick", "coffee", "astronaut", "chelsea", "rocket"]
    for i, name in enumerate(names):
        out = tmp_path / f"t{i}"
        result = teach(source, [(name, write_crops(name, tmp_path / "photos" / name, 6 + i, seed=i))], out)
        model, ckpt = load_model(result.best)
        counts += 6 + i
        rule = rule_from_checkpoint(ckpt)
        assert rule is not None and rule.means is not None and rule.precision is not None
        assert ckpt["classes"] == [*CLASSES, *names[:i + 1]] and model.mlp_head.taught == i + 1
        assert float(model.mlp_head.taught_bias) == GATE_BIAS
        assert torch.equal(model.mlp_head.trained.weight, torch.as_tensor(first["model"]["mlp_head.weight"]))
        assert np.array_equal(rule.means[:len(CLASSES)], start.means)
        assert rule.threshold == pytest.approx(start.threshold * counts / sum(first["class_means"]["counts"]),
                                               rel=1e-5)
        assert np.allclose(rule.precision, rule.precision.T) and np.linalg.eigvalsh(rule.precision).min() > 0
        assert rule.offsets is not None and np.array_equal(rule.offsets[:len(offsets)], offsets)
        offsets = rule.offsets
        sample, kept = ckpt["teach_sample"], first["teach_sample"]
        assert torch.equal(sample["trunk"][:len(kept["trunk"])], kept["trunk"])
        assert np.bincount(sample["labels"].numpy())[len(CLASSES):].tolist() == [2 * (6 + j) for j in range(i + 1)]
        (estimate,) = result.estimates
        low, high = recall_range(estimate)
        assert estimate["photos"] == 6 + i and 0 <= low <= recall(estimate) <= high <= 1
        source = out
    held = tmp_path / "held.csv"
    assert predict_main([str(write_crops("brick", tmp_path / "held", 10, seed=9)), "--checkpoint", str(source),
                         "--output", str(held), "--quiet", "--no-unknown"]) == 0
    assert _labels(held).count("brick") >= 7


def test_a_taught_run_is_not_resumed_and_trains_on_as_pretrained(hybrid_run, tmp_path, caplog):
    """A run teach wrote has no training state: ``--resume`` says so in one line and names the way on
    (``--pretrained``), leaving the run as it was; ``--pretrained`` from it trains a new run from its trained network
    (the trunk and the encoder as trained; the gate is not carried into training)."""
    new = tmp_path / "new"
    assert teach_main([str(hybrid_run), "--add", f"brick={write_crops('brick', tmp_path / 'c', 6, seed=0)}",
                       "--output", str(new)]) == 0
    before = file_digests(new)
    common = ["--config", "configs/smoke.yaml", "--out-dir", str(tmp_path / "ck"), "--threads", "1", "--progress",
              "false", "--report", "false"]
    caplog.set_level("ERROR")
    assert train_mod.main(common + ["--resume", str(new)]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"{new / 'best.pt'} has no training state to resume from (a run that teach wrote: train on "
                      f"from its network with --pretrained)"]
    assert file_digests(new) == before and not (tmp_path / "ck").exists()
    cfg = smoke_config(tmp_path, run_name="on", pretrained=str(new / "best.pt"), patch_embed="lite0", patch_size=32,
                       epochs=1)
    tuned = load_checkpoint(train_mod.train(cfg).run_dir / "best.pt")
    assert tuned["classes"] == list(CLASSES) and "taught" not in tuned["model_config"]
    assert not any(k.startswith("mlp_head.gate") for k in tuned["model"]) and file_digests(new) == before
