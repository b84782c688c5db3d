"""Which photos a run used (vit_flowers/training/run_data.py): the one rule that evaluate and export (its check and
its int8 calibration) follow, told from the run folder alone."""

from __future__ import annotations

import json

import pytest
from helpers import write_class_folders

from vit_flowers.data.splits import folder_samples, save_split
from vit_flowers.export import training_photos, validation_photos
from vit_flowers.runs import folders as runs
from vit_flowers.training.config import load_config, save_config
from vit_flowers.training.run_data import evaluation_set, run_config, run_folder

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
    assert not set(train.names) & set(validation_photos(ckpt, run_dir).names)


def test_a_flower_photos_run_is_found_under_data_root(tmp_path):
    photos = write_class_folders(tmp_path / "root" / "flower_photos", per_class=4, classes=CLASSES)
    run_dir, ckpt = _folder_run(tmp_path, {"dataset": "flower_photos", "data_root": str(tmp_path / "root")}, photos)
    (run_dir / runs.SPLIT).write_text(json.dumps({**json.loads((run_dir / runs.SPLIT).read_text()), "root": None}))
    folder = run_folder(run_config(run_dir, ckpt), run_dir)
    assert folder.root == folder.held_out == photos and len(folder.files.train) == 9
    assert training_photos(ckpt, run_dir).source == f"training photos of {photos}"


def test_without_split_json_nothing_guesses_which_photos_were_held_out(tmp_path):
    photos = write_class_folders(tmp_path / "photos", per_class=4, classes=CLASSES)
    run_dir, ckpt = _folder_run(tmp_path, {"dataset": "folder", "data": str(photos)}, photos)
    (run_dir / runs.SPLIT).unlink()
    with pytest.raises(FileNotFoundError, match="split.json not found: cannot tell which images"):
        evaluation_set(ckpt, run_dir)
    assert training_photos(ckpt, run_dir).source == "synthetic flowers"  # as validation_photos, never a guess
