"""The Train tab's Gradio layout: class slots (a name, photos dropped or chosen, webcam shots), a PHOTOS folder where
the page may read this computer's folders, the training length, the check before training, Train and Cancel, the
progress bar (refreshed by the page's timer: :func:`vit_flowers.app.server.build_page`)."""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .classes import ClassCheck, check_classes, check_folder
from .engine import Engine
from .new_run import begin_training, commands
from .page import class_check_markdown, progress_html

__all__ = ["MAX_CLASSES", "SHOWN_CLASSES", "TrainTab", "train_tab", "full_minutes"]

logger = logging.getLogger(__name__)

MAX_CLASSES = 10  # class slots in the page (a PHOTOS folder may have more)
SHOWN_CLASSES = 2  # shown at first; "Add a class" shows the next
PLACEHOLDERS = ("daisy", "rose", "tulip", "sunflower", "dandelion")
DEFAULT_MINUTES = 2  # the short budget: the head start's minute or two


def full_minutes() -> float:
    """The longest training the page offers: the full budget of ``train --data PHOTOS``."""
    from ..training.config import PHOTO_RECIPE, shipped_recipe

    return float(shipped_recipe(PHOTO_RECIPE)["time_budget"])


@dataclass
class TrainTab:
    """The components that the page's timer refreshes."""

    progress: Any
    result: Any


def _check(engine: Engine, values: Sequence[Any], folder: str | None) -> ClassCheck:
    """The classes given: ``folder`` when one is typed, else the slots' (name, files) pairs of ``values``."""
    if folder and folder.strip():
        return check_folder(folder, engine.max_upload_bytes)
    pairs = [(values[2 * i], list(values[2 * i + 1] or [])) for i in range(len(values) // 2)]
    return check_classes(pairs, engine.max_upload_bytes)


def _start(engine: Engine, values: Sequence[Any], folder: str | None, minutes: float) -> tuple[str, str, str]:
    """Train: (the check, the result, the progress bar)."""
    check = _check(engine, values, folder)
    text = class_check_markdown(check)
    try:
        run = begin_training(engine, check, float(minutes),
                             Path(folder.strip()).expanduser() if folder and folder.strip() else None)
    except (ValueError, OSError) as exc:  # ConfigError is a ValueError; OSError: a full disk. The page stays up
        logger.warning("training not started: %s", exc)
        return text, f"**Not started:** {html.escape(str(exc))}", progress_html(
            engine.training.progress() if engine.training else None)
    lines = [f"Training **{run.run_dir.name}** for {minutes:g} min in `{run.run_dir}`; the photos are kept in "
             f"`{run.photos}`. The same on the command line:"] + [f"    {c}" for c in commands(run.run_dir, run.photos,
                                                                                              run.minutes)]
    return text, "\n\n".join(lines[:1]) + "\n\n" + "\n".join(lines[1:]), progress_html(run.training.progress())


def _cancel(engine: Engine) -> str:
    if engine.training is not None:
        engine.training.cancel()
    return progress_html(engine.training.progress() if engine.training else None)


def _class_slot(gr: Any, i: int) -> tuple[Any, Any, Any]:
    """One class: its box, name and photos (a webcam shot is added to its photos)."""
    with gr.Group(visible=i < SHOWN_CLASSES, elem_id=f"vf-class-{i}") as box:
        name = gr.Textbox(label=f"Class {i + 1}: its name", placeholder=PLACEHOLDERS[i % len(PLACEHOLDERS)],
                          elem_id=f"vf-class-{i}-name")
        with gr.Row():
            photos = gr.File(label="Its photos: drop or choose, many at once", file_count="multiple",
                             elem_id=f"vf-class-{i}-photos", height=180, scale=3)
            shot = gr.Image(label="Or take photos with the webcam", sources=["webcam"], type="filepath",
                            elem_id=f"vf-class-{i}-camera", height=180, buttons=[], scale=1)
    # the shot joins the photos, and the camera is emptied for the next one
    shot.input(lambda files, path: ([*(files or []), path] if path else files, None), [photos, shot], [photos, shot],
               api_visibility="private")
    return box, name, photos


def train_tab(gr: Any, engine: Engine, folders: bool) -> TrainTab:
    """Lay the Train tab out (``folders``: offer a PHOTOS folder of this computer too)."""
    gr.Markdown("Make a classifier from your own photos: a class per kind of flower (or anything), each with its "
                "name and its photos (10 or more each; drop many at once). Train runs the same recipe as "
                "`vit-flowers train --data PHOTOS`; the new model is used at once and kept with its photos. The "
                "training runs in the app, not in this tab: closing the tab does not stop it (open the page again "
                "to follow it); Cancel does, and so does stopping the app.", elem_id="vf-train-intro")
    slots = [_class_slot(gr, i) for i in range(MAX_CLASSES)]
    shown = gr.State(SHOWN_CLASSES)
    add = gr.Button("Add a class", elem_id="vf-class-add", size="sm")
    add.click(lambda n: (min(n + 1, MAX_CLASSES), *[gr.update(visible=i < n + 1) for i in range(MAX_CLASSES)]),
              shown, [shown, *[box for box, _, _ in slots]], api_visibility="private")
    folder = gr.Textbox(label="Or a PHOTOS folder on this computer: one sub-folder of photos per class",
                        placeholder="/home/me/Pictures/flowers", visible=folders, elem_id="vf-train-folder")
    minutes = gr.Slider(1, full_minutes(), value=DEFAULT_MINUTES, step=1, label="Training length (minutes)",
                        elem_id="vf-train-minutes")
    checked = gr.Markdown(label="check", elem_id="vf-train-check")
    with gr.Row():
        go = gr.Button("Train", variant="primary", elem_id="vf-train-go")
        cancel = gr.Button("Cancel", variant="stop", elem_id="vf-train-cancel")
    progress = gr.HTML(progress_html(None), label="progress", elem_id="vf-train-progress")
    result = gr.Markdown(label="training", elem_id="vf-train-result")
    fields = [c for _, name, photos in slots for c in (name, photos)]

    def allowed(path: str | None) -> str | None:  # off, a request naming a folder is not read (it has no box)
        return path if folders else None

    def check(*values: Any) -> str:
        return class_check_markdown(_check(engine, values[:-1], allowed(values[-1])))

    gr.on([c.change for _, _, c in slots] + [c.blur for _, c, _ in slots] + [folder.blur], check, [*fields, folder],
          checked, concurrency_id="check", api_visibility="private", show_progress="hidden")
    go.click(lambda *v: _start(engine, v[:-2], allowed(v[-2]), v[-1]), [*fields, folder, minutes],
             [checked, result, progress], concurrency_id="train", api_name="train")
    cancel.click(lambda: _cancel(engine), None, progress, concurrency_id="cancel", api_name="cancel")
    return TrainTab(progress, result)
