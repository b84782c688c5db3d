"""A local web page for the classifier: drop photos, see the flower, its confidence and where the model looked.

    pip install -e ".[app]"                                    # Gradio, as an optional extra
    python -m vit_flowers.app                                  # newest run's best.pt on http://127.0.0.1:7860
    python -m vit_flowers.app --checkpoint checkpoints/my-run --port 8080
    python -m vit_flowers.app --host 0.0.0.0 --allow-folders   # on the network, with the Folder tab (reads this disk)

Three tabs: Classify (upload, drag, paste or the webcam; top-k with confidence bars, the attention-rollout
overlay and "not sure" where the run's unknown rule rejects the photo), Folder (every image of a folder on this
computer: a table, a gallery grouped by predicted class with the least confident first, a CSV, the unreadable
files with their reason) and Model (what the checkpoint is, its validation report and training curves).

The page runs on the package's own engine: the same checks of every file (size and pixel limits, truncated
and non-image files), the same numbers and CSV as ``python -m vit_flowers.predict``, the attention maps of
``python -m vit_flowers.explain``.

Offline by design: no analytics, no share link, no fonts or scripts from the internet; it listens on loopback
unless ``--host`` says otherwise, and then the Folder tab is off unless ``--allow-folders`` is given. Requests
queue: the model never runs twice at once.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import ipaddress
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from .cli import (
    LoadedModel,
    add_model_arguments,
    command_parser,
    inference_dtype,
    load_model_from_args,
    setup_logging,
    unknown_rule,
)
from .data.images import ImageLoadError, load_image, printable_name
from .inference.unknown import UNKNOWN, UnknownRule
from .runs import folders as runs
from .runs.checkpoint import CheckpointError

__all__ = ["Engine", "Classified", "FolderResult", "ModelCard", "check_upload", "classify_files", "classify_html",
           "predict_folder", "folder_table", "gallery_groups", "gallery_html", "model_card", "model_card_markdown",
           "is_loopback", "build_page", "launch", "wait_until_serving", "main"]

logger = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 50 * 2**20  # a bigger upload is refused with a message (--max-upload-mb)
DISPLAY_SIZE = 320  # photos and overlays are shown this many pixels wide or high (the longer side)
THUMB_SIZE = 112  # gallery thumbnails
GALLERY_PER_CLASS = 40  # the least confident images of each predicted class that the gallery shows


@dataclass
class Engine:
    """The loaded model and the page's settings; ``lock`` keeps two requests from running the model at once
    (the page's queue does too)."""

    loaded: LoadedModel
    top_k: int = 3
    not_sure: float | None = None  # --not-sure: a top probability below this is "not sure" (replaces `unknown`)
    unknown: UnknownRule | None = None  # the run's "none of these" rule: what it rejects is "not sure"
    batch_size: int = 32
    precision: str = "auto"
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    workdir: Path | None = None  # where the folder CSVs go (default: a fresh temporary folder, made when needed)

    @property
    def classes(self) -> list[str]:
        return list(self.loaded.ckpt["classes"])

    @property
    def rule(self) -> UnknownRule | None:
        """What makes a photo "not sure": ``--not-sure`` when given, else the run's unknown rule (or none)."""
        return UnknownRule("max_softmax", self.not_sure) if self.not_sure is not None else self.unknown

    @property
    def k(self) -> int:
        return max(1, min(self.top_k, len(self.classes)))

    def output_dir(self) -> Path:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="vit_flowers_app_"))
        return self.workdir

    def amp_dtype(self, num_images: int) -> Any:
        """--precision for a request of ``num_images`` (fp32 for a few photos, see ``cli.inference_dtype``)."""
        return inference_dtype(self.loaded, num_images, precision=self.precision, batch_size=self.batch_size)


# ---------------------------------------------------------------------------------------------- Classify


@dataclass
class Classified:
    """One photo of the Classify tab: top-k [(label, probability)] best first, display-sized photo and
    attention overlay; or an ``error``."""

    name: str
    top_k: list[tuple[str, float]] = field(default_factory=list)
    not_sure: bool = False
    photo: Image.Image | None = None
    overlay: Image.Image | None = None
    error: str | None = None


