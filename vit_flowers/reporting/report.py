"""Figures and reports: training curves, confusion matrices, a grid of mistakes, report.md and a
self-contained report.html (figures embedded as base64, no other files needed to view it).

Plots use matplotlib's object-oriented API (``Figure`` rendered by Agg), so nothing needs a display and the
global pyplot backend is left alone. The metrics dict is the one :mod:`vit_flowers.evaluate` writes to
``metrics.json``.
"""

from __future__ import annotations

import base64
import csv
import html
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from PIL import Image
from sklearn.metrics import ConfusionMatrixDisplay

from ..data.images import printable_name
from ..runs.folders import KeptWeights, read_metrics

__all__ = [
    "Mistake",
    "plot_training_curves",
    "training_curves_figure",
    "plot_confusion_matrix",
    "write_confusion_csv",
    "plot_mistakes",
    "top_confusions",
    "write_markdown",
    "write_html",
    "thumbnail",
    "CSS",
]

logger = logging.getLogger(__name__)

DPI = 110
_COLOURS = {"train": "#4C72B0", "val": "#DD8452", "val_ema": "#C44E52", "lr": "#55A868"}


@dataclass
class Mistake:
    """A misclassified image: pixels (H, W, 3) uint8, true and predicted class index, the confidence."""

    image: np.ndarray
    true: int
    pred: int
    confidence: float
    path: str | None = None


# ---------------------------------------------------------------------------------------------- curves


def plot_training_curves(metrics_csv: str | os.PathLike, out_png: str | os.PathLike,
                         kept: KeptWeights | None = None) -> Path | None:
    """Loss, accuracy (validation of the raw and the EMA weights) and learning rate against epoch from a run's
    ``metrics.csv`` (columns epoch, train_loss, train_acc, val_loss, val_acc, val_acc_ema, lr, ...; missing columns
    are left out). ``kept`` (what best.pt holds) is circled on its curve and named in the legend, which sits below
    the plots so that it never covers a line.

    Returns the PNG path, or None when the file has no rows yet. Raises ``FileNotFoundError`` naming the
    file when it does not exist.
    """
    metrics_csv, out_png = Path(metrics_csv), Path(out_png)
    fig = training_curves_figure(read_metrics(metrics_csv), kept)
    if fig is None:
        logger.debug("%s has no rows yet: no training curves", metrics_csv)
        return None
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    return out_png


def training_curves_figure(rows: list[dict[str, float]], kept: KeptWeights | None = None) -> Figure | None:
    """The figure of :func:`plot_training_curves` from the rows of a metrics.csv; None without rows."""
    cols = {key: np.asarray([row[key] for row in rows]) for key in (rows[0] if rows else ())}
    if "epoch" not in cols:
        return None
    epoch = cols["epoch"]
    fig = Figure(figsize=(12, 4.2), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, 3)
    lines = (("loss", "train_loss", "train", "-"), ("loss", "val_loss", "val", "-"), ("acc", "train_acc", "train", "-"),
             ("acc", "val_acc", "val", "-"), ("acc", "val_acc_ema", "val (EMA weights)", "--"))
    for metric, key, label, style in lines:
        y = cols.get(key)
        if y is not None and np.isfinite(y).any():
            ax = axes[0] if metric == "loss" else axes[1]
            colour = _COLOURS["val_ema" if key.endswith("ema") else label]
            ax.plot(epoch, y, style, marker="o", markersize=3, color=colour, label=label)
    _mark_kept(axes[1], cols, kept)
    for ax, title in ((axes[0], "Loss"), (axes[1], "Accuracy")):
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    if "lr" in cols and np.isfinite(cols["lr"]).any():
        axes[2].plot(epoch, cols["lr"], color=_COLOURS["lr"])
        axes[2].ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    axes[2].set_title("Learning rate")
    axes[2].set_xlabel("epoch")
    axes[2].grid(alpha=0.3)
    return fig


def _mark_kept(ax: Any, cols: dict[str, np.ndarray], kept: KeptWeights | None) -> None:
    """Circle the accuracy of the weights best.pt holds (its epoch, on the raw or the EMA curve); nothing when
    ``kept`` is None or its epoch has no validation figure."""
    if kept is None:
        return
    y = cols.get("val_acc_ema" if kept.weights == "ema" else "val_acc")
    row = np.flatnonzero(cols["epoch"] == kept.epoch)
    if y is None or not len(row) or not np.isfinite(y[row[0]]):
        return
    acc = float(y[row[0]])
    kind = "EMA" if kept.weights == "ema" else "raw"
    ax.plot([kept.epoch], [acc], linestyle="none", marker="o", markersize=11, markerfacecolor="none",
            markeredgecolor="black", label=f"kept in best.pt: {acc:.1%} (epoch {kept.epoch}, {kind} weights)")


