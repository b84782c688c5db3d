"""Class folders and their train / val (/ test) splits.

A folder in the ImageFolder layout either has its own split folders (train/, val/ and optionally test/,
with the usual synonyms) or is split here, class by class, with a fixed seed. The split is saved as the
run's ``split.json`` (paths relative to the folder), so that resuming, ``evaluate`` and any later look at
the run see exactly the photos that were held out; :func:`run_split` finds a finished run's folder and split again.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .class_names import case_clash
from .duplicates import duplicate_groups, hash_files
from .image_files import inside_folder
from .images import list_images, printable_name

__all__ = ["SPLIT_SYNONYMS", "scan_class_folders", "find_split_dirs", "stratified_split", "save_split",
           "load_split", "samples_in_split", "keep_groups_together", "split_folder", "check_same_classes",
           "FolderSamples", "folder_samples", "RunFolder", "run_split"]

logger = logging.getLogger(__name__)

# Folder names recognised as splits (compared lower-case).
SPLIT_SYNONYMS: dict[str, tuple[str, ...]] = {
    "train": ("train", "training"),
    "val": ("val", "valid", "validation", "dev"),
    "test": ("test", "testing"),
}

def _folders_in(root: Path, report: bool = False) -> list[str]:
    """The names of the (not hidden) sub-folders of ``root``, sorted. An entry that cannot be followed (a symbolic
    link loop: ELOOP) is no folder; with ``report`` such entries are named in one warning."""
    folders, broken = [], []
    with os.scandir(root) as entries:
        for entry in entries:
            try:
                if entry.is_dir() and not entry.name.startswith("."):
                    folders.append(entry.name)
            except OSError as exc:
                broken.append(f"{printable_name(entry.path)} ({exc.strerror or exc})")
    if broken and report:
        logger.warning("skipped %d entr%s of %s that cannot be followed: %s", len(broken),
                       "y" if len(broken) == 1 else "ies", printable_name(root), ", ".join(sorted(broken)))
    return sorted(folders)


def _check_is_folder(root: Path) -> None:
    """Raise FileNotFoundError / NotADirectoryError naming ``root`` when it is no folder (what it is instead)."""
    if root.is_dir():
        return
    if root.is_file():
        raise NotADirectoryError(f"data path {root} is a file, not a folder: give the folder that holds one "
                                 f"sub-folder of photos per class")
    if root.is_symlink():
        raise NotADirectoryError(f"data path {root} is a symbolic link that leads nowhere (dangling, or a loop)")
    if root.exists():
        raise NotADirectoryError(f"data path is not a folder: {root}")
    raise FileNotFoundError(f"data folder not found: {root}")


def _where_link_leads(link: Path, root: Path, class_dirs: dict[str, str]) -> str:
    """``link -> target (what that is)``, for the warning that names links not followed: another class's folder,
    a folder of ``root`` outside every class, or outside ``root``."""
    real, top = os.path.realpath(link), os.path.realpath(root)
    into = [name for name, folder in class_dirs.items() if inside_folder(real, folder)]
    if into:
        what = f"the class {into[0]}"
    elif not inside_folder(real, top):
        return f"{printable_name(link.relative_to(root))} -> {printable_name(real)} (outside {printable_name(root)})"
    else:
        what = "outside every class folder"
    shown = os.path.relpath(real, top) if inside_folder(real, top) else real
    return f"{printable_name(link.relative_to(root))} -> {printable_name(shown)} ({what})"


def _class_folder_links_out(root: Path, classes: list[str]) -> list[str]:
    """The class folders of ``root`` that are links into (or around) another class's folder, or around ``root``
    itself: not classes of their own, since their photos would count twice. (A class folder that is a link to a
    folder elsewhere, e.g. a subset of another data set's classes, is that class's folder.)"""
    top = os.path.realpath(root)
    real = {name: os.path.realpath(root / name) for name in classes}
    out = []
    for name in classes:
        if (root / name).is_symlink() and (inside_folder(top, real[name]) or any(
                inside_folder(real[name], real[other]) or inside_folder(real[other], real[name])
                for other in classes if other != name)):
            out.append(name)
    return out


def _warn_links_not_followed(root: Path, links: list[Path], class_dirs: dict[str, str]) -> None:
    """One warning naming every link of ``root`` that leads out of its class folder (not followed)."""
    if links:
        logger.warning("not followed: %d link(s) leading out of their class folder (their photos would count under "
                       "two classes, or be read and moved outside %s): %s", len(links), printable_name(root),
                       ", ".join(_where_link_leads(link, root, class_dirs) for link in links))


def scan_class_folders(root: str | os.PathLike) -> tuple[list[str], list[tuple[Path, int]]]:
    """Scan an ImageFolder layout: one folder per class, images possibly nested below.

    Returns (sorted class names, [(image path, class index)]). Files next to the class folders (e.g. a
    LICENSE.txt) and non-image files inside them are ignored (the latter listed in a debug log). A symbolic link
    inside a class folder that leads out of that folder's real path (into another class, or outside ``root``), and
    a class folder that is a link into another class's folder, are not followed, and named in one warning; a class
    folder that is a link to a folder elsewhere is that class's folder. This is the one place that says which files
    are a folder's photos (training, evaluate, check and its moves all list them here). Raises
    `FileNotFoundError` / `NotADirectoryError` / `ValueError` with the folder or class at fault.
    """
    root = Path(root)
    _check_is_folder(root)
    found = _folders_in(root, report=True)
    linked = _class_folder_links_out(root, found)
    classes = [name for name in found if name not in linked]
    class_dirs = {name: os.path.realpath(root / name) for name in classes}
    links_out = [root / name for name in linked]
    if not classes:
        _warn_links_not_followed(root, links_out, class_dirs)
        loose, _ = list_images(root, recursive=False)
        hint = f" (it holds {len(loose)} loose images: put them in one folder per class)" if loose else ""
        raise ValueError(f"no class folders in {root}: expected one sub-folder per class{hint}")
    if len(classes) == 1:
        _warn_links_not_followed(root, links_out, class_dirs)
        raise ValueError(f"only one class folder ({classes[0]!r}) in {root}: need at least two classes")
    clash = case_clash(classes)
    if clash is not None:
        raise ValueError(f"class folders {clash[0]!r} and {clash[1]!r} in {root} differ only in case (one folder on "
                         f"macOS and Windows): rename one of them, or merge them if they are one class")
    samples: list[tuple[Path, int]] = []
    empty: list[str] = []
    for idx, name in enumerate(classes):
        files, skipped = list_images(root / name, links_out=links_out)
        if skipped:  # (named, so that a photo in a format not listed in IMAGE_EXTENSIONS is never lost unseen)
            logger.info("%s: skipped %d file(s) that are not images by their extension: %s", root / name, len(skipped),
                        ", ".join(printable_name(p.name) for p in skipped[:5]) + ", ..." * (len(skipped) > 5))
        if not files:
            empty.append(name)
        samples.extend((f, idx) for f in files)
    _warn_links_not_followed(root, links_out, class_dirs)
    if not samples:
        raise ValueError(f"no images found in {root} (class folders: {', '.join(classes)})")
    if empty:
        raise ValueError(f"class folder(s) with no images in {root}: {', '.join(empty)}")
    return classes, samples


def find_split_dirs(root: str | os.PathLike) -> dict[str, Path]:
    """Find 'train', 'val' and 'test' sub-folders (case-insensitive, with synonyms: val = valid / validation /
    dev, test = testing, train = training). Returns {} when there is no train folder."""
    root = Path(root)
    found: dict[str, Path] = {}
    for name in _folders_in(root):  # (scan_class_folders names the entries that cannot be followed)
        for role, names in SPLIT_SYNONYMS.items():
            if name.lower() in names:
                if role in found:
                    raise ValueError(f"ambiguous {role} folders in {root}: {found[role].name!r} and {name!r}")
                found[role] = root / name
    return found if "train" in found else {}


def stratified_split(labels: list[int], val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Split indices into (train, val), class by class, shuffled with `seed`.

    Each class sends n * val_fraction images (rounded half up) to val, but at least one when it has >= 2 images and
    never all of them (a class with a single image stays in train). sklearn's `train_test_split(stratify=)`
    cannot give that guarantee, hence this small function. Both lists are sorted.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    labels_arr = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train: list[int] = []
    val: list[int] = []
    for c in np.unique(labels_arr):
        idx = rng.permutation(np.flatnonzero(labels_arr == c))
        n_val = min(max(1, int(len(idx) * val_fraction + 0.5)), len(idx) - 1) if len(idx) >= 2 else 0
        val.extend(idx[:n_val].tolist())
        train.extend(idx[n_val:].tolist())
    return sorted(train), sorted(val)


def keep_groups_together(train: list[int], val: list[int], groups: list[list[int]]) -> tuple[list[int], list[int],
                                                                                         list[list[int]]]:
    """(train, val, the groups moved): every group of indices (duplicates of one photo) on one side, the side that
    holds most of it (train on a tie: a class of two copies keeps one to learn from). Photos outside the groups
    stay where they are, so a folder without duplicates splits exactly as before; both lists stay sorted."""
    in_val = set(val)
    moved = []
    for group in groups:
        n_val = sum(i in in_val for i in group)
        if 0 < n_val < len(group):
            to_val = 2 * n_val > len(group)
            in_val.update(group) if to_val else in_val.difference_update(group)
            moved.append(group)
    everyone = sorted(set(train) | set(val))
    return [i for i in everyone if i not in in_val], [i for i in everyone if i in in_val], moved


def save_split(path: str | os.PathLike, split: dict) -> None:
    """Write a split dict (as in `Datasets.split`) to JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(split, indent=1) + "\n")


