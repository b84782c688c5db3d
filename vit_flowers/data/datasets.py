"""Datasets as uint8 tensors, memory-mapped from the photo cache.

Every dataset is decoded and resized once (`images.decode_file`) into a uint8 tensor (N, 3, S, S) and augmented in
batches later (`augment.py`): no per-item PIL work in the training loop. Photos from disk are decoded into the photo
cache (:mod:`.photo_cache`: a file, memory-mapped, reused by the next run on the same photos), so the tensor's pages
are the OS page cache's, not the process's memory; drawn ones (and ``photo_cache: false``) are in memory.
Sources: a folder in the ImageFolder layout (with or without train/val[/test] subfolders), Oxford Flowers-102,
TensorFlow's flower_photos, or the built-in synthetic flowers.

Each source is registered by name (:func:`register_dataset`) with its builder (:func:`create_dataset`) and how it
finds a finished run's train / val photos again from what the run folder records (:func:`rebuild_photos`): the one
way evaluate, export and teach get them (:mod:`vit_flowers.inference.run_data`). The synthetic flowers are drawn by
:func:`draw_synthetic` alone, for all of them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch
from torchvision.datasets.utils import download_and_extract_archive
from tqdm.auto import tqdm

from .cache_folder import cache_size, human_bytes
from .cache_format import file_key, set_name, user_cache_dir
from .config import DataConfig
from .images import DECODE_THREADS, decode_file, decode_rows
from .photo_cache import PhotoCache
from .progress import counting
from .splits import Samples, folder_samples, run_split

logger = logging.getLogger(__name__)

# a large prime between seeds that must never meet: the synthetic val set's (seed + it) and the
# trainer's epoch seeds (seed * it + epoch * 1009 + rank) stay apart from the small seeds users and epochs take
SEED_STRIDE = 1_000_003

Which = Literal["train", "val"]  # a run's training or validation photos

FLOWER_PHOTOS_URL = "https://storage.googleapis.com/download.tensorflow.org/example_images/flower_photos.tgz"
FLOWERS102_URL = "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/"

@dataclass(eq=False)
class TensorImageDataset(torch.utils.data.Dataset):
    """Decoded images: `images` uint8 (N, 3, S, S) (memory-mapped from the photo cache, or in memory), `labels`
    int64 (N,). Read them by batch (`batch`, slices): the whole tensor at once would be N x 150 KB at 224 px."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    paths: list[str] | None = None  # source files when from disk (for reports of mistakes)
    keys: list[str] | None = None  # each photo's content key in the photo cache (what a trunk output is kept by)

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4 or self.images.shape[1] != 3:
            raise ValueError(
                f"images must be uint8 (N, 3, S, S), got {self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"labels must have shape ({self.images.shape[0]},), got {tuple(self.labels.shape)}")
        if self.paths is not None and len(self.paths) != len(self.labels):
            raise ValueError(f"{len(self.paths)} paths for {len(self.labels)} images")
        if self.keys is not None and len(self.keys) != len(self.labels):
            raise ValueError(f"{len(self.keys)} keys for {len(self.labels)} images")

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]

    def batch(self, idx: torch.Tensor) -> torch.Tensor:
        """The images at ``idx``: uint8 (len(idx), 3, S, S)."""
        return self.images[idx]


@dataclass
class Photos:
    """Images to check or calibrate a model on: uint8 (N, 3, S, S), labels (index into the model's classes, -1 for
    a class it does not have), a name for each (file path or "image i") and where they came from."""

    images: torch.Tensor
    labels: np.ndarray
    names: list[str]
    source: str


