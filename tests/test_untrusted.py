"""Untrusted input through the command lines: crafted and foreign checkpoints, hostile image folders, bad
configs, and random bytes fed to `predict` (hypothesis).

Unit-level cases live in test_checkpoint.py (pickles, garbage, other weights), test_images.py (each image
kind), test_config.py (each config error) and test_predict.py (a messy folder); here the same inputs go
through `predict`, `evaluate` and `train` as a user would run them. The record is docs/robustness.md.
"""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import write_class_folders
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vit_flowers import evaluate, predict
from vit_flowers import train as train_mod
from vit_flowers.data.images import IMAGE_EXTENSIONS, decode_file, printable_name
from vit_flowers.data.synthetic import CLASSES
from vit_flowers.inference.unknown import UNKNOWN
from vit_flowers.models.vit import create_vit
from vit_flowers.runs.checkpoint import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
TRAIN_CLI = ["--config", str(SMOKE), "--deterministic", "true", "--threads", "1", "--progress", "false"]


@pytest.fixture(scope="module")
def run(micro_run) -> Path:
    """A trained micro run: checkpoints/micro/best.pt (this module's copy of the session's)."""
    return micro_run


# ---------------------------------------------------------------------------------------------- checkpoints


class Payload:
    """Unpickling this creates the file ``marker``: proof that code from the checkpoint ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _evil_checkpoint(source: Path, path: Path, marker: Path) -> Path:
    state = torch.load(source, weights_only=True)  # a genuine checkpoint ...
    state["payload"] = Payload(marker)  # ... with one extra object that runs code when unpickled
    torch.save(state, path)
    return path


def _cli(tool: str, ckpt: Path, tmp_path: Path, image: Path, data: Path) -> int:
    if tool == "predict":
        return predict.main([str(image), "--checkpoint", str(ckpt), "--quiet"])
    if tool == "evaluate":
        return evaluate.main(["--checkpoint", str(ckpt), "--data", str(data), "--output", str(tmp_path / "eval"),
                              "--quiet"])
    return train_mod.main([*TRAIN_CLI, "--out-dir", str(tmp_path / "ck"), "--resume", str(ckpt)])


@pytest.mark.parametrize("tool", ["predict", "evaluate", "train --resume"])
def test_checkpoint_that_runs_code_is_refused_by_every_command(run, tmp_path, caplog, tool):
    marker = tmp_path / "pwned"
    evil = _evil_checkpoint(run / "best.pt", tmp_path / "evil.pt", marker)
    data = write_class_folders(tmp_path / "photos", per_class=1)
    image = next((data / "daisy").iterdir())
    assert _cli(tool.split()[0], evil, tmp_path, image, data) != 0
    assert "refusing to load" in caplog.text and str(evil) in caplog.text and "could run code" in caplog.text
    assert "weights_only" not in caplog.text  # torch's advice to load it unsafely is not passed on
    assert not marker.exists()
    assert not (tmp_path / "eval").exists() and not (tmp_path / "ck").exists()  # nothing started
    torch.load(evil, weights_only=False)  # the payload is live: loaded unsafely, it does run
    assert marker.exists()


def _foreign(kind: str, best: Path, path: Path) -> Path:
    state = load_checkpoint(best)
    if kind == "another model's weights":
        state["model"] = create_vit("vit_micro", len(CLASSES), dim=32, heads=2).state_dict()
    elif kind == "another architecture":
        state["model_config"] = {**state["model_config"], "depth": 3}
    elif kind == "other classes":
        state["classes"] = ["orchid", "lily", "iris"]
    elif kind == "a bare state dict":
        state = state["model"]
    elif kind == "a truncated file":
        save_checkpoint(state, path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return path
    elif kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(5000))
        return path
    elif kind == "an ONNX model named .pt":
        path.write_bytes(b"\x08\x08\x12\x07pytorch\x1a\x052.4.0:" + np.random.default_rng(1).bytes(2000))
        return path
    torch.save(state, path)
    return path


FOREIGN = {
    "another model's weights": "weights do not fit its model_config",
    "another architecture": "weights do not match the model (missing ['transformer.layers.2.",
    "other classes": "the head has 5 outputs but the checkpoint lists 3 classes",
    "a bare state dict": "is not a vit_flowers checkpoint",
    "a truncated file": "it is truncated (a zip archive whose end is missing)",
    "random bytes": "it is not a PyTorch checkpoint (it starts like neither a zip archive nor a pickle)",
    "an ONNX model named .pt": "it is an ONNX model, not a PyTorch checkpoint",
}


@pytest.mark.parametrize("kind", FOREIGN)
def test_foreign_checkpoints_give_a_clear_error_in_predict_and_evaluate(run, tmp_path, caplog, kind):
    ckpt = _foreign(kind, run / "best.pt", tmp_path / "other.pt")
    data = write_class_folders(tmp_path / "photos", per_class=1)
    caplog.set_level(logging.ERROR)
    for tool in ("predict", "evaluate"):
        caplog.clear()
        assert _cli(tool, ckpt, tmp_path, next((data / "rose").iterdir()), data) == 1, tool
        assert FOREIGN[kind] in caplog.text and str(ckpt) in caplog.text, (tool, caplog.text)
        assert len(caplog.records) == 1 and "weights_only" not in caplog.text and "run code" not in caplog.text
    assert not (tmp_path / "eval").exists()


def test_an_onnx_file_given_to_app_explain_or_export_says_which_files_they_take(run, tmp_path, caplog, monkeypatch):
    from vit_flowers import explain, export
    from vit_flowers.app import command as app_command

    onnx_file = tmp_path / "model.onnx"  # (its content does not matter: its name says ONNX)
    onnx_file.write_bytes(b"\x08\x08\x12\x07pytorch" + np.random.default_rng(0).bytes(500))
    image = next((write_class_folders(tmp_path / "photos", per_class=1) / "rose").iterdir())
    monkeypatch.setattr(app_command, "gradio", lambda: None)  # (app imports Gradio before the model: not needed here)
    caplog.set_level(logging.ERROR)
    for tool, main in (("app", app_command.main), ("explain", lambda a: explain.main([str(image), *a]))):
        caplog.clear()
        assert main(["--checkpoint", str(onnx_file)]) == 1
        assert caplog.messages == [f"error: --checkpoint {onnx_file} is an ONNX export: {tool} runs a PyTorch "
                                   f"checkpoint (a .pt file or a run folder); ONNX exports run in predict and "
                                   f"evaluate"], tool
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    caplog.clear()
    assert export.main(["--checkpoint", str(onnx_file), "--output", str(tmp_path / "again.onnx")]) == 1
    assert caplog.messages == [f"error: cannot read checkpoint {onnx_file}: it is an ONNX model, not a PyTorch "
                               f"checkpoint"]


def test_resume_on_other_classes_or_another_model_is_a_clear_error(run, tmp_path, caplog):
    state = load_checkpoint(run / "best.pt")  # the micro run (synthetic flowers, 32 px, patch 8) made resumable
    state["train_state"] = {"model": state["model"], "optimizer": {}, "scheduler": {}, "ema": None, "history": []}
    last, config = tmp_path / "ck" / "r" / "last.pt", tmp_path / "ck" / "r" / "config.yaml"
    save_checkpoint(state, last)
    config.write_text("unchanged\n")
    before = last.read_bytes(), config.read_text()
    three = write_class_folders(tmp_path / "three", per_class=3, classes=["daisy", "rose", "tulip"])
    caplog.set_level(logging.ERROR)
    assert train_mod.main([*TRAIN_CLI, "--resume", str(last), "--data", str(three), "--epochs", "2"]) == 2
    assert f"cannot resume {last}: it was trained on the classes ['daisy', 'dandelion', 'rose', 'sunflower', " \
           f"'tulip'], but the data now has ['daisy', 'rose', 'tulip']" in caplog.text
    assert (last.read_bytes(), config.read_text()) == before  # checked before anything is rewritten
    caplog.clear()
    assert train_mod.main([*TRAIN_CLI, "--resume", str(last), "--patch-size", "4", "--epochs", "2"]) == 2
    assert f"cannot resume {last}: its training state does not fit this model" in caplog.text
    assert "Traceback" not in caplog.text and (last.read_bytes(), config.read_text()) == before


# ---------------------------------------------------------------------------------------------- images


def _png_claiming(width: int, height: int) -> bytes:
    """A valid PNG header that claims ``width`` x ``height`` pixels, followed by almost no data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