def load_split(path: str | os.PathLike) -> dict:
    """Read a split JSON written by `save_split`; raises `ValueError` naming the file and key at fault."""
    path = Path(path)
    try:
        split = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"split file {path} is not valid JSON: {e}") from None
    if not isinstance(split, dict):
        raise ValueError(f"split file {path}: expected a JSON object, got {type(split).__name__}")
    for key in ("train", "val"):
        if not isinstance(split.get(key), list) or not all(isinstance(p, str) for p in split[key]):
            raise ValueError(f"split file {path}: key {key!r} must be a list of relative file paths")
    return split


def check_same_classes(expected: list[str], got: list[str], where: str, reference: str) -> None:
    if got != expected:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        raise ValueError(
            f"classes in {where} differ from {reference}: "
            f"missing {missing or 'none'}, extra {extra or 'none'}"
        )




def samples_in_split(root: Path, samples: list[tuple[Path, int]], relative_paths: list[str],
                     where: str) -> list[tuple[Path, int]]:
    """The ``samples`` (path, label) of ``root`` named by ``relative_paths`` (a part of a split file), in that
    order; files that have gone missing are skipped with one warning naming ``where`` (the split file)."""
    by_rel = {p.relative_to(root).as_posix(): (p, label) for p, label in samples}
    missing = [r for r in relative_paths if r not in by_rel]
    if missing:
        logger.warning("split file %s lists %d files not found in %s (skipped): %s", where, len(missing), root,
                       missing[:10] + (["..."] if len(missing) > 10 else []))
    return [by_rel[r] for r in relative_paths if r in by_rel]


