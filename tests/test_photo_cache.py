"""The photo cache (vit_flowers/data/photo_cache.py): decoded photos and trunk outputs kept on disk, memory-mapped,
read back by the next run on the same photos, rebuilt (never misread) when anything about them changed."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import smoke_config, write_class_folders

from vit_flowers.cache import main as cache_main
from vit_flowers.data import cache_folder, datasets
from vit_flowers.data.cache_format import user_cache_dir
from vit_flowers.data.datasets import load_folder
from vit_flowers.data.images import decode_file
from vit_flowers.data.photo_cache import PhotoCache
from vit_flowers.evaluate import main as evaluate_main
from vit_flowers.models.vit import create_vit
from vit_flowers.runs.checkpoint import load_checkpoint
from vit_flowers.training.budget import STEP_OVER_FORWARD
from vit_flowers.training.recipe import plan_recipe
from vit_flowers.training.token_cache import trunk_outputs

SIZE = 24


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    return write_class_folders(tmp_path / "photos", 8)  # 40 PNGs, 5 classes


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files decoded from here on (datasets.decode_file counted)."""
    seen: list[str] = []
    lock = threading.Lock()

    def counted(path: Path, size: int) -> torch.Tensor | str:
        with lock:
            seen.append(str(path))
        return decode_file(path, size)

    monkeypatch.setattr(datasets, "decode_file", counted)
    return seen


def load(photos: Path, cache: PhotoCache | None) -> datasets.Datasets:
    return load_folder(photos, image_size=SIZE, progress=False, cache=cache)


def packs(cache: PhotoCache) -> list[Path]:
    assert cache.folder is not None
    return sorted(cache.folder.iterdir())


def test_a_second_load_decodes_nothing_and_reads_the_same_pixels_from_a_mapped_file(photos, tmp_path, decodes):
    cache = PhotoCache(tmp_path / "cache")
    first = load(photos, cache)
    assert len(decodes) == 40
    second = load(photos, cache)
    assert len(decodes) == 40  # nothing decoded again
    plain = load(photos, None)
    for a, b, c in ((first.train, second.train, plain.train), (first.val, second.val, plain.val)):
        assert torch.equal(a.images, c.images) and torch.equal(b.images, c.images)
        assert a.paths == b.paths == c.paths and torch.equal(b.labels, c.labels)
    assert {p.suffix for p in packs(cache)} == {".json", ".rows", ".lock"}
    assert not [p for p in photos.rglob("*") if p.is_file() and p.suffix not in (".png",)]  # nothing written there


def test_a_changed_photo_is_decoded_again_and_only_it(photos, tmp_path, decodes):
    cache = PhotoCache(tmp_path / "cache")
    load(photos, cache)
    changed = next(iter(sorted((photos / "rose").iterdir())))
    other = next(iter(sorted((photos / "tulip").iterdir())))
    changed.write_bytes(other.read_bytes())  # another photo under the same name
    decodes.clear()
    again = load(photos, cache)
    assert decodes == [str(changed)]
    for part in (again.train, again.val):
        if str(changed) in part.paths:
            assert torch.equal(part.images[part.paths.index(str(changed))], decode_file(other, SIZE))
    assert torch.equal(again.train.images, load(photos, None).train.images)


def test_a_deleted_photo_leaves_the_others_read_from_the_cache(photos, tmp_path, decodes):
    cache = PhotoCache(tmp_path / "cache")
    load(photos, cache)
    gone = sorted((photos / "daisy").iterdir())[0]
    gone.unlink()
    decodes.clear()
    again = load(photos, cache)
    assert decodes == [] and len(again.train) + len(again.val) == 39
    assert str(gone) not in again.train.paths + again.val.paths
    assert torch.equal(again.train.images, load(photos, None).train.images)
    assert len([p for p in packs(cache) if p.suffix == ".rows"]) == 2  # the replaced sets' files removed