def check_upload(path: str | os.PathLike, max_bytes: int = MAX_UPLOAD_BYTES) -> str | None:
    """Why an uploaded file is refused before it is decoded (missing, a folder, too big), or None."""
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return f"cannot read the upload ({exc.strerror or exc})"
    if os.path.isdir(path):
        return "is a folder, not an image file"
    if size > max_bytes:
        return f"file is {_size(size)}, over the limit of {_size(max_bytes)}"
    return None


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n / 2**10:,.0f} KB"


def _display_copy(path: Path, size: int = DISPLAY_SIZE) -> Image.Image:
    """The photo to show: its longer side ``size`` px (JPEGs decode at a reduced scale; a small photo is
    enlarged, so that the attention overlay drawn over it is smooth), read by ``images.load_image``."""
    img = load_image(path, min_size=size)
    scale = size / max(img.size)
    return img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))),
                      Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BICUBIC)


def classify_files(engine: Engine, paths: Sequence[str | os.PathLike]) -> list[Classified]:
    """Top-k, "not sure" and the attention-rollout overlay of each file, in input order; unreadable files
    get their reason (the same decoder and checks as ``predict``)."""
    from .explain import explain, overlay
    from .inference.batches import predict_files

    model, ckpt, _, device = engine.loaded
    out: dict[int, Classified] = {}
    accepted: list[tuple[int, Path]] = []
    for i, p in enumerate(map(Path, paths)):
        reason = check_upload(p, engine.max_upload_bytes)
        if reason:
            out[i] = Classified(printable_name(p.name), error=reason)
        else:
            accepted.append((i, p))
    rule = engine.rule
    with engine.lock:
        for batch, probs, scores in predict_files(model, [p for _, p in accepted], image_size=ckpt["image_size"],
                                                  mean=ckpt["mean"], std=ckpt["std"], device=device,
                                                  batch_size=engine.batch_size, unknown=rule,
                                                  amp_dtype=engine.amp_dtype(len(accepted))):
            for err in batch.errors:
                i, p = accepted[err.index]
                out[i] = Classified(printable_name(p.name), error=err.reason)
            if not batch.paths:
                continue
            rollout = explain(model, batch.images, ckpt["mean"], ckpt["std"], device).rollout  # (B, g, g)
            values, indices = probs.topk(engine.k, dim=1)  # (B, k)
            for j, index in enumerate(batch.indices):
                i, p = accepted[index]
                top = [(engine.classes[c], float(v)) for v, c in zip(values[j].tolist(), indices[j].tolist())]
                unsure = rule is not None and bool(scores[j] < rule.threshold)
                item = Classified(printable_name(p.name), top, not_sure=unsure)
                try:
                    item.photo = _display_copy(p)
                    item.overlay = overlay(item.photo, rollout[j])
                except (ImageLoadError, OSError, ValueError) as exc:  # changed since it was decoded
                    logger.warning("no overlay for %s: %s", printable_name(p), exc)
                out[i] = item
    return [out[i] for i in sorted(out)]


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


def _message_html(text: str) -> str:
    return f'<div class="vf-results"><div class="vf-card vf-error"><div class="vf-error-text">{html.escape(text)}' \
           f'</div></div></div>'


