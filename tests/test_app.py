"""Tests of the functions behind the web app's tabs (vit_flowers.app), without a browser."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import write_messy_folder
from PIL import Image

from vit_flowers.app import command as app_command
from vit_flowers.app import engine as app_engine
from vit_flowers.app import page, server
from vit_flowers.app.engine import Engine, classify_files, folder_table, gallery_groups, model_card, predict_folder
from vit_flowers.app.page import classify_html, classify_page, folder_page, gallery_html, model_card_markdown
from vit_flowers.app.server import is_loopback
from vit_flowers.cli import load_model_from_args
from vit_flowers.data import image_files
from vit_flowers.data.synthetic import CLASSES
from vit_flowers.inference.predictions import predict_images
from vit_flowers.inference.unknown import rule_from_checkpoint
from vit_flowers.predict import main as predict_main


@pytest.fixture(scope="module")
def world(micro_run, tmp_path_factory) -> tuple[Path, tuple[Path, list[str], list[str]]]:
    """This module's copy of the session's micro run, and a folder of every kind of file (readable names, bad
    names)."""
    base = tmp_path_factory.mktemp("app")
    return micro_run, (base / "photos", *write_messy_folder(base / "photos"))


@pytest.fixture
def run(world) -> Path:
    return world[0]


@pytest.fixture
def messy(world) -> tuple[Path, list[str], list[str]]:
    return world[1]


@pytest.fixture
def engine(run, tmp_path) -> Engine:
    args = app_command.build_parser().parse_args(["--checkpoint", str(run), "--device", "cpu"])
    return Engine(load_model_from_args(args), top_k=3, not_sure=0.5, batch_size=4, workdir=tmp_path)


def test_classify_matches_predict_and_draws_the_overlay(engine, messy):
    root, good, _ = messy
    paths = [root / name for name in good]
    results = classify_files(engine, paths)
    loaded = engine.loaded
    ckpt = loaded.ckpt
    expected = [r for batch in predict_images(loaded.model, paths, ckpt["classes"], image_size=ckpt["image_size"],
                                               mean=ckpt["mean"], std=ckpt["std"], top_k=3)
                for r in batch]
    assert [r.name for r in results] == [p.name for p in paths]
    for got, want in zip(results, expected):
        assert got.error is None
        assert [label for label, _ in got.top_k] == [label for label, _ in want.top_k]
        assert [p for _, p in got.top_k] == pytest.approx([p for _, p in want.top_k], abs=1e-5)
        assert got.not_sure == (got.top_k[0][1] < 0.5)
        assert got.photo is not None and got.overlay is not None and got.overlay.size == got.photo.size
        assert max(got.photo.size) == app_engine.DISPLAY_SIZE
    rotated = results[good.index("rotated.jpg")]
    assert rotated.photo.height > rotated.photo.width  # EXIF rotation honoured, as in predict


def test_not_sure_follows_the_threshold(engine, messy):
    root, good, _ = messy
    engine.not_sure = 1.0
    (sure,) = classify_files(engine, [root / good[0]])
    assert sure.not_sure
    html = classify_html([sure], engine.rule)
    assert "Not sure" in html and 'class="vf-label"' in html and 'class="vf-confidence"' in html
    engine.not_sure = 0.0
    assert not classify_files(engine, [root / good[0]])[0].not_sure


def test_bad_uploads_get_their_reason_and_the_next_photo_still_works(engine, messy, tmp_path, monkeypatch):
    root, good, bad = messy
    big = tmp_path / "huge.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (200, 200, 3), dtype=np.uint8)).save(big)
    bomb = tmp_path / "bomb.png"
    Image.new("L", (300, 300)).save(bomb)
    monkeypatch.setattr(image_files, "MAX_IMAGE_PIXELS", 50_000)  # 300 x 300 is a "bomb" now
    engine.max_upload_bytes = 100 * 2**10  # 100 KB; the noise PNG is 118 KB
    paths = [root / b for b in bad] + [big, bomb, tmp_path, tmp_path / "gone.jpg", root / good[0]]
    results = classify_files(engine, paths)
    assert [r.name for r in results] == [p.name for p in paths]
    reasons = {r.name: r.error for r in results}
    assert "truncated" in reasons["corrupt.jpg"] and "empty" in reasons["empty.jpg"]
    assert "not an image" in reasons["notes.jpg"]
    assert reasons["huge.png"] == "file is 118 KB, over the limit of 100 KB"
    assert "decompression bomb" in reasons["bomb.png"]
    assert "folder" in reasons[tmp_path.name] and reasons["gone.jpg"]
    assert results[-1].error is None and results[-1].top_k[0][0] in CLASSES
    html = classify_html(results, engine.rule)
    assert html.count("vf-error-text") == len(paths) - 1


def test_names_are_escaped(engine, messy, tmp_path):
    root, good, _ = messy
    odd = tmp_path / "<img src=x onerror=alert(1)>.png"
    Image.open(root / good[1]).save(odd)
    page = classify_page(engine, [str(odd)])
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;.png" in page


def test_classify_page_turns_any_failure_into_a_message(engine, monkeypatch):
    assert "Drop one or several photos" in classify_page(engine, None)
    monkeypatch.setattr(page, "classify_files", lambda *a: 1 / 0)
    assert "ZeroDivisionError" in classify_page(engine, ["x.png"])


def test_folder_rows_csv_gallery_as_predict(engine, run, messy, tmp_path):
    root, good, bad = messy
    engine.not_sure, engine.unknown = None, rule_from_checkpoint(engine.loaded.ckpt)  # the run's own, as predict's
    assert engine.unknown is not None
    seen = []
    result = predict_folder(engine, str(root), recursive=True, progress=lambda n, total: seen.append((n, total)))
    assert seen[-1] == (len(good) + len(bad),) * 2
    out = tmp_path / "cli.csv"
    assert predict_main([str(root), "--recursive", "--checkpoint", str(run), "--output", str(out), "--quiet",
                         "--device", "cpu"]) == 0
    with open(out, newline="") as f, open(result.csv_path, newline="") as g:
        cli_rows, app_rows = list(csv.reader(f)), list(csv.reader(g))
    assert app_rows[0] == cli_rows[0] and len(app_rows) == len(cli_rows)  # the same header, the same files
    for mine, theirs in zip(app_rows[1:], cli_rows[1:]):  # in the same order, with the same labels and errors
        assert mine[0:2] == theirs[0:2] and mine[3::2] == theirs[3::2]
        assert [float(x or 0) for x in mine[2::2]] == pytest.approx([float(x or 0) for x in theirs[2::2]], abs=1e-5)
    table = folder_table(result)
    assert sorted(row[0] for row in table) == sorted(good + bad)
    assert all(row[5] for row in table if row[0] in bad) and not any(row[5] for row in table if row[0] in good)
    groups = gallery_groups(result.rows, engine.classes)
    assert sum(map(len, groups.values())) == len(good)
    for label, group in groups.items():
        assert all(r.label == label for r in group)
        assert [r.confidence for r in group] == sorted(r.confidence for r in group)  # least confident first
    page = gallery_html(result, engine.classes, per_class=2)
    assert f"{len(bad)} file(s) could not be read" in page and "corrupt.jpg" in page
    assert page.count('class="vf-group"') == len(groups)
    assert page.count("<img ") <= 2 * len(groups)


def test_folder_page_messages(engine, tmp_path):
    text, gallery, table, csv_path = folder_page(engine, str(tmp_path / "nowhere"), True)
    assert "not a folder" in text and table == [] and csv_path is None
    (tmp_path / "empty").mkdir()
    assert "no image files" in folder_page(engine, str(tmp_path / "empty"), False)[0]


def test_model_card_reads_the_run_folder(engine, run, tmp_path):
    """The card shows the training's report; without one, it says so, until evaluate writes one again."""
    from vit_flowers.evaluate import main as evaluate_main

    card = model_card(engine.loaded)
    facts = dict(card.facts)
    assert facts["classes"] == ", ".join(CLASSES) and facts["image size"] == "32 px"
    assert "M" in facts["parameters"] and "epoch(s)" in facts["training"]
    assert card.metrics is not None and card.confusion is not None and card.report is not None
    assert card.curves == (run / "curves.png").resolve()  # the run's own figure, drawn as it trained
    text = model_card_markdown(card, "gradio_api/file=/x/report.html")
    assert f"Validation accuracy: {card.metrics['accuracy']:.1%}" in text and "(gradio_api/file=/x/report.html)" in text
    (run / "report").rename(tmp_path / "report")
    card = model_card(engine.loaded)
    assert card.metrics is None and card.report is None and card.confusion is None
    assert "No evaluation report" in model_card_markdown(card)
    assert evaluate_main(["--checkpoint", str(run), "--output", str(run / "report"), "--quiet",
                          "--device", "cpu"]) == 0
    card = model_card(engine.loaded)
    assert card.metrics is not None and card.confusion is not None and card.report is not None
    assert card.metrics["accuracy"] == json.loads((tmp_path / "report" / "metrics.json").read_text())["accuracy"]


