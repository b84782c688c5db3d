"""The web app's HTML: the Classify tab's cards, the Folder tab's gallery and summary, the Model tab's text and the
page's CSS (each renders what :mod:`vit_flowers.app.engine` computed; no Gradio)."""

from __future__ import annotations

import base64
import html
import io
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from ..inference.unknown import UNKNOWN, UnknownRule
from ..reporting.confusion_cells import CONFUSION_CSS, confusion_html, read_predictions
from .classes import ClassCheck
from .engine import (
    Classified,
    Engine,
    FolderResult,
    ModelCard,
    NoModel,
    classify_files,
    folder_table,
    gallery_groups,
    predict_folder,
    relative_name,
)
from .training import Progress

if TYPE_CHECKING:
    from ..inference.onnx_export import CheckedExport

__all__ = ["CSS", "classify_html", "classify_page", "gallery_html", "folder_summary", "folder_page",
           "model_card_markdown", "cells_html", "message_html", "class_check_markdown", "progress_html", "duration"]

logger = logging.getLogger(__name__)

THUMB_SIZE = 112  # gallery thumbnails
GALLERY_PER_CLASS = 40  # the least confident images of each predicted class that the gallery shows


def _data_uri(img: Image.Image | np.ndarray, quality: int = 85) -> str:
    """An RGB image as a ``data:image/jpeg`` URI (the page needs no file route for it)."""
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _bars_html(top_k: Sequence[tuple[str, float]]) -> str:
    esc = html.escape
    return "".join(
        f'<div class="vf-bar"><span class="vf-bar-label">{esc(label)}</span>'
        f'<span class="vf-track"><span class="vf-fill" style="width:{100 * p:.1f}%"></span></span>'
        f'<span class="vf-bar-value">{p:.1%}</span></div>' for label, p in top_k)


def _card_html(item: Classified, rule: UnknownRule | None) -> str:
    esc = html.escape
    name = f'<div class="vf-name">{esc(item.name)}</div>'
    if item.error:
        return f'<div class="vf-card vf-error">{name}<div class="vf-error-text">{esc(item.error)}</div></div>'
    label, p = item.top_k[0]
    if item.not_sure:
        why = f"below the unknown rule: {rule.describe()}" if rule else "not sure"
        verdict = (f'<div class="vf-verdict"><span class="vf-unsure" title="{esc(why)}">Not sure:</span> '
                   f'<b class="vf-label">{esc(label)}</b>? '
                   f'<span class="vf-confidence">{p:.1%}</span></div>')
    else:
        verdict = (f'<div class="vf-verdict"><b class="vf-label">{esc(label)}</b> '
                   f'<span class="vf-confidence">{p:.1%}</span></div>')
    figures = "".join(f'<figure><img src="{_data_uri(img)}" alt="{esc(alt)}"><figcaption>{esc(alt)}</figcaption>'
                      f'</figure>' for img, alt in ((item.photo, "photo"), (item.overlay, "where the model looked"))
                      if img is not None)
    return (f'<div class="vf-card" data-label="{esc(label)}" data-confidence="{p:.6f}">'
            f'<div class="vf-images">{figures}</div><div class="vf-preds">{name}{verdict}{_bars_html(item.top_k)}'
            f'</div></div>')


def classify_html(results: Sequence[Classified], rule: UnknownRule | None) -> str:
    """The Classify tab's result: one card per photo (photo, overlay, verdict, bars) or per error; ``rule``: what
    made a photo "not sure" (named in its tooltip)."""
    if not results:
        return '<div class="vf-results vf-empty">Drop one or several photos above.</div>'
    return '<div class="vf-results">' + "".join(_card_html(r, rule) for r in results) + "</div>"


def message_html(text: str) -> str:
    return f'<div class="vf-results"><div class="vf-card vf-error"><div class="vf-error-text">{html.escape(text)}' \
           f'</div></div></div>'