def test_a_truncated_cache_file_is_rebuilt(photos, tmp_path, decodes, caplog):
    cache = PhotoCache(tmp_path / "cache")
    load(photos, cache)
    for rows in (p for p in packs(cache) if p.suffix == ".rows"):
        with open(rows, "r+b") as f:
            f.truncate(os.path.getsize(rows) // 2)
    decodes.clear()
    with caplog.at_level(logging.INFO, logger="vit_flowers.data.photo_cache"):
        again = load(photos, cache)
    assert len(decodes) == 40 and "building it again" in caplog.text
    assert torch.equal(again.train.images, load(photos, None).train.images)
    decodes.clear()
    load(photos, cache)
    assert decodes == []  # whole again



def train_pack(cache: PhotoCache) -> tuple[Path, dict]:
    """The data file of the training photos' pack, and its index."""
    for index in (p for p in packs(cache) if p.suffix == ".json"):
        info = json.loads(index.read_text())
        if info["source"].startswith("train"):
            return index.parent / info["data"], info
    raise AssertionError("no training pack")


@pytest.mark.parametrize("damage", ["random bytes", "zeros", "one row"])
def test_a_cache_file_overwritten_in_place_is_decoded_again_with_one_warning(photos, tmp_path, decodes, caplog,
                                                                            damage):
    """The size check cannot see bytes changed in place: each row's checksum does, and only the damaged rows are
    decoded again (random bytes once trained on as photos into a nan loss; zeros, on blank images)."""
    cache = PhotoCache(tmp_path / "cache")
    first = load(photos, cache)
    rows, _ = train_pack(cache)
    size = rows.stat().st_size
    row_bytes = size // len(first.train)
    if damage == "one row":
        with open(rows, "r+b") as f:
            f.seek(3 * row_bytes + 100)
            f.write(bytes(50))
    else:
        rows.write_bytes(os.urandom(size) if damage == "random bytes" else bytes(size))
    assert rows.stat().st_size == size
    decodes.clear()
    with caplog.at_level(logging.WARNING, logger="vit_flowers.data.photo_cache"):
        again = load(photos, cache)
    expected = [first.train.paths[3]] if damage == "one row" else sorted(first.train.paths)
    assert sorted(decodes) == expected
    plain = load(photos, None)
    assert torch.equal(again.train.images, plain.train.images) and torch.equal(again.val.images, plain.val.images)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(rows) in warnings[0] and "\n" not in warnings[0], warnings
    n = len(first.train)
    assert (f"1 of {n} rows" if damage == "one row" else f"{n} of {n} rows") in warnings[0]
    decodes.clear()
    load(photos, cache)
    assert decodes == []  # whole again


@pytest.mark.parametrize("how", ["rewritten in place", "replaced by another file"])
def test_a_photo_changed_with_its_size_and_mtime_restored_is_decoded_again(photos, tmp_path, decodes, how):
    from PIL import Image

    changed, other = sorted((photos / "rose").iterdir())[0], sorted((photos / "tulip").iterdir())[0]
    for f in (changed, other):  # uncompressed: the same size whatever the pixels
        Image.open(f).convert("RGB").save(f, compress_level=0)
    assert changed.stat().st_size == other.stat().st_size
    cache = PhotoCache(tmp_path / "cache")
    load(photos, cache)
    before = changed.stat()
    time.sleep(0.05)  # (a later ctime on a file system of coarse timestamps)
    if how == "rewritten in place":
        changed.write_bytes(other.read_bytes())
    else:
        new = changed.with_suffix(".new")
        new.write_bytes(other.read_bytes())
        os.replace(new, changed)
    os.utime(changed, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (changed.stat().st_size, changed.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    decodes.clear()
    again = load(photos, cache)
    assert decodes == [str(changed)]
    part = again.train if str(changed) in again.train.paths else again.val
    assert torch.equal(part.images[part.paths.index(str(changed))], decode_file(other, SIZE))


@pytest.mark.parametrize("damage", ["older version", "not json", "no data file", "names another file"])
def test_an_index_of_another_version_or_unreadable_is_a_rebuild(photos, tmp_path, decodes, damage):
    cache = PhotoCache(tmp_path / "cache")
    load(photos, cache)
    for index in (p for p in packs(cache) if p.suffix == ".json"):
        info = json.loads(index.read_text())
        if damage == "older version":
            index.write_text(json.dumps({**info, "version": 0}))
        elif damage == "not json":
            index.write_text("{half an ind")
        elif damage == "names another file":  # a hand-edited index: never read as a set, never removed with one
            victim = tmp_path / f"victim-{index.stem}.rows"
            victim.write_bytes((index.parent / info["data"]).read_bytes())
            index.write_text(json.dumps({**info, "data": f"../../{victim.name}"}))
        else:
            (index.parent / info["data"]).unlink()
    decodes.clear()
    again = load(photos, cache)
    assert len(decodes) == 40
    assert torch.equal(again.val.images, load(photos, None).val.images)
    assert all(v.stat().st_size > 0 for v in tmp_path.glob("victim-*.rows"))


def test_a_cache_folder_that_cannot_be_written_falls_back_to_memory_with_one_warning(photos, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING):
        data = load(photos, PhotoCache(blocker))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "keeps its photos in memory" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()
    assert torch.equal(data.train.images, load(photos, None).train.images)
    assert blocker.read_text().startswith("a file")


def test_a_full_disk_while_writing_goes_on_in_memory_and_leaves_no_partial_file(photos, tmp_path, monkeypatch,
                                                                                caplog):
    from vit_flowers.data import cache_writer

    written = [0]
    real_open = open

    class FullAfter:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            written[0] += 1
            if written[0] > 5:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(cache_writer, "open", lambda *a, **k: FullAfter(real_open(*a, **k)), raising=False)
    cache = PhotoCache(tmp_path / "cache")
    with caplog.at_level(logging.WARNING):
        data = load(photos, cache)
    assert "the disk is full" in caplog.text
    assert torch.equal(data.train.images, load(photos, None).train.images)
    assert torch.equal(data.val.images, load(photos, None).val.images)
    assert not [p for p in packs(cache) if p.suffix != ".lock"]  # no pack claims to be whole, no temporary left


def test_a_killed_build_leaves_nothing_that_is_read_as_whole(photos, tmp_path, monkeypatch, decodes):
    cache = PhotoCache(tmp_path / "cache")
    real = datasets.decode_file

    def killed(path, size):
        if len(decodes) > 10:
            raise KeyboardInterrupt
        return real(path, size)

    monkeypatch.setattr(datasets, "decode_file", killed)
    with pytest.raises(KeyboardInterrupt):
        load(photos, cache)
    assert not [p for p in packs(cache) if p.suffix in (".json", ".rows")]
    assert cache.folder is not None
    stale = cache.folder / "0123.abcd.rows.tmp-otherhost-999999"  # what a SIGKILL'd run leaves
    stale.write_bytes(b"\0" * 100)
    monkeypatch.setattr(datasets, "decode_file", real)
    data = load(photos, cache)
    assert torch.equal(data.train.images, load(photos, None).train.images)
    assert cache_folder.listing(tmp_path / "cache")[1] == 100  # listed as other files; --clear removes it


def test_an_unreadable_photo_is_left_out_without_a_copy_and_memory_stays_flat(tmp_path):
    """Decoding 600 photos at 160 px (46 MB) into the cache grows the process's anonymous memory by far less than
    the photos, an unreadable one among them included; in memory it grows by all of them."""
    if not Path("/proc/self/status").exists():
        pytest.skip("RssAnon is read from /proc")
    write_class_folders(tmp_path / "photos", 120)
    write_class_folders(tmp_path / "warm", 2)
    (tmp_path / "photos" / "rose" / "broken.jpg").write_bytes(b"not a jpeg")
    script = """
import sys
from vit_flowers.data.datasets import load_folder
from vit_flowers.data.photo_cache import PhotoCache
def anon():
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('RssAnon')) * 1024
cache = PhotoCache(sys.argv[3]) if sys.argv[3] != '-' else None
load_folder(sys.argv[2], image_size=160, progress=False, cache=cache)  # imports, threads and buffers warmed up
before = anon()
data = load_folder(sys.argv[1], image_size=160, progress=False, cache=cache, train_on_val=True)
int(data.train.images.max()) + int(data.val.images.max())  # every page read (a reduction: no copy)
print(anon() - before, data.train.images.nbytes, len(data.train))
"""

    def grown(cache: str) -> tuple[int, int, int]:
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "photos"), str(tmp_path / "warm"), cache],
                             capture_output=True, text=True, check=True)
        grew, nbytes, n = map(int, out.stdout.split())
        return grew, nbytes, n

    grew, nbytes, n = grown(str(tmp_path / "cache"))
    assert n == 600 and nbytes == 600 * 3 * 160 * 160  # the unreadable photo left out
    assert grew < nbytes / 4, (grew, nbytes)
    assert grown("-")[0] > nbytes, nbytes  # (the measure sees the photos when they are in memory: train and val)


