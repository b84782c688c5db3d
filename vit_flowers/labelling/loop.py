"""One round of labelling, without a page: the user's folder read (never written), the run's suggestions for what is
not labelled yet, suggestions (or the user's own labels) accepted as training photos, copied into the class-folder
tree, and the train command that grows the run on them.

    state = open_state(photos, folder=folder, run=str(run_dir))
    todo = scan_folder(state)                       # unlabelled (sha256, path); duplicates and unreadable files listed
    suggest(state, loaded, todo)                    # state.suggestions: the run's best class for each
    accept(state, {sha: "daisy" for sha in ...})    # copied into photos/daisy/, recorded
    save_state(state)
    train_argv(state, minutes=3)                    # ["--data", photos, "--time-budget", "3"]
"""

from __future__ import annotations

import csv
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data.class_names import check_class_name
from ..data.duplicates import file_sha256
from ..data.image_files import IMAGE_EXTENSIONS, list_images, printable_name
from ..inference.loaded import LoadedModel
from .state import SKIP, Entry, LabelState, StateError, Suggestion

__all__ = ["ORDERS", "Accepted", "check_places", "scan_folder", "suggest", "ordered", "accept", "read_choices",
           "accept_csv", "train_argv", "train_command", "copy_photo", "run_photos", "next_round", "rename_class"]

ORDERS = ("confident", "uncertain")  # most certain first (go fast), least certain first (the most useful labels)


@dataclass
class Accepted:
    """What an accept did: photos newly labelled (``copied`` of them copied into PHOTOS, the rest skipped), those
    labelled already (by content: a duplicate is labelled once), the classes it added, and the choices it could not
    use (path: why)."""

    labelled: int = 0
    copied: int = 0
    already: int = 0
    new_classes: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def check_places(photos: Path, folder: Path) -> None:
    """ValueError when the training photos and the user's folder overlap: copies into PHOTOS would change the
    folder (or PHOTOS's own photos would be offered as unlabelled)."""
    if not folder.is_dir():
        raise ValueError(f"not a folder: {printable_name(folder)}")
    if _inside(photos, folder) or _inside(folder, photos):
        raise ValueError(f"the training photos {printable_name(photos)} and the folder to label "
                         f"{printable_name(folder)} overlap: keep the training photos elsewhere (--photos)")


def scan_folder(state: LabelState, progress: Callable[[int, int], None] | None = None) -> list[tuple[str, Path]]:
    """The photos of ``state.folder`` (sub-folders included) not labelled yet, as (sha256, path), once per content.
    A non-image file or one that cannot be read goes to ``state.unreadable`` (one the model could not decode
    before stays there); a second path of the same content,
    or a copy of a labelled photo, to ``state.duplicates``. Reads only."""
    if state.folder is None:
        raise StateError("the labelling state names no folder to label")
    images, others = list_images(state.folder, recursive=True)
    undecodable = {p: why for p, why in state.unreadable.items()  # (not the listing's own reasons)
                   if Path(p).suffix.lower() in IMAGE_EXTENSIONS and why != "cannot be read" and Path(p).is_file()}
    state.unreadable = {str(p): f"not an image file by its extension ({p.suffix or 'none'}; images are "
                                f"{' '.join(sorted(IMAGE_EXTENSIONS))})" for p in others}
    state.unreadable.update(undecodable)  # a photo the model could not decode stays listed, not offered again
    state.duplicates = {}
    seen: dict[str, Path] = {}
    todo: list[tuple[str, Path]] = []
    for i, path in enumerate(images):
        sha = file_sha256(path)
        if progress is not None:
            progress(i + 1, len(images))
        if sha is None:
            state.unreadable[str(path)] = "cannot be read"
            continue
        if str(path) in undecodable:
            continue
        entry = state.entries.get(sha)
        if entry is not None:
            if entry.path != str(path):
                state.duplicates[str(path)] = sha
            continue
        if sha in seen:
            state.duplicates[str(path)] = sha
            continue
        seen[sha] = path
        todo.append((sha, path))
    known = set(seen)
    for sha in [s for s in state.suggestions if s not in known]:  # gone from the folder, or labelled since
        del state.suggestions[sha]
    return todo