@dataclass
class Datasets:
    """The train / val (/ test) sets of one source, with its class names and how it was split."""

    train: TensorImageDataset
    val: TensorImageDataset
    test: TensorImageDataset | None
    classes: list[str]
    split: dict | None  # train/val assignment of a single-folder source (saved as split.json), else None
    source: str  # human-readable description of where the data came from
    cache: PhotoCache | None = None  # where its photos (and a hybrid's trunk outputs of them) are kept


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
    cache: PhotoCache | None = None,
) -> TensorImageDataset:
    """Decode and resize every file once into a `TensorImageDataset` of uint8 (N, 3, size, size): into ``cache``'s
    folder (memory-mapped, read back by the next run on the same files), or into memory without one.

    Files that fail to load are left out (nothing is copied) and reported together in a single warning. Raises
    `ValueError` if no file could be loaded. Decoding runs on `num_threads` threads (default `DECODE_THREADS`).
    """
    if len(paths) != len(labels):
        raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
    if not paths:
        raise ValueError(f"no images to load{f' for {desc}' if desc else ''}")
    store = cache or PhotoCache(None)
    keys, group, folder = _set_keys(paths, size, desc)
    produce = decode_rows(paths, size, decode_file, num_threads or DECODE_THREADS)
    count = counting(f"decoding the photos{f' ({desc})' if desc else ''}", len(paths))
    with tqdm(total=len(paths), desc=desc or "loading images", unit="img", disable=None if progress else True,
              leave=False) as bar:

        def advance(n: int) -> None:
            bar.update(n)
            count(n)

        rows = store.rows(group, keys, (3, size, size), torch.uint8, produce, f"{desc or 'photos'} of {folder} at "
                          f"{size} px", progress=advance)
    if rows.failed:
        logger.warning(
            "skipped %d of %d images that could not be loaded%s:\n  %s",
            len(rows.failed), len(paths), f" ({desc})" if desc else "",
            "\n  ".join(f"{paths[i]}: {why}" for i, why in rows.failed.items()),
        )
    if not rows.kept:
        raise ValueError(f"none of the {len(paths)} images could be loaded{f' ({desc})' if desc else ''}")
    if rows.where is not None:
        logger.info("photo cache: %s, %d photos at %d px: %s (%s a photo), %d read from the cache, %d decoded",
                    desc or "photos", len(rows.kept), size, human_bytes(rows.data.nbytes),
                    human_bytes(rows.data.nbytes / len(rows.kept)), rows.reused, len(paths) - rows.reused)
    return TensorImageDataset(
        images=rows.data,
        labels=torch.tensor(labels, dtype=torch.int64)[rows.kept],
        classes=list(classes),
        paths=[str(paths[i]) for i in rows.kept],
        keys=[keys[i] for i in rows.kept],
    )


def cached_set(paths: list[Path], labels: list[int], classes: list[str], size: int, desc: str,
               cache: PhotoCache) -> TensorImageDataset | None:
    """What :func:`cache_images` gives for these arguments when ``cache`` holds the set whole, every photo of it
    readable (a run's validation photos, decoded by its training); None otherwise. Decodes and writes nothing."""
    if not paths:
        return None
    keys, group, _ = _set_keys(paths, size, desc)
    rows = cache.lookup(group, keys, (3, size, size), torch.uint8)
    if rows is None or rows.failed:
        return None
    return TensorImageDataset(rows.data, torch.tensor(labels, dtype=torch.int64), list(classes),
                              [str(p) for p in paths], keys)


def _set_keys(paths: list[Path], size: int, desc: str) -> tuple[list[str], str, str]:
    """(each photo's key, the set's name, the folder that holds them all) of photos decoded at ``size`` as
    ``desc``."""
    spec = photo_spec(size)
    folder = os.path.commonpath([os.path.abspath(p) for p in paths])
    # the set's pack is replaced when its photos change
    return [file_key(p, spec) for p in paths], set_name("photos", os.path.realpath(folder), desc, spec), folder