def _check_held_out(root: Path, classes: list[str], labels: list[int], val_idx: list[int],
                    val_fraction: float) -> None:
    """Raise ValueError when the split of ``root`` holds no photo out (every class has a single photo, which
    stays in training), naming the photos per class, what ``val_fraction`` leaves and the way out; warn about
    the classes left without a validation photo when others have one."""
    counts = np.bincount(labels, minlength=len(classes))
    single = [c for c, n in zip(classes, counts) if n == 1]
    if not single:
        return
    rule = (f"val_fraction {val_fraction} holds out {val_fraction:.0%} of each class, at least one photo of a "
            f"class of 2 or more, none of a class of 1")
    fix = f"add photos (2 or more per class), or give {root} train/ and val/ sub-folders of class folders"
    if not val_idx:
        per_class = ", ".join(f"{c} {n}" for c, n in zip(classes[:12], counts)) + ", ..." * (len(classes) > 12)
        raise ValueError(f"no photo of {root} is left for validation: photos per class: {per_class}; {rule}. "
                         f"To train, {fix}")
    logger.warning("%d class(es) of %s have a single photo, kept for training and never validated: %s (%s); to "
                   "validate them, %s", len(single), root, ", ".join(single[:12]) + ", ..." * (len(single) > 12),
                   rule, fix)