def suggest(state: LabelState, loaded: LoadedModel, todo: Iterable[tuple[str, Path]], *, batch_size: int = 64,
            amp_dtype: Any = None, progress: Callable[[int, int], None] | None = None, bar: bool = False) -> int:
    """The run's best class (and runner-up) for each photo of ``todo`` into ``state.suggestions`` (replacing the
    last round's); a photo that cannot be decoded goes to ``state.unreadable``. The run's classes join the
    state's. ``progress(done, total)`` after each batch; ``bar``: a progress bar in the terminal. Returns the number
    suggested."""
    from ..inference.predictions import predict_images

    todo = list(todo)
    model, ckpt, _, device = loaded
    classes = [state.renamed.get(c, c) for c in ckpt["classes"]]  # (a class renamed mid-way: its new name)
    for cls in classes:
        if cls not in state.classes:
            state.classes.append(cls)
    by_path = {str(path): sha for sha, path in todo}
    done = 0
    for rows in predict_images(model, [p for _, p in todo], classes, image_size=model.image_size, mean=ckpt["mean"],
                               std=ckpt["std"], device=device, top_k=2, batch_size=batch_size, amp_dtype=amp_dtype,
                               progress=bar):
        for row in rows:
            sha = by_path[row.path]
            if row.error:
                state.unreadable[row.path] = row.error
                state.suggestions.pop(sha, None)
                continue
            second = row.top_k[1] if len(row.top_k) > 1 else ("", 0.0)
            state.suggestions[sha] = Suggestion(row.path, row.top_k[0][0], round(row.top_k[0][1], 6), second[0],
                                                round(second[1], 6))
            done += 1
        if progress is not None:
            progress(done, len(todo))
    return done


