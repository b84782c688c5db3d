"""Datasets as in-memory uint8 tensors.

Every dataset is decoded and resized once (`images.decode_file`) into a uint8 tensor (3,446 photos at 72 px
are ~50 MB) and augmented in batches later (`augment.py`): no per-item PIL work in
the training loop. Sources: a folder in the ImageFolder layout (with or without train/val[/test]
subfolders), Oxford Flowers-102, TensorFlow's flower_photos, or the built-in synthetic flowers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torchvision.datasets.utils import download_and_extract_archive
from tqdm.auto import tqdm

from .config import DataConfig
from .images import DECODE_THREADS, decode_file
from .splits import folder_samples

logger = logging.getLogger(__name__)

# a large prime between seeds that must never meet: the synthetic val set's (seed + it) and the
# trainer's epoch seeds (seed * it + epoch * 1009 + rank) stay apart from the small seeds users and epochs take
SEED_STRIDE = 1_000_003

FLOWER_PHOTOS_URL = "https://storage.googleapis.com/download.tensorflow.org/example_images/flower_photos.tgz"
FLOWERS102_URL = "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/"

@dataclass(eq=False)
class TensorImageDataset(torch.utils.data.Dataset):
    """Decoded images in memory: `images` uint8 (N, 3, S, S), `labels` int64 (N,)."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    paths: list[str] | None = None  # source files when from disk (for reports of mistakes)

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4 or self.images.shape[1] != 3:
            raise ValueError(
                f"images must be uint8 (N, 3, S, S), got {self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"labels must have shape ({self.images.shape[0]},), got {tuple(self.labels.shape)}")
        if self.paths is not None and len(self.paths) != len(self.labels):
            raise ValueError(f"{len(self.paths)} paths for {len(self.labels)} images")

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]

    def batch(self, idx: torch.Tensor) -> torch.Tensor:
        """The images at ``idx``: uint8 (len(idx), 3, S, S)."""
        return self.images[idx]


@dataclass
class Datasets:
    """The train / val (/ test) sets of one source, with its class names and how it was split."""

    train: TensorImageDataset
    val: TensorImageDataset
    test: TensorImageDataset | None
    classes: list[str]
    split: dict | None  # train/val assignment of a single-folder source (saved as split.json), else None
    source: str  # human-readable description of where the data came from


# ----------------------------------------------------------------------------------------------------------
# Folders


def cache_images(
    paths: list[Path],
    labels: list[int],
    classes: list[str],
    size: int,
    desc: str = "",
    progress: bool = True,
    num_threads: int | None = None,
) -> TensorImageDataset:
    """Decode and resize every file once into a `TensorImageDataset` of uint8 (N, 3, size, size).

    Files that fail to load are skipped and reported together in a single warning. Raises `ValueError` if no
    file could be loaded. Decoding runs on `num_threads` threads (default `DECODE_THREADS`).
    """
    if len(paths) != len(labels):
        raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
    if not paths:
        raise ValueError(f"no images to load{f' for {desc}' if desc else ''}")
    images = torch.empty(len(paths), 3, size, size, dtype=torch.uint8)  # (N, 3, S, S)
    ok = torch.zeros(len(paths), dtype=torch.bool)
    failed: list[str] = []
    num_threads = num_threads or DECODE_THREADS
    with ThreadPoolExecutor(max_workers=num_threads) as pool, tqdm(
        total=len(paths), desc=desc or "loading images", unit="img", disable=None if progress else True, leave=False
    ) as bar:
        for i, (path, result) in enumerate(zip(paths, pool.map(decode_file, paths, [size] * len(paths)))):
            if isinstance(result, str):
                failed.append(f"{path}: {result}")
            else:
                images[i] = result
                ok[i] = True
            bar.update()
    if failed:
        logger.warning(
            "skipped %d of %d images that could not be loaded%s:\n  %s",
            len(failed), len(paths), f" ({desc})" if desc else "", "\n  ".join(failed),
        )
    if not ok.any():
        raise ValueError(f"none of the {len(paths)} images could be loaded{f' ({desc})' if desc else ''}")
    keep = ok.nonzero().squeeze(1).tolist()
    all_ok = len(keep) == len(paths)
    return TensorImageDataset(
        images=images if all_ok else images[ok],
        labels=torch.tensor(labels, dtype=torch.int64)[ok],
        classes=list(classes),
        paths=[str(paths[i]) for i in keep],
    )


