"""The Label tab's Gradio layout (:mod:`vit_flowers.app.labelling` computes it): the folder to label and where its
photos go, the order, one class's grid at a time with one-click choices under each photo, Accept, and Train on the
labelled photos (the Train tab's training, its progress bar there)."""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any

from ..labelling.loop import ORDERS
from ..labelling.state import StateError, load_state
from ..runs.errors import CheckpointError
from .engine import Engine, NoModel
from .labelling import (
    LabelView,
    accept_grid,
    check_labels,
    findings_html,
    grid_html,
    last_state,
    open_labelling,
    resume,
    summary_markdown,
    train_on_labels,
)
from .train_tab import DEFAULT_MINUTES, full_minutes

__all__ = ["LabelTab", "label_tab", "ACCEPT_JS"]

logger = logging.getLogger(__name__)

ORDER_CHOICES = [("most confident first (go fast)", "confident"), ("least certain first (most useful)", "uncertain")]
assert [v for _, v in ORDER_CHOICES] == list(ORDERS)
# Accept's inputs as the browser sends them: the picks read from the grid (the checked choice under each photo)
ACCEPT_JS = """(stateFile, order, label, picks) => {
  const out = {};
  document.querySelectorAll('#vf-label-grid .vf-pick').forEach((fig) => {
    const chosen = fig.querySelector('input[type=radio]:checked');
    out[fig.dataset.sha] = chosen ? chosen.value : '';
  });
  return [stateFile, order, label, JSON.stringify(out)];
}"""
# a (Enter not in a text box): Accept
KEYS_JS = """() => {
  document.addEventListener('keydown', (e) => {
    const typing = ['INPUT', 'TEXTAREA'].includes(e.target.tagName) && e.target.type !== 'radio';
    if (typing || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key === 'a' && document.querySelector('#vf-label-grid .vf-pick')) {
      document.querySelector('#vf-label-accept')?.click();
    }
  });
}"""


class LabelTab:
    """The tab's parts that the page's load refreshes (a reopened tab, a restarted app)."""

    def __init__(self, load: Any, outputs: list[Any]) -> None:
        self.load, self.outputs = load, outputs


def _shown(view: LabelView) -> tuple[str, str, str, str]:
    return grid_html(view), summary_markdown(view), str(view.state.path), view.label or ""


def _failed(exc: Exception, keep: Any) -> tuple[str, str, Any, Any]:
    """The grid emptied and the message; the state file and class shown are ``keep`` (Gradio's skip: kept as they
    were, so that the next Accept or Continue still knows the labelling)."""
    logger.warning("label: %s", exc)
    return '<div id="vf-label-grid" class="vf-label-empty"></div>', f"**{html.escape(str(exc))}**", keep, keep


