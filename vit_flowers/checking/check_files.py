"""The folder a check writes (DIR/duplicates.csv, DIR/label_issues.csv, DIR/report.html), and what ``--move-to``
reads back from its CSVs, which a person may have edited since: the photos they flag."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ..data.duplicates import union_groups
from .photo_check import CheckResult

__all__ = ["DUPLICATES_CSV", "LABELS_CSV", "REPORT_HTML", "write_csv", "read_csv", "refuse_existing_check",
           "write_check", "Flagged", "flagged_files"]

DUPLICATES_CSV, LABELS_CSV, REPORT_HTML = "duplicates.csv", "label_issues.csv", "report.html"


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """``rows`` under ``header`` as the CSV ``path`` (UTF-8, a file name that is not keeps its bytes)."""
    with open(path, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def refuse_existing_check(out: Path, overwrite: bool) -> None:
    """FileExistsError when ``out`` holds a check (whose CSVs may have been edited by hand) and not ``overwrite``."""
    existing = [name for name in (DUPLICATES_CSV, LABELS_CSV, REPORT_HTML) if (out / name).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{out} already holds a check ({', '.join(existing)}): choose another --output, or "
                              f"--overwrite to replace it")


def write_check(result: CheckResult, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """DIR/duplicates.csv, DIR/label_issues.csv and DIR/report.html of ``result``; refuses a folder that holds
    a check already (its CSVs may be edited by hand for ``--move-to``) unless ``overwrite``."""
    from .check_report import write_check_html

    out = Path(out_dir)
    refuse_existing_check(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    photos, names = result.photos, result.photos.classes
    write_csv(out / DUPLICATES_CSV, ("path_a", "path_b", "kind", "similarity", "match"),
              [(photos.rel(p.a), photos.rel(p.b), p.kind, f"{p.similarity:.4f}", p.match) for p in result.pairs])
    write_csv(out / LABELS_CSV, ("path", "given_label", "suggested_label", "score"),
              [(photos.rel(x.index), names[x.given], names[x.suggested], f"{x.score:.4f}")
               for x in result.issues or ()])
    write_check_html(result, out / REPORT_HTML)
    return out


def read_csv(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    """The rows of a CSV that check wrote (perhaps edited since); ValueError naming the file when a column is
    missing."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `vit-flowers check PHOTOS --output {path.parent}` first")
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(missing)} (expected {', '.join(columns)})")
        return list(reader)


class Flagged(NamedTuple):
    """What a check's CSVs say of the photos they name, each by its path relative to PHOTOS as written there."""

    moves: dict[str, str]  # {path: why} of the photos to move
    kept: dict[str, str]  # {path: the duplicate it stands for} of the copy of each group of duplicates that stays


def flagged_files(from_dir: str | os.PathLike) -> Flagged:
    """The photos a check's (possibly edited) CSVs flag: every photo of a group of duplicates but its first (in path
    order), and every photo of label_issues.csv; and each group's first, the copy that stays (``--move-to`` checks
    it too: a row whose kept copy is not a photo of PHOTOS would leave no copy there)."""
    pairs = [(r["path_a"], r["path_b"], r["kind"]) for r in read_csv(Path(from_dir) / DUPLICATES_CSV,
                                                                      ("path_a", "path_b", "kind"))]
    names = sorted({p for a, b, _ in pairs for p in (a, b)})
    index = {p: i for i, p in enumerate(names)}
    kind_of = {p: kind for a, b, kind in pairs for p in (a, b)}
    groups = union_groups(len(names), [(index[a], index[b]) for a, b, _ in pairs])
    why = {names[i]: f"duplicate ({kind_of[names[i]]}) of {names[group[0]]}" for group in groups for i in group[1:]}
    kept = {names[group[0]]: names[group[1]] for group in groups}
    for row in read_csv(Path(from_dir) / LABELS_CSV, ("path", "given_label", "suggested_label")):
        why.setdefault(row["path"], f"label {row['given_label']}, looks like {row['suggested_label']}")
    return Flagged(why, kept)
