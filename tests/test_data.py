"""Tests for vit_flowers.data.datasets: folder scanning, splits, caching, and the dataset sources."""

from __future__ import annotations

import json
import logging
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_flowers.data import datasets as data
from vit_flowers.data.config import DataConfig
from vit_flowers.data.datasets import (
    Datasets,
    TensorImageDataset,
    TrainedOn,
    cache_images,
    create_dataset,
    dataset_names,
    load_flower_photos,
    load_flowers102,
    load_folder,
    load_synthetic,
    rebuild_photos,
    register_dataset,
)
from vit_flowers.data.image_files import list_images
from vit_flowers.data.splits import find_split_dirs, load_split, save_split, scan_class_folders, stratified_split

# One flat colour per class, so that a cached image tells which label it must carry.
COLOURS = [(230, 20, 20), (20, 230, 20), (20, 20, 230), (230, 230, 20), (20, 230, 230)]


def make_class_folders(root: Path, counts: dict[str, int], size: tuple[int, int] = (20, 14)) -> None:
    """ImageFolder layout under root: one folder per class with counts[name] flat-colour images (JPEG/PNG)."""
    for c, (name, n) in enumerate(sorted(counts.items())):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            ext = ".png" if i % 2 else ".jpg"
            Image.new("RGB", size, COLOURS[c % len(COLOURS)]).save(folder / f"img_{i:03d}{ext}")


def assert_labels_match_colours(ds: TensorImageDataset) -> None:
    """Every image's mean colour is the colour of its class: images and labels stayed aligned."""
    means = ds.images.float().mean(dim=(2, 3))  # (N, 3)
    for mean, label in zip(means, ds.labels.tolist()):
        expected = COLOURS[ds.classes.index(ds.classes[label]) % len(COLOURS)]
        assert torch.allclose(mean, torch.tensor(expected, dtype=torch.float32), atol=6), (mean, label)


# ----------------------------------------------------------------------------------------------------------
# scan_class_folders / find_split_dirs


def test_scan_class_folders(tmp_path: Path) -> None:
    make_class_folders(tmp_path, {"tulip": 3, "daisy": 2})
    (tmp_path / "LICENSE.txt").write_text("cc-by")  # next to the class folders: ignored
    (tmp_path / "daisy" / "README.md").write_text("not an image")
    nested = tmp_path / "tulip" / "more" / "deep.png"
    nested.parent.mkdir()
    Image.new("RGB", (4, 4)).save(nested)
    (tmp_path / ".git").mkdir()  # hidden folder is not a class
    classes, samples = scan_class_folders(tmp_path)
    assert classes == ["daisy", "tulip"]
    assert len(samples) == 6
    assert (nested, 1) in samples
    assert all(p.suffix in {".jpg", ".png"} for p, _ in samples)
    assert sorted(label for _, label in samples) == [0, 0, 1, 1, 1, 1]


def test_scan_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        scan_class_folders(tmp_path / "nowhere")


def test_scan_no_class_folders(tmp_path: Path) -> None:
    Image.new("RGB", (4, 4)).save(tmp_path / "loose.jpg")
    with pytest.raises(ValueError, match="no class folders.*1 loose images"):
        scan_class_folders(tmp_path)


def test_scan_single_class(tmp_path: Path) -> None:
    make_class_folders(tmp_path, {"rose": 2})
    with pytest.raises(ValueError, match="only one class folder.*rose"):
        scan_class_folders(tmp_path)