NON_UTF8 = os.fsdecode(b"na\xefve.png")  # a Latin-1 file name, as from an old camera card or zip file

# bad file -> a word of the reason every command must report for it
BAD = {
    "truncated.jpg": "truncated",
    "corrupt.jpg": "corrupt",
    "empty.jpg": "empty file",
    "notes.png": "not an image",
    "bomb.png": "decompression bomb",
    "gone.jpg": "file not found",
    "loop.jpg": "Too many levels of symbolic links",
}


def write_zoo(folder: Path) -> list[str]:
    """Every hostile or odd file in one folder; returns the names of the readable images (BAD: the others)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)  # (H, W, 3)
    Image.fromarray(pixels).save(folder / "plain.jpg", quality=90)
    Image.fromarray(pixels).convert("CMYK").save(folder / "cmyk.jpg")
    Image.fromarray((rng.integers(0, 65536, (40, 40))).astype(np.uint16)).save(folder / "gray16.png")  # I;16
    Image.new("RGB", (1, 100_000), (200, 40, 40)).save(folder / "strip.png")  # 475 bytes, 1 x 100,000 pixels
    Image.fromarray(pixels).save(folder / NON_UTF8)
    jpeg = (folder / "plain.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    at = jpeg.index(b"\xff\xc4")  # Huffman table: overwritten with junk, the file cannot be decoded
    (folder / "corrupt.jpg").write_bytes(jpeg[: at + 4] + b"\xff" * 200 + jpeg[at + 204:])
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "notes.png").write_text("shopping list, not a picture\n")
    (folder / "bomb.png").write_bytes(_png_claiming(100_000, 100_000))  # 10^10 pixels claimed in ~90 bytes
    (folder / "gone.jpg").symlink_to(folder / "deleted.jpg")  # dangling link
    (folder / "loop.jpg").symlink_to(folder / "loop.jpg")  # a link to itself
    (folder / "again").symlink_to(folder, target_is_directory=True)  # a folder loop for the recursive walk
    return ["plain.jpg", "cmyk.jpg", "gray16.png", "strip.png", NON_UTF8]


def test_predict_reports_every_hostile_file_and_loses_no_other(run, tmp_path):
    good = write_zoo(tmp_path / "zoo")
    out = tmp_path / "p.json"
    assert predict.main([str(tmp_path / "zoo"), "--recursive", "--checkpoint", str(run), "--output", str(out),
                         "--batch-size", "4", "--attention", str(tmp_path / "att"), "--quiet"]) == 0
    rows = {Path(r["path"]).name: r for r in json.loads(out.read_text())}
    good = [printable_name(name) for name in good]  # na\xefve.png: the undecodable byte written as \xef
    assert sorted(rows) == sorted(good + list(BAD))  # one row each, the folder loop walked once
    for name in good:  # a class, or "unknown" where the run's rule rejects the picture (its best class kept)
        assert rows[name]["error"] is None and rows[name]["label"] in (*CLASSES, UNKNOWN), rows[name]
        assert rows[name]["top_k"][0]["label"] in CLASSES, rows[name]
    for name, reason in BAD.items():
        assert rows[name]["label"] is None and reason in rows[name]["error"], rows[name]
    assert len(list((tmp_path / "att").iterdir())) == len(good)


def test_evaluate_and_train_on_a_hostile_class_folder(run, tmp_path, caplog):
    data = write_class_folders(tmp_path / "photos", per_class=3)
    good = write_zoo(data / "daisy")
    (data / "tulip" / NON_UTF8).write_bytes((data / "daisy" / NON_UTF8).read_bytes())  # so that one is a mistake,
    good.append(NON_UTF8)  # and its name goes into the figure of mistakes
    (data / "rose" / "again").symlink_to(data, target_is_directory=True)  # a link back up to the dataset's root
    out = tmp_path / "eval"
    assert evaluate.main(["--checkpoint", str(run), "--data", str(data), "--output", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_images"] == 15 + len(good) and metrics["n_failed"] == len(BAD)
    failed = [line for line in (out / "predictions.csv").read_text().splitlines() if "error:" in line]
    for name, reason in BAD.items():
        assert any(f"/{name}," in line and reason in line for line in failed), name
    assert "na\\xefve.png" in (out / "predictions.csv").read_text()
    for name in BAD:
        assert name in caplog.text  # logged by name
    caplog.clear()

    ck = tmp_path / "ck"
    assert train_mod.main([*TRAIN_CLI, "--data", str(data), "--out-dir", str(ck), "--run-name", "zoo",
                           "--epochs", "1", "--val-fraction", "0.25"]) == 0
    for name, reason in BAD.items():
        assert any(name in line and reason in line for line in caplog.text.splitlines()), name
    best = load_checkpoint(ck / "zoo" / "best.pt")
    assert best["classes"] == list(CLASSES)
    split = json.loads((ck / "zoo" / "split.json").read_text())
    assert len(split["train"]) + len(split["val"]) == 15 + len(good) + len(BAD)
    assert (ck / "zoo" / "report" / "report.html").is_file()


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to measure peak memory")
def test_a_tiny_file_cannot_make_the_resize_allocate_gigabytes(tmp_path):
    strip = tmp_path / "strip.png"
    Image.new("RGB", (1, 100_000), (10, 200, 10)).save(strip)  # legal size, 475 bytes; resized whole: 1.2 GB
    assert strip.stat().st_size < 1000
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident memory
    except OSError:
        pytest.skip("cannot reset the peak memory counter here")
    before = _peak_rss_mb()
    image = decode_file(strip, 64)
    assert not isinstance(image, str) and image.shape == (3, 64, 64)
    assert image[1].float().mean() > 150  # the green centre, not padding
    assert _peak_rss_mb() - before < 100


# ---------------------------------------------------------------------------------------------- configs


@pytest.mark.parametrize("yaml_text, flags, message", [
    ("epochz: 3\n", [], "unknown key 'epochz' (did you mean 'epochs'?)"),
    ("batch_size: sixteen\n", [], "key 'batch_size' expects int, got 'sixteen'"),
    ("ema: [1]\n", [], "key 'ema' expects bool"),
    ("", ["--image-size", "0"], "'image_size' must be positive, got 0"),
    ("", ["--batch-size", "-8"], "'batch_size' must be positive, got -8"),
    ("", ["--epochs", "0"], "'epochs' must be positive, got 0"),
    ("", ["--lr", "fast"], "key 'lr' expects float, got 'fast'"),
    ("", ["--patch-size", "5"], "image_size (32) must be divisible by patch_size (5)"),
    ("image_size: 48\n", [], "must be >= image_size (48)"),
    ("", ["--time-budget", "nan"], "key 'time_budget' must be a finite number, got nan"),  # (#53: an epoch, then rc 2)
    ("", ["--time-budget", "inf"], "key 'time_budget' must be a finite number, got inf"),  # (#53: a traceback)
    ("time_budget: .nan\n", [], "key 'time_budget' must be a finite number, got nan"),
    ("lr: -.inf\n", [], "key 'lr' must be a finite number, got -inf"),
])
def test_bad_configs_stop_the_cli_before_anything_is_written(tmp_path, caplog, yaml_text, flags, message):
    config = tmp_path / "run.yaml"
    config.write_text(SMOKE.read_text() + yaml_text)
    out = tmp_path / "ck"
    assert train_mod.main(["--config", str(config), "--out-dir", str(out), "--progress", "false", *flags]) == 2
    assert message in caplog.text
    if yaml_text and "image_size" not in yaml_text:
        assert str(config) in caplog.text  # names the file
    assert not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--freeze-stages", "99"], "config key 'freeze_stages': EfficientNet-Lite0 cut at stride 32 has 7 stages: "
                                "cannot freeze 99"),
    (["--time-budget", "nan"], "key 'time_budget' must be a finite number"),
])
def test_settings_are_checked_before_the_photos_are_read(tmp_path, caplog, flags, message):
    """`train --data PHOTOS` with a setting that no photo can make right is refused before PHOTOS is listed (here
    it does not exist, which would be the error otherwise) and before any weights load (#53)."""
    out = tmp_path / "ck"
    assert train_mod.main(["--data", str(tmp_path / "nowhere"), "--out-dir", str(out), *flags]) == 2
    assert message in caplog.text and "nowhere" not in caplog.text
    assert not out.exists()


# ---------------------------------------------------------------------------------------------- property-based

_MAGIC = [b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"GIF89a", b"BM", b"RIFF\0\0\0\0WEBPVP8 ", b"II*\0", b"MM\0*"]
_MODES = ["1", "L", "P", "RGB", "RGBA", "CMYK", "I;16", "I", "F", "LA"]
_FORMATS = {"PNG": ".png", "JPEG": ".jpg", "BMP": ".bmp", "GIF": ".gif", "WEBP": ".webp", "TIFF": ".tif"}


@st.composite
def hostile_files(draw) -> tuple[str, bytes]:
    """(file name, content): random bytes behind a real magic number, or a random small image in any mode and
    format, possibly cut short."""
    if draw(st.booleans()):
        content = draw(st.sampled_from(_MAGIC)) + draw(st.binary(max_size=600))
        return "random" + draw(st.sampled_from(sorted(IMAGE_EXTENSIONS))), content
    w, h = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    mode, fmt = draw(st.sampled_from(_MODES)), draw(st.sampled_from(sorted(_FORMATS)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).convert(mode)
    buf = io.BytesIO()
    try:
        img.save(buf, fmt)
    except (OSError, ValueError, KeyError):  # this format cannot store this mode: store it as RGB
        buf = io.BytesIO()
        img.convert("RGB").save(buf, fmt)
    content = buf.getvalue()
    cut = draw(st.sampled_from([1.0, 1.0, 0.9, 0.5, 0.1]))
    return f"image_{mode.replace(';', '')}" + _FORMATS[fmt], content[: max(1, int(len(content) * cut))]


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")  # PIL on a cut-short TIFF: expected here
@pytest.mark.filterwarnings("ignore:Tag data larger than file:UserWarning")  # the same, another cut
@pytest.mark.filterwarnings("ignore:Truncated File Read:UserWarning")  # the same, as Pillow 12 words it
@pytest.mark.filterwarnings("ignore:Saving I mode images as PNG is deprecated:DeprecationWarning")  # Pillow 12
@settings(max_examples=50, deadline=None, database=None)
@given(files=st.lists(hostile_files(), min_size=1, max_size=4))
def test_predict_never_crashes_and_answers_every_file(run, files):
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, (name, content) in enumerate(files):
            path = Path(tmp) / f"{i}_{name}"
            path.write_bytes(content)
            paths.append(path)
        out = Path(tmp) / "out.json"
        code = predict.main([*map(str, paths), "--checkpoint", str(run), "--output", str(out), "--quiet",
                             "--batch-size", "3"])
        rows = json.loads(out.read_text())
    assert [r["path"] for r in rows] == [str(p) for p in paths]  # one row per file, in order
    for r in rows:
        assert (r["label"] in (*CLASSES, UNKNOWN) and r["error"] is None) or (r["label"] is None and r["error"]), r
    assert code == (0 if any(r["error"] is None for r in rows) else 1)


def test_link_loops_beside_and_inside_the_class_folders_are_named_and_nothing_else_is_lost(tmp_path, caplog):
    """The issue's case: a loop beside the class folders stopped train with a raw "[Errno 40] Too many levels of
    symbolic links"; one inside a class folder (a name without an image extension) was dropped unseen."""
    data = write_class_folders(tmp_path / "photos", per_class=3)
    (data / "loopA").symlink_to(data / "loopB")
    (data / "loopB").symlink_to(data / "loopA")
    (data / "rose" / "self").symlink_to(data / "rose" / "self")
    caplog.set_level(logging.INFO)
    assert train_mod.main([*TRAIN_CLI, "--data", str(data), "--out-dir", str(tmp_path / "ck"), "--run-name", "loops",
                           "--epochs", "1", "--report", "false"]) == 0
    lines = caplog.text.splitlines()
    beside = [line for line in lines if "loopA" in line]
    assert len(beside) == 1 and "loopB" in beside[0] and "Too many levels of symbolic links" in beside[0], beside
    inside = [line for line in lines if str(data / "rose" / "self") in line]
    assert len(inside) == 1 and "Too many levels of symbolic links" in inside[0], inside
    assert "[Errno" not in caplog.text
    split = json.loads((tmp_path / "ck" / "loops" / "split.json").read_text())
    assert len(split["train"]) + len(split["val"]) == 15 + 1  # every photo, and the link (then skipped, named)


@pytest.mark.parametrize("tool", ["train", "evaluate"])
def test_data_that_is_a_file_says_so(run, tmp_path, caplog, tool):
    afile = tmp_path / "afile.txt"
    afile.write_text("photos are elsewhere\n")
    if tool == "train":
        rc = train_mod.main([*TRAIN_CLI, "--data", str(afile), "--out-dir", str(tmp_path / "ck")])
    else:
        rc = evaluate.main(["--checkpoint", str(run), "--data", str(afile), "--quiet"])
    assert rc in (1, 2) and f"data path {afile} is a file, not a folder" in caplog.text
    assert "not found" not in caplog.text
