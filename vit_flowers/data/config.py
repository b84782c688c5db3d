"""The data section of a training config: which images, where they are, how they are split and at what size they are
cached. :func:`vit_flowers.data.datasets.create_dataset` builds a run's datasets from it alone.

It lives here, below ``training/``, so that the dataset builders take it without importing the trainer; the other
sections are in :mod:`vit_flowers.training.config`, built with the same :func:`setting` helper.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["setting", "DataConfig", "TRAIN_ON_VAL_DATASETS"]

TRAIN_ON_VAL_DATASETS: tuple[str, ...] = ("folder", "flower_photos")  # split from one folder of photos


def setting(default: Any, help: str, key: str | None = None) -> Any:
    """A config field: its default, its help text (what ``--help`` says of it) and, where the field's name in its
    section differs, the ``key`` that the command line and a flat YAML file call it (``--data`` is the data
    section's ``path``)."""
    return dataclasses.field(default=default, metadata={"help": help, "key": key})


@dataclass
class DataConfig:
    dataset: str = setting("synthetic", "the images: synthetic (built in), folder (--data PATH, which alone means "
        "folder), flowers102 or flower_photos (downloaded)")
    path: str | None = setting(None, "a folder of photos in the ImageFolder layout", key="data")
    data_root: str = setting("data", "where flowers102 / flower_photos are downloaded")
    download: bool = setting(True, "allow downloading flowers102 / flower_photos when absent")
    val_fraction: float = setting(0.2, "held-out share when a folder has no val/ split")
    split_seed: int = setting(0, "seed of that stratified split (kept in the run's split.json)")
    train_on_val: bool = setting(False, "train on the val photos too (a final model: best.pt is then the last "
        "epoch's weights, EMA's when ema is on, and the val figures are of trained-on photos)")
    synthetic_train_per_class: int = setting(500, "synthetic set: training images per class")
    synthetic_val_per_class: int = setting(100, "synthetic set: validation images per class")
    image_size: int = setting(64, "model input size in pixels")
    cache_size: int = setting(72, "training images are cached at this size, then randomly cropped to image_size")
    photo_cache: bool = setting(True, "keep photos decoded (and a hybrid's trunk outputs of them) in files under "
        "cache_dir, read through a memory map: memory flat in the number of photos, and the next run on the same "
        "photos decodes none (false: in memory, decoded again every run)")
    cache_dir: str | None = setting(None, "photo_cache's folder (none: $XDG_CACHE_HOME/vit_flowers, "
        "~/.cache/vit_flowers by default); list or clear it with vit-flowers cache")

    def validate(self) -> None:
        """The data options' own rules, a ValueError naming the key: their one home (the config calls it before any
        work starts, :func:`~vit_flowers.data.datasets.create_dataset` for callers that build no config)."""
        for key in ("image_size", "cache_size", "synthetic_train_per_class", "synthetic_val_per_class"):
            if getattr(self, key) <= 0:
                raise ValueError(f"'{key}' must be positive, got {getattr(self, key)}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"'val_fraction' must be between 0 and 1, got {self.val_fraction}")
        if self.train_on_val and self.dataset not in TRAIN_ON_VAL_DATASETS:
            raise ValueError(f"'train_on_val' works for the datasets {', '.join(TRAIN_ON_VAL_DATASETS)} (split from "
                             f"one folder), not {self.dataset!r}")
        if self.cache_size < self.image_size:
            raise ValueError(f"'cache_size' ({self.cache_size}) must be >= image_size ({self.image_size})")
        if self.dataset == "folder" and not self.path:
            raise ValueError("'dataset' folder needs 'data': the path of a folder of photos (--data PATH)")