def label_tab(gr: Any, engine: Engine) -> LabelTab:
    """Lay the Label tab out; returns what the page's load calls to reopen the last labelling."""
    gr.Markdown("Label a folder of your photos with the model's help. It suggests a class for each photo; check one "
                "class at a time: the photos are ticked (✓), most confident first; click ✗ on a wrong one to leave it "
                "for later, or the class it is (→) or skip, then **Accept** (key `a`): the ticked and moved photos are "
                "copied into the training photos (your folder is only read). Train a new run on them, then Continue: "
                "it suggests the rest better. Everything is kept in a file: close the tab, come back later.",
                elem_id="vf-label-intro")
    with gr.Row():
        folder = gr.Textbox(label="The folder of photos to label", placeholder="/home/me/Pictures/summer", scale=3,
                            elem_id="vf-label-folder")
        photos = gr.Textbox(label="Training photos (a class-folder tree; empty: the run's own, or where runs live)",
                            scale=3, elem_id="vf-label-photos")
        order = gr.Radio(ORDER_CHOICES, value="confident", label="Order", elem_id="vf-label-order", scale=2)
    go = gr.Button("Start / Continue: suggest with the model in use", variant="primary", elem_id="vf-label-go")
    summary = gr.Markdown(label="labelling", elem_id="vf-label-summary")
    grid = gr.HTML('<div id="vf-label-grid" class="vf-label-empty"></div>', label="grid", elem_id="vf-label-grid-box")
    with gr.Row():
        accept = gr.Button("Accept (a)", variant="primary", elem_id="vf-label-accept")
        minutes = gr.Slider(1, full_minutes(), value=DEFAULT_MINUTES, step=1,
                            label="Train on the labelled photos (minutes)", elem_id="vf-label-minutes")
        train = gr.Button("Train a new run on them", elem_id="vf-label-train")
    trained = gr.Markdown(label="training", elem_id="vf-label-trained")
    check = gr.Button("Check the labelled photos (duplicates, likely wrong labels)", size="sm",
                      elem_id="vf-label-check-go")
    checked = gr.HTML(label="check", elem_id="vf-label-check-box")
    state_file = gr.Textbox(visible="hidden", label="state file", elem_id="vf-label-state")
    label = gr.Textbox(visible="hidden", label="class shown", elem_id="vf-label-class")
    picks = gr.Textbox(visible="hidden", label="picks", elem_id="vf-label-picks")
    shown = [grid, summary, state_file, label]

    # Gradio's own idiom: it sees the default and injects its progress tracker
    def start(path: str, where: str, how: str, progress: Any = gr.Progress()) -> tuple:  # noqa: B008
        try:
            return _shown(open_labelling(engine, path, where, how, progress=lambda n, total: progress((n, total))))
        except (NoModel, StateError, CheckpointError, ValueError, OSError) as exc:
            return _failed(exc, gr.skip())

    def accepted(path: str, how: str, cls: str, chosen: str) -> tuple:
        import json

        if not path:
            return _failed(ValueError("start with a folder first"), gr.skip())
        try:
            return _shown(accept_grid(Path(path), cls, json.loads(chosen or "{}"), how))
        except (StateError, CheckpointError, ValueError, OSError) as exc:
            return _failed(exc, gr.skip())

    def reordered(path: str, how: str, cls: str) -> tuple:
        if not path:
            return tuple(gr.skip() for _ in shown)
        try:
            return _shown(resume(Path(path), how, cls or None))
        except (StateError, OSError) as exc:
            return _failed(exc, gr.skip())

    def retrain(path: str, length: float) -> str:
        if not path:
            return "**Start with a folder first.**"
        try:
            run = train_on_labels(engine, Path(path), length)
        except (StateError, ValueError, OSError) as exc:
            return f"**Not started:** {html.escape(str(exc))}"
        return (f"Training **{run.run_dir.name}** on `{run.photos}` for {length:g} min: its progress is in the Train "
                f"tab; the page uses the new run when it is done. Then press Continue for its suggestions. On the "
                f"command line: `vit-flowers train --data {run.photos} --time-budget {length:g}`")

    def checking(path: str) -> str:
        if not path:
            return "<p><b>Start with a folder first.</b></p>"
        try:
            state = load_state(Path(path))
            return findings_html(check_labels(engine, Path(path)), state.photos)
        except (StateError, ValueError, OSError) as exc:
            logger.warning("label check: %s", exc)
            return f"<p><b>Could not check:</b> {html.escape(str(exc))}</p>"

    def reopen() -> tuple:
        """The page (re)opened: the last labelling, where it stands."""
        found = last_state(engine)
        if found is None:
            return (gr.skip(), gr.skip(), *[gr.skip() for _ in shown])
        try:
            view = resume(found)
        except (StateError, OSError) as exc:
            return (gr.skip(), gr.skip(), *_failed(exc, gr.skip()))
        return (str(view.state.folder or ""), str(view.state.photos), *_shown(view))

    go.click(start, [folder, photos, order], shown, concurrency_id="model", api_name="label")
    accept.click(accepted, [state_file, order, label, picks], shown, js=ACCEPT_JS, concurrency_id="label",
                 api_name="label_accept")
    order.input(reordered, [state_file, order, label], shown, concurrency_id="label", api_visibility="private")
    check.click(checking, state_file, checked, concurrency_id="model", api_name="label_check")
    train.click(retrain, [state_file, minutes], trained, concurrency_id="train", api_name="label_train")
    return LabelTab(reopen, [folder, photos, *shown])