def photo_spec(size: int) -> str:
    """How a photo is decoded, part of its key in the photo cache: the size, and Pillow's version (its resizing
    may change with it)."""
    import PIL

    return f"photo {size} px, Pillow {PIL.__version__}"


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
    cache: PhotoCache | None = None,
) -> Datasets:
    """Load an ImageFolder-style folder (decoded into ``cache``, :func:`cache_images`).

    With train/ and val/ sub-folders (synonyms: see `find_split_dirs`, optional test/) those are used as
    given. Otherwise the class folders (of `root`, or of its train/ folder when there is no val/) are split
    stratified with `split_seed`, or exactly as recorded in `split_file` when that file exists (paths
    relative to `root`). Train images are cached at `cache_size` (default `image_size`), val/test at
    `image_size`. ``train_on_val``: the val photos join the training set too (a final model on every labelled
    photo); val is still returned, and is then no longer held out.
    """
    found = folder_samples(root, val_fraction, split_seed, split_file)
    classes = found.classes
    if not found.val and not train_on_val:
        dups = (found.split or {}).get("duplicates") or {}
        why = (f" (its {dups['groups']} group(s) of duplicate photos, {dups['photos']} photos, each stay on one side "
               f"of the split)" if dups.get("groups") else "")
        raise ValueError(f"no photo of {root} is left for validation{why}: add photos to each class (other shots, "
                         f"not copies of each other), or give a val/ folder of your own")

    def decoded(samples: list[tuple[Path, int]], size: int, name: str) -> TensorImageDataset:
        paths, labels = [p for p, _ in samples], [y for _, y in samples]
        return cache_images(paths, labels, classes, size, desc=name, progress=progress, cache=cache)

    try:
        train = decoded(found.train + found.val if train_on_val else found.train, cache_size or image_size, "train")
        check_trainable(train, classes, root)
        val = decoded(found.val, image_size, "val")
        test = decoded(found.test, image_size, "test") if found.test else None
    finally:
        if cache is not None:
            cache.tidy()  # the sets these replaced: read from until all were built
    return Datasets(train=train, val=val, test=test, classes=classes, split=found.split, source=found.source,
                    cache=cache)


def check_trainable(train: TensorImageDataset, classes: list[str], root: str | os.PathLike) -> None:
    """Raise ValueError naming every class left with no training photo once unreadable photos were skipped (a model
    would be trained on a class it never saw, and never predict it)."""
    counts = torch.bincount(train.labels, minlength=len(classes)).tolist()
    empty = [c for c, n in zip(classes, counts) if n == 0]
    if empty:
        raise ValueError(f"{len(empty)} class(es) of {root} have no readable training photo once the unreadable ones "
                         f"were skipped: {', '.join(empty[:12])}{', ...' if len(empty) > 12 else ''}; add photos "
                         f"that open (JPEG, PNG, ...) to those folders, or remove them")


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


def _flowers102_ready(root: Path, download: bool) -> Path:
    """The Flowers-102 folder under ``root`` (root/flowers-102), downloaded there when absent and ``download``;
    FileNotFoundError / RuntimeError saying how to get the files otherwise."""
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
    return base


def _flowers102_split(base: Path, key: str) -> Samples:
    """The labelled files of one official split of Flowers-102 in ``base``: ``key`` trnid, valid or tstid."""
    from scipy.io import loadmat

    try:
        set_ids = loadmat(base / "setid.mat", squeeze_me=True)
        image_labels = np.atleast_1d(loadmat(base / "imagelabels.mat", squeeze_me=True)["labels"]).astype(int) - 1
    except Exception as e:
        raise ValueError(f"cannot read Flowers-102 label files in {base} ({type(e).__name__}: {e})") from e
    if key not in set_ids:
        raise ValueError(f"{base / 'setid.mat'} has no {key!r} entry")
    ids = np.atleast_1d(set_ids[key]).astype(int).tolist()  # 1-based image ids
    return [(base / "jpg" / f"image_{i:05d}.jpg", int(image_labels[i - 1])) for i in ids]


