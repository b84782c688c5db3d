""""None of these": the rule chosen at the end of training, stored in best.pt and the ONNX export, and applied by
predict, evaluate and the app, with --unknown-threshold and --no-unknown."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import smoke_config, write_class_folders
from PIL import Image

from vit_flowers import train as train_mod
from vit_flowers.evaluate import main as evaluate_main
from vit_flowers.inference.features import batch_outputs
from vit_flowers.inference.run_data import evaluation_set
from vit_flowers.inference.unknown import ACCEPT_FRACTION, UNKNOWN, calibrate, known_scores, rule_from_checkpoint
from vit_flowers.predict import main as predict_main
from vit_flowers.reporting.evaluation import evaluate_dataset
from vit_flowers.runs.checkpoint import load_checkpoint, load_model

skimage_data = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A smoke training run: its end chose the unknown rule."""
    return train_mod.train(smoke_config(tmp_path_factory.mktemp("unknown"), run_name="s")).run_dir


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """Synthetic flowers and scikit-image's non-flowers, in one folder."""
    root = write_class_folders(tmp_path_factory.mktemp("photos") / "p", per_class=2)
    mixed = root.parent / "mixed"
    mixed.mkdir()
    for i, path in enumerate(sorted(root.rglob("*.png"))):
        Image.open(path).save(mixed / f"flower_{i}.png")
    for name in ("astronaut", "coffee", "chelsea", "camera", "coins", "brick"):
        Image.fromarray(getattr(skimage_data, name)()).save(mixed / f"{name}.png")
    return mixed


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_training_stores_a_rule_that_accepts_95_percent_of_its_validation_photos(run):
    ckpt = load_checkpoint(run / "best.pt")
    rule = rule_from_checkpoint(ckpt)
    assert rule is not None and rule.means.shape == (len(ckpt["classes"]), ckpt["model_config"]["dim"])
    model, _ = load_model(run / "best.pt")
    val = evaluation_set(ckpt, run).data
    out = batch_outputs(model, val.images, ckpt["mean"], ckpt["std"])
    accepted = (rule.scores(out.logits, out.features) >= rule.threshold).mean()
    assert accepted == pytest.approx(ckpt["unknown"]["val_accepted"]) and ACCEPT_FRACTION <= accepted < 1


def test_the_final_report_reads_the_rules_pass_and_equals_a_pass_of_its_own(run, tmp_path):
    """Training's report takes the validation photos' outputs from the unknown rule's pass over them: the same
    predictions, accuracy and accepted count as a report that runs the model again (the slow way)."""
    ckpt = load_checkpoint(run / "best.pt")
    model, _ = load_model(run / "best.pt")
    val = evaluation_set(ckpt, run).data
    again = evaluate_dataset(model, val, ckpt, tmp_path / "again", run_dir=run, batch_size=64)  # (the rule's)
    first = json.loads((run / "report" / "metrics.json").read_text())
    for key in ("accuracy", "per_class", "unknown", "n_images", "top_k_accuracy"):
        assert first[key] == again[key], key
    assert _rows(run / "report" / "predictions.csv") == _rows(tmp_path / "again" / "predictions.csv")
    assert first["unknown"]["accepted"] == round(ckpt["unknown"]["val_accepted"] * first["n_images"])


def test_a_run_whose_trunk_trained_passes_over_its_validation_photos_once_at_the_end(tmp_path, monkeypatch):
    from vit_flowers.inference import calibration
    from vit_flowers.reporting import evaluation

    passes = []
    real = calibration.batch_outputs
    monkeypatch.setattr(calibration, "batch_outputs", lambda model, images, *a, **k: passes.append(len(images))
                        or real(model, images, *a, **k))
    monkeypatch.setattr(evaluation, "score_batch", lambda *a, **k: pytest.fail("the report ran the model again"))
    result = train_mod.train(smoke_config(tmp_path, run_name="once"))
    report = result.run_dir / "report"
    metrics = json.loads((report / "metrics.json").read_text())
    # the rule's pass over the val photos, or none when best.pt is the last epoch's, whose validation it reads (#53)
    assert passes.count(metrics["n_images"]) <= 1 and metrics["images_per_second"] > 0  # (that pass's speed)
    assert (report / "training_curves.png").read_bytes() == (result.run_dir / "curves.png").read_bytes()