def test_two_runs_at_once_on_the_same_photos_decode_them_once(photos, tmp_path):
    script = """
import logging, sys
from vit_flowers.data.datasets import load_folder
from vit_flowers.data.photo_cache import PhotoCache
logging.basicConfig(level=logging.INFO, format='%(message)s')
d = load_folder(sys.argv[1], image_size=24, progress=False, cache=PhotoCache(sys.argv[2]))
print(int(d.train.images.double().sum()) + int(d.val.images.double().sum()))
"""
    args = [sys.executable, "-c", script, str(photos), str(tmp_path / "cache")]
    runs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [r.communicate() for r in runs]
    assert all(r.returncode == 0 for r in runs), outs
    assert outs[0][0] == outs[1][0]
    decoded = sum(int(line.rsplit(", ", 1)[1].split()[0]) for _, err in outs for line in err.splitlines()
                  if line.startswith("photo cache: train") or line.startswith("photo cache: val"))
    assert decoded == 40  # the second waited for the first and read its sets


def hybrid() -> torch.nn.Module:
    return create_vit("vit_micro", 5, image_size=64, patch_size=32, patch_embed="lite0")


def test_trunk_outputs_are_kept_and_read_back_without_running_the_trunk(photos, tmp_path, monkeypatch):
    cache = PhotoCache(tmp_path / "cache")
    data = load_folder(photos, image_size=64, progress=False, cache=cache).train
    model = hybrid()
    through = [0]
    real = type(model).trunk_grid

    def counted(self, x):
        through[0] += len(x)
        return real(self, x)

    monkeypatch.setattr(type(model), "trunk_grid", counted)
    first = trunk_outputs(model, data, 8, torch.device("cpu"), None, "trunk (train)", False, cache)
    assert through[0] == len(data) + 1 and first.computed == len(data)  # every photo, and one to learn the shape
    through[0] = 0
    again = trunk_outputs(model, data, 8, torch.device("cpu"), None, "trunk (train)", False, cache)
    assert through[0] == 1 and again.computed == 0 and torch.equal(first.data, again.data)
    assert torch.equal(again.data, trunk_outputs(model, data, 8, torch.device("cpu"), None, "t", False, None).data)
    with torch.no_grad():
        next(model.to_patch_embedding.trunk.parameters()).add_(0.1)  # other weights: other outputs
    through[0] = 0
    other = trunk_outputs(model, data, 8, torch.device("cpu"), None, "trunk (train)", False, cache)
    assert through[0] == len(data) + 1 and not torch.equal(other.data, first.data)


