"""The Train tab's classes, without Gradio: the classes made in the page (a name and its photos) or a PHOTOS folder,
checked before training (counts, warnings, errors), and the page's photos written as an ImageFolder that
``python -m vit_flowers.train --data`` reads."""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..data.class_names import case_clash, check_class_name
from ..data.duplicates import exact_pairs, file_sha256
from ..data.image_files import IMAGE_EXTENSIONS, ImageLoadError, load_image, printable_name
from ..data.splits import scan_class_folders
from .engine import check_upload

__all__ = ["MIN_PHOTOS", "MAX_PHOTOS_PER_CLASS", "ClassPhotos", "ClassCheck", "check_classes", "check_folder",
           "write_image_folder"]

MIN_PHOTOS = 10  # fewer photos in a class: a warning (the validation split keeps a fifth of them)
MAX_PHOTOS_PER_CLASS = 5000  # more uploads in one class: refused (a PHOTOS folder, read in place, has no such limit)
_CHECK_SIZE = 64  # photos are checked by decoding them this small (a JPEG decodes at 1/8 scale: fast)


@dataclass
class ClassPhotos:
    """One class: its name as typed and its files (uploads, webcam shots or a folder's photos)."""

    name: str
    files: list[Path]


@dataclass
class ClassCheck:
    """What the page says before training: the classes that will train (their photos, the unusable files dropped),
    ``errors`` that stop training, ``warnings`` that do not."""

    classes: list[ClassPhotos] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and len(self.classes) >= 2


def _unusable(path: Path, max_bytes: int) -> str | None:
    """Why ``path`` cannot be a training photo (too big, unreadable, not an image, a decompression bomb), or None."""
    reason = check_upload(path, max_bytes)
    if reason is None:
        try:
            stat = path.stat()
        except OSError as exc:  # gone since check_upload looked
            return f"cannot read the file ({exc.strerror or exc})"
        reason = _undecodable(str(path), stat.st_size, stat.st_mtime_ns)
    return reason


@functools.lru_cache(maxsize=20000)
def _undecodable(path: str, size: int, mtime_ns: int) -> str | None:
    """Why the file cannot be decoded, or None; remembered by (path, size, mtime): the page checks its classes
    again at each change, and only the new photos are decoded."""
    del size, mtime_ns  # (part of the cache key only)
    try:
        load_image(path, min_size=_CHECK_SIZE)
    except ImageLoadError as exc:
        return exc.reason
    return None


def _one_class(index: int, name: str, files: Sequence[Path], max_bytes: int, out: ClassCheck,
               max_files: int | None) -> None:
    """Check the class typed in slot ``index`` (1-based), adding it to ``out.classes`` when it can train."""
    try:
        cleaned = check_class_name(name)
    except ValueError as exc:
        out.errors.append(f"class {index}: {exc}")
        return
    if max_files is not None and len(files) > max_files:  # refused before a file is read
        out.errors.append(f"{cleaned}: {len(files):,} files, over the page's limit of {max_files:,} uploads a class: "
                          f"give their folder as the PHOTOS folder instead (the page reads it in place), or train "
                          f"from the command line")
        return
    good, bad = [], []
    for path in files:
        reason = _unusable(path, max_bytes)
        if reason:
            bad.append(f"{printable_name(path.name)} ({reason})")
        else:
            good.append(path)
    if bad:
        out.warnings.append(f"{cleaned}: {len(bad)} file(s) left out, not usable photos: {'; '.join(bad[:5])}"
                            + ("; ..." if len(bad) > 5 else ""))
    if not good:
        out.errors.append(f"{cleaned}: no photos" + (" that can be read" if bad else ""))
        return
    if len(good) < MIN_PHOTOS:
        out.warnings.append(f"{cleaned}: only {len(good)} photo(s); {MIN_PHOTOS} or more train a better model")
    out.classes.append(ClassPhotos(cleaned, good))


def _duplicates_across(classes: Sequence[ClassPhotos]) -> list[str]:
    """One warning per file whose bytes are also in another class."""
    owners = [(c.name, p) for c in classes for p in c.files]
    digests = [file_sha256(p) for _, p in owners]
    return [f"the same photo in {owners[i][0]} ({printable_name(owners[i][1].name)}) and {owners[j][0]} "
            f"({printable_name(owners[j][1].name)})" for i, j in exact_pairs(digests) if owners[i][0] != owners[j][0]]


def check_classes(slots: Sequence[tuple[str | None, Sequence[str | os.PathLike]]],
                  max_bytes: int, max_files: int | None = MAX_PHOTOS_PER_CLASS) -> ClassCheck:
    """Check the page's classes, (name, files) per slot in page order; a slot with neither a name nor files is
    not a class. Errors: a name that :func:`~vit_flowers.data.class_names.check_class_name` refuses, two classes
    of one name or of names that differ only in case, a class with no usable photo or more than ``max_files`` files
    (None: no limit), fewer than two classes. Warnings: fewer than :data:`MIN_PHOTOS` photos, files left out (not
    photos), the same photo in two classes."""
    out = ClassCheck()
    for index, (name, files) in enumerate(slots, 1):
        if (name or "").strip() or files:
            _one_class(index, name or "", [Path(f) for f in files], max_bytes, out, max_files)
    names = [c.name for c in out.classes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        out.errors.append(f"two classes are named {', '.join(map(repr, twice))}: give each class its own name")
    clash = case_clash(names) if not twice else None
    if clash is not None:
        out.errors.append(f"classes {clash[0]!r} and {clash[1]!r} differ only in case: give each class its own name "
                          f"(a folder of each is one folder on macOS and Windows)")
    if not out.errors and len(out.classes) < 2:
        out.errors.append("a classifier needs at least two classes: add another class and its photos")
    out.warnings += _duplicates_across(out.classes)[:10]
    return out


def check_folder(folder: str, max_bytes: int) -> ClassCheck:
    """Check a PHOTOS folder in the ImageFolder layout (one sub-folder per class) as :func:`check_classes` checks
    the page's classes; a folder that is not one is an error."""
    root = Path(os.path.expanduser(folder.strip()))
    try:
        names, samples = scan_class_folders(root)
    except (OSError, ValueError) as exc:
        return ClassCheck(errors=[f"{printable_name(root)}: {exc}"])
    return check_classes([(name, [p for p, label in samples if label == i]) for i, name in enumerate(names)],
                         max_bytes, max_files=None)


def _target_name(path: Path, folder: Path) -> Path:
    """Where ``path`` is copied in ``folder``: its own name (an extension the trainer reads added where it has
    none), ``-2``, ``-3``, ... before the extension when two uploads share a name."""
    name = path.name if path.suffix.lower() in IMAGE_EXTENSIONS else f"{path.name}.jpg"
    target, n = folder / name, 1
    while target.exists():
        n += 1
        target = folder / f"{Path(name).stem}-{n}{Path(name).suffix}"
    return target


def write_image_folder(classes: Sequence[ClassPhotos], folder: Path) -> None:
    """Copy each class's photos, bytes unchanged, into ``folder/<class>/`` (a new folder: FileExistsError when it
    exists). A copy that fails removes what it wrote and raises OSError."""
    folder.mkdir(parents=True)
    try:
        for cls in classes:
            (folder / cls.name).mkdir()
            for path in cls.files:
                shutil.copyfile(path, _target_name(path, folder / cls.name))
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