def test_the_report_draws_the_curves_afresh_when_the_runs_figure_is_older_than_its_metrics(run, tmp_path,
                                                                                           monkeypatch):
    from vit_flowers.reporting import report

    drawn = []
    real = report.plot_training_curves
    monkeypatch.setattr(report, "plot_training_curves", lambda *a, **k: drawn.append(a) or real(*a, **k))
    ckpt = load_checkpoint(run / "best.pt")
    model, _ = load_model(run / "best.pt")
    val = evaluation_set(ckpt, run).data
    mine = Path(shutil.copytree(run, tmp_path / "run"))  # (times kept)
    evaluate_dataset(model, val, ckpt, tmp_path / "copied", run_dir=mine)
    assert drawn == [] and (tmp_path / "copied" / "training_curves.png").is_file()
    later = (mine / "curves.png").stat().st_mtime_ns + 10**9
    os.utime(mine / "metrics.csv", ns=(later, later))  # a row written after the figure
    evaluate_dataset(model, val, ckpt, tmp_path / "drawn", run_dir=mine)
    assert len(drawn) == 1 and (tmp_path / "drawn" / "training_curves.png").is_file()


def test_scores_rank_a_class_mean_first_and_the_threshold_is_a_quantile():
    means = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    feats = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 5.0]])
    logits = np.zeros((3, 2))
    assert np.argmax(known_scores("cosine", logits, feats, means)) == 0
    assert known_scores("distance", logits, feats, means)[0] == pytest.approx(0.0)
    assert known_scores("distance", logits, feats, means)[2] < known_scores("distance", logits, feats, means)[1]
    stretched = np.diag([1.0, 1.0, 1e-4])  # a direction the classes spread along counts little
    assert known_scores("mahalanobis", logits, feats, means, stretched)[2] > known_scores(
        "mahalanobis", logits, feats, means, np.eye(3))[2]
    rule = calibrate("max_softmax", np.arange(100) / 100)
    assert rule.threshold == pytest.approx(0.04) and rule.val_accepted == pytest.approx(0.96)
    with pytest.raises(ValueError, match="needs the model's features"):
        known_scores("cosine", logits)


def test_predict_labels_unknown_below_the_threshold_with_its_score(run, photos, tmp_path):
    out = tmp_path / "p.csv"
    assert predict_main([str(photos), "--checkpoint", str(run), "--output", str(out), "--quiet"]) == 0
    threshold = load_checkpoint(run / "best.pt")["unknown"]["threshold"]
    rows = _rows(out)
    assert rows and all((r["label"] == UNKNOWN) == (float(r["known_score"]) < threshold) for r in rows)
    assert {r["best_class"] for r in rows} <= set(load_checkpoint(run / "best.pt")["classes"])  # the best guess
    everything = tmp_path / "all.json"
    assert predict_main([str(photos), "--checkpoint", str(run), "--output", str(everything), "--quiet",
                         "--unknown-threshold", "1e9"]) == 0
    rows = json.loads(everything.read_text())
    assert all(r["label"] == UNKNOWN and r["known_score"] < 1e9 for r in rows)
    off = tmp_path / "off.csv"
    assert predict_main([str(photos), "--checkpoint", str(run), "--output", str(off), "--quiet",
                         "--no-unknown"]) == 0
    rows = _rows(off)
    assert "known_score" not in rows[0] and not any(r["label"] == UNKNOWN for r in rows)


def test_a_checkpoint_without_a_rule_predicts_as_before_unless_given_a_threshold(tmp_path, photos):
    old = train_mod.train(smoke_config(tmp_path, report=False)).run_dir  # no report: no rule chosen
    assert load_checkpoint(old / "best.pt")["unknown"] is None
    out, cut = tmp_path / "old.csv", tmp_path / "cut.csv"
    assert predict_main([str(photos), "--checkpoint", str(old), "--output", str(out), "--quiet"]) == 0
    assert "known_score" not in _rows(out)[0] and not any(r["label"] == UNKNOWN for r in _rows(out))
    assert predict_main([str(photos), "--checkpoint", str(old), "--output", str(cut), "--quiet",
                         "--unknown-threshold", "0.9"]) == 0
    rows = _rows(cut)  # a top probability cut-off, the app's old "not sure"
    assert all((r["label"] == UNKNOWN) == (float(r["confidence"]) < 0.9) for r in rows)