def test_a_head_start_read_from_the_cache_plans_on_a_timed_forward_pass(photos, tmp_path, monkeypatch):
    """Reading the trunk's outputs from the cache takes a fraction of a second: planned from that, an end-to-end
    epoch would look free and a second run would overrun its budget. A pass that computed every photo is its own
    timing; a pass the cache answered times one batch instead."""
    from vit_flowers.training import token_cache

    cache = PhotoCache(tmp_path / "cache")
    data = load_folder(photos, image_size=64, progress=False, cache=cache)
    timed: list[float] = []
    real = token_cache.timed_forward
    monkeypatch.setattr(token_cache, "timed_forward", lambda *a: timed.append(real(*a)) or timed[-1])

    model = hybrid()  # one trunk: its weights are part of the outputs' key

    def phase() -> token_cache.TokenPhase:
        recipe = plan_recipe([len(data.train)], batch_size=8, token_epochs=1, head_start_steps=0,
                             end_to_end_min_per_class=0)
        return token_cache.TokenPhase(model, data.train, data.val, recipe=recipe, lr=1e-3, weight_decay=0.0,
                                      batch_size=8, label_smoothing=0.0, device=torch.device("cpu"),
                                      amp_dtype=None, progress=False, cache=cache)

    first = phase()
    assert not timed and first.forward_per_photo == first.cache_seconds / (len(data.train) + len(data.val))
    second = phase()
    assert timed == [second.forward_per_photo] and second.forward_per_photo > 0
    assert second.end_to_end_epoch_estimate(100) == second.forward_per_photo * (
        STEP_OVER_FORWARD * 100 + len(data.val))


