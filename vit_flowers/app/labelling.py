"""The Label tab without Gradio: a folder of unlabelled photos labelled with the run in use, one class at a time.
Everything lives in the labelling state file (:mod:`vit_flowers.labelling.state`, beside the training photos), read
afresh by every request: a closed tab, a reloaded page or a restarted app goes on where the file says; two tabs on
one folder cannot label a photo twice (the second is told what the first did).

    view = open_labelling(engine, "~/summer", "")       # scans, suggests (the run in use), saves; the first class
    view = accept_grid(engine, view.state.path, "daisy", {sha: "daisy", sha2: "rose", sha3: ""})   # "" leaves it
    html = grid_html(view)
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.image_files import printable_name
from ..labelling.loop import accept, check_places, next_round, ordered, run_photos, scan_folder, suggest
from ..labelling.state import GRID, SKIP, STATE_SUFFIX, LabelState, Suggestion, load_state, open_state, save_state
from .engine import Engine

__all__ = ["LabelView", "PHOTOS_NAME", "default_photos", "last_state", "open_labelling", "resume", "accept_grid",
           "train_on_labels", "Finding", "check_labels", "findings_html", "grid_html", "summary_markdown", "LABEL_CSS"]

logger = logging.getLogger(__name__)

PHOTOS_NAME = "labelled-photos"  # where runs live: the training photos of a run that was not trained on a folder
THUMB = 128


@dataclass
class LabelView:
    """What the tab shows: the state, the class shown (None: nothing left to check), its grid (sha256,
    suggestion), the suggestions left per class, and a message (what the last action did)."""

    state: LabelState
    label: str | None
    grid: list[tuple[str, Suggestion]]
    left: dict[str, int] = field(default_factory=dict)
    message: str = ""


def default_photos(engine: Engine) -> Path:
    """Where accepted photos go when the tab is not told: the folder the run in use was trained on, else
    ``<where runs live>/labelled-photos``."""
    return run_photos(engine.model()) or engine.runs_home / PHOTOS_NAME


def last_state(engine: Engine) -> Path | None:
    """The state file the tab reopens: the one of :func:`default_photos`, else the newest ``*.labels.json`` where
    runs live."""
    if engine.loaded is not None:
        try:
            path = default_photos(engine)
            candidate = path.resolve().parent / f"{path.name}{STATE_SUFFIX}"
            if candidate.is_file():
                return candidate
        except (OSError, ValueError) as exc:
            logger.debug("no labelling state beside the run's photos: %s", exc)
    found = sorted(engine.runs_home.glob(f"*{STATE_SUFFIX}"), key=lambda p: p.stat().st_mtime) \
        if engine.runs_home.is_dir() else []
    return found[-1] if found else None


def _view(state: LabelState, label: str | None, order: str, message: str = "") -> LabelView:
    left = {c: len(ordered(state, c, order)) for c in state.classes}
    if label not in left or not left.get(label):  # the class shown is done: the next one with suggestions
        names = list(left)
        start = names.index(label) if label in names else 0
        turn = names[start:] + names[:start]
        label = next((name for name in turn if left[name]), None)
    grid = ordered(state, label, order)[:GRID] if label else []
    return LabelView(state, label, grid, left, message)


def open_labelling(engine: Engine, folder: str, photos: str, order: str = "confident", label: str | None = None,
                   progress: Callable[[int, int], None] | None = None) -> LabelView:
    """Start or continue labelling ``folder`` into ``photos`` (empty: :func:`default_photos`): the folder scanned,
    the photos not labelled yet predicted by the run in use when it has not suggested them (a new run: all of
    them, a new round), the state saved; ``progress(done, total)`` follows the prediction. Raises ValueError /
    StateError / CheckpointError with a message."""
    loaded = engine.model()
    root = Path(os.path.expanduser(folder.strip())) if folder and folder.strip() else None
    if root is None:
        raise ValueError("type the folder of photos to label")
    where = Path(os.path.expanduser(photos.strip())) if photos and photos.strip() else default_photos(engine)
    check_places(where, root)
    run = str(Path(loaded.path).resolve().parent)
    state = open_state(where, folder=root)
    new_run = state.run != run
    state.run = run
    for cls in loaded.ckpt["classes"]:
        if cls not in state.classes:
            state.classes.append(cls)
    todo = scan_folder(state)
    if new_run:
        next_round(state)
    missing = todo if new_run else [(sha, p) for sha, p in todo if sha not in state.suggestions]
    with engine.lock:
        n = suggest(state, loaded, missing, batch_size=engine.batch_size, amp_dtype=engine.amp_dtype(len(missing)),
                    progress=progress) if missing else 0
    save_state(state)
    return _view(state, label, order, f"{n} photo(s) suggested by {Path(run).name}" if n else "")


def resume(state_file: Path, order: str = "confident", label: str | None = None) -> LabelView:
    """The view of a saved state, as it is (no scan, no prediction)."""
    return _view(load_state(state_file), label, order)


def accept_grid(state_file: Path, label: str, picks: Mapping[str, str], order: str = "confident") -> LabelView:
    """Accept the grid of ``label``: ``picks`` sha256 -> the class it is (``label``: the suggestion kept; another
    class: moved; :data:`SKIP`; "": left for later). Photos labelled meanwhile (another tab) are left as they are,
    and the message says so. Saved."""
    state = load_state(state_file)
    choices = {sha: pick for sha, pick in picks.items() if pick}
    result = accept(state, choices)
    save_state(state)
    moved = sum(1 for sha, pick in choices.items() if pick != label and state.entries.get(sha) and
                state.entries[sha].source == "user")
    parts = [f"{result.labelled} photo(s) labelled ({moved} moved to another class or skipped)"]
    if result.already:
        parts.append(f"{result.already} were labelled meanwhile elsewhere (another tab?) and were left as they are")
    if result.refused:
        parts.append("not labelled: " + "; ".join(f"{printable_name(Path(p).name)}: {why}"
                                                  for p, why in list(result.refused.items())[:5]))
    left = len([1 for v in picks.values() if not v])
    if left:
        parts.append(f"{left} unticked, left for later")
    return _view(state, label, order, "; ".join(parts) + ".")


def train_on_labels(engine: Engine, state_file: Path, minutes: float) -> Any:
    """Start the Train tab's training (:func:`vit_flowers.app.new_run.begin_training`) on the labelled training
    photos of ``state_file`` for ``minutes``; the page uses the new run when it ends well, and the next
    :func:`open_labelling` makes its suggestions (a new round). Returns the NewRun; raises ValueError / StateError /
    OSError with a message."""
    from .classes import check_folder
    from .new_run import begin_training

    state = load_state(state_file)
    return begin_training(engine, check_folder(str(state.photos), engine.max_upload_bytes), float(minutes),
                          state.photos)


@dataclass
class Finding:
    """An accepted photo that `check` flags: its copy in PHOTOS, its label, what is wrong (``why``)."""

    copy: Path
    label: str
    why: str


def check_labels(engine: Engine, state_file: Path) -> list[Finding]:
    """``vit-flowers check`` on the training photos of ``state_file``, its findings on the photos labelled here
    (not the ones PHOTOS held before): likely wrong labels (another class predicted out of sample) and duplicates
    labelled as two classes, so that a mistake accepted in bulk is caught before the next training."""
    from ..checking.photo_check import FEATURE_SIZE, check_photos, find_photos

    state = load_state(state_file)
    mine = {(state.photos / e.copy).resolve(): e for e in state.entries.values()
            if e.copy is not None and e.source != "training"}
    photos = find_photos(state.photos)
    with engine.lock:
        result = check_photos(photos, image_size=FEATURE_SIZE, batch_size=engine.batch_size, folds=5, progress=False)
    found: list[Finding] = []
    for issue in result.issues or []:
        path = photos.paths[issue.index].resolve()
        if path in mine:
            found.append(Finding(path, mine[path].label, f"likely {photos.classes[issue.suggested]} (check's "
                                                         f"cross-validated score {issue.score:+.2f})"))
    for pair in result.pairs:
        if pair.kind != "across_classes":
            continue
        for i, j in ((pair.a, pair.b), (pair.b, pair.a)):
            one = photos.paths[i].resolve()
            if one in mine:
                other = photos.rel(j)
                found.append(Finding(one, mine[one].label,
                                     f"the same photo as {other} ({photos.classes[photos.labels[j]]})"))
    return found


def findings_html(found: list[Finding], photos: Path) -> str:
    """The check's findings on the labelled photos: a thumbnail each, its label and why."""
    esc = html.escape
    if not found:
        return '<div id="vf-label-check" data-found="0">The check found nothing wrong in the labelled photos.</div>'
    items = "".join(f'<figure class="vf-pick"><img src="{_thumb(str(f.copy))}" alt="{esc(f.copy.name)}">'
                    f'<figcaption><b>{esc(f.label)}</b>: {esc(f.why)}<br><code>{esc(str(f.copy.relative_to(photos)))}'
                    f'</code></figcaption></figure>' for f in found)
    return (f'<div id="vf-label-check" data-found="{len(found)}"><h3>{len(found)} labelled photo(s) to look at '
            f'again</h3><div class="vf-pick-grid">{items}</div></div>')