def test_evaluate_counts_accepted_and_rejected(run, tmp_path):
    assert evaluate_main(["--checkpoint", str(run), "--output", str(tmp_path / "e"), "--quiet"]) == 0
    found = json.loads((tmp_path / "e" / "metrics.json").read_text())
    unknown = found["unknown"]
    assert unknown["accepted"] + unknown["rejected"] == found["n_images"]
    assert unknown["accepted_fraction"] >= ACCEPT_FRACTION  # its own validation photos: the threshold's
    assert 0 <= unknown["accuracy_accepted"] <= 1
    assert f"{unknown['rejected']:,} rejected" in (tmp_path / "e" / "report.md").read_text()
    assert evaluate_main(["--checkpoint", str(run), "--output", str(tmp_path / "all"), "--quiet",
                          "--unknown-threshold", "1e9"]) == 0
    unknown = json.loads((tmp_path / "all" / "metrics.json").read_text())["unknown"]
    assert unknown["accepted"] == 0 and unknown["accuracy_accepted"] is None
    assert evaluate_main(["--checkpoint", str(run), "--output", str(tmp_path / "off"), "--quiet",
                          "--no-unknown"]) == 0
    assert "unknown" not in json.loads((tmp_path / "off" / "metrics.json").read_text())


def test_the_onnx_export_carries_the_rule_and_its_features(run, photos, tmp_path):
    pytest.importorskip("onnxruntime")
    from vit_flowers.export import export_checkpoint
    from vit_flowers.inference.onnx_runtime import load_onnx

    onnx_path = export_checkpoint(run, output=tmp_path / "m.onnx")
    assert load_onnx(onnx_path).gives_features
    torch_csv, onnx_csv = tmp_path / "t.csv", tmp_path / "o.csv"
    assert predict_main([str(photos), "--checkpoint", str(run), "--output", str(torch_csv), "--quiet"]) == 0
    assert predict_main([str(photos), "--checkpoint", str(onnx_path), "--output", str(onnx_csv), "--quiet"]) == 0
    mine, theirs = _rows(torch_csv), _rows(onnx_csv)
    assert [float(r["known_score"]) for r in mine] == pytest.approx([float(r["known_score"]) for r in theirs],
                                                                    rel=0.05, abs=0.02)  # PIL's pixels differ
    agree = np.mean([a["label"] == b["label"] for a, b in zip(mine, theirs)])
    assert agree >= 0.8


def test_the_app_says_not_sure_where_the_rule_rejects(run, photos, tmp_path):
    from vit_flowers.app import command as app_command
    from vit_flowers.app import engine as app_engine
    from vit_flowers.app import page
    from vit_flowers.cli import load_model_from_args

    args = app_command.build_parser().parse_args(["--checkpoint", str(run), "--device", "cpu"])
    loaded = load_model_from_args(args)
    engine = app_engine.Engine(loaded, unknown=rule_from_checkpoint(loaded.ckpt, threshold=1e9), batch_size=4,
                        workdir=tmp_path)
    results = app_engine.classify_files(engine, sorted(photos.glob("*.png"))[:3])
    assert all(r.not_sure for r in results)
    assert f"{engine.rule.rule} &gt;=" in page.classify_html(results, engine.rule)  # the tooltip names the rule
    engine.unknown = None
    assert not any(r.not_sure for r in app_engine.classify_files(engine, sorted(photos.glob("*.png"))[:3]))


# ------------------------------------------------------------------ thresholds that make no sense (#45)


