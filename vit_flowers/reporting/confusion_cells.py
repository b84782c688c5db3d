"""The confusion matrix whose cells open their photos: an HTML table where each count links to the photos of its
cell (thumbnail, true and predicted class, confidence), the worst first; static HTML (anchors and CSS ``:target``,
no script), so that report.html (a file, no server) and the web app's Model tab show the same."""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..data.images import printable_name
from .report import thumbnail

__all__ = ["CellPhoto", "PER_CELL", "read_predictions", "cells", "confusion_html", "CONFUSION_CSS"]

PER_CELL = 24  # the photos a cell shows (its worst); the count says how many it holds
THUMB = 96  # thumbnail size (px)

CONFUSION_CSS = """
table.vf-confusion td, table.vf-confusion th {text-align: center; padding: 4px 8px}
table.vf-confusion td.vf-diag a {font-weight: 700}
table.vf-confusion td.vf-off a {color: #dc2626; font-weight: 700}
.vf-cell {display: none} .vf-cell:target {display: block}
.vf-cell-photos {display: flex; flex-wrap: wrap; gap: 8px}
.vf-cell-photos figure {margin: 0; width: 96px} .vf-cell-photos img {width: 96px; height: 96px; object-fit: cover}
.vf-cell-photos figcaption {font-size: 12px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap}
"""


@dataclass(frozen=True)
class CellPhoto:
    """One photo of the matrix: its file, its true and predicted class, the model's confidence."""

    path: str
    true: str
    predicted: str
    confidence: float


def read_predictions(path: str | os.PathLike) -> list[CellPhoto]:
    """The photos of an evaluation's predictions.csv (rows without a file path, or that failed, left out).
    Raises OSError when it cannot be read."""
    photos = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                confidence = float(row.get("confidence") or "nan")
            except ValueError:
                continue
            if "path" in row and row.get("true") and row.get("predicted") and math.isfinite(confidence):
                photos.append(CellPhoto(row["path"], row["true"], row["predicted"], confidence))
    return photos


def cells(photos: Sequence[CellPhoto]) -> dict[tuple[str, str], list[CellPhoto]]:
    """The photos by (true, predicted) cell, the worst first: a mistake the most confident first, a right answer
    the least confident first."""
    out: dict[tuple[str, str], list[CellPhoto]] = {}
    for photo in photos:
        out.setdefault((photo.true, photo.predicted), []).append(photo)
    for (true, predicted), group in out.items():
        group.sort(key=lambda p: -p.confidence if true != predicted else p.confidence)
    return out


def _thumb_uri(path: str) -> str:
    pixels = thumbnail(path, np.full((THUMB, THUMB, 3), 128, np.uint8), THUMB)
    buf = io.BytesIO()
    Image.fromarray(pixels).convert("RGB").save(buf, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _anchor(prefix: str, i: int, j: int) -> str:
    return f"{prefix}-{i}-{j}"


def confusion_html(classes: Sequence[str], photos: Sequence[CellPhoto], prefix: str = "vf-cell",
                   per_cell: int = PER_CELL) -> str:
    """The matrix (rows: true class, columns: predicted) with each non-zero count a link to its cell's section,
    then the sections (hidden until linked to), each with its ``per_cell`` worst photos embedded. ``prefix``: the
    sections' id prefix (unique in the page)."""
    esc = html.escape
    by_cell = cells(photos)
    head = "".join(f"<th>{esc(c)}</th>" for c in classes)
    rows, sections = [], []
    for i, true in enumerate(classes):
        tds = []
        for j, predicted in enumerate(classes):
            group = by_cell.get((true, predicted), [])
            kind = "vf-diag" if i == j else "vf-off"
            if not group:
                tds.append(f'<td class="{kind}">0</td>')
                continue
            anchor = _anchor(prefix, i, j)
            tds.append(f'<td class="{kind}"><a href="#{anchor}" title="open these photos">{len(group)}</a></td>')
            shown = group[:per_cell]
            figures = "".join(  # printable_name: a file name that is not UTF-8 cannot be written into the page
                f'<figure title="{esc(printable_name(Path(p.path).name))}"><img src="{_thumb_uri(p.path)}" '
                f'alt="{esc(printable_name(Path(p.path).name))}"><figcaption>{esc(p.predicted)} '
                f"{p.confidence:.0%}</figcaption></figure>" for p in shown)
            what = "right" if i == j else "wrong"
            order = "the least confident first" if i == j else "the most confident first"
            more = f", the {len(shown)} worst shown" if len(group) > len(shown) else ""
            sections.append(f'<section class="vf-cell" id="{anchor}" data-true="{esc(true)}" '
                            f'data-predicted="{esc(predicted)}"><h3>{esc(true)} predicted as {esc(predicted)} '
                            f"({what}): {len(group)} photo(s), {order}{more}</h3>"
                            f'<div class="vf-cell-photos">{figures}</div></section>')
        rows.append(f"<tr><th>{esc(true)}</th>{''.join(tds)}</tr>")
    return (f'<table class="vf-confusion"><thead><tr><th>true \\ predicted</th>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>" + "".join(sections))
