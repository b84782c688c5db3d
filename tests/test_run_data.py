"""A run's photos found again (vit_flowers/inference/run_data.py, through the dataset registry's rebuild): the one rule
that evaluate, export (its check and its int8 calibration) and teach follow, told from the run folder alone."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import write_class_folders

from vit_flowers.data.splits import folder_samples, save_split
from vit_flowers.inference.run_data import evaluation_set, rebuilt_photos, training_photos, validation_photos
from vit_flowers.runs import folders as runs
from vit_flowers.training.config import load_config, save_config

CLASSES = ["daisy", "rose", "tulip"]


def _folder_run(tmp_path, cfg_overrides, photos):
    """A run folder as training leaves it (config.yaml, split.json of ``photos``) and its checkpoint's keys."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(None, {"val_fraction": 0.25, **cfg_overrides})
    save_config(cfg, run_dir / runs.CONFIG)
    save_split(run_dir / runs.SPLIT, folder_samples(photos, cfg.data.val_fraction, cfg.data.split_seed).split)
    return run_dir, {"classes": CLASSES, "image_size": 32, "config": {}}


def test_a_moved_split_root_falls_back_to_the_configs_folder_for_evaluate_and_export_alike(tmp_path):
    """split.json's root is gone (the photos were moved back where the config says): evaluate and export find them
    in the same place, and calibration never touches the validation photos."""
    photos = write_class_folders(tmp_path / "photos", per_class=8, classes=CLASSES)
    run_dir, ckpt = _folder_run(tmp_path, {"dataset": "folder", "data": str(photos)}, photos)
    split = json.loads((run_dir / runs.SPLIT).read_text())
    (run_dir / runs.SPLIT).write_text(json.dumps({**split, "root": str(tmp_path / "gone")}))
    name, source, (classes, val) = evaluation_set(ckpt, run_dir)
    assert (name, classes, len(val)) == ("val", CLASSES, 6) and str(photos) in source
    train = training_photos(ckpt, run_dir, limit=100)
    assert train.source == f"training photos of {photos}" and len(train.names) == 18
    assert not set(train.names) & set(validation_photos(ckpt, run_dir, None, 2000).names)


def test_a_flower_photos_run_is_found_under_data_root(tmp_path):
    photos = write_class_folders(tmp_path / "root" / "flower_photos", per_class=4, classes=CLASSES)
    run_dir, ckpt = _folder_run(tmp_path, {"dataset": "flower_photos", "data_root": str(tmp_path / "root")}, photos)
    (run_dir / runs.SPLIT).write_text(json.dumps({**json.loads((run_dir / runs.SPLIT).read_text()), "root": None}))
    train = rebuilt_photos(ckpt, run_dir, "train")
    assert train.source == f"training photos of {photos}" and len(train.labels) == 9
    assert train.files is not None and all(f.is_relative_to(photos) for f in train.files)
    assert training_photos(ckpt, run_dir, 256).source == f"training photos of {photos}"


def test_without_split_json_nothing_guesses_which_photos_were_held_out(tmp_path):
    photos = write_class_folders(tmp_path / "photos", per_class=4, classes=CLASSES)
    run_dir, ckpt = _folder_run(tmp_path, {"dataset": "folder", "data": str(photos)}, photos)
    (run_dir / runs.SPLIT).unlink()
    with pytest.raises(FileNotFoundError, match="split.json not found: cannot tell which images"):
        evaluation_set(ckpt, run_dir)
    assert training_photos(ckpt, run_dir, 256).source == "synthetic flowers"  # as validation_photos, never a guess


def test_a_folder_runs_photos_are_the_files_of_its_split_json(tmp_path):
    """Train and val are exactly split.json's files, labelled by their class folders; a train_on_val run trained on
    both."""
    photos = write_class_folders(tmp_path / "photos", per_class=5, classes=CLASSES)
    run_dir, ckpt = _folder_run(tmp_path, {"dataset": "folder", "data": str(photos)}, photos)
    split = json.loads((run_dir / runs.SPLIT).read_text())
    for which in ("train", "val"):
        found = rebuilt_photos(ckpt, run_dir, which)
        assert found.files is not None and found.classes == CLASSES
        assert [f.relative_to(photos).as_posix() for f in found.files] == split[which]
        assert [CLASSES[y] for y in found.labels] == [f.parent.name for f in found.files]
    save_config(load_config(None, {"val_fraction": 0.25, "dataset": "folder", "data": str(photos),
                                   "train_on_val": True}), run_dir / runs.CONFIG)
    found = rebuilt_photos(ckpt, run_dir, "train")
    assert found.files is not None
    assert [f.relative_to(photos).as_posix() for f in found.files] == split["train"] + split["val"]