def test_loopback_hosts():
    assert all(map(is_loopback, ["127.0.0.1", "localhost", "::1", "[::1]", "127.1.2.3"]))
    assert not any(map(is_loopback, ["0.0.0.0", "192.168.1.5", "::", "example.org"]))


def test_page_without_folders_has_no_folder_endpoint(engine):
    pytest.importorskip("gradio")
    on = server.build_page(engine, folders=True).config
    off = server.build_page(engine, folders=False).config

    def labels(config: dict) -> list:
        return [c.get("props", {}).get("label") for c in config["components"]]

    assert "Folder" in labels(on) and "Folder" not in labels(off)
    assert len(off["dependencies"]) < len(on["dependencies"])  # no folder event on the server at all


def test_the_model_never_runs_twice_at_once(engine, messy, monkeypatch):
    import threading
    import time

    from vit_flowers.inference import batches as inference

    root, good, _ = messy
    active, most = [0], [0]
    forward = inference.score_batch  # what the pipelines run the model through

    def slow(*args, **kwargs):
        active[0] += 1
        most[0] = max(most[0], active[0])
        time.sleep(0.05)
        try:
            return forward(*args, **kwargs)
        finally:
            active[0] -= 1

    monkeypatch.setattr(inference, "score_batch", slow)
    threads = [threading.Thread(target=classify_files, args=(engine, [root / good[i]])) for i in range(3)]
    threads.append(threading.Thread(target=predict_folder, args=(engine, root)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    if importlib.util.find_spec("gradio"):  # and the page queues every model call on one slot
        demo = server.build_page(engine)
        assert demo._queue.default_concurrency_limit == 1
        # 3 classify, 2 folder, 1 teach, the model selector's switch (a training runs in a process of its own)
        model_fns = [fn for fn in demo.fns.values() if fn.name in ("classify", "run", "switch")]
        assert len(model_fns) == 7 and all(fn.concurrency_id == "model" for fn in model_fns)


def test_main_refuses_bad_options_and_checkpoints(tmp_path, caplog):
    pytest.importorskip("gradio")
    assert app_command.main(["--top-k", "0"]) == 2
    assert app_command.main(["--not-sure", "1.5"]) == 2
    assert app_command.main(["--checkpoint", str(tmp_path / "nothing.pt")]) == 1
    assert "checkpoint not found" in caplog.text


@pytest.mark.parametrize("where", ["a-file", "/proc/x"])
def test_a_work_dir_that_cannot_be_written_is_refused_at_start(tmp_path, caplog, where):
    """`app --work-dir` that is a file, or below /proc: one line at start, before the model loads (#53: the page
    started and served; only the first teach failed)."""
    pytest.importorskip("gradio")
    work = tmp_path / where if where == "a-file" else Path(where)
    if where == "a-file":
        work.write_text("a user's file")
    assert app_command.main(["--work-dir", str(work), "--checkpoint", str(tmp_path / "nothing.pt")]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and f"cannot write to --work-dir {work}" in errors[0] and "\n" not in errors[0]
    assert "checkpoint not found" not in caplog.text  # refused before the model is looked for
    if where == "a-file":
        assert work.read_text() == "a user's file"


def test_every_api_output_has_a_name(engine):
    pytest.importorskip("gradio")
    info = server.build_page(engine).get_api_info()
    assert {"/classify", "/folder"} <= set(info["named_endpoints"])
    for name, endpoint in info["named_endpoints"].items():
        labels = [r["label"] for r in endpoint["returns"]]
        assert labels and all(label and not label.startswith("value_") for label in labels), (name, labels)
    assert [r["label"] for r in info["named_endpoints"]["/classify"]["returns"]] == ["predictions"]


def test_model_tab_figures_have_their_captions_outside_the_picture(engine, tmp_path, monkeypatch):
    pytest.importorskip("gradio")
    figures = []
    for name in ("confusion.png", "curves.png"):
        Image.new("RGB", (64, 48), "white").save(tmp_path / name)
        figures.append(tmp_path / name)
    card = app_engine.ModelCard([("checkpoint", "x")], None, *figures, None)
    monkeypatch.setattr(server, "model_card", lambda loaded: card)
    components = server.build_page(engine).config["components"]
    images = [c["props"] for c in components if c["type"] == "image" and c["props"].get("interactive") is False]
    assert [p["label"] for p in images] == ["confusion matrix (validation)", "training curves"]
    assert all(p["show_label"] is False for p in images)  # Gradio draws a shown label over the image's corner
    texts = [c["props"].get("value") for c in components if c["type"] == "markdown"]
    assert "**Confusion matrix (validation)**" in texts and "**Training curves**" in texts


def test_the_run_folder_downloads_as_a_zip(engine):
    import zipfile

    run_dir = Path(engine.loaded.path).resolve().parent
    path = app_engine.run_zip(engine)
    assert path.parent == engine.workdir and path.name == f"{run_dir.name}.zip"
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        assert {f"{run_dir.name}/best.pt", f"{run_dir.name}/metrics.csv", f"{run_dir.name}/config.yaml"} <= names
        assert z.read(f"{run_dir.name}/best.pt") == (run_dir / "best.pt").read_bytes()
    engine.loaded = None
    with pytest.raises(app_engine.NoModel):
        app_engine.run_zip(engine)


def test_the_model_downloads_as_onnx_that_labels_like_pytorch(engine, run):
    pytest.importorskip("onnxruntime")
    import torch

    from vit_flowers.app.downloads import model_onnx
    from vit_flowers.inference.onnx_export import batched_logits
    from vit_flowers.inference.onnx_runtime import load_onnx

    done = model_onnx(engine)
    assert done.path == engine.workdir / f"{run.name}.onnx" and not (run / "model.onnx").exists()  # the run untouched
    n = len(done.val.names)
    assert n > 0 and done.same == n and done.worst <= 1e-4
    assert f"the same label on {n:,} of {n:,}" in page.onnx_markdown(done)
    loaded, exported = engine.model(), load_onnx(done.path)  # the file as downloaded, against the model in use
    with torch.no_grad():
        expected = batched_logits(lambda x: loaded.model(x).float().numpy(), done.val, loaded.ckpt)
    got = batched_logits(lambda x: exported.logits(x.numpy()), done.val, loaded.ckpt)
    assert (got.argmax(1) == expected.argmax(1)).all()
    assert model_onnx(engine).path == done.path  # asked again: the page's file replaced, no second copy


def test_the_model_downloads_as_a_zipped_web_page_beside_the_onnx_file(engine, run):
    pytest.importorskip("onnxruntime")
    import zipfile

    from vit_flowers.app.downloads import model_web

    done = model_web(engine)
    assert done.path == engine.workdir / f"{run.name}-web.zip" and not (run / "model.onnx").exists()
    with zipfile.ZipFile(done.path) as z:
        names = set(z.namelist())
        config = json.loads(z.read(f"{run.name}-web/config.json"))
    assert {f"{run.name}-web/{name}" for name in ("index.html", "app.js", "unknown.js", "model.onnx")} <= names
    assert done.runtime_included == (f"{run.name}-web/ort-wasm-simd-threaded.wasm" in names)
    assert config["classes"] == list(CLASSES) and config["unknown"]["rule"] == "mahalanobis"
    assert "any web server" in page.web_markdown(done.path.name, done.onnx, done.runtime_included)
    assert model_web(engine).path == done.path  # asked again: replaced, no second copy


def test_the_onnx_download_without_the_extra_says_how_to_install_it(engine, monkeypatch):
    import sys

    from vit_flowers.app.downloads import OnnxMissing, model_onnx

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(OnnxMissing, match=r'the ONNX download needs the onnx extra .*pip install -e "\.\[onnx\]"'):
        model_onnx(engine)
    assert not list(engine.workdir.glob("*.onnx"))
    engine.loaded = None
    with pytest.raises(app_engine.NoModel):
        model_onnx(engine)