def test_class_folders_that_differ_only_in_case_are_refused_in_one_line(tmp_path: Path, caplog) -> None:
    """"Rose" and "rose" are two classes here and one folder on macOS and Windows: refused when the folder is scanned,
    so that `train --data` stops before anything is written, in one line naming both."""
    from vit_flowers import train as train_mod

    make_class_folders(tmp_path / "photos", {"Rose": 2, "rose": 2, "tulip": 2})
    if len(list((tmp_path / "photos").iterdir())) < 3:
        pytest.skip("a file system that ignores case")
    with pytest.raises(ValueError, match=r"class folders 'Rose' and 'rose' in .*photos differ only in case"):
        scan_class_folders(tmp_path / "photos")
    caplog.set_level(logging.ERROR)
    out = tmp_path / "ck"
    assert train_mod.main(["--data", str(tmp_path / "photos"), "--out-dir", str(out), "--progress", "false"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "'Rose' and 'rose'" in errors[0] and "\n" not in errors[0], errors
    assert not out.exists() or not any(out.iterdir())

def test_scan_empty_class_is_named(tmp_path: Path) -> None:
    make_class_folders(tmp_path, {"rose": 2, "daisy": 2})
    (tmp_path / "sunflower").mkdir()
    (tmp_path / "sunflower" / "notes.txt").write_text("no pictures yet")
    with pytest.raises(ValueError, match="no images.*sunflower"):
        scan_class_folders(tmp_path)


def test_scan_no_images_at_all(tmp_path: Path) -> None:
    for name in ["a", "b"]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.txt").write_text("x")
    with pytest.raises(ValueError, match="no images found"):
        scan_class_folders(tmp_path)


def test_find_split_dirs_synonyms_and_case(tmp_path: Path) -> None:
    for name in ["Train", "VALID", "Testing", "other"]:
        (tmp_path / name).mkdir()
    (tmp_path / "val.txt").write_text("a file, not a folder")
    assert find_split_dirs(tmp_path) == {
        "train": tmp_path / "Train", "val": tmp_path / "VALID", "test": tmp_path / "Testing"
    }


def test_find_split_dirs_none_without_train(tmp_path: Path) -> None:
    (tmp_path / "val").mkdir()
    (tmp_path / "daisy").mkdir()
    assert find_split_dirs(tmp_path) == {}


def test_find_split_dirs_ambiguous(tmp_path: Path) -> None:
    for name in ["train", "val", "validation"]:
        (tmp_path / name).mkdir()
    with pytest.raises(ValueError, match="ambiguous val"):
        find_split_dirs(tmp_path)


# ----------------------------------------------------------------------------------------------------------
# stratified_split, split files


def test_stratified_split_properties() -> None:
    labels = [0] * 50 + [1] * 10 + [2] * 2 + [3] * 1 + [4] * 7
    train, val = stratified_split(labels, 0.2, seed=0)
    assert sorted(train + val) == list(range(len(labels)))  # a partition
    assert train == sorted(train) and val == sorted(val)
    val_per_class = np.bincount([labels[i] for i in val], minlength=5).tolist()
    assert val_per_class == [10, 2, 1, 0, 1]  # 20%, at least one per class with >= 2 images, singleton in train


def test_stratified_split_deterministic_and_seeded() -> None:
    labels = [i % 3 for i in range(60)]
    assert stratified_split(labels, 0.25, seed=7) == stratified_split(labels, 0.25, seed=7)
    assert stratified_split(labels, 0.25, seed=7) != stratified_split(labels, 0.25, seed=8)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_stratified_split_bad_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match="val_fraction"):
        stratified_split([0, 0, 1, 1], fraction, seed=0)


def test_load_split_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load_split(bad)
    bad.write_text(json.dumps({"train": ["a.jpg"], "val": "b.jpg"}))
    with pytest.raises(ValueError, match="'val'"):
        load_split(bad)


# ----------------------------------------------------------------------------------------------------------
# cache_images


def test_cache_images_skips_corrupt_file_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_class_folders(tmp_path, {"a": 4, "b": 4})
    classes, samples = scan_class_folders(tmp_path)
    bad1 = tmp_path / "a" / "img_001.png"
    bad1.write_bytes(b"")  # zero bytes
    bad2 = tmp_path / "b" / "img_002.jpg"
    bad2.write_bytes(bad2.read_bytes()[:40])  # truncated
    with caplog.at_level(logging.WARNING, logger="vit_flowers.data.datasets"):
        ds = cache_images([p for p, _ in samples], [y for _, y in samples], classes, 12, progress=False)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert str(bad1) in warnings[0].getMessage() and str(bad2) in warnings[0].getMessage()
    assert len(ds) == 6 and ds.images.shape == (6, 3, 12, 12) and ds.images.dtype == torch.uint8
    assert ds.labels.dtype == torch.int64
    assert str(bad1) not in ds.paths and str(bad2) not in ds.paths
    assert_labels_match_colours(ds)
    image, label = ds[0]
    assert image.shape == (3, 12, 12) and label.ndim == 0


def test_cache_images_all_bad_is_an_error(tmp_path: Path) -> None:
    paths = [tmp_path / "x.jpg", tmp_path / "y.jpg"]
    for p in paths:
        p.write_text("text")
    with pytest.raises(ValueError, match="none of the 2 images"):
        cache_images(paths, [0, 1], ["a", "b"], 8, progress=False)


def test_cache_images_single_thread_same_result(tmp_path: Path) -> None:
    make_class_folders(tmp_path, {"a": 3, "b": 3})
    classes, samples = scan_class_folders(tmp_path)
    args = ([p for p, _ in samples], [y for _, y in samples], classes, 10)
    one = cache_images(*args, progress=False, num_threads=1)
    many = cache_images(*args, progress=False, num_threads=3)
    assert torch.equal(one.images, many.images) and torch.equal(one.labels, many.labels)


# ----------------------------------------------------------------------------------------------------------
# load_folder


def test_load_folder_auto_split_and_reuse_from_split_file(tmp_path: Path) -> None:
    root = tmp_path / "flowers"
    make_class_folders(root, {"daisy": 10, "rose": 6, "tulip": 4})
    ds = load_folder(root, image_size=16, cache_size=20, val_fraction=0.25, split_seed=3, progress=False)
    assert isinstance(ds, Datasets)
    assert ds.classes == ["daisy", "rose", "tulip"]
    assert ds.test is None
    assert ds.train.images.shape[1:] == (3, 20, 20) and ds.val.images.shape[1:] == (3, 16, 16)
    assert len(ds.train) + len(ds.val) == 20
    assert sorted(ds.val.labels.tolist()) == [0, 0, 0, 1, 1, 2]  # round(25%) per class, >= 1
    assert "auto split 75/25, seed 3" in ds.source
    assert_labels_match_colours(ds.train)
    assert_labels_match_colours(ds.val)
    split = ds.split
    assert split["seed"] == 3 and split["val_fraction"] == 0.25
    assert set(split["train"]).isdisjoint(split["val"])
    assert all(not Path(p).is_absolute() and (root / p).is_file() for p in split["train"] + split["val"])

    split_file = tmp_path / "run" / "split.json"
    save_split(split_file, split)
    assert load_split(split_file) == json.loads(json.dumps(split))
    # a different seed and fraction, but the split file wins
    again = load_folder(root, image_size=16, val_fraction=0.5, split_seed=99, split_file=split_file, progress=False)
    assert again.split["train"] == split["train"] and again.split["val"] == split["val"]
    assert again.val.paths == ds.val.paths and torch.equal(again.val.labels, ds.val.labels)
    assert str(split_file) in again.source

    # without the split file the other seed gives another split
    other = load_folder(root, image_size=16, val_fraction=0.25, split_seed=99, progress=False)
    assert other.split["val"] != split["val"]


def test_load_folder_split_file_with_missing_file_and_other_classes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "flowers"
    make_class_folders(root, {"daisy": 4, "rose": 4})
    ds = load_folder(root, image_size=8, progress=False)
    split_file = tmp_path / "split.json"
    save_split(split_file, ds.split)
    gone = root / ds.split["val"][0]
    gone.unlink()
    with caplog.at_level(logging.WARNING, logger="vit_flowers.data.splits"):
        again = load_folder(root, image_size=8, split_file=split_file, progress=False)
    assert len(again.val) == len(ds.val) - 1
    assert any(ds.split["val"][0] in r.getMessage() for r in caplog.records)

    save_split(split_file, {**ds.split, "classes": ["daisy", "rose", "tulip"]})
    with pytest.raises(ValueError, match="tulip"):
        load_folder(root, image_size=8, split_file=split_file, progress=False)


def test_load_folder_with_train_valid_test_subfolders(tmp_path: Path) -> None:
    make_class_folders(tmp_path / "Train", {"daisy": 3, "rose": 2})
    make_class_folders(tmp_path / "valid", {"daisy": 2, "rose": 1})
    make_class_folders(tmp_path / "test", {"daisy": 1, "rose": 1})
    split_file = tmp_path / "unused.json"
    ds = load_folder(tmp_path, image_size=8, split_file=split_file, progress=False)
    assert ds.split is None and not split_file.exists()
    assert (len(ds.train), len(ds.val), len(ds.test)) == (5, 3, 2)
    assert ds.classes == ["daisy", "rose"]
    assert "Train/" in ds.source and "valid/" in ds.source and "test/" in ds.source
    assert all("/valid/" in p for p in ds.val.paths)
    assert_labels_match_colours(ds.test)


def test_load_folder_train_val_class_mismatch(tmp_path: Path) -> None:
    make_class_folders(tmp_path / "train", {"daisy": 2, "rose": 2})
    make_class_folders(tmp_path / "val", {"daisy": 1, "tulip": 1})
    with pytest.raises(ValueError, match=r"missing \['rose'\], extra \['tulip'\]"):
        load_folder(tmp_path, image_size=8, progress=False)


def test_load_folder_train_only_is_split(tmp_path: Path) -> None:
    make_class_folders(tmp_path / "train", {"daisy": 5, "rose": 5})
    ds = load_folder(tmp_path, image_size=8, progress=False)
    assert len(ds.train) + len(ds.val) == 10 and len(ds.val) == 2
    assert all(p.startswith("train/") for p in ds.split["train"] + ds.split["val"])


def test_one_photo_per_class_says_why_nothing_is_left_for_validation_and_what_to_do(tmp_path: Path) -> None:
    make_class_folders(tmp_path, {"daisy": 1, "rose": 1, "tulip": 1})
    with pytest.raises(ValueError) as info:
        load_folder(tmp_path, image_size=8, val_fraction=0.2, progress=False)
    message = str(info.value)
    assert f"no photo of {tmp_path} is left for validation: photos per class: daisy 1, rose 1, tulip 1" in message
    assert "val_fraction 0.2 holds out 20% of each class, at least one photo of a class of 2 or more, none of a " \
           "class of 1" in message
    assert "add photos (2 or more per class), or give" in message and "train/ and val/ sub-folders" in message


def test_a_class_of_one_photo_among_others_is_named_as_never_validated(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    make_class_folders(tmp_path, {"daisy": 5, "rose": 1})
    ds = load_folder(tmp_path, image_size=8, progress=False)
    assert len(ds.val) == 1 and ds.classes[int(ds.val.labels[0])] == "daisy"
    assert "1 class(es) of" in caplog.text and "have a single photo, kept for training and never validated: rose" \
        in caplog.text


# ----------------------------------------------------------------------------------------------------------
# Flowers-102 and flower_photos (tiny fakes of the on-disk formats; never the network)


def make_fake_flowers102(root: Path) -> None:
    """root/flowers-102/{jpg/image_XXXXX.jpg, imagelabels.mat, setid.mat} with 12 images in 3 classes."""
    from scipy.io import savemat

    base = root / "flowers-102"
    (base / "jpg").mkdir(parents=True)
    labels = np.array([1, 2, 3] * 4)  # 1-based class per image id 1..12
    for i, label in enumerate(labels, start=1):
        Image.new("RGB", (30, 24), COLOURS[label - 1]).save(base / "jpg" / f"image_{i:05d}.jpg")
    savemat(base / "imagelabels.mat", {"labels": labels.reshape(1, -1)})
    savemat(base / "setid.mat", {"trnid": np.array([[1, 2, 3, 4, 5, 6]]), "valid": np.array([[7, 8, 9]]),
                                 "tstid": np.array([[10, 11, 12]])})


def test_a_flowers102_runs_photos_are_its_official_split_files(tmp_path: Path) -> None:
    """Found again as files of the official split, never downloaded (a missing copy says how to get it)."""
    make_fake_flowers102(tmp_path / "flowers102")
    cfg = DataConfig(dataset="flowers102", data_root=str(tmp_path))
    run = TrainedOn(cfg, seed=0, run_dir=tmp_path / "run", split_file=tmp_path / "run" / "split.json")
    val = rebuild_photos(run, "val", 12)
    assert val.files is not None and [f.name for f in val.files] == [f"image_{i:05d}.jpg" for i in (7, 8, 9)]
    assert val.labels == [0, 1, 2] and len(val.classes) == 102
    assert val.source == f"flowers102 validation split ({tmp_path})"
    assert rebuild_photos(run, "train", 12).labels == [0, 1, 2, 0, 1, 2]
    gone = TrainedOn(DataConfig(dataset="flowers102", data_root=str(tmp_path / "gone")), 0, run.run_dir, run.split_file)
    with pytest.raises(FileNotFoundError, match="Flowers-102 not found in .*gone/flowers102/flowers-102: download"):
        rebuild_photos(gone, "val", 12)


def test_load_flowers102_from_disk(tmp_path: Path) -> None:
    make_fake_flowers102(tmp_path)
    ds = load_flowers102(tmp_path, image_size=12, cache_size=16, download=False, progress=False)
    assert len(ds.classes) == 102 and len(set(ds.classes)) == 102
    assert (len(ds.train), len(ds.val), len(ds.test)) == (6, 3, 3)
    assert ds.train.images.shape[1:] == (3, 16, 16) and ds.test.images.shape[1:] == (3, 12, 12)
    assert ds.train.labels.tolist() == [0, 1, 2, 0, 1, 2]  # 1-based .mat labels -> 0-based
    assert ds.val.paths[0].endswith("image_00007.jpg")
    # colours follow labels (COLOURS indexed by label, as made above)
    for split in (ds.train, ds.val, ds.test):
        means = split.images.float().mean(dim=(2, 3))
        for mean, label in zip(means, split.labels.tolist()):
            assert torch.allclose(mean, torch.tensor(COLOURS[label], dtype=torch.float32), atol=6)
    assert ds.split is None


def test_flowers102_class_names() -> None:
    names = data._flowers102_classes()
    assert len(names) == 102
    from torchvision.datasets import Flowers102

    if hasattr(Flowers102, "classes"):
        assert names[0] == "pink primrose"


def test_load_flowers102_absent_offline(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="102flowers.tgz.*imagelabels.mat.*setid.mat"):
        load_flowers102(tmp_path, image_size=8, download=False, progress=False)


def test_load_flowers102_downloads_when_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_download(root: Path) -> None:
        calls.append(Path(root))
        make_fake_flowers102(Path(root))

    monkeypatch.setattr(data, "_download_flowers102", fake_download)
    ds = load_flowers102(tmp_path, image_size=8, download=True, progress=False)
    assert calls == [tmp_path] and len(ds.train) == 6
    load_flowers102(tmp_path, image_size=8, download=True, progress=False)
    assert len(calls) == 1  # present now: not downloaded again


def test_load_flowers102_download_failure_is_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(root: Path) -> None:
        raise OSError("Name or service not known")

    monkeypatch.setattr(data, "_download_flowers102", offline)
    with pytest.raises(RuntimeError, match="could not download Flowers-102.*robots.ox.ac.uk"):
        load_flowers102(tmp_path, image_size=8, progress=False)


def make_fake_flower_photos(root: Path) -> None:
    folder = root / "flower_photos"
    make_class_folders(folder, {"daisy": 5, "dandelion": 5, "roses": 5, "sunflowers": 5, "tulips": 5})
    (folder / "LICENSE.txt").write_text("All images in this archive are licensed under the Creative Commons")


def test_load_flower_photos_from_disk(tmp_path: Path) -> None:
    make_fake_flower_photos(tmp_path)
    ds = load_flower_photos(tmp_path, image_size=8, download=False, progress=False)
    assert ds.classes == ["daisy", "dandelion", "roses", "sunflowers", "tulips"]
    assert (len(ds.train), len(ds.val)) == (20, 5)
    assert ds.source.startswith("flower_photos")
    assert_labels_match_colours(ds.val)


def test_load_flower_photos_absent_offline(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="flower_photos.tgz"):
        load_flower_photos(tmp_path, image_size=8, download=False, progress=False)


def test_load_flower_photos_downloads_when_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_download(url: str, download_root: str, **kwargs) -> None:
        calls.append((url, Path(download_root)))
        make_fake_flower_photos(Path(download_root))

    monkeypatch.setattr(data, "download_and_extract_archive", fake_download)
    ds = load_flower_photos(tmp_path, image_size=8, progress=False)
    assert calls == [(data.FLOWER_PHOTOS_URL, tmp_path)]
    assert len(ds.train) + len(ds.val) == 25


# ----------------------------------------------------------------------------------------------------------
# synthetic and dispatch


@pytest.fixture
def fake_synthetic(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """A stand-in vit_flowers.data.synthetic whose images encode the seed, recording its calls."""
    calls: list[tuple[int, int, int]] = []

    def make_synthetic_flowers(num_per_class: int, image_size: int, seed: int = 0, progress: bool = False,
                               indices=None):
        calls.append((num_per_class, image_size, seed))
        n = num_per_class * 5
        images = torch.full((n, 3, image_size, image_size), seed % 256, dtype=torch.uint8)
        return images, torch.arange(n) % 5

    module = types.ModuleType("vit_flowers.data.synthetic")
    module.CLASSES = ("daisy", "dandelion", "rose", "sunflower", "tulip")
    module.make_synthetic_flowers = make_synthetic_flowers
    monkeypatch.setitem(sys.modules, "vit_flowers.data.synthetic", module)
    return calls


def test_load_synthetic_train_and_val_differ(fake_synthetic: list) -> None:
    ds = load_synthetic(image_size=8, cache_size=10, train_per_class=3, val_per_class=2, seed=5)
    assert ds.classes == ["daisy", "dandelion", "rose", "sunflower", "tulip"]
    assert ds.train.images.shape == (15, 3, 10, 10) and ds.val.images.shape == (10, 3, 8, 8)
    assert ds.train.labels.dtype == torch.int64
    (_, _, train_seed), (_, _, val_seed) = fake_synthetic
    assert train_seed == 5 and val_seed != train_seed
    assert ds.test is None and ds.split is None


def test_load_synthetic_real_module() -> None:
    synthetic = pytest.importorskip("vit_flowers.data.synthetic")
    ds = load_synthetic(image_size=16, train_per_class=2, val_per_class=1, seed=0)
    assert ds.classes == list(synthetic.CLASSES)
    assert ds.train.images.shape == (10, 3, 16, 16) and ds.train.images.dtype == torch.uint8
    assert ds.val.images.shape == (5, 3, 16, 16)
    assert sorted(ds.val.labels.tolist()) == [0, 1, 2, 3, 4]
    assert not torch.equal(ds.train.images[:5], ds.val.images)  # val drawn with another seed


def _load(dataset: str, **overrides):
    options = dict(path=None, data_root="unused", image_size=8, cache_size=10, val_fraction=0.2, split_seed=0,
                   synthetic_train_per_class=2, synthetic_val_per_class=1, download=False)
    return create_dataset(DataConfig(dataset=dataset, **{**options, **overrides}), seed=0)


def test_create_dataset_dispatch(tmp_path: Path, fake_synthetic: list) -> None:
    syn = _load("synthetic")
    assert syn.train.images.shape[-1] == 10 and syn.val.images.shape[-1] == 8
    make_class_folders(tmp_path / "mine", {"a": 5, "b": 5})
    folder = _load("folder", path=str(tmp_path / "mine"))
    assert folder.train.images.shape[-1] == 10 and folder.val.images.shape[-1] == 8 and folder.split
    make_fake_flower_photos(tmp_path)
    assert _load("flower_photos", data_root=str(tmp_path)).classes[2] == "roses"
    make_fake_flowers102(tmp_path / "flowers102")
    f102 = _load("flowers102", data_root=str(tmp_path))
    assert len(f102.test) == 3 and f102.train.images.shape[-1] == 10


def test_create_dataset_errors(fake_synthetic: list) -> None:
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'.*synthetic, folder, flowers102, flower_photos"):
        _load("imagenet")
    with pytest.raises(ValueError, match="'dataset' folder needs 'data'"):
        _load("folder")
    with pytest.raises(ValueError, match="cache_size"):
        _load("synthetic", cache_size=4)


def test_a_new_source_is_one_registered_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    """create_dataset dispatches on the registry, and the config key 'dataset' accepts what is registered."""
    from vit_flowers.training.config import ConfigError, load_config

    monkeypatch.setattr(data, "_DATASETS", dict(data._DATASETS))  # the registration ends with the test
    with pytest.raises(ConfigError, match="'dataset' must be one of"):
        load_config(None, {"dataset": "plain"})
    calls = []

    @register_dataset("plain")
    def plain(cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets:
        calls.append((cfg.image_size, seed, split_file))
        images = torch.full((2, 3, cfg.image_size, cfg.image_size), 7, dtype=torch.uint8)
        ds = TensorImageDataset(images, torch.tensor([0, 1]), ["a", "b"])
        return Datasets(train=ds, val=ds, test=None, classes=["a", "b"], split=None, source="plain")

    assert dataset_names()[-1] == "plain" and load_config(None, {"dataset": "plain"}).data.dataset == "plain"
    loaded = create_dataset(DataConfig(dataset="plain", image_size=8, cache_size=8), seed=4)
    assert calls == [(8, 4, None)] and loaded.source == "plain" and loaded.train.images.shape == (2, 3, 8, 8)


def test_tensor_dataset_validates_shapes() -> None:
    with pytest.raises(ValueError, match="uint8"):
        TensorImageDataset(torch.zeros(2, 3, 4, 4), torch.zeros(2, dtype=torch.int64), ["a"])
    with pytest.raises(ValueError, match="labels"):
        TensorImageDataset(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(3, dtype=torch.int64), ["a"])


# ----------------------------------------------------------------------------------------------------------
# real photos


@pytest.mark.slow
def test_load_flowers5(flowers5_dir: Path, capsys: pytest.CaptureFixture) -> None:
    start = time.perf_counter()
    ds = load_folder(flowers5_dir, image_size=64, cache_size=72, progress=False)
    seconds = time.perf_counter() - start
    assert ds.classes == ["daisy", "dandelion", "rose", "sunflower", "tulip"]
    assert len(ds.train) + len(ds.val) == len(list_images(flowers5_dir)[0])  # every photo of the folder, once
    assert ds.train.images.shape[1:] == (3, 72, 72) and ds.val.images.shape[1:] == (3, 64, 64)
    assert set(ds.val.labels.tolist()) == set(range(5))
    with capsys.disabled():
        print(f"\nflowers5: {len(ds.train)} train + {len(ds.val)} val images cached in {seconds:.1f} s")


def test_heic_photos_in_a_class_folder_are_counted_and_decoded(tmp_path: Path, caplog) -> None:
    """The issue's case: two .heic files in a class folder vanished from train's counts, unlisted."""
    pytest.importorskip("pillow_heif").register_heif_opener()  # to write them (phones do)
    make_class_folders(tmp_path, {"a": 3, "b": 3})
    for i in range(2):
        Image.new("RGB", (20, 14), (250, 10, 10)).save(tmp_path / "a" / f"IMG_{i}.HEIC", quality=90)
    (tmp_path / "a" / "IMG_0.AAE").write_text("<plist/>")  # an iPhone's edit sidecar: not a photo
    with caplog.at_level(logging.INFO, logger="vit_flowers.data.splits"):
        classes, samples = scan_class_folders(tmp_path)
    assert sum(1 for p, y in samples if p.suffix == ".HEIC" and classes[y] == "a") == 2
    assert "skipped 1 file(s) that are not images by their extension: IMG_0.AAE" in caplog.text
    ds = cache_images([p for p, _ in samples], [y for _, y in samples], classes, 12, progress=False)
    heic = [str(p).endswith(".HEIC") for p in ds.paths]
    assert len(ds) == 8 and sum(heic) == 2 and ds.images.float().mean(dim=(2, 3))[heic][:, 0].min() > 200  # red


# ----------------------------------------------------------------------------------------------------------
# Links out of a class folder (#45)


def make_links_out(root: Path) -> None:
    """Class folders daisy, rose, tulip (flat colours 0-2) and violet, a link to a folder elsewhere (colour 3), with
    a link of every kind. Followed: violet (a class folder elsewhere), rose/alias -> rose/sub (inside its class).
    Not followed: rose/daisy-link -> daisy, rose/stray.png -> a file outside, rose/up -> root, daisy2 -> daisy,
    violet/rose-link -> rose."""
    make_class_folders(root, {"daisy": 3, "rose": 3, "tulip": 3})
    elsewhere = root.parent / "elsewhere" / "violet"
    elsewhere.mkdir(parents=True)
    for i in range(2):
        Image.new("RGB", (20, 14), COLOURS[3]).save(elsewhere / f"v{i}.png")
    (root / "violet").symlink_to(elsewhere, target_is_directory=True)
    (root / "rose" / "sub").mkdir()
    Image.new("RGB", (20, 14), COLOURS[1]).save(root / "rose" / "sub" / "deep.png")
    (root / "rose" / "alias").symlink_to("sub", target_is_directory=True)
    (root / "rose" / "daisy-link").symlink_to("../daisy", target_is_directory=True)
    (root / "rose" / "stray.png").symlink_to(root.parent / "elsewhere" / "stray.png")
    Image.new("RGB", (20, 14), COLOURS[0]).save(root.parent / "elsewhere" / "stray.png")
    (root / "rose" / "up").symlink_to("..", target_is_directory=True)
    (root / "daisy2").symlink_to("daisy", target_is_directory=True)
    (elsewhere / "rose-link").symlink_to(root / "rose", target_is_directory=True)


def test_links_out_of_a_class_folder_are_named_and_not_followed(tmp_path, caplog):
    root = tmp_path / "photos"
    make_links_out(root)
    caplog.set_level(logging.WARNING)
    classes, samples = scan_class_folders(root)
    assert classes == ["daisy", "rose", "tulip", "violet"]  # daisy2 is daisy again: no class of its own
    found = sorted(p.relative_to(root).as_posix() for p, _ in samples)
    assert found == sorted([f"{c}/img_{i:03d}{'.png' if i % 2 else '.jpg'}" for c in classes[:3] for i in range(3)]
                           + ["rose/alias/deep.png", "violet/v0.png", "violet/v1.png"])  # alias: inside, once
    warning = [r.getMessage() for r in caplog.records if "not followed" in r.getMessage()]
    assert len(warning) == 1, caplog.text
    for named in ("rose/daisy-link -> daisy (the class daisy)", f"rose/stray.png -> {tmp_path}", "rose/up -> . ",
                  "daisy2 -> daisy (the class daisy)", "violet/rose-link -> rose (the class rose)"):
        assert named in warning[0], named


def test_training_reads_no_photo_through_a_link_out_of_its_class(tmp_path):
    root = tmp_path / "photos"
    make_links_out(root)
    ds = load_folder(root, image_size=16, val_fraction=0.25, split_seed=3, progress=False)
    assert ds.classes == ["daisy", "rose", "tulip", "violet"]
    assert len(ds.train) + len(ds.val) == 12  # 9 photos, rose/alias/deep.png and violet's 2; no daisy as a rose
    assert_labels_match_colours(ds.train)
    assert_labels_match_colours(ds.val)


def test_a_loop_tracked_for_another_process_writes_its_step(tmp_path, monkeypatch):
    from vit_flowers.data import progress
    from vit_flowers.runs import folders as runs

    mark = tmp_path / runs.IN_PROGRESS
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)  # every item
    assert list(progress.tracked(range(3), "decoding", 3)) == [0, 1, 2] and not mark.exists()  # no watcher: nothing
    monkeypatch.setenv(progress.PROGRESS_ENV, str(mark))
    seen = []
    for item in progress.tracked(["a", "b", "c"], "decoding the photos (train)", 3):
        seen.append((item, progress.read_step(mark)))  # while an item is worked on: the ones before it are done
    assert seen == [("a", progress.Step("decoding the photos (train)", 0, 3)),
                    ("b", progress.Step("decoding the photos (train)", 1, 3)),
                    ("c", progress.Step("decoding the photos (train)", 2, 3))]
    assert progress.read_step(mark) == progress.Step("decoding the photos (train)", 3, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [runs.IN_PROGRESS]  # replaced whole, nothing left beside
    mark.write_text("{half a")
    assert progress.read_step(mark) is None and progress.read_step(tmp_path / "missing") is None


def test_a_folder_of_copies_leaves_no_validation_photo_and_is_refused_in_one_line(tmp_path):
    """Every class one group of copies of a photo: the split keeps each group on one side, so nothing is left for
    validation; the error names the groups and what to add (it was "no images to load for val")."""
    rng = np.random.default_rng(0)
    for name in ("daisy", "rose"):
        (tmp_path / name).mkdir()
        photo = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
        for i in range(4):
            Image.fromarray(photo).save(tmp_path / name / f"{i}.png")
    with pytest.raises(ValueError, match=r"no photo of .* is left for validation \(its 2 group\(s\) of duplicate "
                                         r"photos, 8 photos, .*\): add photos to each class"):
        data.load_folder(tmp_path, image_size=32, progress=False)