def load_folder(
    root: str | os.PathLike,
    *,
    image_size: int,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    split_file: Path | None = None,
    progress: bool = True,
    cache_size: int | None = None,
    train_on_val: bool = False,
) -> Datasets:
    """Load an ImageFolder-style folder into memory.

    With train/ and val/ sub-folders (synonyms: see `find_split_dirs`, optional test/) those are used as
    given. Otherwise the class folders (of `root`, or of its train/ folder when there is no val/) are split
    stratified with `split_seed`, or exactly as recorded in `split_file` when that file exists (paths
    relative to `root`). Train images are cached at `cache_size` (default `image_size`), val/test at
    `image_size`. ``train_on_val``: the val photos join the training set too (a final model on every labelled
    photo); val is still returned, and is then no longer held out.
    """
    found = folder_samples(root, val_fraction, split_seed, split_file)
    classes = found.classes

    def cache(samples: list[tuple[Path, int]], size: int, name: str) -> TensorImageDataset:
        paths, labels = [p for p, _ in samples], [y for _, y in samples]
        return cache_images(paths, labels, classes, size, desc=name, progress=progress)

    return Datasets(
        train=cache(found.train + found.val if train_on_val else found.train, cache_size or image_size, "train"),
        val=cache(found.val, image_size, "val"),
        test=cache(found.test, image_size, "test") if found.test else None,
        classes=classes,
        split=found.split,
        source=found.source,
    )


# ----------------------------------------------------------------------------------------------------------
# Public datasets


def _flowers102_files(base: Path) -> list[Path]:
    return [base / "jpg", base / "imagelabels.mat", base / "setid.mat"]


def _download_flowers102(root: Path) -> None:
    """Download Flowers-102 into root/flowers-102 (torchvision checks the md5 sums)."""
    from torchvision.datasets import Flowers102

    Flowers102(str(root), split="train", download=True)


def _flowers102_classes() -> list[str]:
    """The 102 official class names (torchvision's list), or class_001..class_102 when unavailable."""
    from torchvision.datasets import Flowers102

    names = getattr(Flowers102, "classes", None)
    if isinstance(names, (list, tuple)) and len(names) == 102:
        return list(names)
    return [f"class_{i:03d}" for i in range(1, 103)]


def load_flowers102(
    root: str | os.PathLike,
    *,
    image_size: int,
    download: bool = True,
    progress: bool = True,
    cache_size: int | None = None,
) -> Datasets:
    """Oxford Flowers-102 with its official train / val / test split (1,020 / 1,020 / 6,149 images).

    Files are expected in torchvision's layout, root/flowers-102/{jpg/image_XXXXX.jpg, imagelabels.mat,
    setid.mat}, and downloaded there (via torchvision) when absent and `download` is true.
    """
    from scipy.io import loadmat

    root = Path(root)
    base = root / "flowers-102"
    how_to = (
        f"download 102flowers.tgz, imagelabels.mat and setid.mat from {FLOWERS102_URL}, put them in {base}/ "
        f"and extract the archive there (so that {base / 'jpg' / 'image_00001.jpg'} exists)"
    )
    if not all(p.exists() for p in _flowers102_files(base)):
        if not download:
            raise FileNotFoundError(f"Flowers-102 not found in {base}: {how_to}, or allow downloading")
        logger.info("downloading Flowers-102 (~330 MB) into %s", base)
        try:
            _download_flowers102(root)
        except Exception as e:
            raise RuntimeError(f"could not download Flowers-102 ({type(e).__name__}: {e}); offline? {how_to}") from e
        if not all(p.exists() for p in _flowers102_files(base)):
            raise FileNotFoundError(f"Flowers-102 download did not produce the expected files in {base}: {how_to}")
    try:
        set_ids = loadmat(base / "setid.mat", squeeze_me=True)
        image_labels = np.atleast_1d(loadmat(base / "imagelabels.mat", squeeze_me=True)["labels"]).astype(int) - 1
    except Exception as e:
        raise ValueError(f"cannot read Flowers-102 label files in {base} ({type(e).__name__}: {e})") from e
    classes = _flowers102_classes()

    def split(key: str, size: int, name: str) -> TensorImageDataset:
        if key not in set_ids:
            raise ValueError(f"{base / 'setid.mat'} has no {key!r} entry")
        ids = np.atleast_1d(set_ids[key]).astype(int).tolist()  # 1-based image ids
        paths = [base / "jpg" / f"image_{i:05d}.jpg" for i in ids]
        return cache_images(paths, [int(image_labels[i - 1]) for i in ids], classes, size, desc=name, progress=progress)

    return Datasets(
        train=split("trnid", cache_size or image_size, "flowers102 train"),
        val=split("valid", image_size, "flowers102 val"),
        test=split("tstid", image_size, "flowers102 test"),
        classes=classes,
        split=None,
        source=f"flowers102 {base} (official train/val/test split)",
    )


def load_flower_photos(
    root: str | os.PathLike,
    *,
    image_size: int,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    download: bool = True,
    progress: bool = True,
    split_file: Path | None = None,
    cache_size: int | None = None,
    train_on_val: bool = False,
) -> Datasets:
    """TensorFlow's flower_photos (3,670 photos, 5 classes) from root/flower_photos/, downloaded when absent,
    then split like any single folder (`load_folder`)."""
    root = Path(root)
    folder = root / "flower_photos"
    if not folder.is_dir():
        how_to = f"download {FLOWER_PHOTOS_URL} and extract it into {root}/ (giving {folder}/daisy/...)"
        if not download:
            raise FileNotFoundError(f"flower_photos not found in {folder}: {how_to}, or allow downloading")
        logger.info("downloading flower_photos (~220 MB) into %s", root)
        try:
            download_and_extract_archive(FLOWER_PHOTOS_URL, download_root=str(root), remove_finished=True)
        except Exception as e:
            raise RuntimeError(f"could not download flower_photos ({type(e).__name__}: {e}); offline? {how_to}") from e
        if not folder.is_dir():
            raise FileNotFoundError(f"the flower_photos archive did not create {folder}: {how_to}")
    data = load_folder(
        folder, image_size=image_size, val_fraction=val_fraction, split_seed=split_seed,
        split_file=split_file, progress=progress, cache_size=cache_size, train_on_val=train_on_val,
    )
    data.source = data.source.replace("folder ", "flower_photos ", 1)
    return data