def classify_page(engine: Engine, paths: Sequence[str | os.PathLike] | str | None) -> str:
    """What the Classify tab shows for an upload: never raises (an unexpected error becomes a message)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        return classify_html(classify_files(engine, list(paths or [])), engine.rule)
    except NoModel as exc:
        return message_html(str(exc))
    except Exception as exc:  # the page must answer the next request (logged whole below)
        logger.exception("classify failed")
        return message_html(f"Could not classify: {type(exc).__name__}: {exc}")




def _thumb_html(row: Any, root: Path) -> str:
    from ..reporting.report import thumbnail

    esc = html.escape
    pixels = thumbnail(row.path, np.full((THUMB_SIZE, THUMB_SIZE, 3), 128, np.uint8), THUMB_SIZE)
    unsure = row.label == UNKNOWN
    name = relative_name(row.path, root)
    return (f'<figure class="vf-thumb{" vf-unsure" if unsure else ""}" title="{esc(name)}">'
            f'<img src="{_data_uri(pixels, 80)}" alt="{esc(name)}"><figcaption>{row.confidence:.0%}'
            f'{" not sure" if unsure else ""}<br>{esc(Path(name).name)}</figcaption></figure>')


def gallery_html(result: FolderResult, classes: Sequence[str], per_class: int = GALLERY_PER_CLASS) -> str:
    """The Folder tab's gallery: the files that could not be read (with their reason), then one section per
    predicted class (and one of the photos the unknown rule rejected) with its ``per_class`` least confident
    images."""
    esc = html.escape
    parts = []
    if result.errors:
        items = "".join(f"<li><code>{esc(relative_name(r.path, result.folder))}</code>: {esc(r.error)}</li>"
                        for r in result.errors)
        parts.append(f'<div class="vf-bad"><h3>{len(result.errors)} file(s) could not be read</h3>'
                     f'<ul>{items}</ul></div>')
    for label, group in gallery_groups(result.rows, classes).items():
        shown = group[:per_class]
        more = f", the {len(shown)} least confident shown" if len(group) > len(shown) else ""
        thumbs = "".join(_thumb_html(r, result.folder) for r in shown)
        parts.append(f'<section class="vf-group" data-label="{esc(label)}"><h3>{esc(label)}: {len(group)} '
                     f'image(s){more}</h3><div class="vf-thumbs">{thumbs}</div></section>')
    return '<div class="vf-gallery">' + "".join(parts) + "</div>"


def folder_summary(result: FolderResult, rule: UnknownRule | None) -> str:
    ok = [r for r in result.rows if not r.error]
    unsure = sum(r.label == UNKNOWN for r in ok)
    why = f" (below the unknown rule: {rule.describe()})" if rule else ""
    return (f"**{len(ok):,}** of {len(result.rows):,} file(s) predicted in {result.seconds:.1f} s; "
            f"{unsure:,} not sure{why}; {len(result.errors):,} could not be read.")


def folder_page(engine: Engine, folder: str, recursive: bool,
                progress: Callable[[int, int], None] | None = None) -> tuple[str, str, list[list[Any]], str | None]:
    """The Folder tab's outputs (summary, gallery, table, CSV path); never raises."""
    try:
        result = predict_folder(engine, folder, recursive, progress)
    except ValueError as exc:
        return f"**{html.escape(str(exc))}**", "", [], None
    except Exception as exc:  # the page must answer the next request (logged whole below)
        logger.exception("folder prediction failed")
        return f"**Could not predict the folder: {html.escape(f'{type(exc).__name__}: {exc}')}**", "", [], None
    return (folder_summary(result, engine.rule), gallery_html(result, engine.classes), folder_table(result),
            str(result.csv_path))




def model_card_markdown(card: ModelCard, report_url: str | None = None) -> str:
    """The Model tab's text: a table of facts, the validation figures and the report link."""
    rows = [f"| {k} | {html.escape(v).replace('|', '&#124;')} |" for k, v in card.facts]
    lines = rows[:1] + ["|---|---|"] + rows[1:]  # the first fact (the checkpoint) is the table's header
    m = card.metrics
    if m:
        k = m.get("top_k", 5)
        lines += ["", f"**Validation accuracy: {m['accuracy']:.1%}** (top-{k} {m.get('top_k_accuracy', 0):.1%}, "
                      f"macro F1 {m['macro_avg']['f1']:.3f}, {m.get('n_images', 0):,} images)"]
    else:
        lines += ["", "No evaluation report next to this checkpoint (`python -m vit_flowers.evaluate` writes one)."]
    if card.report and report_url:
        lines += ["", f"[Open the full evaluation report (report.html)]({report_url})"]
    return "\n".join(lines)


def onnx_markdown(exported: CheckedExport) -> str:
    """The Model tab's line on the ONNX file: what it was checked on and what the check found."""
    n = len(exported.val.names)
    return (f"**{html.escape(exported.path.name)}**: checked against PyTorch on {n:,} photos "
            f"({html.escape(exported.val.source)}): the same label on {exported.same:,} of {n:,}, the largest logit "
            f"difference {exported.worst:.1e}. It runs without PyTorch: `vit-flowers predict PHOTOS --checkpoint "
            f"{html.escape(exported.path.name)}`")


