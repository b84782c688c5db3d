"""A run's photos, found again from its run folder alone: the one place where ``evaluate`` (the run's held-out
photos), ``export`` (photos to check the export on, training photos to calibrate int8 on) and ``teach`` (the training
photos of a run that kept no features of them) get them.

- What the run trained on is its ``config.yaml``'s data section and seed, else those of the copy inside the
  checkpoint (:func:`trained_on`): the training config's other sections are not read, so this finds photos without
  the training package (:func:`vit_flowers.data.config.data_section`).
- Its dataset says how its photos are found again: the registry's ``rebuild``
  (:func:`vit_flowers.data.datasets.rebuild_photos`). Synthetic flowers are drawn again exactly as training drew them;
  Flowers-102 has its official split; a folder of photos (``dataset`` folder or flower_photos) is found and split as
  its ``split.json`` says (:func:`vit_flowers.data.splits.run_split`), and without one nothing guesses which photos
  were held out.
- :func:`photos_of` reads (or draws) the ones a command asks for at the checkpoint's size, as
  :class:`~vit_flowers.data.datasets.Photos` labelled with the checkpoint's classes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..data.cache_format import user_cache_dir
from ..data.config import ConfigError, data_section, read_yaml
from ..data.datasets import (
    Photos,
    RunPhotos,
    TensorImageDataset,
    TrainedOn,
    Which,
    cached_set,
    draw_synthetic,
    rebuild_photos,
)
from ..data.image_files import printable_name
from ..data.photo_cache import PhotoCache
from ..data.splits import Samples, scan_class_folders
from ..runs import folders as runs
from ..runs.checkpoint import ModelFacts
from .batches import iter_image_batches

__all__ = ["EvaluationSet", "trained_on", "rebuilt_photos", "evaluation_set", "run_photo_cache", "evenly", "photos_of",
           "validation_photos", "training_photos"]

logger = logging.getLogger(__name__)


class EvaluationSet(NamedTuple):
    """What to evaluate on: a short name (for a report folder), a description, and the images: in memory, or
    (classes, labelled files) streamed from disk."""

    name: str
    source: str
    data: TensorImageDataset | tuple[list[str], Samples]


def trained_on(ckpt: ModelFacts, run_dir: Path) -> TrainedOn:
    """What the run in ``run_dir`` trained on: the data section and seed of its config.yaml, else of the copy inside
    its checkpoint ``ckpt`` (``{}`` in a checkpoint without one: the defaults)."""
    path = run_dir / runs.CONFIG
    if path.is_file():
        values, where = read_yaml(path), str(path)
    elif isinstance(ckpt["config"], dict):
        values, where = ckpt["config"], f"the config in {run_dir}'s checkpoint"
    else:
        raise ConfigError(f"{run_dir} has no {runs.CONFIG} and the checkpoint holds no config: cannot tell which data "
                          f"the run was trained on; pass --data FOLDER")
    seed = values.get("seed", 0)  # RunConfig.seed's default, for a checkpoint without a config
    return TrainedOn(data_section(values, where), seed, run_dir, run_dir / runs.SPLIT)


def rebuilt_photos(ckpt: ModelFacts, run_dir: Path, which: Which, size: int | None = None) -> RunPhotos:
    """The ``which`` photos (train or val) of the run in ``run_dir`` (``ckpt`` its checkpoint), as its dataset finds
    them again; drawn ones at ``size`` pixels (default: the checkpoint's). Raises ConfigError / OSError / ValueError
    saying why they cannot be found."""
    return rebuild_photos(trained_on(ckpt, run_dir), which, size or ckpt["image_size"])


def _chosen_photos(ckpt: ModelFacts, run_dir: Path, data: str | Path | None,
                   size: int | None) -> tuple[str, RunPhotos]:
    """(a short name, the photos) of ``data`` (a class-folder tree) when given, else of the run's validation set."""
    if not data:
        return "val", rebuilt_photos(ckpt, run_dir, "val", size)
    root = Path(data)
    classes, samples = scan_class_folders(root)
    return root.resolve().name, RunPhotos(classes, [y for _, y in samples], f"folder {root}",
                                          files=[p for p, _ in samples])


def evaluation_set(ckpt: ModelFacts, run_dir: Path, data: str | Path | None = None,
                   size: int | None = None, cache: PhotoCache | None = None) -> EvaluationSet:
    """The images of ``data`` (a class-folder tree) when given, else the validation images of the run in
    ``run_dir`` (whose checkpoint is ``ckpt``); images drawn in memory at ``size`` pixels (default: the
    checkpoint's). The run's own photos are read from ``cache`` where it holds them as training decoded them."""
    name, found = _chosen_photos(ckpt, run_dir, data, size)
    if not data and found.files is not None and cache is not None:
        kept = cached_set(found.files, found.labels, found.classes, size or ckpt["image_size"], "val", cache)
        if kept is not None:
            logger.info("photo cache: the %d validation photos read from %s", len(kept), cache.folder)
            return EvaluationSet(name, found.source, kept)
    return EvaluationSet(name, found.source, found.everything())


def run_photo_cache(ckpt: ModelFacts, run_dir: Path, cache_dir: str | None = None) -> PhotoCache | None:
    """Where the run in ``run_dir`` kept its decoded photos: ``cache_dir`` when given, else its config's
    (``cache_dir``, the user's cache folder by default); None when it kept none (``photo_cache`` false)."""
    if cache_dir:
        return PhotoCache(cache_dir)
    try:
        data = trained_on(ckpt, run_dir).data
    except (OSError, ValueError):  # ConfigError is a ValueError
        return PhotoCache(user_cache_dir())
    return PhotoCache(data.cache_dir or user_cache_dir()) if data.photo_cache else None


def _labels(labels: Sequence[int], data_classes: Sequence[str], classes: Sequence[str]) -> np.ndarray:
    """``labels`` (indices into ``data_classes``) as indices into ``classes``: -1 for a class it does not have."""
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index.get(data_classes[y], -1) for y in labels], dtype=np.int64)


