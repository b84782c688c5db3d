"""Tests of the web app's Train tab without a browser: the classes checked before training, the photos written as an
ImageFolder, the runs listed, and the training in its child process (started, failed, cancelled)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from helpers import write_class_folders
from PIL import Image

from vit_flowers.app import training as app_training
from vit_flowers.app.classes import MIN_PHOTOS, check_classes, check_folder, write_image_folder
from vit_flowers.app.engine import Engine, NoModel
from vit_flowers.app.new_run import begin_training
from vit_flowers.app.page import class_check_markdown, classify_page, progress_html
from vit_flowers.app.run_list import list_runs, run_info
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import latest_run

TRAIN_YAML = Path(__file__).resolve().parent / "data" / "app_train.yaml"
LIMIT = 50 * 2**20


@pytest.fixture
def given(tmp_path) -> dict[str, list[Path]]:
    """Three classes of 12 synthetic flower PNGs, as a page would receive them."""
    root = write_class_folders(tmp_path / "given", 12, classes=["daisy", "rose", "tulip"])
    return {d.name: sorted(d.iterdir()) for d in sorted(root.iterdir())}


def test_good_classes_pass_with_their_counts(given):
    check = check_classes(list(given.items()), LIMIT)
    assert check.ok and not check.errors and not check.warnings
    assert [(c.name, len(c.files)) for c in check.classes] == [("daisy", 12), ("rose", 12), ("tulip", 12)]
    assert "**daisy**: 12 photo(s)" in class_check_markdown(check)


def test_bad_names_one_class_and_twice_a_name_stop_training(given):
    daisy, rose = given["daisy"], given["rose"]
    for name in ("unknown", "..", "a/b", ""):
        check = check_classes([(name, daisy), ("rose", rose)], LIMIT)
        assert not check.ok and any("class 1" in e and "refused" in e for e in check.errors), name
    twice = check_classes([("rose", daisy), (" rose ", rose)], LIMIT)
    assert not twice.ok and any("two classes are named 'rose'" in e for e in twice.errors)
    cased = check_classes([("Rose", daisy), ("rose", rose)], LIMIT)  # one folder on macOS and Windows
    assert not cased.ok and cased.errors == [
        "classes 'Rose' and 'rose' differ only in case: give each class its own name (a folder of each is one folder "
        "on macOS and Windows)"]
    alone = check_classes([("daisy", daisy), ("", [])], LIMIT)  # an empty slot is no class
    assert not alone.ok and any("at least two classes" in e for e in alone.errors)
    empty = check_classes([("daisy", daisy), ("rose", [])], LIMIT)
    assert not empty.ok and "rose: no photos" in empty.errors


def test_non_photos_are_left_out_and_few_photos_or_copies_warned(given, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a photo")
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    bomb = tmp_path / "bomb.png"
    Image.new("1", (20000, 20000)).save(bomb)  # 400 megapixels in a small file
    check = check_classes([("daisy", [*given["daisy"], notes, broken, bomb]), ("rose", given["rose"][:3]),
                           ("tulip", [*given["tulip"], given["daisy"][0]])], LIMIT)
    assert check.ok  # warnings do not stop training
    assert [len(c.files) for c in check.classes] == [12, 3, 13]  # the three non-photos left out
    text = " ".join(check.warnings)
    assert "daisy: 3 file(s) left out" in text and "notes.txt" in text and "broken.jpg" in text
    assert "decompression bomb" in text
    assert f"rose: only 3 photo(s); {MIN_PHOTOS} or more" in text
    assert "the same photo in daisy" in text and "and tulip" in text
    big = check_classes([("daisy", given["daisy"]), ("rose", given["rose"])], max_bytes=100)
    assert not big.ok and "over the limit" in " ".join(big.warnings)


def test_ten_thousand_files_in_one_class(given, tmp_path, micro_run):
    """Uploads: refused at once, before a file is read. A PHOTOS folder (read in place, no such limit): checked in
    bounded memory, and the model keeps answering while it is checked (the page runs the two side by side)."""
    import threading
    import tracemalloc

    from vit_flowers.app import classes as app_classes
    from vit_flowers.app import command as app_command
    from vit_flowers.app.engine import classify_files
    from vit_flowers.cli import load_model_from_args

    many = tmp_path / "photos" / "daisy"
    many.mkdir(parents=True)
    tiny = io.BytesIO()
    for i in range(10_000):  # made-up tiny JPEGs, each its own (no duplicates to report)
        tiny.seek(0)
        tiny.truncate()
        Image.new("RGB", (8, 8), (i % 256, i // 256 % 256, 7)).save(tiny, "JPEG")
        (many / f"{i:05d}.jpg").write_bytes(tiny.getvalue())
    shutil.copytree(tmp_path / "given" / "rose", tmp_path / "photos" / "rose")
    files = sorted(many.iterdir())

    decoded = app_classes._undecodable.cache_info().misses
    start = time.monotonic()
    refused = check_classes([("daisy", files), ("rose", given["rose"])], LIMIT)
    read = app_classes._undecodable.cache_info().misses - decoded
    assert time.monotonic() - start < 5 and read <= len(given["rose"])  # rose's photos only, none of the 10,000
    assert not refused.ok and "daisy: 10,000 files, over the page's limit of 5,000 uploads a class" in refused.errors[0]

    args = app_command.build_parser().parse_args(["--checkpoint", str(micro_run), "--device", "cpu"])
    engine = Engine(load_model_from_args(args), runs_home=tmp_path / "runs")
    found, checked = [], threading.Event()

    def check() -> None:
        tracemalloc.start()
        found.append(check_folder(str(tmp_path / "photos"), LIMIT))
        found.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        checked.set()

    threading.Thread(target=check).start()
    time.sleep(0.5)
    assert not checked.is_set()  # 10,000 files take longer: the check is under way
    start = time.monotonic()
    (answer,) = classify_files(engine, [given["rose"][0]])
    assert answer.error is None and time.monotonic() - start < 10
    assert checked.wait(300)
    folder, peak = found
    assert folder.ok and [(c.name, len(c.files)) for c in folder.classes] == [("daisy", 10_000), ("rose", 12)]
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MB"  # paths and reasons, never the decoded photos


def test_a_photos_folder_is_checked_like_the_page(given, tmp_path):
    assert check_folder(str(tmp_path / "given"), LIMIT).ok
    assert check_folder(str(tmp_path / "missing"), LIMIT).errors
    one = tmp_path / "one"
    shutil.copytree(tmp_path / "given" / "rose", one / "rose")
    assert "one class" in " ".join(check_folder(str(one), LIMIT).errors)
    shutil.copytree(tmp_path / "given" / "daisy", one / "Rose")
    if len(list(one.iterdir())) == 2:  # (a file system that ignores case has one folder)
        (error,) = check_folder(str(one), LIMIT).errors
        assert "class folders 'Rose' and 'rose'" in error and "differ only in case" in error, error


def test_the_photos_are_copied_unchanged_as_an_image_folder(given, tmp_path):
    twin = tmp_path / "elsewhere" / given["rose"][0].name  # an upload of the same name as another
    twin.parent.mkdir()
    shutil.copy(given["rose"][1], twin)
    bare = tmp_path / "shot"  # a file without an extension (the trainer reads photos by their extension)
    shutil.copy(given["daisy"][0], bare)
    check = check_classes([("daisy", [*given["daisy"], bare]), ("rose", [*given["rose"], twin])], LIMIT)
    write_image_folder(check.classes, tmp_path / "out")
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["daisy", "rose"]
    assert len(list((out / "rose").iterdir())) == 13 and (out / "rose" / f"{twin.stem}-2.png").is_file()
    assert (out / "daisy" / "shot.jpg").read_bytes() == bare.read_bytes()
    assert all((out / "daisy" / p.name).read_bytes() == p.read_bytes() for p in given["daisy"])
    with pytest.raises(FileExistsError):  # never into an existing folder
        write_image_folder(check.classes, out)


def _fake_run(folder: Path, classes: list[str], accuracy: float | None, in_progress: bool = False) -> Path:
    """A run folder as the trainer leaves it (best.pt's bytes do not matter to the list), report or not."""
    folder.mkdir(parents=True)
    (folder / runs.BEST).write_bytes(b"weights")
    (folder / runs.SPLIT).write_text(json.dumps({"classes": classes}))
    if accuracy is not None:
        (folder / runs.REPORT).mkdir()
        (folder / runs.REPORT / "metrics.json").write_text(json.dumps({"classes": classes, "accuracy": accuracy}))
    if in_progress:
        (folder / runs.IN_PROGRESS).write_bytes(b"")
    return folder


def test_the_selector_lists_finished_runs_newest_first(tmp_path):
    old = _fake_run(tmp_path / "old", ["a", "b"], 0.75)
    new = _fake_run(tmp_path / "new", ["a", "b", "c"], None)
    (new / runs.METRICS).write_text("epoch,val_acc,val_acc_ema\n1,0.5,0.625\n2,0.6,\n")
    os.utime(old / runs.BEST, (1e9, 1e9))
    _fake_run(tmp_path / "half", ["a", "b"], None, in_progress=True)  # a training still running, or stopped
    (tmp_path / "photos" / "a").mkdir(parents=True)  # no best.pt: not a run
    (tmp_path / "latest").symlink_to("new")
    listed = list_runs(tmp_path)
    assert [r.path.name for r in listed] == ["new", "old"]
    assert listed[0].accuracy == 0.625 and listed[1].accuracy == 0.75  # metrics.csv's best when no report
    assert listed[1].label.startswith("old · 2 classes (a, b) · 75.0% · 2001-09-09")
    assert run_info(tmp_path / "half") is None and list_runs(tmp_path / "missing") == []


def test_no_model_yet_says_how_to_get_one(tmp_path, given):
    engine = Engine(None, runs_home=tmp_path)
    assert engine.classes == [] and "Train tab" in classify_page(engine, [given["daisy"][0]])
    with pytest.raises(NoModel, match="Train tab"):
        engine.model()


def _wait(condition, timeout: float = 180.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_a_training_that_ends_well_is_listed_and_used(given, tmp_path, monkeypatch):
    """The child ends as train does (status 0, not killed at its exit by the thread that watches the app): the run
    kept whole, listed, and used by the page."""
    monkeypatch.setenv(app_training.CONFIG_ENV, str(TRAIN_YAML))
    home = tmp_path / "runs"
    engine = Engine(None, runs_home=home, workdir=tmp_path / "work")
    run = begin_training(engine, check_classes(list(given.items()), LIMIT), 1.0)
    _wait(lambda: not run.training.running)
    assert run.training.state == "done", run.training.progress()
    assert [r.path for r in list_runs(home)] == [run.run_dir] and not (run.run_dir / runs.IN_PROGRESS).exists()
    assert engine.loaded is not None and engine.classes == ["daisy", "rose", "tulip"]
    assert "Fatal Python error" not in (run.run_dir / runs.LOG).read_text()


def test_a_training_cancelled_leaves_nothing(given, tmp_path, monkeypatch):
    long_recipe = tmp_path / "long.yaml"  # the tiny model, as many epochs as a minute holds
    long_recipe.write_text(TRAIN_YAML.read_text().replace("epochs: 6", "epochs: 100000"))
    monkeypatch.setenv(app_training.CONFIG_ENV, str(long_recipe))
    home = tmp_path / "runs"
    engine = Engine(None, runs_home=home, workdir=tmp_path / "work")
    run = begin_training(engine, check_classes(list(given.items())[:2], LIMIT), 1.0)
    assert run.photos == home / f"{run.run_dir.name}-photos" and (run.photos / "daisy").is_dir()
    with pytest.raises(ValueError, match="a training is running"):
        begin_training(engine, check_classes(list(given.items())[:2], LIMIT), 1.0)
    _wait(lambda: run.training.progress().epochs >= 1)  # then an epoch's steps, as the child says them
    _wait(lambda: re.search(r"epoch \d+/\d+: \d+ of \d+$", run.training.progress().phase) is not None, 60)
    progress = run.training.progress()
    assert progress.state == "running" and 0 < progress.fraction < 1
    assert 0 < progress.seconds_left <= 60 and progress.accuracy is not None
    assert list_runs(home) == [] and latest_run(home) is not None  # there, but not listed: half-written
    start = time.monotonic()
    run.training.cancel()
    assert time.monotonic() - start < 5
    assert run.training.progress().state == "cancelled" and 'data-state="cancelled"' in progress_html(
        run.training.progress())
    assert sorted(p.name for p in home.iterdir() if not p.is_symlink()) == []  # no run, no photos copy
    assert not (home / runs.LATEST).is_symlink() and engine.loaded is None  # no link to the removed run


def _marked_page_run(home: Path) -> tuple[Path, Path]:
    """A page run as train leaves it once started (config.yaml, its in-progress mark, marked ``latest``) and the
    page's copy of its photos."""
    run_dir, photos = home / "page-1", home / "page-1-photos"
    (photos / "daisy").mkdir(parents=True)
    run_dir.mkdir()
    (run_dir / runs.CONFIG).write_text("epochs: 1\n")
    (run_dir / runs.IN_PROGRESS).write_bytes(b"")
    runs.mark_latest(run_dir)
    return run_dir, photos


def test_a_cancelled_training_leaves_latest_on_the_run_before_it(tmp_path):
    """Cancelled, the page's run is removed and ``latest`` (which train pointed at it) goes back to the run before,
    or goes away when there is none: it pointed at the removed folder."""
    home = tmp_path / "runs"
    before = _fake_run(home / "before", ["a", "b"], 0.75)
    for left in ("before", None):
        run_dir, photos = _marked_page_run(home)
        job = app_training.Training(run_dir, [], photos_made=photos)  # (no child: cancel removes what it made)
        job.cancel()
        assert job.state == "cancelled" and not run_dir.exists() and not photos.exists()
        link = home / runs.LATEST
        if left:
            assert os.readlink(link) == left and latest_run(home) == before.resolve()
        else:
            assert not link.is_symlink() and latest_run(home) is None
        shutil.rmtree(before, ignore_errors=True)


def test_a_child_whose_app_is_gone_leaves_latest_on_the_run_before_it(tmp_path, monkeypatch):
    """The child removes the page's folders when its app is gone (:func:`vit_flowers.app.child._end`): ``latest``
    goes back to the run before, as on a cancel."""
    from vit_flowers.app import child

    def exit_(code: int) -> None:
        raise SystemExit(code)

    home = tmp_path / "runs"
    _fake_run(home / "before", ["a", "b"], 0.75)
    run_dir, photos = _marked_page_run(home)
    monkeypatch.setattr(child.os, "_exit", exit_)  # (the child ends its process there)
    with pytest.raises(SystemExit):
        child._end([run_dir, photos])
    assert sorted(p.name for p in home.iterdir()) == ["before", runs.LATEST]
    assert os.readlink(home / runs.LATEST) == "before"


def test_the_bar_moves_while_the_child_writes_no_run_file(tmp_path):
    """Before config.yaml (the libraries loading, the photos decoding) the bar follows the clock against the
    length chosen, and the text names the step the child says it is at (its in-progress mark)."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    job = app_training.Training(run_dir, [], minutes=1.0)
    job.started -= 30  # half of the minute gone
    first = job.progress()
    assert first.phase == "starting: loading the libraries" and first.fraction == pytest.approx(0.5, abs=0.02)
    job.mark.write_text(json.dumps({"phase": "decoding the photos (train)", "done": 1200, "total": 9000}))
    job.started -= 6
    later = job.progress()
    assert later.phase == "starting: decoding the photos (train): 1,200 of 9,000"
    assert later.fraction == pytest.approx(0.6, abs=0.02) and later.elapsed >= 36


def test_a_failed_training_says_why_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(app_training.CONFIG_ENV, str(TRAIN_YAML))
    run_dir = tmp_path / "runs" / "r"
    job = app_training.start_training(tmp_path / "no-such-photos", run_dir, 1.0)
    _wait(lambda: not job.running, 120)
    assert job.state == "failed" and "no-such-photos" in job.error and "ERROR" not in job.error
    assert not run_dir.exists()


@pytest.mark.skipif(os.name != "posix", reason="limits the child's file size with setrlimit")
def test_a_disk_that_fills_up_mid_training_says_so_and_leaves_nothing(given, tmp_path, monkeypatch):
    """A write of the child's that fails mid-training (its file size limit set low: the same OSError as a full disk,
    at its first checkpoint, after the photos, config.yaml and split.json were written): the training fails with
    train's message naming the file; the half-written run and the page's copy of the photos are removed."""
    import resource
    import subprocess

    monkeypatch.setenv(app_training.CONFIG_ENV, str(TRAIN_YAML))
    limit = 64 * 1024  # below best.pt's size (the tiny model's), above the files before it
    real_popen = subprocess.Popen

    def limited(*args, **kwargs):
        return real_popen(*args, **kwargs, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1])))

    monkeypatch.setattr(app_training.subprocess, "Popen", limited)
    home = tmp_path / "runs"
    engine = Engine(None, runs_home=home, workdir=tmp_path / "work")
    run = begin_training(engine, check_classes(list(given.items())[:2], LIMIT), 1.0)
    _wait(lambda: not run.training.running, 180)
    progress = run.training.progress()
    assert progress.state == "failed" and "File too large" in progress.phase and "best.pt" in progress.phase, progress
    assert 'data-state="failed"' in progress_html(progress)
    assert not [p for p in home.iterdir() if not p.is_symlink()]  # no run, no photos copy
    assert list_runs(home) == [] and engine.loaded is None


def test_the_page_trains_what_train_data_trains(tmp_path, monkeypatch):
    """Without the tests' override, the child is `train --data PHOTOS --time-budget N` with the run where the page
    put it: train's own choice of recipe (train.PHOTO_DEFAULTS), the page's length."""
    from vit_flowers.train import PHOTO_DEFAULTS, command_defaults, parse_args
    from vit_flowers.training.config import config_from_args

    monkeypatch.delenv(app_training.CONFIG_ENV, raising=False)
    run_dir = tmp_path / "runs" / "page-1"
    argv = app_training.train_argv(tmp_path / "photos", run_dir, 3.0)
    assert argv == ["--data", str(tmp_path / "photos"), "--out-dir", str(run_dir.parent), "--run-name", "page-1",
                    "--time-budget", "3"]
    args = parse_args(argv)
    cfg = config_from_args(args, command_defaults(args))[0]
    assert cfg.optim.time_budget == 3.0 and cfg.model.pretrained == PHOTO_DEFAULTS["pretrained"]
    assert cfg.model.patch_embed == PHOTO_DEFAULTS["patch_embed"] and cfg.run.run_name == "page-1"
    with_override = app_training.train_argv(tmp_path / "photos", run_dir, 3.0, str(TRAIN_YAML))
    assert with_override[:2] == ["--config", str(TRAIN_YAML)]


def test_the_app_opens_the_newest_finished_run_or_none(micro_run, tmp_path):
    from vit_flowers.app import command as app_command

    home = tmp_path / "home"
    shutil.copytree(micro_run, home / "micro")
    half = shutil.copytree(micro_run, home / "newer-but-half-written")
    (half / runs.IN_PROGRESS).write_bytes(b"")  # an app stopped mid-training left it
    os.utime(half / runs.BEST)  # the newest best.pt
    args = app_command.build_parser().parse_args(["--device", "cpu"])
    loaded, _ = app_command._open_run(args, home)
    assert loaded is not None and Path(loaded.path).parent == home / "micro"
    (home / "micro" / runs.BEST).unlink()
    (home / "micro" / runs.LAST).unlink(missing_ok=True)
    args = app_command.build_parser().parse_args(["--device", "cpu"])
    assert app_command._open_run(args, home) == (None, None)  # the page opens on its Train tab


def _training_children(marker: str) -> list[int]:
    """The pids of the processes whose command line holds ``marker`` (Linux's /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:  # ended meanwhile
            pass
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the child through Linux's /proc")
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_an_app_stopped_mid_training_leaves_no_training_and_no_run(given, tmp_path, stop):
    """The app, stopped in order (SIGTERM, as `kill`) or killed (SIGKILL, as a crash), while its Train tab trains:
    within seconds no training runs on, and neither the half-written run nor the page's copy of the photos is left."""
    import signal
    import socket
    import subprocess
    import sys

    gradio_client = pytest.importorskip("gradio_client", reason="Gradio is not installed (pip install -e '.[app]')")
    from vit_flowers.app.server import wait_until_serving

    long_recipe = tmp_path / "long.yaml"  # the tiny model, as many epochs as a minute holds
    long_recipe.write_text(TRAIN_YAML.read_text().replace("epochs: 6", "epochs: 100000"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home, log = tmp_path / "runs", (tmp_path / "app.log").open("w")
    app = subprocess.Popen([sys.executable, "-m", "vit_flowers.app", "--work-dir", str(home), "--port", str(port),
                            "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, app_training.CONFIG_ENV: str(long_recipe),
                                "GRADIO_TEMP_DIR": str(tmp_path / "gradio")})
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/", 180, app)
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        slots = [v for name in ("daisy", "rose") for v in (name, [gradio_client.handle_file(str(p))
                                                                  for p in given[name]])]
        client.predict(*slots, *([None] * (20 - len(slots))), "", 1, api_name="/train")
        (run,) = [p for p in home.iterdir() if not p.is_symlink() and not p.name.endswith("-photos")]
        _wait(lambda: (run / runs.METRICS).is_file(), 120)  # training: an epoch done
        children = _training_children(str(run))
        assert children and (home / f"{run.name}-photos").is_dir()
        app.send_signal(getattr(signal, stop))
        app.wait(30)
        _wait(lambda: not _training_children(str(run)), 30)
        _wait(lambda: not [p for p in home.iterdir() if not p.is_symlink()], 30)  # no run, no photos copy
        assert list_runs(home) == []
    finally:
        if app.poll() is None:
            app.kill()
        log.close()


def test_a_run_that_ends_with_its_head_start_is_not_said_to_last_its_budget(tmp_path):
    """The Train tab reads the run's plan.json: a small folder's run (the frozen-feature start and one head-start
    epoch, no end-to-end epoch) ends well before its budget, so the page gives no "left" from the budget's clock
    (#60's note: "about 1 min 32 s left" on a run that ended 3 s later); a run with end-to-end epochs does."""
    from vit_flowers.training.plan import Plan
    from vit_flowers.training.recipe import Recipe

    head = Recipe(passes=1, steps_per_pass=2, head_epochs=1, end_to_end=False, reason="")
    for epochs, bounded in ((0, False), (5, True)):
        run_dir = tmp_path / f"r{epochs}"
        run_dir.mkdir()
        Plan(head, feature_start=True, epochs=epochs, steps_per_epoch=2, warmup_steps=1, time_budget=120.0,
             val_passes=1.0).write(run_dir)
        progress = app_training.Training(run_dir, [], minutes=2.0).progress()
        assert progress.state == "running" and progress.epochs == 0
        assert (progress.seconds_left is not None) == bounded, progress