def classify_page(engine: Engine, paths: Sequence[str | os.PathLike] | str | None) -> str:
    """What the Classify tab shows for an upload: never raises (an unexpected error becomes a message)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        return classify_html(classify_files(engine, list(paths or [])), engine.rule)
    except Exception as exc:  # the page must answer the next request (logged whole below)
        logger.exception("classify failed")
        return _message_html(f"Could not classify: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------- Folder


@dataclass
class FolderResult:
    """Every image file of a folder: its predictions (``predict``'s rows, errors included) and the CSV."""

    folder: Path
    rows: list[Any]  # vit_flowers.predict.Prediction
    csv_path: Path
    seconds: float

    @property
    def errors(self) -> list[Any]:
        return [r for r in self.rows if r.error]


def predict_folder(engine: Engine, folder: str | os.PathLike, recursive: bool = True,
                   progress: Callable[[int, int], None] | None = None) -> FolderResult:
    """``predict`` on every image of ``folder`` (sub-folders with ``recursive``), with its CSV written into the
    engine's work folder. Raises ValueError with a message when ``folder`` is not a folder or holds no image."""
    from .predict import PredictionWriter, collect_files, predict_images, skipped_rows

    root = Path(os.path.expanduser(str(folder).strip()))
    if not str(folder).strip() or not root.is_dir():
        raise ValueError(f"not a folder on this computer: {printable_name(root)}")
    skipped: list[Path] = []
    files = collect_files([root], recursive=recursive, skipped_out=skipped)
    if not files:
        raise ValueError(f"no image files in {printable_name(root)}{'' if recursive else ' (include sub-folders?)'}")
    model, ckpt, _, device = engine.loaded
    csv_path = engine.output_dir() / f"predictions-{time.strftime('%Y%m%d-%H%M%S')}-{root.name or 'folder'}.csv"
    rule = engine.rule
    writer, rows, start = PredictionWriter(csv_path, engine.k, scores=rule is not None), [], time.perf_counter()
    try:
        with engine.lock:
            for batch in predict_images(model, files, engine.classes, image_size=ckpt["image_size"],
                                        mean=ckpt["mean"], std=ckpt["std"], device=device, top_k=engine.k,
                                        batch_size=engine.batch_size, amp_dtype=engine.amp_dtype(len(files)),
                                        unknown=rule):
                writer.write(batch)
                rows += batch
                if progress:
                    progress(len(rows), len(files))
        writer.write(skipped_rows(skipped))  # the CSV lists every file, as predict's does
    finally:
        writer.close()
    return FolderResult(root, rows, csv_path, time.perf_counter() - start)


def _relative(path: str, root: Path) -> str:
    try:
        return printable_name(Path(path).relative_to(root))
    except ValueError:
        return printable_name(path)


FOLDER_COLUMNS = ["file", "prediction", "confidence", "not sure", "next best", "error"]


def folder_table(result: FolderResult) -> list[list[Any]]:
    """One row per file (:data:`FOLDER_COLUMNS`), in the folder's order; "not sure": the unknown rule rejected
    it (its prediction is the best class all the same)."""
    table = []
    for r in result.rows:
        if r.error:
            table.append([_relative(r.path, result.folder), "", None, "", "", r.error])
            continue
        others = ", ".join(f"{label} {p:.1%}" for label, p in r.top_k[1:])
        table.append([_relative(r.path, result.folder), r.top_k[0][0], round(r.confidence, 4),
                      "yes" if r.label == UNKNOWN else "", others, ""])
    return table


def gallery_groups(rows: Sequence[Any], classes: Sequence[str]) -> dict[str, list[Any]]:
    """Predicted rows by predicted class (in the model's class order, empty classes left out), the least
    confident first within each class."""
    groups: dict[str, list[Any]] = {c: [] for c in classes}
    for r in rows:
        if not r.error:
            groups.setdefault(r.label, []).append(r)
    return {c: sorted(g, key=lambda r: r.confidence) for c, g in groups.items() if g}


def _thumb_html(row: Any, root: Path) -> str:
    from .reporting.report import thumbnail

    esc = html.escape
    pixels = thumbnail(row.path, np.full((THUMB_SIZE, THUMB_SIZE, 3), 128, np.uint8), THUMB_SIZE)
    unsure = row.label == UNKNOWN
    name = _relative(row.path, root)
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
        items = "".join(f"<li><code>{esc(_relative(r.path, result.folder))}</code>: {esc(r.error)}</li>"
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


# ---------------------------------------------------------------------------------------------- Model


@dataclass
class ModelCard:
    """What a checkpoint is and what its run folder says about it; figure and report paths exist or are None."""

    facts: list[tuple[str, str]]
    metrics: dict[str, Any] | None
    confusion: Path | None
    curves: Path | None
    report: Path | None


def _existing(*paths: Path) -> Path | None:
    return next((p for p in paths if p.is_file()), None)


def _training_facts(ckpt: dict[str, Any], run_dir: Path) -> list[tuple[str, str]]:
    """When and how the checkpoint was trained: its config and the run's metrics.csv."""
    cfg = ckpt.get("config") or {}
    data = cfg.get("data") or cfg.get("dataset")
    keys = ("time_budget",) if cfg.get("time_budget") else ("epochs",)  # with a budget, epochs is only a cap
    keys += ("batch_size", "lr", "augment", "mixup", "cutmix", "precision", "pretrained")
    how = ", ".join(f"{k} {cfg[k]}{' min' if k == 'time_budget' else ''}" for k in keys
                    if cfg.get(k) not in (None, "", 0, 0.0))
    facts = [("trained on", str(data))] if data else []
    if how:
        facts.append(("recipe", how))
    try:
        epochs = runs.read_metrics(run_dir / runs.METRICS)  # one row per epoch; "seconds": its training time
    except OSError:
        return facts
    seconds = math.fsum(s for row in epochs if math.isfinite(s := row.get("seconds", math.nan)))
    facts.append(("training", f"{len(epochs)} epoch(s)" + (f", {seconds / 60:.1f} min" if seconds else "")))
    return facts


def model_card(loaded: LoadedModel) -> ModelCard:
    """The Model tab's content from the checkpoint and its run folder (its report, its training curves)."""
    model, ckpt, path, device = loaded
    run_dir = Path(path).resolve().parent
    mc = ckpt["model_config"]
    params = sum(p.numel() for p in model.parameters())
    trained = datetime.fromtimestamp(Path(path).stat().st_mtime).strftime("%Y-%m-%d %H:%M")
    facts = [("checkpoint", printable_name(path)), ("classes", ", ".join(ckpt["classes"])),
             ("image size", f"{ckpt['image_size']} px"), ("parameters", f"{params / 1e6:.2f} M"),
             ("architecture", f"ViT, patch {mc.get('patch_size')} ({mc.get('patch_embed', 'linear')} embedding), "
                              f"width {mc.get('dim')}, depth {mc.get('depth')}, {mc.get('heads')} heads"),
             ("weights", f"{ckpt.get('weights', 'raw')}, epoch {ckpt.get('epoch', '?')}, saved {trained}"),
             ("device", str(device))]
    facts += _training_facts(ckpt, run_dir)
    metrics = None
    report = run_dir / runs.REPORT
    metrics_json = report / "metrics.json"
    if metrics_json.is_file():
        try:
            metrics = json.loads(metrics_json.read_text())
        except (OSError, ValueError) as exc:
            logger.warning("cannot read %s: %s", metrics_json, exc)
    if metrics is None and ckpt.get("best_accuracy") is not None:
        facts.append(("best validation accuracy during training", f"{ckpt['best_accuracy']:.1%}"))
    return ModelCard(facts, metrics, _existing(report / "confusion_matrix.png"),
                     _existing(run_dir / runs.CURVES, report / "training_curves.png"),
                     _existing(report / "report.html"))


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


# ---------------------------------------------------------------------------------------------- page

CSS = """
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
"""


def _gradio() -> Any:
    """Gradio, imported with its analytics off (set before the import), or SystemExit with the install line."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        import gradio as gr
    except ImportError:
        raise SystemExit('error: the web app needs Gradio: pip install -e ".[app]"') from None
    return gr


def _model_tab(gr: Any, engine: Engine) -> None:
    card = model_card(engine.loaded)
    url = f"gradio_api/file={card.report.resolve()}" if card.report else None
    gr.Markdown(model_card_markdown(card, url), elem_id="vf-model-card")
    with gr.Row():
        for path, label in ((card.confusion, "confusion matrix (validation)"), (card.curves, "training curves")):
            try:
                figure = load_image(path) if path is not None else None
            except ImageLoadError as exc:  # a damaged figure costs its own panel, not the page
                logger.warning("%s", exc)
                continue
            if figure is not None:
                with gr.Column():  # the caption above the figure: Gradio's own label would cover its top corner
                    gr.Markdown(f"**{label.capitalize()}**")
                    gr.Image(value=figure, label=label, show_label=False, interactive=False,
                             buttons=["download", "fullscreen"])  # no "share" (to Hugging Face)


def _folder_tab(gr: Any, engine: Engine) -> None:
    with gr.Row():
        folder = gr.Textbox(label="A folder on this computer", placeholder="/home/me/Pictures/garden", scale=4,
                            elem_id="vf-folder")
        recursive = gr.Checkbox(value=True, label="include sub-folders")
        go = gr.Button("Predict every image", variant="primary", elem_id="vf-folder-go")
    summary = gr.Markdown(label="summary", elem_id="vf-folder-summary")
    csv_file = gr.File(label="predictions.csv", interactive=False)
    gallery = gr.HTML(label="gallery", elem_id="vf-folder-gallery")
    table = gr.Dataframe(headers=FOLDER_COLUMNS, label="every file", interactive=False, wrap=True)

    # Gradio's own idiom: it sees the default and injects its progress tracker
    def run(path: str, sub: bool, progress: Any = gr.Progress()) -> tuple:  # noqa: B008
        text, page, rows, csv_path = folder_page(engine, path, sub, lambda n, total: progress((n, total)))
        return text, csv_path, page, rows

    go.click(run, [folder, recursive], [summary, csv_file, gallery, table], concurrency_id="model", api_name="folder")
    folder.submit(run, [folder, recursive], [summary, csv_file, gallery, table], concurrency_id="model",
                  api_visibility="private")


def build_page(engine: Engine, folders: bool = True) -> Any:
    """The Gradio page (Blocks, queued one model call at a time). ``folders``: build the Folder tab at all
    (off, it does not exist on the server: no request can reach it).

    The functions behind each tab (:func:`classify_files`, :func:`predict_folder`, :func:`model_card` and their
    ``*_html`` renderers) work without Gradio; this only lays them out. Every output has a label: the name the
    API gives it (shown or not)."""
    gr = _gradio()
    with gr.Blocks(title="vit_flowers", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"## vit_flowers: which flower is it?\nThe model knows {len(engine.classes)} classes: "
                    f"{', '.join(engine.classes)}.")
        with gr.Tab("Classify"):
            with gr.Row():
                files = gr.File(label="Photos: drop, or click to choose, one or several", file_count="multiple",
                                elem_id="vf-upload", height=160)
                camera = gr.Image(label="Or paste a photo / use the webcam", sources=["clipboard", "webcam"],
                                  type="filepath", elem_id="vf-camera", height=160, buttons=[])
            results = gr.HTML(classify_html([], engine.rule), label="predictions", elem_id="vf-results")

            def classify(paths: list[str] | str | None) -> str:
                return classify_page(engine, paths)

            files.upload(classify, files, results, concurrency_id="model", api_name="classify")
            files.delete(classify, files, results, concurrency_id="model", api_visibility="private")  # the rest
            files.clear(lambda: classify_html([], engine.rule), None, results, api_visibility="private")
            camera.input(classify, camera, results, concurrency_id="model", api_visibility="private")
        if folders:
            with gr.Tab("Folder"):
                _folder_tab(gr, engine)
        with gr.Tab("Model"):
            _model_tab(gr, engine)
    demo.queue(default_concurrency_limit=1, max_size=64)
    return demo


def launch(demo: Any, engine: Engine, host: str, port: int, block: bool = True) -> Any:
    """Serve ``demo`` on ``host:port``: no share link, no analytics or monitoring endpoints, no footer links out;
    only the run's ``report/`` folder is served as files. Returns the local URL."""
    gr = _gradio()
    card_dir = Path(engine.loaded.path).resolve().parent / runs.REPORT
    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    _, url, _ = demo.launch(server_name=host, server_port=port, share=False, prevent_thread_lock=not block,
                            quiet=True, max_file_size=engine.max_upload_bytes, show_error=False,
                            allowed_paths=[str(card_dir)] if card_dir.is_dir() else None, enable_monitoring=False,
                            footer_links=[], run_history=False, pwa=False, mcp_server=False, ssr_mode=False,
                            theme=theme, css=CSS)
    return url


def wait_until_serving(url: str, timeout: float = 60.0, process: Any = None) -> float:
    """Seconds until ``url`` answers 200 (for scripts and tests that start the app in another process); raises
    TimeoutError after ``timeout``, or RuntimeError as soon as ``process`` (a Popen) has exited."""
    import urllib.request

    start = time.perf_counter()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.perf_counter() - start
        except OSError:
            pass
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the app exited with status {process.returncode} before {url} answered")
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")
        time.sleep(0.05)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this computer (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("app", __doc__)
    add_model_arguments(p, batch_size=32)
    p.add_argument("--host", default="127.0.0.1",
                   help="the address the page listens on (default: %(default)s, this computer only)")
    p.add_argument("--port", type=int, default=7860, help="the port the page listens on (default: %(default)s)")
    p.add_argument("--allow-folders", action="store_true",
                   help="keep the Folder tab (which reads this computer's disk) with a --host other than loopback")
    p.add_argument("--top-k", type=int, default=3,
                   help="the most probable classes shown per photo (default: %(default)s)")
    p.add_argument("--not-sure", type=float, metavar="P",
                   help="deprecated: a top probability below P is 'not sure' (the same as --unknown-threshold P on a "
                        "run trained without an unknown rule). Default: the run's own unknown rule (a run trained "
                        "before it: never 'not sure')")
    p.add_argument("--max-upload-mb", type=float, default=MAX_UPLOAD_BYTES / 2**20,
                   help="uploads larger than this many MB are refused (default: %(default)s)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up requests to the page
    if (args.top_k <= 0 or args.batch_size <= 0 or args.max_upload_mb <= 0
            or (args.not_sure is not None and not 0 <= args.not_sure <= 1)):
        logger.error("error: --top-k, --batch-size and --max-upload-mb must be positive, --not-sure in [0, 1]")
        return 2
    _gradio()  # fail early, before loading the model, when Gradio is not installed
    if args.not_sure is not None:
        logger.warning("--not-sure is deprecated: the run's own unknown rule decides what is 'not sure'; "
                       "--not-sure %g overrides it with a top probability cut-off", args.not_sure)
    try:
        loaded = load_model_from_args(args, "app")
        rule = unknown_rule(args, loaded.ckpt, loaded.model, str(loaded.path))
    except (CheckpointError, ValueError) as exc:
        logger.error("error: %s", exc)
        return 1
    engine = Engine(loaded, top_k=args.top_k, not_sure=args.not_sure, unknown=rule, batch_size=args.batch_size,
                    precision=args.precision, max_upload_bytes=int(args.max_upload_mb * 2**20))
    folders = args.allow_folders or is_loopback(args.host)
    if not folders:
        logger.warning("listening on %s: the Folder tab is off (add --allow-folders to let anyone who reaches the "
                       "page read this computer's folders)", args.host)
    demo = build_page(engine, folders=folders)
    logger.info("model %s (%d classes); starting the page", loaded.path, len(engine.classes))
    try:
        url = launch(demo, engine, args.host, args.port, block=False)
    except OSError as exc:  # the port is taken, or the address is not this computer's
        logger.error("error: cannot listen on %s:%d (%s); pass another --port or --host", args.host, args.port, exc)
        return 1
    logger.info("open %s in a browser (Ctrl+C stops)", url)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` cleans up like Ctrl+C
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    finally:
        demo.close()
        if engine.workdir:
            shutil.rmtree(engine.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