def _strict_json(path: Path) -> dict:
    """The JSON of ``path``, refusing NaN and Infinity (not JSON, though Python writes and reads them)."""
    def refuse(name: str) -> None:
        raise ValueError(f"{path} holds {name}: not valid JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("tool", ["predict", "evaluate"])
@pytest.mark.parametrize("given", [["--unknown-threshold", "nan"], ["--unknown-threshold", "inf"],
                                   ["--unknown-threshold", "-inf"], ["--unknown-threshold=-inf"],
                                   ["--unknown-threshold", "-300", "--no-unknown"]])
def test_non_finite_or_contradictory_thresholds_are_refused_with_a_clear_message(run, photos, tmp_path, capsys,
                                                                                tool, given):
    args = [str(photos)] if tool == "predict" else []
    main = predict_main if tool == "predict" else evaluate_main
    with pytest.raises(SystemExit) as stopped:
        main([*args, "--checkpoint", str(run), "--output", str(tmp_path / "out"), "--quiet", *given])
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert ("must be a finite number" in said) if "--no-unknown" not in given else ("not allowed with" in said)
    assert not (tmp_path / "out").exists()


def test_negative_thresholds_are_values():
    from vit_flowers.predict import build_parser

    for text, value in (("-300", -300.0), ("-1e3", -1000.0), ("-412.5", -412.5), ("-.5", -0.5)):
        assert build_parser().parse_args(["x.jpg", "--unknown-threshold", text]).unknown_threshold == value


def test_a_threshold_that_rejects_nearly_everything_says_the_scale_of_the_rule(run, photos, tmp_path, caplog):
    """A threshold far above every score (as 0.5, a probability, is for minus a squared distance): every photo is
    unknown, and one warning says what the rule scores and its calibrated threshold; the run's own threshold on its
    own validation photos says nothing."""
    stored = load_checkpoint(run / "best.pt")["unknown"]
    assert predict_main([str(photos), "--checkpoint", str(run), "--output", str(tmp_path / "p.csv"), "--quiet",
                         "--unknown-threshold", "1e9"]) == 0
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "rejected" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert f"{len(_rows(tmp_path / 'p.csv'))} of {len(_rows(tmp_path / 'p.csv'))} photos (100%)" in warned[0]
    assert f"({stored['rule']}) scores" in warned[0] and f"calibrated threshold is {stored['threshold']:.4g}" in \
        warned[0]
    caplog.clear()
    assert evaluate_main(["--checkpoint", str(run), "--output", str(tmp_path / "e"), "--quiet",
                          "--unknown-threshold", "1e9"]) == 0
    assert f"calibrated threshold is {stored['threshold']:.4g}" in caplog.text and "(100%)" in caplog.text
    caplog.clear()
    assert evaluate_main(["--checkpoint", str(run), "--output", str(tmp_path / "own"), "--quiet"]) == 0
    assert "rejected by the threshold" not in caplog.text  # its own threshold on its own validation photos


@pytest.mark.parametrize("threshold", [None, "1e9", "-1e9"])
def test_evaluate_rejected_counts_agree_with_its_predictions_csv(run, tmp_path, threshold):
    given = ["--unknown-threshold", threshold] if threshold else []
    assert evaluate_main(["--checkpoint", str(run), "--output", str(tmp_path / "e"), "--quiet", *given]) == 0
    metrics = _strict_json(tmp_path / "e" / "metrics.json")
    rows = _rows(tmp_path / "e" / "predictions.csv")
    assert metrics["unknown"]["rejected"] == sum(r["unknown"] == "1" for r in rows)
    assert metrics["unknown"]["accepted"] == sum(r["unknown"] == "0" for r in rows)
    cut = metrics["unknown"]["threshold"]
    clear = [r for r in rows if abs(float(r["known_score"]) - cut) > 1e-5 * max(1.0, abs(cut))]  # (6 digits shown)
    assert len(clear) >= len(rows) - 2 and all((r["unknown"] == "1") == (float(r["known_score"]) < cut) for r in clear)


def test_a_report_with_a_nan_score_or_threshold_is_valid_json_and_agrees_with_its_csv(tmp_path):
    """The library's own guard: a rule built by hand with a NaN threshold, and a NaN score (a broken model):
    metrics.json stays JSON, and a photo whose score is NaN is rejected in both files."""
    from vit_flowers.inference.unknown import UnknownRule
    from vit_flowers.reporting.evaluation import EvalResult, write_report

    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], dtype=np.float32)
    for threshold, known in ((float("nan"), [0.9, 0.8, 0.6]), (0.5, [0.9, float("nan"), 0.6])):
        out = tmp_path / str(threshold)
        result = EvalResult(["a", "b"], np.array([0, 1, 1]), probs, ["x.png", "y.png", "z.png"], 1.0,
                            known=np.array(known), unknown=UnknownRule("max_softmax", threshold))
        write_report(result, out)
        metrics = _strict_json(out / "metrics.json")
        rows = _rows(out / "predictions.csv")
        assert metrics["unknown"]["rejected"] == sum(r["unknown"] == "1" for r in rows)
    assert [r["unknown"] for r in rows] == ["0", "1", "0"]  # the NaN score is rejected