def _thumb(path: str) -> str:
    from ..reporting.report import thumbnail
    from .page import _data_uri

    return _data_uri(thumbnail(path, np.full((THUMB, THUMB, 3), 128, np.uint8), THUMB), 80)


def grid_html(view: LabelView) -> str:
    """The class's grid: each photo pre-ticked as ``label``, with one-click choices under it: ✗ (leave it for
    later), each other class, skip. ``data-sha`` and the checked radio are what Accept reads; ``data-revision``:
    the state file's revision it shows."""
    esc = html.escape
    if view.label is None:
        return (f'<div id="vf-label-grid" class="vf-label-empty" data-revision="{view.state.revision}">Nothing left '
                f'to check: every photo of the folder is labelled, or listed below.</div>')
    others = [c for c in view.state.classes if c != view.label]
    figures = []
    for sha, s in view.grid:
        name = f"vf-pick-{sha[:16]}"
        options = [(view.label, "✓", "vf-yes", True), ("", "✗", "vf-no", False)]
        options += [(c, f"→ {c}", "vf-move", False) for c in others] + [(SKIP, "skip", "vf-skip", False)]
        radios = "".join(
            f'<label class="{cls}"><input type="radio" name="{name}" value="{esc(value)}"'
            f'{" checked" if checked else ""}><span>{esc(text)}</span></label>'
            for value, text, cls, checked in options)
        file = Path(s.path).name
        figures.append(f'<figure class="vf-pick" data-sha="{sha}" data-name="{esc(file)}" title="{esc(s.path)}">'
                       f'<img src="{_thumb(s.path)}" alt="{esc(file)}"><figcaption>{s.confidence:.0%} '
                       f'{esc(file)}</figcaption><div class="vf-picks">{radios}</div></figure>')
    return (f'<div id="vf-label-grid" data-label="{esc(view.label)}" data-revision="{view.state.revision}">'
            f'<h3>{esc(view.label)}: '
            f'{len(view.grid)} of {view.left.get(view.label, 0)} suggestion(s)</h3>'
            f'<div class="vf-pick-grid">{"".join(figures)}</div></div>')


