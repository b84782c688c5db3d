"""The report.html of `vit-flowers check`: one self-contained page (thumbnails inlined as base64 JPEG, the
evaluation report's style, no request leaves the page) that a person reads in a minute: the counts first,
then the pairs of duplicates side by side (conflicting labels and leaks first), then the likely wrong labels
(most suspect first), then unreadable and tiny photos and the class counts."""

from __future__ import annotations

import base64
import html
import io
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ..data.image_files import printable_name
from ..reporting.report import CSS, thumbnail
from .photo_check import KINDS, TINY_SIDE

if TYPE_CHECKING:
    from .photo_check import CheckResult

__all__ = ["MAX_PAIRS", "MAX_ISSUES", "THUMB_SIZE", "write_check_html"]

MAX_PAIRS = 150  # pairs of duplicates shown (all are in duplicates.csv)
MAX_ISSUES = 100  # likely wrong labels shown (all are in label_issues.csv)
THUMB_SIZE = 160  # px, the longer side of a thumbnail: ~6 KB of JPEG

_EXTRA_CSS = """
.pairs, .issues { display: grid; grid-template-columns: repeat(auto-fill, minmax(340px, 1fr)); gap: 14px; }
.issues { grid-template-columns: repeat(auto-fill, minmax(180px, 1fr)); }
.item { border: 1px solid var(--line); border-radius: 10px; padding: 8px; background: var(--bg); font-size: 12px; }
.item .imgs { display: flex; gap: 6px; } .item img { width: 160px; height: 160px; object-fit: contain;
  background: #fff; border-radius: 6px; } .item .p { word-break: break-all; color: var(--muted); }
.kind-across_classes, .kind-across_split { color: var(--bad); font-weight: 600; }
"""
_GREY = np.full((THUMB_SIZE, THUMB_SIZE, 3), 200, dtype=np.uint8)  # in place of a photo that cannot be read


def _thumb(path: Path) -> str:
    """``path`` as an inline JPEG thumbnail (grey when it cannot be read)."""
    buffer = io.BytesIO()
    Image.fromarray(thumbnail(path, _GREY, THUMB_SIZE)).save(buffer, "JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(result: CheckResult, i: int) -> str:
    photos, esc = result.photos, html.escape
    name = esc(printable_name(photos.rel(i)))
    return f'<img alt="{name}" title="{name}" src="{_thumb(photos.paths[i])}">'


def _cards(result: CheckResult) -> str:
    counts = {kind: sum(p.kind == kind for p in result.pairs) for kind in KINDS}
    items = [("Photos", f"{len(result.photos.paths):,}"), ("Duplicate pairs", str(len(result.pairs))),
             ("Across classes", str(counts["across_classes"]))]
    if result.photos.sides is not None:
        items.append(("Across the split", str(counts["across_split"])))
    items += [("Likely wrong labels", "–" if result.issues is None else str(len(result.issues))),
              ("Unreadable", str(len(result.unreadable))), (f"Under {TINY_SIDE} px", str(len(result.tiny)))]
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="k">{k}</div><div class="v">{v}</div></div>' for k, v in items) + "</div>"


def _pairs(result: CheckResult) -> str:
    photos, esc = result.photos, html.escape
    order = sorted(result.pairs, key=lambda p: (KINDS.index(p.kind), -p.similarity))
    items = []
    for pair in order[:MAX_PAIRS]:
        a, b = (photos.classes[photos.labels[i]] for i in (pair.a, pair.b))
        items.append(f'<div class="item"><div class="imgs">{_figure(result, pair.a)}{_figure(result, pair.b)}</div>'
                     f'<div><span class="kind-{pair.kind}">{pair.kind.replace("_", " ")}</span> · {pair.match} · '
                     f'similarity {pair.similarity:.4f}</div><div class="p">{esc(printable_name(photos.rel(pair.a)))}'
                     f'<br>{esc(printable_name(photos.rel(pair.b)))}</div></div>')
    more = f"<p>… and {len(order) - MAX_PAIRS} more in duplicates.csv</p>" if len(order) > MAX_PAIRS else ""
    return (f"<h2>Duplicates ({len(order)} pairs)</h2><p class=\"sub\">Conflicting labels and train/val leaks "
            f"first, then the most similar. Byte-identical files have similarity 1.</p>"
            f'<div class="pairs">{"".join(items)}</div>{more}')


def _issues(result: CheckResult) -> str:
    if result.issues is None:
        return "<h2>Likely wrong labels</h2><p>Not looked for: every class needs 2 or more readable photos.</p>"
    photos, esc = result.photos, html.escape
    items = [f'<div class="item">{_figure(result, x.index)}<div>filed as <b>{esc(photos.classes[x.given])}</b>, '
             f'looks like <b>{esc(photos.classes[x.suggested])}</b> (score {x.score:.2f})</div>'
             f'<div class="p">{esc(printable_name(photos.rel(x.index)))}</div></div>'
             for x in result.issues[:MAX_ISSUES]]
    more = (f"<p>… and {len(result.issues) - MAX_ISSUES} more in label_issues.csv</p>"
            if len(result.issues) > MAX_ISSUES else "")
    return (f"<h2>Likely wrong labels ({len(result.issues)})</h2><p class=\"sub\">Most suspect first; score = the "
            f"probability of the suggested class minus that of the folder's, from a model that never saw the "
            f"photo.</p><div class=\"issues\">{''.join(items)}</div>{more}")


def _files_and_classes(result: CheckResult) -> str:
    photos, esc = result.photos, html.escape
    counts = np.bincount(photos.labels, minlength=len(photos.classes))
    rows = "".join(f"<tr><td>{esc(c)}</td><td>{n:,}</td></tr>" for c, n in zip(photos.classes, counts))
    parts = [f"<h2>Classes</h2><p>{counts.min():,}-{counts.max():,} photos a class (imbalance "
             f"{counts.max() / max(counts.min(), 1):.1f}x)</p>"
             f'<table class="compact"><thead><tr><th>class</th><th>photos</th></tr></thead><tbody>{rows}'
             f"</tbody></table>"]
    if result.unreadable:
        parts.append("<h2>Unreadable</h2><ul>" + "".join(
            f"<li>{esc(printable_name(photos.rel(i)))}: {esc(why)}</li>" for i, why in result.unreadable.items())
                     + "</ul>")
    if result.tiny:
        parts.append(f"<h2>Under {TINY_SIDE} px</h2><ul>" + "".join(
            f"<li>{esc(printable_name(photos.rel(i)))} ({w}x{h})</li>" for i, (w, h) in result.tiny.items())
                     + "</ul>")
    return "".join(parts)


def write_check_html(result: CheckResult, out_path: Path) -> Path:
    """The check's report.html (module docstring)."""
    title = f"Check of {printable_name(result.photos.root)}"
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{html.escape(title)}</title><style>{CSS}{_EXTRA_CSS}</style></head><body><main>",
             f"<h1>{html.escape(title)}</h1>",
             f'<p class="sub">{len(result.photos.classes)} classes · checked in {result.seconds:.0f} s · nothing '
             f"was moved (vit-flowers check --move-to)</p>",
             _cards(result), _pairs(result), _issues(result), _files_and_classes(result),
             f"<footer>generated {datetime.now():%Y-%m-%d %H:%M} by vit_flowers.check</footer></main></body></html>"]
    out_path.write_text("\n".join(parts), encoding="utf-8")
    return out_path
