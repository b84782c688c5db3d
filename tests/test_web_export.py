"""``vit-flowers export --web DIR`` without a browser (vit_flowers/inference/web_export.py): what the folder holds, its
config.json and rule.json against the checkpoint, the CDN flag, a run without an unknown rule, and the bad inputs
(no best.pt, an output folder that exists, ONNX Runtime Web not installed). The page itself, in Chromium:
tests/test_web_browser.py. The JavaScript resize against PyTorch's: test_preprocess_js_matches_resize_crop (node).

Skipped, with the reason, without the onnx extra; the tests that copy ONNX Runtime Web in skip without `npm ci`
in web/ (.ci/run runs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import run_without_rule

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from vit_flowers.data.images import resize_crop
from vit_flowers.export import main as export_main
from vit_flowers.inference import web_export
from vit_flowers.inference.unknown import RULES, known_scores, rule_from_checkpoint
from vit_flowers.runs.checkpoint import load_checkpoint

NPM = web_export.NPM_FOLDER
NODE = shutil.which("node")


def _installed() -> bool:
    try:
        web_export.find_ort()
    except ValueError:
        return False
    return True


needs_npm = pytest.mark.skipif(not _installed(), reason=f"ONNX Runtime Web is not installed: `npm ci` in {NPM}")


@pytest.fixture(scope="module")
def site(micro_run, tmp_path_factory) -> Path:
    if not _installed():
        pytest.skip(f"ONNX Runtime Web is not installed: `npm ci` in {NPM}")
    folder = tmp_path_factory.mktemp("web") / "site"
    assert export_main(["--checkpoint", str(micro_run), "--web", str(folder), "--quiet"]) == 0
    return folder


@needs_npm
def test_the_folder_holds_the_page_the_model_and_onnx_runtime(site, micro_run):
    names = {p.name for p in site.iterdir()}
    assert {"index.html", "app.js", "preprocess.js", "unknown.js", "model.onnx", "config.json", "rule.json",
            *web_export.ORT_FILES} == names
    assert not (micro_run / "model.onnx").exists()  # --web without --output writes nothing beside the run
    config = json.loads((site / "config.json").read_text())
    ckpt = load_checkpoint(micro_run / "best.pt")
    assert config["classes"] == list(ckpt["classes"]) and config["image_size"] == ckpt["image_size"]
    assert config["mean"] == list(ckpt["mean"]) and config["std"] == list(ckpt["std"])
    assert config["ort"] == {"version": web_export.find_ort().version, "script": "ort.wasm.min.js", "wasm_paths": None}
    lock = json.loads((NPM / "package-lock.json").read_text())
    assert config["ort"]["version"] == lock["packages"]["node_modules/onnxruntime-web"]["version"]


@needs_npm
def test_rule_json_rounds_back_to_the_checkpoints_float32_arrays(site, micro_run):
    """The page reads each number with Math.fround: the same float32 as the checkpoint's, so its scores are numpy's."""
    rule = rule_from_checkpoint(load_checkpoint(micro_run / "best.pt"))
    assert rule is not None and rule.means is not None and rule.precision is not None
    arrays = json.loads((site / "rule.json").read_text())
    config = json.loads((site / "config.json").read_text())
    assert config["unknown"]["rule"] == rule.rule and config["unknown"]["threshold"] == rule.threshold
    np.testing.assert_array_equal(np.asarray(arrays["means"], dtype=np.float32), rule.means)
    np.testing.assert_array_equal(np.asarray(arrays["precision"], dtype=np.float32), rule.precision)


def test_the_cdn_flag_copies_no_runtime_and_names_the_pinned_version(micro_run, tmp_path):
    folder = tmp_path / "cdn"
    assert export_main(["--checkpoint", str(micro_run), "--web", str(folder), "--web-cdn", "--quiet"]) == 0
    assert not any((folder / name).exists() for name in web_export.ORT_FILES)
    ort = json.loads((folder / "config.json").read_text())["ort"]
    assert ort["script"] == f"https://cdn.jsdelivr.net/npm/onnxruntime-web@{ort['version']}/dist/ort.wasm.min.js"
    assert ort["wasm_paths"] == f"https://cdn.jsdelivr.net/npm/onnxruntime-web@{ort['version']}/dist/"


def test_a_run_without_an_unknown_rule_exports_a_page_without_not_sure(micro_run, tmp_path):
    run = run_without_rule(micro_run, tmp_path / "no-rule")
    folder = tmp_path / "site"
    assert export_main(["--checkpoint", str(run), "--web", str(folder), "--web-cdn", "--quiet"]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["unknown"] is None and config["features_output"] is False and not (folder / "rule.json").exists()


def test_a_folder_that_exists_is_refused_unless_overwrite_and_a_users_folder_never(micro_run, tmp_path, caplog):
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "mine.txt").write_text("a user's file")
    args = ["--checkpoint", str(micro_run), "--web", str(folder), "--web-cdn"]
    assert export_main(args) == 1
    assert f"--web {folder} already exists: pass --overwrite" in caplog.text
    caplog.clear()
    assert export_main([*args, "--overwrite"]) == 1  # not an earlier export: kept, even with --overwrite
    assert "is not a web export" in caplog.text and (folder / "mine.txt").read_text() == "a user's file"
    shutil.rmtree(folder)
    assert export_main(args + ["--quiet"]) == 0
    assert export_main(args + ["--quiet"]) == 1  # an export now: refused without --overwrite ...
    assert export_main([*args, "--overwrite", "--quiet"]) == 0  # ... replaced with it
    assert not list(tmp_path.glob(".site.*"))  # no staging folder left behind


def test_a_run_folder_without_best_pt_is_named(tmp_path, caplog):
    (tmp_path / "run").mkdir()
    assert export_main(["--checkpoint", str(tmp_path / "run"), "--web", str(tmp_path / "site"), "--web-cdn"]) == 1
    assert f"no checkpoint (best.pt) in {tmp_path / 'run'}" in caplog.text
    assert not (tmp_path / "site").exists()


def test_onnx_runtime_web_missing_says_npm_ci_before_any_work(micro_run, tmp_path, monkeypatch, caplog):
    npm = tmp_path / "web"
    npm.mkdir()
    shutil.copy(NPM / "package-lock.json", npm / "package-lock.json")
    monkeypatch.setattr(web_export, "NPM_FOLDER", npm)
    assert export_main(["--checkpoint", str(micro_run), "--web", str(tmp_path / "site")]) == 1
    assert f"run `npm ci` in {npm}" in caplog.text and "--web-cdn" in caplog.text
    assert not (tmp_path / "site").exists()


@pytest.mark.skipif(NODE is None, reason="node is not installed (apt-get install nodejs)")
def test_preprocess_js_matches_resize_crop(tmp_path):
    """preprocess.js's resize and crop give PyTorch's uint8 pixels exactly: down, up, portrait, landscape, square,
    odd crops."""
    rng = np.random.default_rng(0)
    cases = []
    for h, w, size in [(240, 320, 64), (333, 500, 96), (500, 333, 96), (64, 64, 64), (50, 70, 64), (317, 211, 72),
                       (97, 97, 32), (48, 48, 32)]:
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        expected = resize_crop([torch.from_numpy(image).permute(2, 0, 1)], size)[0].permute(1, 2, 0)
        cases.append({"h": h, "w": w, "size": size, "image": image.ravel().tolist(),
                      "expected": expected.contiguous().numpy().ravel().tolist()})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    script = f"""