# ----------------------------------------------------------------------------------------------------------
# Synthetic flowers


def load_synthetic(
    *,
    image_size: int,
    train_per_class: int,
    val_per_class: int,
    seed: int,
    cache_size: int | None = None,
    progress: bool = False,
) -> Datasets:
    """The built-in synthetic flowers, drawn on the fly: train at `cache_size` (default `image_size`) with
    `seed`, val at `image_size` with a different seed."""
    from .synthetic import CLASSES, make_synthetic_flowers

    classes = list(CLASSES)

    def make(n: int, size: int, s: int) -> TensorImageDataset:
        images, labels = make_synthetic_flowers(n, size, seed=s, progress=progress)
        return TensorImageDataset(images=images, labels=labels.to(torch.int64), classes=classes)

    return Datasets(
        train=make(train_per_class, cache_size or image_size, seed),
        val=make(val_per_class, image_size, seed + SEED_STRIDE),
        test=None,
        classes=classes,
        split=None,
        source=f"synthetic flowers ({train_per_class}/{val_per_class} per class train/val, seed {seed})",
    )


# ----------------------------------------------------------------------------------------------------------
# The registry: a builder per dataset name, as timm's create_dataset. A new source is one registered function;
# the config key 'dataset' takes the registry's names.


class DatasetBuilder(Protocol):
    def __call__(self, cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets: ...


_BUILDERS: dict[str, DatasetBuilder] = {}


def register_dataset(name: str) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Register the decorated function as the builder of the dataset ``name``."""
    def add(builder: DatasetBuilder) -> DatasetBuilder:
        _BUILDERS[name] = builder
        return builder

    return add


def dataset_names() -> tuple[str, ...]:
    """The registered dataset names, the choices of the config key 'dataset'."""
    return tuple(_BUILDERS)


def create_dataset(cfg: DataConfig, *, seed: int = 0, split_file: Path | None = None,
                   progress: bool = False) -> Datasets:
    """The datasets that the data section ``cfg`` describes, in memory.

    "folder" reads ``cfg.path``; the public datasets live in ``data_root``/flowers102/ and ``data_root``/flower_photos/
    (downloaded there when absent and ``download`` is true). Train images are cached at ``cache_size`` (room for
    random crops), val/test at ``image_size``. ``seed`` draws the synthetic flowers; ``split_file`` (a run's
    split.json) splits a folder as recorded there.
    """
    builder = _BUILDERS.get(cfg.dataset)
    if builder is None:
        raise ValueError(f"unknown dataset {cfg.dataset!r}: choose one of {', '.join(_BUILDERS)}")
    cfg.validate()
    return builder(cfg, seed=seed, split_file=split_file, progress=progress)


@register_dataset("synthetic")
def _synthetic(cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets:
    return load_synthetic(image_size=cfg.image_size, cache_size=cfg.cache_size,
                          train_per_class=cfg.synthetic_train_per_class, val_per_class=cfg.synthetic_val_per_class,
                          seed=seed, progress=progress)


@register_dataset("folder")
def _folder(cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets:
    assert cfg.path is not None  # DataConfig.validate
    return load_folder(cfg.path, image_size=cfg.image_size, cache_size=cfg.cache_size, val_fraction=cfg.val_fraction,
                       split_seed=cfg.split_seed, split_file=split_file, progress=progress,
                       train_on_val=cfg.train_on_val)


def _warn_unused_path(cfg: DataConfig) -> None:
    if cfg.path:
        logger.warning("dataset %r lives in %s: --data %s is not used (use dataset 'folder' for your own folder)",
                       cfg.dataset, cfg.data_root, cfg.path)


@register_dataset("flowers102")
def _flowers102(cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets:
    _warn_unused_path(cfg)
    return load_flowers102(Path(cfg.data_root) / "flowers102", image_size=cfg.image_size, cache_size=cfg.cache_size,
                           download=cfg.download, progress=progress)


@register_dataset("flower_photos")
def _flower_photos(cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets:
    _warn_unused_path(cfg)
    return load_flower_photos(cfg.data_root, image_size=cfg.image_size, cache_size=cfg.cache_size,
                              val_fraction=cfg.val_fraction, split_seed=cfg.split_seed, split_file=split_file,
                              download=cfg.download, progress=progress, train_on_val=cfg.train_on_val)