def _gaussian_classes(rng: np.random.Generator, centres: np.ndarray, per_class: int, scale: float = 1.0,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` points about each row of ``centres``, and their labels."""
    x = np.concatenate([c + scale * rng.standard_normal((per_class, centres.shape[1])) for c in centres])
    return x, np.repeat(np.arange(len(centres)), per_class)


def test_teach_recalibrates_the_rule_so_a_taught_class_is_accepted_and_old_photos_are_not_turned_away():
    """Synthetic features: 4 trained classes (500 photos each), a fifth taught from 10 photos, more spread out (the
    features of a species the network never trained on are). Before (#46) its mean joined under the old covariance
    and threshold; recalibrated, held-out photos of it are accepted about as often
    as held-out photos of the old classes, and no old photo accepted before is turned away."""
    from vit_flowers.inference.unknown import shared_precision
    from vit_flowers.teaching.rule import recalibrate

    rng = np.random.default_rng(0)
    centres = 6 * rng.standard_normal((5, 8))
    train_x, train_y = _gaussian_classes(rng, centres[:4], 500)
    means = np.stack([train_x[train_y == c].mean(0) for c in range(4)])
    precision = shared_precision(train_x, train_y, means)
    val_x, _ = _gaussian_classes(rng, centres[:4], 100)
    trained = calibrate("mahalanobis", known_scores("mahalanobis", np.zeros((len(val_x), 4)), val_x, means, precision),
                        means=means, precision=precision)
    taught = centres[4] + 1.4 * rng.standard_normal((10, 8))
    all_means = np.vstack([means, taught.mean(0)])
    before = rule_from_checkpoint({"unknown": {**trained.state(), "means": all_means}})
    after = recalibrate(before, 2000, {4: taught}, [500] * 4 + [10])
    held_new, _ = _gaussian_classes(rng, centres[4:], 400, scale=1.4)
    held_old, _ = _gaussian_classes(rng, centres[:4], 400)
    accepted = {name: [float((~rule.rejects(rule.scores(np.zeros((len(x), 5)), x))).mean()) for x in (held_new,
                                                                                                         held_old)]
                for name, rule in (("before", before), ("after", after))}
    assert accepted["before"][0] < 0.85 and accepted["after"][0] >= 0.9  # the taught class: about as the old ones
    assert accepted["after"][0] > accepted["before"][0] + 0.1
    old_before = ~before.rejects(before.scores(np.zeros((len(held_old), 5)), held_old))
    old_after = ~after.rejects(after.scores(np.zeros((len(held_old), 5)), held_old))
    assert (old_after >= old_before).all() and accepted["after"][1] >= 0.93  # none turned away
    assert after.offsets is not None and after.offsets[:4].tolist() == [0] * 4 and after.offsets[4] > 0
    stored = rule_from_checkpoint({"unknown": after.state()})  # the offsets go into best.pt and the ONNX metadata
    assert stored is not None and np.allclose(stored.offsets, after.offsets)
    from vit_flowers.inference.unknown import from_metadata, metadata_entries

    exported = rule_from_checkpoint(from_metadata(metadata_entries({"unknown": after.state()})))
    assert exported is not None and np.allclose(exported.scores(np.zeros((3, 5)), held_new[:3]),
                                                after.scores(np.zeros((3, 5)), held_new[:3]), rtol=1e-4)
    with pytest.raises(ValueError, match="offset per class"):
        rule_from_checkpoint({"unknown": {**after.state(), "offsets": np.zeros(3, np.float32)}})


def test_one_photo_a_class_gives_plain_distances_not_a_singular_matrix(caplog):
    """Two photos a class leave one a class to train on: no spread about the means, whose covariance has no inverse
    (the end of such a run failed with numpy's "Singular matrix")."""
    from vit_flowers.inference.unknown import shared_precision

    features = np.arange(12, dtype=np.float32).reshape(3, 4)
    with caplog.at_level("WARNING", logger="vit_flowers.unknown"):
        precision = shared_precision(features, np.arange(3), features)
    assert (precision == np.eye(4)).all() and "no spread of the training photos" in caplog.text