def load_flowers102(
    root: str | os.PathLike,
    *,
    image_size: int,
    download: bool = True,
    progress: bool = True,
    cache_size: int | None = None,
    cache: PhotoCache | None = None,
) -> Datasets:
    """Oxford Flowers-102 with its official train / val / test split (1,020 / 1,020 / 6,149 images).

    Files are expected in torchvision's layout, root/flowers-102/{jpg/image_XXXXX.jpg, imagelabels.mat,
    setid.mat}, and downloaded there (via torchvision) when absent and `download` is true.
    """
    base = _flowers102_ready(Path(root), download)
    classes = _flowers102_classes()

    def split(key: str, size: int, name: str) -> TensorImageDataset:
        samples = _flowers102_split(base, key)
        return cache_images([p for p, _ in samples], [y for _, y in samples], classes, size, desc=name,
                            progress=progress, cache=cache)

    try:
        train = split("trnid", cache_size or image_size, "flowers102 train")
        val, test = split("valid", image_size, "flowers102 val"), split("tstid", image_size, "flowers102 test")
    finally:
        if cache is not None:
            cache.tidy()
    return Datasets(train=train, val=val, test=test, classes=classes, split=None,
                    source=f"flowers102 {base} (official train/val/test split)", cache=cache)


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
    cache: PhotoCache | None = None,
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
        split_file=split_file, progress=progress, cache_size=cache_size, train_on_val=train_on_val, cache=cache,
    )
    data.source = data.source.replace("folder ", "flower_photos ", 1)
    return data


# ----------------------------------------------------------------------------------------------------------
# Synthetic flowers


def synthetic_seed(seed: int, which: Which) -> int:
    """The seed a run's synthetic ``which`` set is drawn with: the run's ``seed`` for train, another for val."""
    return seed if which == "train" else seed + SEED_STRIDE