const p = require({json.dumps(str(web_export.ASSETS / "preprocess.js"))});
const cases = require({json.dumps(str(tmp_path / "cases.json"))});
console.log(JSON.stringify(cases.map((c) => {{
  const out = p.resizeCrop(Uint8Array.from(c.image), c.h, c.w, c.size);
  return out.reduce((n, v, i) => n + (v !== c.expected[i]), 0);
}})));"""
    differing = json.loads(subprocess.run([NODE, "-e", script], capture_output=True, text=True, check=True).stdout)
    assert differing == [0] * len(cases)


@pytest.mark.skipif(NODE is None, reason="node is not installed (apt-get install nodejs)")
def test_unknown_js_scores_as_unknown_py(tmp_path):
    """unknown.js's score of every rule (a taught run's offsets too) is numpy's, from the numbers rule.json holds."""
    rng = np.random.default_rng(1)
    classes, dim, photos = 4, 6, 5
    logits = rng.normal(size=(photos, classes)).astype(np.float32)
    features = rng.normal(size=(photos, dim)).astype(np.float32)
    means = rng.normal(size=(classes, dim)).astype(np.float32)
    a = rng.normal(size=(dim, dim))
    precision = (a @ a.T / dim + np.eye(dim)).astype(np.float32)
    offsets = np.abs(rng.normal(size=classes)).astype(np.float32)
    arrays = {"means": web_export._float32s(means), "precision": web_export._float32s(precision),
              "offsets": web_export._float32s(offsets)}
    cases = [{"rule": rule, "expected": known_scores(rule, logits, features, means, precision,
                                                     offsets if rule == "mahalanobis" else None).tolist()}
             for rule in RULES]
    (tmp_path / "in.json").write_text(json.dumps({"cases": cases, "arrays": arrays, "logits": logits.tolist(),
                                                  "features": features.tolist()}))
    script = f"""
const u = require({json.dumps(str(web_export.ASSETS / "unknown.js"))});
const d = require({json.dumps(str(tmp_path / "in.json"))});
console.log(JSON.stringify(d.cases.map((c) => {{
  const arrays = c.rule === "mahalanobis" ? d.arrays : {{ means: d.arrays.means }};
  const rule = u.prepareRule({{ rule: c.rule, threshold: 0 }}, arrays);
  return d.logits.map((l, i) => {{
    const logits = l.map(Math.fround);
    return u.knownScore(rule, logits, u.softmax(logits), d.features[i].map(Math.fround));
  }});
}})));"""
    got = json.loads(subprocess.run([NODE, "-e", script], capture_output=True, text=True, check=True).stdout)
    for case, scores in zip(cases, got):
        np.testing.assert_allclose(scores, case["expected"], rtol=1e-9, atol=1e-9, err_msg=case["rule"])
