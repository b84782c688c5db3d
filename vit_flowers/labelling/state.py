"""The labelling state: one JSON file beside a class-folder tree of training photos (``PHOTOS.labels.json`` beside
``PHOTOS/``) that says which photo is labelled what, by whom and in which round, and what the run suggests for the
rest. Photos are known by the SHA-256 of their bytes (a copy under another name is the same photo: labelled once)
and by their path.

Written atomically (:func:`vit_flowers.runs.checkpoint.atomic_write_text`: a full disk or a crash leaves the previous
file whole) and guarded by a revision number: a save made from an older read than the file's (two tabs, two
commands on one folder) is refused with :class:`StaleState`, so one wins cleanly and the other is told.

    state = open_state(Path("checkpoints/page-photos"), folder=Path("~/summer").expanduser(), run="checkpoints/latest")
    state.entries["3f2a..."].label       # "daisy"
    save_state(state)
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..data.duplicates import file_sha256
from ..data.image_files import list_images

__all__ = ["GRID", "SKIP", "SOURCES", "STATE_SUFFIX", "VERSION", "Entry", "Suggestion", "LabelState", "StateError",
           "StaleState", "state_path", "open_state", "load_state", "save_state"]

GRID = 48  # photos in one grid of the page's Label tab (and of benchmarks/label_loop.py's simulated user)
SKIP = "skip"  # the label of a photo that is not a flower, or that the user does not want: never a training photo
SOURCES = ("training", "user", "suggestion")  # already in PHOTOS, labelled by the user, a suggestion accepted
STATE_SUFFIX = ".labels.json"
VERSION = 1


class StateError(ValueError):
    """A state file that cannot be read or used; the message names it."""


class StaleState(StateError):
    """The state file changed since it was read (another tab or command labelled in between)."""


@dataclass
class Entry:
    """One labelled photo: its ``path`` (the user's file, or for a ``training`` photo its place in PHOTOS), its
    ``label`` (a class, or :data:`SKIP`), its ``source`` (:data:`SOURCES`), the ``round`` it was labelled in and
    ``copy``, where its copy lies in PHOTOS (relative; None for a skipped photo)."""

    path: str
    label: str
    source: str
    round: int
    copy: str | None = None


@dataclass
class Suggestion:
    """What the run predicted for an unlabelled photo: its best class and that class's probability, and the runner-up
    (the margin between the two is how uncertain the model is)."""

    path: str
    label: str
    confidence: float
    second: str = ""
    second_confidence: float = 0.0

    @property
    def margin(self) -> float:
        return self.confidence - self.second_confidence


@dataclass
class LabelState:
    """The labelling of ``folder`` (the user's photos, only ever read) into ``photos`` (the class-folder tree
    of training photos), stored at ``path``. ``entries``: sha256 -> :class:`Entry`; ``suggestions``: sha256 ->
    :class:`Suggestion`, the unlabelled photos as the last prediction saw them; ``unreadable``: path -> reason (listed,
    skipped); ``duplicates``: path -> sha256 of a photo of the folder whose content is labelled, or suggested,
    under another path."""

    path: Path
    photos: Path
    folder: Path | None = None
    run: str | None = None
    classes: list[str] = field(default_factory=list)
    round: int = 1
    revision: int = 0
    entries: dict[str, Entry] = field(default_factory=dict)
    suggestions: dict[str, Suggestion] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)
    duplicates: dict[str, str] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)  # a class renamed mid-way: the run's name -> the new one

    def counts(self) -> dict[str, int]:
        """Labelled photos per label (classes first, in order; :data:`SKIP` last when any)."""
        out = dict.fromkeys(self.classes, 0)
        for e in self.entries.values():
            out[e.label] = out.get(e.label, 0) + 1
        if SKIP in out:
            out[SKIP] = out.pop(SKIP)
        return out

    def labelled_paths(self) -> set[str]:
        return {e.path for e in self.entries.values() if e.source != "training"}

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "photos": str(self.photos), "folder": str(self.folder) if self.folder else None,
                "run": self.run, "classes": self.classes, "round": self.round, "revision": self.revision,
                "entries": {k: asdict(v) for k, v in self.entries.items()},
                "suggestions": {k: asdict(v) for k, v in self.suggestions.items()},
                "unreadable": self.unreadable, "duplicates": self.duplicates, "renamed": self.renamed}


def state_path(photos: Path) -> Path:
    """Where the state of the training photos ``photos`` lives: ``photos.labels.json`` beside the folder (not in
    it: the folder stays a plain class-folder tree for ``train --data``)."""
    photos = Path(photos)
    return photos.parent / f"{photos.name}{STATE_SUFFIX}"


def load_state(path: Path) -> LabelState:
    """The state stored at ``path``; StateError naming the file when it cannot be read or is not a state."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise ValueError(f"not a labelling state of version {VERSION}")
        return LabelState(
            path=Path(path), photos=Path(raw["photos"]), folder=Path(raw["folder"]) if raw.get("folder") else None,
            run=raw.get("run"), classes=list(raw.get("classes", [])), round=int(raw.get("round", 1)),
            revision=int(raw.get("revision", 0)),
            entries={k: Entry(**v) for k, v in raw.get("entries", {}).items()},
            suggestions={k: Suggestion(**v) for k, v in raw.get("suggestions", {}).items()},
            unreadable=dict(raw.get("unreadable", {})), duplicates=dict(raw.get("duplicates", {})),
            renamed=dict(raw.get("renamed", {})))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StateError(f"cannot read the labelling state {path}: {exc}") from None


def open_state(photos: Path, folder: Path | None = None, run: str | None = None,
               classes: list[str] | None = None) -> LabelState:
    """The state of ``photos`` (read from :func:`state_path`), or a new one: its training photos already there
    (``photos/<class>/*``) recorded by content as labelled (source ``training``, round 0), so that a copy of one in
    the user's folder is not offered again. ``folder``, ``run`` and ``classes`` update what the state says (a class
    given that it lacks is added). Not saved: :func:`save_state`."""
    photos = Path(photos).resolve()
    path = state_path(photos)
    if path.exists():
        state = load_state(path)
        if state.photos.resolve() != photos:
            raise StateError(f"{path} labels {state.photos}, not {photos}")
    else:
        state = LabelState(path=path, photos=photos)
        for cls in sorted(p.name for p in photos.iterdir() if p.is_dir() and not p.name.startswith(".")) \
                if photos.is_dir() else []:
            state.classes.append(cls)
            for file in list_images(photos / cls)[0]:
                sha = file_sha256(file)
                if sha is not None and sha not in state.entries:
                    rel = file.relative_to(photos).as_posix()
                    state.entries[sha] = Entry(rel, cls, "training", 0, rel)
    if folder is not None:
        state.folder = Path(folder).resolve()
    if run is not None:
        state.run = str(run)
    for cls in classes or []:
        if cls not in state.classes:
            state.classes.append(cls)
    return state


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s lock file (``.<name>.lock`` beside it) while the block runs (POSIX; elsewhere
    no lock: the revision check alone)."""
    lock = path.with_name(f".{path.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        try:
            import fcntl
        except ImportError:  # Windows
            yield
            return
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def save_state(state: LabelState) -> None:
    """Write ``state`` atomically, its revision one up; :class:`StaleState` (nothing written) when the file's
    revision is not the one ``state`` was read at; CheckpointError (an OSError's message, the previous file whole)
    when it cannot be written."""
    from ..runs.checkpoint import atomic_write_text

    with _locked(state.path):
        on_disk = _revision(state.path)
        if on_disk != state.revision:
            raise StaleState(f"the labels of {state.photos} changed since this page read them (another tab or "
                             f"command labelled in between: revision {on_disk}, not {state.revision}): reload to "
                             f"go on from there; this change was not saved")
        state.revision += 1
        try:
            atomic_write_text(state.path, json.dumps(state.to_json(), indent=1, ensure_ascii=False) + "\n")
        except BaseException:
            state.revision -= 1
            raise


def _revision(path: Path) -> int:
    """The revision of the state file at ``path`` (0: none yet)."""
    if not path.exists():
        return 0
    try:
        return int(json.loads(path.read_text(encoding="utf-8")).get("revision", 0))
    except (OSError, ValueError, AttributeError) as exc:
        raise StateError(f"cannot read the labelling state {path}: {exc}") from None


def relative_to_folder(state: LabelState, path: str | os.PathLike) -> str:
    """``path`` as the page shows it: relative to the user's folder when inside it."""
    try:
        return Path(path).relative_to(state.folder).as_posix() if state.folder else str(path)
    except ValueError:
        return str(path)