def test_a_synthetic_runs_photos_are_drawn_again_as_training_drew_them(tmp_path, monkeypatch):
    """The real trainer's run: evaluate's set is the very images and labels training validated on, the training set
    drawn again (a few images alone, or all of it) is the one it trained on, and export calibrates within it."""
    from helpers import smoke_config

    from vit_flowers import train as train_mod
    from vit_flowers.runs.checkpoint import load_checkpoint
    from vit_flowers.training import setup

    used = []

    def spy(*args, **kwargs):
        used.append(load_run_data(*args, **kwargs))
        return used[-1]

    load_run_data = setup.load_run_data
    monkeypatch.setattr(setup, "load_run_data", spy)
    cfg = smoke_config(tmp_path, run_name="s", epochs=1, report=False, synthetic_train_per_class=4,
                       synthetic_val_per_class=3)
    run_dir = train_mod.train(cfg).run_dir
    (data,) = used
    ckpt = load_checkpoint(run_dir / runs.BEST)
    name, source, val = evaluation_set(ckpt, run_dir)
    assert name == "val" and source.startswith("synthetic flowers, validation set of run s")
    assert torch.equal(val.images, data.val.images) and torch.equal(val.labels, data.val.labels)
    train = rebuilt_photos(ckpt, run_dir, "train", size=cfg.data.cache_size)
    assert train.draw is not None and train.labels == data.train.labels.tolist()
    assert torch.equal(train.draw([13, 2]), data.train.images[[13, 2]])
    assert torch.equal(train.everything().images, data.train.images)
    calibration = training_photos(ckpt, run_dir, limit=256)  # the run's 20 training flowers, none drawn beyond them
    assert calibration.source.startswith("synthetic flowers, training set of run s") and len(calibration.names) == 20


def test_a_dataset_that_cannot_find_a_runs_photos_says_so(tmp_path, monkeypatch, caplog):
    """A dataset registered without a rebuild: evaluate gets one message naming the run folder; export checks on
    synthetic flowers and says why."""
    from vit_flowers.data import datasets

    monkeypatch.setattr(datasets, "_DATASETS", dict(datasets._DATASETS))
    datasets.register_dataset("plain")(lambda cfg, *, seed, split_file, progress: None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_config(load_config(None, {"dataset": "plain"}), run_dir / runs.CONFIG)
    ckpt = {"classes": CLASSES, "image_size": 16, "config": {}}
    message = (f"{run_dir}: cannot find the photos this run was trained on: its dataset 'plain' was registered "
               f"without a way to find a run's photos again; pass --data FOLDER")
    with pytest.raises(ValueError) as raised:
        evaluation_set(ckpt, run_dir)
    assert str(raised.value) == message
    with caplog.at_level("WARNING"):
        assert validation_photos(ckpt, run_dir, None, limit=5).source == "synthetic flowers"
    assert message in caplog.text


def test_a_runs_photos_are_found_from_its_data_section_alone(tmp_path):
    """trained_on reads the data section and seed (config.yaml, else the checkpoint's copy) and no other section: a
    key of another section that this version no longer knows does not stop evaluate; a bad data value is named."""
    from vit_flowers.data.config import ConfigError
    from vit_flowers.inference.run_data import trained_on

    photos = write_class_folders(tmp_path / "photos", per_class=4, classes=CLASSES)
    run_dir, ckpt = _folder_run(tmp_path, {"dataset": "folder", "data": str(photos), "seed": 3}, photos)
    flat = load_config(run_dir / runs.CONFIG).flat()
    (run_dir / runs.CONFIG).unlink()
    run = trained_on({**ckpt, "config": {**flat, "a_gone_key": 1}}, run_dir)
    assert (run.data.dataset, run.data.path, run.seed) == ("folder", str(photos), 3)
    run = trained_on({**ckpt, "config": {"data": str(photos)}}, run_dir)  # --data PATH alone: a folder
    assert run.data.dataset == "folder" and run.seed == 0
    (run_dir / runs.CONFIG).write_text(f"data: {photos}\nval_fraction: 2.0\n")
    with pytest.raises(ConfigError, match=r"config.yaml: config key 'val_fraction' must be between 0 and 1"):
        trained_on(ckpt, run_dir)