def summary_markdown(view: LabelView) -> str:
    """Where the labelling stands: labelled per class, what is left, duplicates and skipped files, the files."""
    state = view.state
    counts = state.counts()
    lines = [f"**Round {state.round}.** Labelled: " + ", ".join(f"{c} {n}" for c, n in counts.items()) + ".",
             "Left to check: " + (", ".join(f"{c} {n}" for c, n in view.left.items() if n) or "none") + "."]
    if view.message:
        lines.append(html.escape(view.message))
    if state.duplicates:
        lines.append(f"{len(state.duplicates)} duplicate(s) of a photo labelled or shown already: labelled once.")
    if state.unreadable:
        shown = "; ".join(f"`{printable_name(Path(p).name)}`: {html.escape(why)}"
                          for p, why in list(state.unreadable.items())[:10])
        lines.append(f"{len(state.unreadable)} file(s) skipped (not a photo, or unreadable): {shown}")
    lines.append(f"Training photos: `{state.photos}`; labels: `{state.path}`. Your folder is only read.")
    return "\n\n".join(lines)


LABEL_CSS = """
.vf-pick-grid {display: flex; flex-wrap: wrap; gap: 10px}
.vf-pick {margin: 0; width: 148px; padding: 4px; border: 1px solid var(--border-color-primary); border-radius: 6px}
.vf-pick img {width: 140px; height: 140px; object-fit: cover; border-radius: 4px}
.vf-pick:has(.vf-no input:checked) {opacity: 0.45}
.vf-pick:has(.vf-move input:checked), .vf-pick:has(.vf-skip input:checked) {outline: 3px solid #c2410c}
.vf-picks {display: flex; flex-wrap: wrap; gap: 2px}
.vf-picks label {font-size: 0.75em; cursor: pointer}
.vf-picks input {position: absolute; opacity: 0; width: 0; height: 0}
.vf-picks span {display: inline-block; padding: 1px 5px; border: 1px solid var(--border-color-primary);
                border-radius: 4px}
.vf-picks input:checked + span {background: var(--color-accent); color: white}
"""