def test_the_cache_command_lists_and_clears(photos, tmp_path, caplog):
    cache = PhotoCache(tmp_path / "cache")
    load(photos, cache)
    with caplog.at_level(logging.INFO, logger="vit_flowers.cache"):
        assert cache_main(["--cache-dir", str(tmp_path / "cache")]) == 0
    assert "2 sets" in caplog.text and "train of" in caplog.text and "val of" in caplog.text
    assert cache_folder.cache_size(tmp_path / "cache") > 40 * 3 * SIZE * SIZE
    (tmp_path / "cache" / "keep.txt").write_text("not the cache's")
    assert cache_main(["--cache-dir", str(tmp_path / "cache"), "--clear"]) == 0
    assert cache_folder.cache_size(tmp_path / "cache") == 0 and (tmp_path / "cache" / "keep.txt").exists()



@pytest.mark.parametrize("clear", [False, True])
def test_the_cache_command_refuses_a_file_or_a_missing_folder_in_one_line(tmp_path, caplog, clear):
    """`vit-flowers cache --cache-dir A_FILE --clear` said "cleared …: 0 B freed" and exited 0: a mistyped folder
    passed for an empty cache."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a cache")
    for where, why in ((a_file, "is a file, not a folder"), (tmp_path / "nowhere", "no cache folder at")):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vit_flowers.cache"):
            assert cache_main(["--cache-dir", str(where), *(["--clear"] if clear else [])]) == 2
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and why in lines[0] and str(where) in lines[0], lines
    assert a_file.read_text() == "not a cache" and not (tmp_path / "nowhere").exists()

def test_training_keeps_its_photos_where_cache_dir_says_and_nowhere_with_photo_cache_off(photos, tmp_path, caplog):
    from vit_flowers.train import train

    cfg = smoke_config(tmp_path, data=str(photos), dataset="folder", cache_dir=str(tmp_path / "here"), epochs=1,
                       report=False)
    run_dir = train(cfg).run_dir
    assert len(list((tmp_path / "here").glob("packs-v*/*.rows"))) == 2
    metrics = {}
    for where in ("run's", "empty"):  # evaluate reads the run's validation photos where training kept them
        out = tmp_path / f"eval-{where}"
        extra = ["--cache-dir", str(tmp_path / "empty")] if where == "empty" else []
        with caplog.at_level(logging.INFO):
            caplog.clear()
            assert evaluate_main(["--checkpoint", str(run_dir), "--output", str(out), "--quiet", *extra]) == 0
        assert ("validation photos read from" in caplog.text) == (where == "run's")
        metrics[where] = json.loads((out / "metrics.json").read_text())
    assert metrics["run's"]["accuracy"] == metrics["empty"]["accuracy"]
    assert not (tmp_path / "empty").exists()  # evaluate writes no cache
    before = cache_folder.cache_size(user_cache_dir())
    train(smoke_config(tmp_path, data=str(photos), dataset="folder", photo_cache=False, epochs=1, report=False,
                       run_name="off"))
    assert cache_folder.cache_size(user_cache_dir()) == before


def test_a_resumed_run_reads_its_photos_from_the_cache(photos, tmp_path, caplog):
    from vit_flowers.train import train

    common = dict(data=str(photos), dataset="folder", cache_dir=str(tmp_path / "here"), report=False)
    train(smoke_config(tmp_path, epochs=1, **common))
    with caplog.at_level(logging.INFO, logger="vit_flowers.data.datasets"):
        resumed = train(smoke_config(tmp_path, epochs=2, resume="auto", **common))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("photo cache: train",
                                                                                  "photo cache: val"))]
    assert len(lines) == 2 and all(line.endswith("read from the cache, 0 decoded") for line in lines), lines
    assert len(load_checkpoint(resumed.run_dir / "last.pt")["train_state"]["history"]) == 2