def web_markdown(name: str, exported: CheckedExport, runtime_included: bool) -> str:
    """The Model tab's line on the web page's zip: what is in it, where ONNX Runtime Web comes from, how to serve it."""
    runtime = ("ONNX Runtime Web is inside: it works with no internet" if runtime_included else
               "ONNX Runtime Web loads from a CDN (`npm ci` in the repository's web/ folder puts it inside)")
    return (f"**{html.escape(name)}**: a web page that classifies photos and the webcam in the browser, with no "
            f"Python: the model above ({html.escape(exported.path.name)}, checked against PyTorch), its classes and "
            f"its \"not sure\" rule. {runtime}. Unzip it onto any web server (GitHub Pages, or "
            f"`python -m http.server` in its folder) and open index.html")


def class_check_markdown(check: ClassCheck) -> str:
    """The Train tab's check of the classes: each class's count, then what stops training and the warnings."""
    lines = [" · ".join(f"**{html.escape(c.name)}**: {len(c.files)} photo(s)" for c in check.classes)]
    lines += [f"**Cannot train:** {html.escape(e)}" for e in check.errors]
    lines += [f"**Warning:** {html.escape(w)}" for w in check.warnings]
    return "\n\n".join(line for line in lines if line)


def duration(seconds: float) -> str:
    """``seconds`` in words: "45 s", "2 min 5 s"."""
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def progress_html(progress: Progress | None) -> str:
    """The Train tab's progress bar: the bar (``data-state``, ``data-fraction`` for scripts and tests), the phase,
    the epochs done, the best validation accuracy so far and the time left."""
    if progress is None:
        return '<div class="vf-progress" data-state="idle" data-fraction="0">No training yet.</div>'
    parts = [progress.phase]
    if progress.accuracy is not None:
        parts.append(f"best validation accuracy so far {progress.accuracy:.1%}")
    if progress.state == "running":
        parts.append(f"{duration(progress.elapsed)} so far")
        if progress.seconds_left is not None:
            parts.append(f"about {duration(progress.seconds_left)} left, then the report")
    return (f'<div class="vf-progress" data-state="{progress.state}" data-fraction="{progress.fraction:.4f}" '
            f'data-epochs="{progress.epochs}"><div class="vf-track"><span class="vf-fill" '
            f'style="width:{100 * progress.fraction:.1f}%"></span></div><div class="vf-progress-text">'
            f'{html.escape(" · ".join(parts))}</div></div>')


def cells_html(card: ModelCard, classes: Sequence[str]) -> str:
    """The Model tab's confusion matrix whose counts open their photos, from the run's report (its
    predictions.csv); empty without one."""
    if card.report is None:
        return ""
    try:
        photos = read_predictions(card.report.parent / "predictions.csv")
    except OSError as exc:
        logger.warning("no clickable confusion matrix: %s", exc)
        return ""
    if not photos:
        return ""
    return ('<div class="vf-cells"><p><b>Confusion matrix (validation): click a count to see its photos</b>, the '
            'worst first</p>' + confusion_html(classes, photos) + "</div>")


# ---------------------------------------------------------------------------------------------- page

CSS = CONFUSION_CSS + """
.vf-results {display: flex; flex-direction: column; gap: 12px}
.vf-card {display: flex; flex-wrap: wrap; gap: 16px; padding: 12px; border: 1px solid var(--border-color-primary);
          border-radius: 8px}
.vf-images {display: flex; gap: 8px} .vf-images figure, .vf-thumb {margin: 0}
.vf-images img {max-width: 240px; max-height: 240px; border-radius: 4px}
figcaption {font-size: 0.85em; opacity: 0.75; text-align: center}
.vf-preds {flex: 1; min-width: 240px} .vf-name {font-size: 0.9em; opacity: 0.75; word-break: break-all}
.vf-verdict {font-size: 1.5em; margin: 4px 0 12px} .vf-unsure {color: #c2410c; font-weight: 600}
.vf-bar {display: flex; align-items: center; gap: 8px; margin: 4px 0}
.vf-bar-label {width: 110px; overflow: hidden; text-overflow: ellipsis} .vf-bar-value {width: 56px; text-align: right}
.vf-track {flex: 1; height: 14px; background: var(--background-fill-secondary); border-radius: 7px; overflow: hidden}
.vf-fill {display: block; height: 100%; background: var(--color-accent)}
.vf-error {border-color: #dc2626} .vf-error-text {color: #dc2626; font-weight: 600}
.vf-thumbs {display: flex; flex-wrap: wrap; gap: 8px}
.vf-thumb {width: 112px} .vf-thumb img {width: 112px; height: 112px; object-fit: cover; border-radius: 4px}
.vf-thumb figcaption {white-space: nowrap; overflow: hidden; text-overflow: ellipsis}
.vf-thumb.vf-unsure img {outline: 3px solid #c2410c}
.vf-bad {color: #dc2626}
.vf-progress .vf-track {display: block; height: 18px; margin: 6px 0}
.vf-progress[data-state=failed] .vf-progress-text {color: #dc2626; font-weight: 600}
"""

