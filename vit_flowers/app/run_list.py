"""The runs the web app's model selector lists: the finished runs of one folder (where runs live), each with its
name, classes, validation accuracy and date, read from the run's own files without loading a model."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..runs import folders as runs

__all__ = ["RunInfo", "list_runs", "run_info"]


@dataclass(frozen=True)
class RunInfo:
    """One finished run: its folder, its classes, its validation accuracy (None when its files do not say) and when
    its best.pt was written."""

    path: Path
    classes: tuple[str, ...]
    accuracy: float | None
    date: datetime

    @property
    def label(self) -> str:
        """The selector's line: name, classes, accuracy, date."""
        accuracy = f"{self.accuracy:.1%}" if self.accuracy is not None else "accuracy ?"
        return (f"{self.path.name} · {len(self.classes)} classes ({', '.join(self.classes)}) · {accuracy} · "
                f"{self.date:%Y-%m-%d %H:%M}")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _best_val_accuracy(run_dir: Path) -> float | None:
    try:
        rows = runs.read_metrics(run_dir / runs.METRICS)
    except OSError:
        return None
    scores = [v for row in rows for v in (row.get("val_acc", math.nan), row.get("val_acc_ema", math.nan))
              if math.isfinite(v)]
    return max(scores) if scores else None


def run_info(run_dir: Path) -> RunInfo | None:
    """``run_dir`` as the selector lists it, or None when it is no finished run: no best.pt, or the app's Train tab
    is still filling it (:data:`~vit_flowers.runs.folders.IN_PROGRESS`, also left by an app stopped mid-training)."""
    best = run_dir / runs.BEST
    if not best.is_file() or (run_dir / runs.IN_PROGRESS).exists():
        return None
    report = _json(run_dir / runs.REPORT / "metrics.json")
    classes = report.get("classes") or _json(run_dir / runs.SPLIT).get("classes") or []
    accuracy = report.get("accuracy")
    return RunInfo(run_dir, tuple(map(str, classes)),
                   float(accuracy) if isinstance(accuracy, (int, float)) else _best_val_accuracy(run_dir),
                   datetime.fromtimestamp(best.stat().st_mtime))


def list_runs(folder: Path) -> list[RunInfo]:
    """The finished runs in ``folder`` (its sub-folders, not the ``latest`` link), the newest first."""
    try:
        dirs = [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    found = [info for info in map(run_info, dirs) if info is not None]
    return sorted(found, key=lambda info: info.date, reverse=True)