MAX_GROUP = 20  # photos: a larger group of "duplicates" is a crowd of alike shots (bursts, made-up photos)


def _group_duplicates(root: Path, samples: list[tuple[Path, int]], train: list[int],
                      val: list[int]) -> tuple[list[int], list[int], dict[str, int]]:
    """(train, val, counts) with every group of duplicate photos (byte-identical, or the same pixels re-encoded or
    resized: :mod:`.duplicates`' cheap hashes, a few seconds for a few thousand photos) on one side, so that no
    photo is validated on a copy of itself it trained on. Crops are left to `vit-flowers check`, whose network
    would cost training a minute."""
    started = time.perf_counter()
    groups = duplicate_groups(hash_files([path for path, _ in samples]))
    crowds = [g for g in groups if len(g) > MAX_GROUP]
    if crowds:  # a chain of alike photos, not copies of one: moving it whole could empty a side of the split
        groups = [g for g in groups if len(g) <= MAX_GROUP]
        logger.warning("%s: %d groups of more than %d alike photos (%d photos) left where the split put them; "
                       "`vit-flowers check %s` lists them", root, len(crowds), MAX_GROUP, sum(map(len, crowds)), root)
    new_train, new_val, moved = keep_groups_together(train, val, groups)
    counts = {"groups": len(groups), "photos": sum(map(len, groups)), "moved_groups": len(moved),
              "moved_photos": len(set(val) ^ set(new_val))}
    if groups:
        logger.info("%s: %d groups of duplicate photos (%d photos) kept on one side of the train/val split (%d groups, "
                    "%d photos moved) [hashed in %.1f s]; `vit-flowers check %s` lists them", root, counts["groups"],
                    counts["photos"], counts["moved_groups"], counts["moved_photos"], time.perf_counter() - started,
                    root)
    return new_train, new_val, counts


def split_folder(
    root: Path,
    samples: list[tuple[Path, int]],
    classes: list[str],
    val_fraction: float,
    split_seed: int,
    split_file: Path | None,
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]], dict]:
    """(train samples, val samples, split dict) of one folder of class folders: as recorded in ``split_file``
    when it exists, else stratified with ``split_seed``."""
    if split_file is not None and Path(split_file).exists():
        split = load_split(split_file)
        if "classes" in split:
            check_same_classes(split["classes"], classes, str(root), f"split file {split_file}")
        train = samples_in_split(root, samples, split["train"], str(split_file))
        val = samples_in_split(root, samples, split["val"], str(split_file))
        unused = len(samples) - len(set(split["train"]) | set(split["val"]))
        if unused > 0:
            logger.warning("%d images in %s are not in split file %s and are not used", unused, root, split_file)
        logger.info("reusing the train/val split of %s (%d train, %d val)", split_file, len(train), len(val))
        return train, val, split
    labels = [label for _, label in samples]
    train_idx, val_idx = stratified_split(labels, val_fraction, split_seed)
    train_idx, val_idx, duplicates = _group_duplicates(root, samples, train_idx, val_idx)
    _check_held_out(root, classes, labels, val_idx, val_fraction)
    train = [samples[i] for i in train_idx]
    val = [samples[i] for i in val_idx]
    split = {
        "root": str(root.resolve()),
        "val_fraction": val_fraction,
        "seed": split_seed,
        "classes": list(classes),
        "train": [p.relative_to(root).as_posix() for p, _ in train],
        "val": [p.relative_to(root).as_posix() for p, _ in val],
        "duplicates": duplicates,
    }
    return train, val, split


