"""The data section of a training config: which images, where they are, how they are split and at what size they are
cached. :func:`vit_flowers.data.datasets.create_dataset` builds a run's datasets from it alone.

It lives here, below ``training/``, so that the dataset builders take it without importing the trainer, and a run's
photos are found again from its config.yaml's data section alone (:func:`data_section`,
:mod:`vit_flowers.inference.run_data`); the other sections are in :mod:`vit_flowers.training.config`, built with the
same :func:`setting` helper, reading YAML with the same :func:`read_yaml`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # importlib.resources.abc is Python 3.11's; only the annotation needs it
    from importlib.resources.abc import Traversable

__all__ = ["setting", "DataConfig", "TRAIN_ON_VAL_DATASETS", "ConfigError", "read_yaml", "data_section"]

TRAIN_ON_VAL_DATASETS: tuple[str, ...] = ("folder", "flower_photos")  # split from one folder of photos


class ConfigError(ValueError):
    """A configuration problem, with a message meant for the user."""


def read_yaml(path: Path | Traversable) -> dict[str, Any]:
    """The ``key: value`` mapping of the YAML file at ``path`` (a config file, a run's config.yaml, or a recipe
    shipped in the package), with an error naming the file when it is missing, not YAML or not a mapping."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of key: value, got {type(values).__name__}")
    return values


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

    def infer_dataset(self) -> bool:
        """``--data PATH`` alone means "train on this folder": a path with the dataset left synthetic (its default)
        makes it folder; True when it did (the training config then counts ``dataset`` as given)."""
        if self.path and self.dataset == "synthetic":
            self.dataset = "folder"
            return True
        return False

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


def data_section(values: Mapping[str, Any], where: str) -> DataConfig:
    """The data section of a run's flat config (its config.yaml, or the copy in its checkpoint: every key, as
    :func:`vit_flowers.training.config.save_config` wrote them, typed), the other keys left out; its defaults for a
    key it lacks. What evaluate, export and teach read of a run to find its photos again, without the training
    config's other sections. ConfigError naming ``where`` when a value breaks the section's rules."""
    keys = {f.metadata.get("key") or f.name: f.name for f in dataclasses.fields(DataConfig)}
    section = DataConfig(**{name: values[key] for key, name in keys.items() if key in values})
    section.infer_dataset()
    try:
        section.validate()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: config key {exc}") from None
    return section