def draw_synthetic(per_class: int, size: int, seed: int, *, indices: Sequence[int] | None = None,
                   progress: bool = False) -> TensorImageDataset:
    """The built-in synthetic flowers drawn with ``seed`` at ``size`` px, ``per_class`` a class (classes
    interleaved), or only the images ``indices`` of that set: the one function that draws them for training,
    evaluation, export and teach. Image i depends on (seed, i) alone, so a set is drawn again identically."""
    from .synthetic import CLASSES, make_synthetic_flowers

    images, labels = make_synthetic_flowers(per_class, size, seed=seed, progress=progress, indices=indices)
    return TensorImageDataset(images=images, labels=labels.to(torch.int64), classes=list(CLASSES))


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
    `seed`, val at `image_size` with another (:func:`synthetic_seed`)."""
    train = draw_synthetic(train_per_class, cache_size or image_size, synthetic_seed(seed, "train"), progress=progress)
    val = draw_synthetic(val_per_class, image_size, synthetic_seed(seed, "val"), progress=progress)
    return Datasets(
        train=train,
        val=val,
        test=None,
        classes=train.classes,
        split=None,
        source=f"synthetic flowers ({train_per_class}/{val_per_class} per class train/val, seed {seed})",
    )


# ----------------------------------------------------------------------------------------------------------
# A run's photos found again: each registered dataset says how (its ``rebuild``), from what the run folder records


@dataclass(frozen=True)
class TrainedOn:
    """What a run folder records of the photos it trained on: its config's data section and seed, the folder, and
    the split file training wrote there (a folder's train/val assignment; absent for the other sources)."""

    data: DataConfig
    seed: int
    run_dir: Path
    split_file: Path


@dataclass
class RunPhotos:
    """A run's train or val photos, found again (:func:`rebuild_photos`): their classes, each photo's label and
    where they came from. On disk they are ``files`` (read by whoever uses them); otherwise ``draw`` makes the
    images (uint8 (n, 3, S, S)) of the indices asked for, and only those: a drawn set costs time."""

    classes: list[str]
    labels: list[int]
    source: str
    files: list[Path] | None = None
    draw: Callable[[Sequence[int]], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if (self.files is None) == (self.draw is None):
            raise ValueError("RunPhotos needs files or draw, not both")
        if self.files is not None and len(self.files) != len(self.labels):
            raise ValueError(f"{len(self.files)} files for {len(self.labels)} labels")

    def everything(self) -> TensorImageDataset | tuple[list[str], Samples]:
        """All of them: (classes, labelled files) when on disk, else the images drawn, in memory."""
        if self.files is not None:
            return self.classes, list(zip(self.files, self.labels))
        assert self.draw is not None  # __post_init__
        images = self.draw(range(len(self.labels)))
        return TensorImageDataset(images, torch.tensor(self.labels, dtype=torch.int64), list(self.classes))


class PhotoRebuilder(Protocol):
    def __call__(self, run: TrainedOn, which: Which, size: int) -> RunPhotos: ...


def _synthetic_photos(run: TrainedOn, which: Which, size: int) -> RunPhotos:
    """A synthetic run's flowers, drawn at ``size`` px exactly as training drew them (same seed, same count)."""
    from .synthetic import CLASSES, synthetic_label

    per_class = run.data.synthetic_train_per_class if which == "train" else run.data.synthetic_val_per_class
    seed = synthetic_seed(run.seed, which)

    def draw(indices: Sequence[int]) -> torch.Tensor:
        return draw_synthetic(per_class, size, seed, indices=indices).images

    what = "training" if which == "train" else "validation"
    return RunPhotos(list(CLASSES), [synthetic_label(i) for i in range(len(CLASSES) * per_class)],
                     f"synthetic flowers, {what} set of run {run.run_dir.name} (seed {run.seed})", draw=draw)


def _folder_photos(run: TrainedOn, which: Which, configured: Path | None) -> RunPhotos:
    """A folder run's photos, found and split as :func:`~vit_flowers.data.splits.run_split` says (``configured``:
    where the config says the folder is); a ``train_on_val`` run trained on its val photos too."""
    found = run_split(run.split_file, configured, run.data.val_fraction, run.data.split_seed)
    if which == "val":
        samples, source = found.files.val, f"held-out split of run {run.run_dir.name} ({found.held_out})"
    else:
        samples = found.files.train + (found.files.val if run.data.train_on_val else [])
        source = f"training photos of {found.root}"
    return RunPhotos(found.files.classes, [y for _, y in samples], source, files=[p for p, _ in samples])


def _own_folder_photos(run: TrainedOn, which: Which, size: int) -> RunPhotos:
    return _folder_photos(run, which, Path(run.data.path) if run.data.path else None)


def _flower_photos_photos(run: TrainedOn, which: Which, size: int) -> RunPhotos:
    return _folder_photos(run, which, Path(run.data.data_root) / "flower_photos")


def _flowers102_photos(run: TrainedOn, which: Which, size: int) -> RunPhotos:
    """A Flowers-102 run's photos: the official split's files (never downloaded here)."""
    base = _flowers102_ready(Path(run.data.data_root) / "flowers102", download=False)
    samples = _flowers102_split(base, "trnid" if which == "train" else "valid")
    what = "training" if which == "train" else "validation"
    return RunPhotos(_flowers102_classes(), [y for _, y in samples], f"flowers102 {what} split ({run.data.data_root})",
                     files=[p for p, _ in samples])


# ----------------------------------------------------------------------------------------------------------
# The registry: a builder per dataset name, as timm's create_dataset, and how it finds a run's photos again. A new
# source is one registered function; the config key 'dataset' takes the registry's names.


class DatasetBuilder(Protocol):
    def __call__(self, cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets: ...


@dataclass(frozen=True)
class _Registered:
    build: DatasetBuilder
    rebuild: PhotoRebuilder | None  # None: a run's photos cannot be found again


_DATASETS: dict[str, _Registered] = {}


def register_dataset(name: str, rebuild: PhotoRebuilder | None = None) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Register the decorated function as the builder of the dataset ``name``; ``rebuild`` finds a run's train / val
    photos again (:func:`rebuild_photos`), for evaluate, export and teach: without it they cannot."""
    def add(builder: DatasetBuilder) -> DatasetBuilder:
        _DATASETS[name] = _Registered(builder, rebuild)
        return builder

    return add


def dataset_names() -> tuple[str, ...]:
    """The registered dataset names, the choices of the config key 'dataset'."""
    return tuple(_DATASETS)


def create_dataset(cfg: DataConfig, *, seed: int = 0, split_file: Path | None = None,
                   progress: bool = False) -> Datasets:
    """The datasets that the data section ``cfg`` describes, in memory.

    "folder" reads ``cfg.path``; the public datasets live in ``data_root``/flowers102/ and ``data_root``/flower_photos/
    (downloaded there when absent and ``download`` is true). Train images are cached at ``cache_size`` (room for
    random crops), val/test at ``image_size``. ``seed`` draws the synthetic flowers; ``split_file`` (a run's
    split.json) splits a folder as recorded there.
    """
    entry = _DATASETS.get(cfg.dataset)
    if entry is None:
        raise ValueError(f"unknown dataset {cfg.dataset!r}: choose one of {', '.join(_DATASETS)}")
    cfg.validate()
    return entry.build(cfg, seed=seed, split_file=split_file, progress=progress)


def rebuild_photos(run: TrainedOn, which: Which, size: int) -> RunPhotos:
    """The ``which`` photos (train or val) of the run that ``run`` describes, as training had them, through its
    dataset's registered ``rebuild``; drawn ones at ``size`` px. The one way evaluate, export and teach find a run's
    photos. ValueError naming the run folder when its dataset cannot say; FileNotFoundError when the photos are
    gone."""
    entry = _DATASETS.get(run.data.dataset)
    if entry is None or entry.rebuild is None:
        why = "is not registered" if entry is None else "was registered without a way to find a run's photos again"
        raise ValueError(f"{run.run_dir}: cannot find the photos this run was trained on: its dataset "
                         f"{run.data.dataset!r} {why}; pass --data FOLDER")
    return entry.rebuild(run, which, size)


@register_dataset("synthetic", rebuild=_synthetic_photos)
def _synthetic(cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets:
    return load_synthetic(image_size=cfg.image_size, cache_size=cfg.cache_size,
                          train_per_class=cfg.synthetic_train_per_class, val_per_class=cfg.synthetic_val_per_class,
                          seed=seed, progress=progress)


@register_dataset("folder", rebuild=_own_folder_photos)
def _folder(cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets:
    assert cfg.path is not None  # DataConfig.validate
    return load_folder(cfg.path, image_size=cfg.image_size, cache_size=cfg.cache_size, val_fraction=cfg.val_fraction,
                       split_seed=cfg.split_seed, split_file=split_file, progress=progress,
                       train_on_val=cfg.train_on_val, cache=photo_cache(cfg))


def photo_cache(cfg: DataConfig) -> PhotoCache:
    """Where the data section ``cfg`` keeps decoded photos: ``cache_dir`` (the user's cache folder by default), or
    nowhere (memory) with ``photo_cache`` false. The folder and its size are logged."""
    if not cfg.photo_cache:
        return PhotoCache(None)
    root = Path(cfg.cache_dir) if cfg.cache_dir else user_cache_dir()
    cache = PhotoCache(root)
    logger.info("photo cache: %s holds %s (list or clear it: vit-flowers cache)", cache.folder,
                human_bytes(cache_size(root)))
    return cache


def _warn_unused_path(cfg: DataConfig) -> None:
    if cfg.path:
        logger.warning("dataset %r lives in %s: --data %s is not used (use dataset 'folder' for your own folder)",
                       cfg.dataset, cfg.data_root, cfg.path)


@register_dataset("flowers102", rebuild=_flowers102_photos)
def _flowers102(cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets:
    _warn_unused_path(cfg)
    return load_flowers102(Path(cfg.data_root) / "flowers102", image_size=cfg.image_size, cache_size=cfg.cache_size,
                           download=cfg.download, progress=progress, cache=photo_cache(cfg))


@register_dataset("flower_photos", rebuild=_flower_photos_photos)
def _flower_photos(cfg: DataConfig, *, seed: int, split_file: Path | None, progress: bool) -> Datasets:
    _warn_unused_path(cfg)
    return load_flower_photos(cfg.data_root, image_size=cfg.image_size, cache_size=cfg.cache_size,
                              val_fraction=cfg.val_fraction, split_seed=cfg.split_seed, split_file=split_file,
                              download=cfg.download, progress=progress, train_on_val=cfg.train_on_val,
                              cache=photo_cache(cfg))