Samples = list[tuple[Path, int]]  # (image file, class index)


@dataclass
class FolderSamples:
    """The labelled files of a folder, split into train / val (/ test)."""

    classes: list[str]
    train: Samples
    val: Samples
    test: Samples | None
    split: dict | None  # the train/val assignment of a single folder (saved as split.json), else None
    source: str  # how the files were found and split, for the log


def folder_samples(root: str | os.PathLike, val_fraction: float = 0.2, split_seed: int = 0,
                   split_file: Path | None = None) -> FolderSamples:
    """The files of an ImageFolder-style folder, split.

    With train/ and val/ sub-folders (synonyms: see `find_split_dirs`, optional test/) those are used as
    given. Otherwise the class folders (of `root`, or of its train/ folder when there is no val/) are split
    stratified with `split_seed`, or exactly as recorded in `split_file` when that file exists (paths
    relative to `root`).
    """
    root = Path(root)
    _check_is_folder(root)
    dirs = find_split_dirs(root)
    split: dict | None = None
    if "train" in dirs and "val" in dirs:
        classes, train = scan_class_folders(dirs["train"])
        val_classes, val = scan_class_folders(dirs["val"])
        check_same_classes(classes, val_classes, str(dirs["val"]), f"train folder {dirs['train']}")
        if split_file is not None:
            logger.info("%s has its own train/val folders: split file %s not used", root, split_file)
        source = f"folder {root} ({dirs['train'].name}/, {dirs['val'].name}/ sub-folders"
    else:
        scan_root = dirs.get("train", root)
        classes, samples = scan_class_folders(scan_root)
        train, val, split = split_folder(root, samples, classes, val_fraction, split_seed, split_file)
        how = (f"split from {split_file}" if split_file is not None and Path(split_file).exists()
               else f"auto split {round(100 * (1 - val_fraction))}/{round(100 * val_fraction)}, seed {split_seed}")
        source = f"folder {root} ({f'{scan_root.name}/ sub-folder, ' if scan_root != root else ''}{how}"
    test = None
    if "test" in dirs:
        test_classes, test = scan_class_folders(dirs["test"])
        check_same_classes(classes, test_classes, str(dirs["test"]), "train classes")
        source += f", {dirs['test'].name}/ as test"
    return FolderSamples(classes, train, val, test, split, source + ")")


@dataclass
class RunFolder:
    """The photos of a run trained on a folder, split as training split them."""

    root: Path  # the folder the photos are in
    held_out: Path  # where its validation photos are: ``root``, or its own val/ folder
    files: FolderSamples  # classes, train and val files


def run_split(split_file: Path, configured: Path | None, val_fraction: float, split_seed: int) -> RunFolder:
    """The photos of a run trained on a folder: found where the run's ``split_file`` (its split.json) says they were
    (its ``root``), else where its config says (``configured``): the first of those that exists; split as training
    split them, by ``split_file`` or by the folder's own train/ and val/ folders. Without either nothing tells which
    photos were held out: FileNotFoundError, as when the folder is not found (naming where it looked)."""
    split = load_split(split_file) if split_file.is_file() else None
    candidates = [Path(split["root"])] if split and split.get("root") else []
    candidates += [configured] if configured is not None else []
    root = next((c for c in candidates if c.is_dir()), None)
    if root is None:
        raise FileNotFoundError(f"the data this run was trained on is not found (looked in "
                                f"{', '.join(map(str, candidates)) or 'nowhere'}); pass --data FOLDER")
    dirs = find_split_dirs(root)
    own_folders = "train" in dirs and "val" in dirs
    if split is None and not own_folders:
        raise FileNotFoundError(f"{split_file} not found: cannot tell which images of {root} were held out; "
                                f"pass --data FOLDER")
    files = folder_samples(root, val_fraction, split_seed, split_file if split is not None else None)
    return RunFolder(root, dirs["val"] if own_folders else root, files)
