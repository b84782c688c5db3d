"""Which photos a training run used, told from its run folder alone: the one rule that ``evaluate`` (the run's
held-out photos) and ``export`` (photos to check the export on, training photos to calibrate int8 on) follow.

- The run's configuration is its ``config.yaml``, else the copy inside the checkpoint (:func:`run_config`).
- Synthetic flowers are drawn again exactly as training drew them; Flowers-102 has its official split.
- A folder of photos (``dataset`` folder or flower_photos) is found where the run's ``split.json`` says it was
  (its ``root``), else where the config says (``data``, or ``<data_root>/flower_photos``): the first of those
  that exists. Its photos are split as training split them: by ``split.json``, or by the folder's own train/ and
  val/ folders; without either nothing tells which photos were held out, and :func:`run_folder` refuses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..data.datasets import TensorImageDataset, create_dataset, load_synthetic
from ..data.splits import FolderSamples, Samples, find_split_dirs, folder_samples, load_split, scan_class_folders
from ..runs import folders as runs
from ..runs.checkpoint import ModelFacts
from .config import ConfigError, TrainConfig, load_config

__all__ = ["RunFolder", "EvaluationSet", "run_config", "run_folder", "evaluation_set"]


@dataclass
class RunFolder:
    """The photos of a run trained on a folder, split as training split them."""

    root: Path  # the folder the photos are in
    held_out: Path  # where its validation photos are: ``root``, or its own val/ folder
    files: FolderSamples  # classes, train and val files


class EvaluationSet(NamedTuple):
    """What to evaluate on: a short name (for a report folder), a description, and the images: in memory, or
    (classes, labelled files) streamed from disk."""

    name: str
    source: str
    data: TensorImageDataset | tuple[list[str], Samples]


def run_config(run_dir: Path, ckpt: ModelFacts) -> TrainConfig:
    """The training config of a run: its config.yaml, else the copy inside the checkpoint."""
    path = run_dir / runs.CONFIG
    if path.is_file():
        return load_config(path)
    if isinstance(ckpt["config"], dict):  # ({} in a checkpoint without one: the defaults)
        return load_config(None, overrides=ckpt["config"])
    raise ConfigError(f"{run_dir} has no {runs.CONFIG} and the checkpoint holds no config: cannot tell which data "
                      f"the run was trained on; pass --data FOLDER")


def run_folder(cfg: TrainConfig, run_dir: Path) -> RunFolder:
    """The photos of a run trained on a folder (``cfg`` its config, see :func:`run_config`), found and split as the
    module docstring says. Raises FileNotFoundError naming the folders looked in, or the missing split.json."""
    split_file = run_dir / runs.SPLIT
    split = load_split(split_file) if split_file.is_file() else None
    candidates = [Path(split["root"])] if split and split.get("root") else []
    if cfg.data.dataset == "flower_photos":
        candidates.append(Path(cfg.data.data_root) / "flower_photos")
    elif cfg.data.path:
        candidates.append(Path(cfg.data.path))
    root = next((c for c in candidates if c.is_dir()), None)
    if root is None:
        raise FileNotFoundError(f"the data this run was trained on is not found (looked in "
                                f"{', '.join(map(str, candidates)) or 'nowhere'}); pass --data FOLDER")
    dirs = find_split_dirs(root)
    own_folders = "train" in dirs and "val" in dirs
    if split is None and not own_folders:
        raise FileNotFoundError(f"{split_file} not found: cannot tell which images of {root} were held out; "
                                f"pass --data FOLDER")
    files = folder_samples(root, cfg.data.val_fraction, cfg.data.split_seed, split_file if split is not None else None)
    return RunFolder(root, dirs["val"] if own_folders else root, files)


def evaluation_set(ckpt: ModelFacts, run_dir: Path, data: str | Path | None = None, size: int | None = None,
                   progress: bool = False) -> EvaluationSet:
    """The images of ``data`` (a class-folder tree) when given, else the validation images of the run in
    ``run_dir`` (whose checkpoint is ``ckpt``); in-memory images at ``size`` pixels (default: the checkpoint's).
    ``progress``: a progress bar while Flowers-102 loads."""
    size = size or ckpt["image_size"]
    if data:
        root = Path(data)
        return EvaluationSet(root.resolve().name, f"folder {root}", scan_class_folders(root))
    cfg = run_config(run_dir, ckpt)
    if cfg.data.dataset == "synthetic":  # regenerated exactly as train drew it
        val = load_synthetic(image_size=size, train_per_class=0, val_per_class=cfg.data.synthetic_val_per_class,
                             seed=cfg.run.seed).val
        return EvaluationSet("val", f"synthetic flowers, validation set of run {run_dir.name} (seed {cfg.run.seed})",
                             val)
    if cfg.data.dataset == "flowers102":
        loaded = create_dataset(dataclasses.replace(cfg.data, image_size=size, cache_size=size, download=False),
                                progress=progress)
        return EvaluationSet("val", f"flowers102 validation split ({cfg.data.data_root})", loaded.val)
    folder = run_folder(cfg, run_dir)
    return EvaluationSet("val", f"held-out split of run {run_dir.name} ({folder.held_out})",
                         (folder.files.classes, folder.files.val))