# ---------------------------------------------------------------------------------------------- confusion


def plot_confusion_matrix(cm: np.ndarray, classes: Sequence[str], out_png: str | os.PathLike,
                          title: str | None = None) -> Path:
    """Counts and row-normalised (recall per true class) confusion matrices side by side.

    ``cm[i, j]`` = images of true class ``i`` predicted as ``j``. Cell values are written for up to 25
    classes; beyond that the colours speak alone.
    """
    cm = np.asarray(cm)
    n = len(classes)
    if cm.shape != (n, n):
        raise ValueError(f"confusion matrix of shape {cm.shape} for {n} classes")
    rows = cm.sum(axis=1, keepdims=True)
    norm = np.divide(cm, rows, out=np.zeros(cm.shape, dtype=float), where=rows > 0)  # (C, C), rows sum to 1
    values = n <= 25
    side = min(max(4.2, 0.55 * n + 2.0), 30.0)
    fig = Figure(figsize=(2 * side + 1.0, side + 0.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, matrix, fmt, name in ((axes[0], cm, "d", "Counts"), (axes[1], norm, ".0%", "Row-normalised (recall)")):
        ConfusionMatrixDisplay(matrix, display_labels=list(classes)).plot(
            ax=ax, cmap="Blues", colorbar=False, include_values=values, values_format=fmt, xticks_rotation=45,
            im_kw={"vmin": 0, "vmax": 1} if matrix is norm else None,
        )
        ax.set_title(name)
        if n > 25:  # too many names to read at this size
            ax.tick_params(labelsize=max(3, 9 - n // 20))
        fig.colorbar(ax.images[0], ax=ax, shrink=0.8, format="{x:.0%}" if matrix is norm else None)
    if title:
        fig.suptitle(title)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    return out_png


def write_confusion_csv(cm: np.ndarray, classes: Sequence[str], path: str | os.PathLike) -> Path:
    """The confusion matrix as CSV: rows = true class, columns = predicted class."""
    path = Path(path)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["true \\ predicted", *classes])
        for name, row in zip(classes, np.asarray(cm)):
            writer.writerow([name, *map(int, row)])
    return path


def top_confusions(cm: np.ndarray, classes: Sequence[str], k: int = 5) -> list[tuple[str, str, int, float]]:
    """The ``k`` largest off-diagonal cells: (true, predicted, count, share of the true class)."""
    cm = np.asarray(cm)
    off = cm.copy()
    np.fill_diagonal(off, 0)
    order = np.argsort(off, axis=None)[::-1][:k]
    rows = cm.sum(axis=1)
    out = []
    for flat in order:
        i, j = np.unravel_index(flat, cm.shape)
        if off[i, j] == 0:
            break
        out.append((classes[i], classes[j], int(off[i, j]), float(off[i, j] / rows[i])))
    return out


# ---------------------------------------------------------------------------------------------- mistakes


def plot_mistakes(mistakes: Sequence[Mistake], classes: Sequence[str], out_png: str | os.PathLike,
                  columns: int = 6) -> Path:
    """A grid of misclassified images (most confident first) with true / predicted class and confidence."""
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    if not mistakes:
        fig = Figure(figsize=(5, 1.4), dpi=DPI)
        fig.text(0.5, 0.5, "No misclassified images", ha="center", va="center", fontsize=14, color="#2e7d32")
        fig.savefig(out_png)
        return out_png
    columns = min(columns, len(mistakes))
    rows = math.ceil(len(mistakes) / columns)
    fig = Figure(figsize=(2.2 * columns, 2.55 * rows), dpi=DPI, layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, columns)).ravel()
    for ax in axes:
        ax.set_axis_off()
    for ax, m in zip(axes, mistakes):
        ax.imshow(m.image)
        name = printable_name(Path(m.path).name) if m.path else None
        ax.set_title(f"true: {classes[m.true]}\npred: {classes[m.pred]} ({m.confidence:.0%})"
                     + (f"\n{_shorten(name, 24)}" if name else ""), fontsize=8, color="#b00020")
    fig.suptitle("Most confident mistakes", fontsize=11)
    fig.savefig(out_png)
    return out_png


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


# ---------------------------------------------------------------------------------------------- markdown


def _fmt(x: Any, pct: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.1%}" if pct else f"{x:.3f}"


def _summary_items(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    k = metrics.get("top_k", 5)
    items = [("Accuracy", _fmt(metrics["accuracy"])), (f"Top-{k} accuracy", _fmt(metrics.get("top_k_accuracy"))),
             ("Macro F1", _fmt(metrics["macro_avg"]["f1"])), ("Weighted F1", _fmt(metrics["weighted_avg"]["f1"])),
             ("Images", f"{metrics['n_images']:,}")]
    if metrics.get("images_per_second"):
        items.append(("Images / s", f"{metrics['images_per_second']:,.0f}"))
    return items


def _details(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    out = [(k, str(metrics[key])) for k, key in (("Checkpoint", "checkpoint"), ("Data", "dataset"),
                                                 ("Device", "device"), ("Test-time augmentation", "tta"))
           if metrics.get(key)]
    if metrics.get("n_failed"):
        out.append(("Unreadable files (skipped)", str(metrics["n_failed"])))
    if metrics.get("data_check"):
        out.append(("Duplicates in the data", str(metrics["data_check"])))
    if metrics.get("model_choice"):
        out.append(("What the run chose", str(metrics["model_choice"])))
    if metrics.get("excluded_classes"):
        ex = metrics["excluded_classes"]
        out.append(("Classes left out (--shared-classes)",
                    f"checkpoint only: {', '.join(ex.get('checkpoint_only', [])) or 'none'}; "
                    f"data only: {', '.join(ex.get('data_only', [])) or 'none'}"))
    if metrics.get("predicted_outside_shared"):
        out.append(("Images whose unrestricted top class is not in the data",
                    str(metrics["predicted_outside_shared"])))
    unknown = metrics.get("unknown")
    if unknown:
        out.append((f"Unknown ({unknown['rule']} >= {unknown['threshold']:.4g})",
                    f"{unknown['accepted']:,} accepted, {unknown['rejected']:,} rejected; accuracy on the accepted "
                    f"{_fmt(unknown['accuracy_accepted'])}"))
    return out


def _class_rows(metrics: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """(name, precision/recall/F1/support, is an average) for each class, then the macro and weighted averages."""
    rows = [(name, row, False) for name, row in metrics["per_class"].items()]
    return rows + [(label, metrics[key], True) for label, key in (("macro avg", "macro_avg"),
                                                                    ("weighted avg", "weighted_avg"))]


def write_markdown(metrics: dict[str, Any], out_path: str | os.PathLike, figures: dict[str, str],
                   confusions: Sequence[tuple[str, str, int, float]] = (), title: str = "Evaluation report") -> Path:
    """report.md: summary, details, per-class table, most confused pairs and links to the figures.

    ``figures`` maps a caption to a PNG path relative to the report's folder (kept in order).
    """
    summary = _summary_items(metrics)
    lines = [f"# {title}", "", "| " + " | ".join(k for k, _ in summary) + " |", "|" + "---:|" * len(summary),
             "| " + " | ".join(v for _, v in summary) + " |", ""]
    for key, value in _details(metrics):
        lines.append(f"- **{key}:** {value}")
    lines += ["", "## Per class", "", "| class | precision | recall | F1 | support |", "|---|---:|---:|---:|---:|"]
    for name, row, average in _class_rows(metrics):
        label = f"*{name}*" if average else name
        lines.append(f"| {label} | {_fmt(row['precision'])} | {_fmt(row['recall'])} | {_fmt(row['f1'])} | "
                     f"{row['support']} |")
    if confusions:
        lines += ["", "## Most confused", "", "| true | predicted as | images | share of true class |",
                  "|---|---|---:|---:|"]
        lines += [f"| {t} | {p} | {n} | {s:.1%} |" for t, p, n, s in confusions]
    for caption, rel in figures.items():
        lines += ["", f"## {caption}", "", f"![{caption}]({rel})"]
    lines += ["", f"<sub>generated {datetime.now():%Y-%m-%d %H:%M} by vit_flowers.evaluate</sub>", ""]
    out_path = Path(out_path)
    out_path.write_text("\n".join(lines))
    return out_path


# ---------------------------------------------------------------------------------------------- html

CSS = """
:root { --fg:#1f2328; --muted:#656d76; --line:#d0d7de; --bg:#f6f8fa; --accent:#0969da; --good:#1a7f37; --bad:#cf222e; }
* { box-sizing: border-box; }
body { font: 15px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", Helvetica, Arial, sans-serif;
       color: var(--fg); margin: 0; background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 32px 48px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 36px 0 12px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
.sub { color: var(--muted); margin: 0 0 22px; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 12px; }
.card { background: var(--bg); border: 1px solid var(--line); border-radius: 10px; padding: 14px 16px; }
.card .v { font-size: 26px; font-weight: 600; }
.card .k { color: var(--muted); font-size: 13px; text-transform: uppercase; letter-spacing: .04em; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 18px; margin: 18px 0 0; font-size: 14px; }
dt { color: var(--muted); } dd { margin: 0; word-break: break-all; }
table { border-collapse: collapse; width: 100%; font-size: 14px; }
th, td { padding: 6px 10px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: var(--bg); font-weight: 600; }
tr.avg td { font-style: italic; color: var(--muted); }
td.bar { width: 38%; text-align: left; }
table.compact { width: auto; min-width: 55%; }
table.compact td:nth-child(2), table.compact th:nth-child(2) { text-align: left; }
.bar span { display: inline-block; height: 10px; border-radius: 5px; vertical-align: middle; }
.bar .good { background: var(--good); } .bar .mid { background: #d4a72c; } .bar .low { background: var(--bad); }
figure { margin: 0; } figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 8px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
footer { color: var(--muted); font-size: 12px; margin-top: 40px; }
"""


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def _bar(value: float) -> str:
    cls = "good" if value >= 0.8 else "mid" if value >= 0.5 else "low"
    return f'<td class="bar"><span class="{cls}" style="width:{max(value, 0.0) * 100:.1f}%"></span></td>'


def write_html(metrics: dict[str, Any], out_path: str | os.PathLike, figures: Mapping[str, str | os.PathLike],
               confusions: Sequence[tuple[str, str, int, float]] = (), title: str = "Evaluation report",
               cells: str = "") -> Path:
    """A self-contained report.html: the same content as report.md, figures embedded as base64 PNGs.

    ``figures`` maps a caption to a PNG path (absolute, or relative to the report's folder); ``cells``: the
    confusion matrix whose counts open their photos, with its style
    (:func:`~vit_flowers.reporting.confusion_cells.confusion_html`).
    """
    out_path = Path(out_path)
    esc = html.escape
    cards = "".join(f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div></div>'
                    for k, v in _summary_items(metrics))
    details = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in _details(metrics))
    rows = []
    for name, r, average in _class_rows(metrics):
        opening, bar = ('<tr class="avg">', "<td></td>") if average else ("<tr>", _bar(r["f1"]))
        rows.append(f"{opening}<td>{esc(name)}</td><td>{_fmt(r['precision'])}</td><td>{_fmt(r['recall'])}</td>"
                    f"<td>{_fmt(r['f1'])}</td>{bar}<td>{r['support']:,}</td></tr>")
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="sub">{esc(str(metrics.get("dataset", "")))}</p>',
        f'<div class="cards">{cards}</div>', f"<dl>{details}</dl>",
        "<h2>Per class</h2>",
        "<table><thead><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th></th><th>support</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>",
    ]
    if cells:
        parts.append(f"<h2>Confusion matrix: click a count to see its photos</h2>{cells}")
    if confusions:
        parts.append('<h2>Most confused</h2><table class="compact"><thead><tr><th>true</th><th>predicted as</th>'
                     "<th>images</th><th>share of true class</th></tr></thead><tbody>")
        parts += [f"<tr><td>{esc(t)}</td><td>{esc(p)}</td><td>{n:,}</td><td>{s:.1%}</td></tr>"
                  for t, p, n, s in confusions]
        parts.append("</tbody></table>")
    for caption, png in figures.items():
        png = Path(png) if Path(png).is_absolute() else out_path.parent / png
        if not png.is_file():
            logger.warning("figure %s not found: left out of %s", png, out_path)
            continue
        parts.append(f'<h2>{esc(caption)}</h2><figure><img alt="{esc(caption)}" src="{_data_uri(png)}">'
                     f"<figcaption>{esc(png.name)}</figcaption></figure>")
    parts.append(f"<footer>generated {datetime.now():%Y-%m-%d %H:%M} by vit_flowers.evaluate</footer>")
    parts.append("</main></body></html>")
    out_path.write_text("\n".join(parts))
    return out_path


def thumbnail(path: str | os.PathLike, fallback: np.ndarray, size: int = 192) -> np.ndarray:
    """The file at ``path`` as an RGB array of at most ``size`` px (sharper than the model's input), or
    ``fallback`` when it cannot be read."""
    from ..data.images import ImageLoadError, load_image

    try:
        img = load_image(path)
    except ImageLoadError:
        return fallback
    img.thumbnail((size, size), Image.Resampling.LANCZOS)
    return np.asarray(img)