def ordered(state: LabelState, label: str, order: str = "confident") -> list[tuple[str, Suggestion]]:
    """The suggestions of ``label`` not labelled yet, most confident first (``confident``) or the least certain
    first (``uncertain``: the smallest margin between the two best classes)."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: one of {', '.join(ORDERS)}")
    items = [(sha, s) for sha, s in state.suggestions.items() if s.label == label and sha not in state.entries]
    key = (lambda item: (-item[1].confidence, item[1].path)) if order == "confident" else \
        (lambda item: (item[1].margin, item[1].path))
    return sorted(items, key=key)


def copy_photo(src: Path, photos: Path, label: str, sha: str) -> str:
    """Copy ``src`` into ``photos/label/`` (the user's file only read) under its name and the start of its hash,
    through a temporary file renamed into place: PHOTOS never holds half a photo. Returns the copy's path relative
    to ``photos``."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in src.stem)[:80] or "photo"
    suffix = src.suffix.lower() if src.suffix.lower() in IMAGE_EXTENSIONS else ".jpg"
    folder = photos / label
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{stem}-{sha[:10]}{suffix}"
    if not target.exists():
        tmp = folder / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return target.relative_to(photos).as_posix()


def accept(state: LabelState, choices: Mapping[str, str], source: str | None = None,
           paths: Mapping[str, Path] | None = None) -> Accepted:
    """Label the photos ``choices`` names (sha256 -> a class or :data:`SKIP`) in this round: each copied into
    ``state.photos/<class>/`` (a skipped one only recorded). ``source``: "user" or "suggestion"; None: a choice
    that agrees with the photo's suggestion is "suggestion", else "user". ``paths``: sha256 -> file for photos
    without a suggestion. A photo labelled already is left as it is (counted in ``already``); a class name not
    known yet is checked (:func:`vit_flowers.data.class_names.check_class_name`) and added. Not saved."""
    result = Accepted()
    for sha, label in choices.items():
        if sha in state.entries:
            result.already += 1
            continue
        hint = state.suggestions.get(sha)
        src = Path(hint.path) if hint is not None else (paths or {}).get(sha)
        if src is None:
            result.refused[sha] = "not a photo of this folder's suggestions"
            continue
        if label != SKIP and label not in state.classes:
            try:
                label = check_class_name(label)
            except ValueError as exc:
                result.refused[str(src)] = str(exc)
                continue
            if label not in state.classes:
                state.classes.append(label)
                result.new_classes.append(label)
        try:
            copy = None if label == SKIP else copy_photo(src, state.photos, label, sha)
        except OSError as exc:
            result.refused[str(src)] = f"cannot copy it: {exc.strerror or exc}"
            continue
        how = source or ("suggestion" if hint is not None and hint.label == label else "user")
        state.entries[sha] = Entry(str(src), label, how, state.round, copy)
        state.suggestions.pop(sha, None)
        result.labelled += 1
        result.copied += copy is not None
    return result


def read_choices(csv_path: Path, base: Path | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(file path -> label, path -> why refused) from a CSV with ``path`` and ``label`` columns (``predict
    --output``'s, or ``label``'s suggestions, edited or not): rows with an ``error``, an empty label or the label
    ``unknown`` are left out. A relative path is found from the working folder, else from ``base``."""
    choices: dict[str, str] = {}
    refused: dict[str, str] = {}
    try:
        with open(csv_path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or not {"path", "label"} <= set(reader.fieldnames):
                raise ValueError(f"{csv_path}: needs the columns path and label (predict --output writes them)")
            for row in reader:
                path, label = (row.get("path") or "").strip(), (row.get("label") or "").strip()
                if not path or (row.get("error") or "").strip() or label in ("", "unknown"):
                    continue
                file = Path(path)
                if not file.is_absolute() and not file.exists() and base is not None:
                    file = base / path
                if not file.is_file():
                    refused[path] = "file not found"
                    continue
                choices[str(file)] = label
    except OSError as exc:
        raise ValueError(f"cannot read {csv_path}: {exc.strerror or exc}") from None
    return choices, refused


def accept_csv(state: LabelState, csv_path: Path) -> Accepted:
    """Accept the rows of ``csv_path`` (:func:`read_choices`) as labels: a row that keeps the run's suggestion is
    an accepted suggestion, an edited one the user's label. Only photos of ``state.folder`` are taken."""
    choices, refused = read_choices(csv_path, state.folder)
    by_sha: dict[str, str] = {}
    paths: dict[str, Path] = {}
    for file, label in choices.items():
        if state.folder is not None and not _inside(Path(file), state.folder):
            refused[file] = f"not in the folder being labelled ({state.folder})"
            continue
        sha = file_sha256(file)
        if sha is None:
            refused[file] = "cannot be read"
            continue
        if sha not in by_sha:
            by_sha[sha], paths[sha] = label, Path(file).resolve()
    result = accept(state, by_sha, paths=paths)
    result.refused.update(refused)
    return result


def train_argv(state: LabelState, minutes: float) -> list[str]:
    """``train``'s arguments for a run on the grown training photos (the Train tab's recipe, ``minutes``)."""
    return ["--data", str(state.photos), "--time-budget", f"{minutes:g}"]


def train_command(state: LabelState, minutes: float) -> str:
    return "vit-flowers train " + " ".join(train_argv(state, minutes))


def run_photos(loaded: LoadedModel) -> Path | None:
    """The class-folder tree the run of ``loaded`` was trained on (its config's ``data``), or None (drawn photos,
    or a folder that is gone)."""
    from ..inference.run_data import trained_on

    try:
        data = trained_on(loaded.ckpt, Path(loaded.path).resolve().parent).data
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        raise StateError(f"cannot tell which photos {loaded.path} was trained on: {exc}") from None
    path = Path(data.path) if data.path and data.dataset == "folder" else None
    return path if path is not None and path.is_dir() else None


def next_round(state: LabelState) -> None:
    """A new prediction opens a new round once something was labelled in the current one."""
    if any(e.round == state.round and e.source != "training" for e in state.entries.values()):
        state.round += 1


def rename_class(state: LabelState, old: str, new: str) -> None:
    """Rename the class ``old`` to ``new`` mid-way: its folder of training photos renamed (PHOTOS is the labelling's
    own tree; the user's folder is not touched), its labels, its suggestions, and the run's name for it from now on
    (``state.renamed``). ValueError for an unknown class, a refused name or one taken. Not saved."""
    if old not in state.classes:
        raise ValueError(f"no class {old!r} to rename (the classes: {', '.join(state.classes)})")
    new = check_class_name(new)
    if new in state.classes or new.lower() in (c.lower() for c in state.classes):
        raise ValueError(f"cannot rename {old!r} to {new!r}: a class of that name exists")
    src, dst = state.photos / old, state.photos / new
    if dst.exists():
        raise ValueError(f"cannot rename {old!r} to {new!r}: {dst} exists")
    if src.is_dir():
        os.rename(src, dst)
    state.classes[state.classes.index(old)] = new
    for entry in state.entries.values():
        if entry.label == old:
            entry.label = new
            if entry.copy is not None and entry.copy.startswith(f"{old}/"):
                entry.copy = f"{new}/{entry.copy[len(old) + 1:]}"
            if entry.source == "training" and entry.path.startswith(f"{old}/"):
                entry.path = f"{new}/{entry.path[len(old) + 1:]}"
    for s in state.suggestions.values():
        s.label = new if s.label == old else s.label
        s.second = new if s.second == old else s.second
    for run_name, now in list(state.renamed.items()):
        if now == old:
            state.renamed[run_name] = new
    if old not in state.renamed.values() and new not in state.renamed.values():
        state.renamed[old] = new