def evenly(count: int, limit: int) -> list[int]:
    """Up to ``limit`` of the indices 0 .. ``count`` - 1, evenly spaced (so that every class folder is in)."""
    if count == 0:
        return []
    return sorted(set(np.linspace(0, count - 1, min(limit, count)).round().astype(int).tolist()))


def photos_of(found: RunPhotos, indices: Sequence[int], ckpt: ModelFacts) -> Photos:
    """The photos ``indices`` of ``found`` at the checkpoint's size, labelled with its classes: drawn, or files decoded
    as the PyTorch path decodes them (unreadable ones left out, named in a warning; ValueError when none can be
    read)."""
    if found.draw is not None:
        return Photos(found.draw(indices), _labels([found.labels[i] for i in indices], found.classes, ckpt["classes"]),
                      [f"image {i}" for i in indices], found.source)
    assert found.files is not None  # RunPhotos holds one or the other
    files = [found.files[i] for i in indices]
    images, labels, names, failed = [], [], [], []
    for batch in iter_image_batches(files, ckpt["image_size"], batch_size=128):
        images.append(batch.images)
        labels += [found.labels[indices[i]] for i in batch.indices]
        names += [str(p) for p in batch.paths]
        failed += [f"{printable_name(e.path)}: {e.reason}" for e in batch.errors]
    if not names:
        raise ValueError(f"none of the {len(files)} images of {found.source} could be read")
    if failed:
        logger.warning("%s: %d photo(s) left out:\n  %s", found.source, len(failed), "\n  ".join(failed[:10]))
    return Photos(torch.cat(images), _labels(labels, found.classes, ckpt["classes"]), names, found.source)


def _synthetic(ckpt: ModelFacts, count: int, seed: int, what: str) -> Photos:
    """``count`` synthetic flowers drawn with ``seed``: what export checks on when a run's photos are not found."""
    from ..data.synthetic import CLASSES

    drawn = draw_synthetic(max(1, math.ceil(count / len(CLASSES))), ckpt["image_size"], seed, indices=range(count))
    return Photos(drawn.images, _labels(drawn.labels.tolist(), drawn.classes, ckpt["classes"]),
                  [f"image {i}" for i in range(len(drawn))], what)


def validation_photos(ckpt: ModelFacts, run_dir: Path, data: str | Path | None, limit: int) -> Photos:
    """Up to ``limit`` images of ``data`` (a class-folder tree) or of the run's own validation set, evenly spaced;
    synthetic flowers when neither is found."""
    try:
        _, found = _chosen_photos(ckpt, run_dir, data, None)
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        logger.warning("validation photos not found (%s): checking on synthetic flowers instead", exc)
        return _synthetic(ckpt, min(limit, 250), seed=12345, what="synthetic flowers")
    return photos_of(found, evenly(len(found.labels), limit), ckpt)


def training_photos(ckpt: ModelFacts, run_dir: Path, limit: int) -> Photos:
    """Up to ``limit`` of the run's training images (for calibration), evenly spaced; synthetic flowers when not
    found."""
    try:
        found = rebuilt_photos(ckpt, run_dir, "train")
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        logger.warning("training photos not found (%s): calibrating on synthetic flowers instead", exc)
        return _synthetic(ckpt, limit, seed=0, what="synthetic flowers")
    return photos_of(found, evenly(len(found.labels), limit), ckpt)
