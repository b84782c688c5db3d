"""How a model does on labelled photos: its predictions on a dataset in memory or on files streamed from a
folder (classes matched by name), the metrics, the most confident mistakes, and the report's files
(:mod:`vit_flowers.reporting.report`). The evaluate command (:mod:`vit_flowers.evaluate`) and training's final
report use it:

    metrics = evaluate_dataset(model, val_set, ckpt, run_dir / "report", device=device, run_dir=run_dir)
"""
from __future__ import annotations

import csv
import difflib
import heapq
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from sklearn.metrics import classification_report, confusion_matrix, top_k_accuracy_score
from tqdm.auto import tqdm

from ..data.datasets import TensorImageDataset
from ..data.images import printable_name
from ..data.progress import tracked
from ..data.splits import SPLIT_SYNONYMS
from ..inference.batches import Classifier, predict_files, score_batch
from ..inference.unknown import UnknownRule, rule_from_checkpoint
from ..runs import folders as runs
from ..runs.checkpoint import ModelFacts, kept_weights
from . import report

__all__ = ["ClassMismatchError", "EvalResult", "KnownOutputs", "match_classes", "evaluate_dataset",
           "evaluate_model_on_dataset", "evaluate_files", "default_top_k", "compute_metrics", "unknown_metrics",
           "write_report"]

logger = logging.getLogger(__name__)

MAX_MISTAKES = 18  # most confident mistakes kept for misclassified.png


class ClassMismatchError(ValueError):
    """The data's classes differ from the checkpoint's; the message lists both sides."""


@dataclass
class EvalResult:
    """Predictions on an evaluation set: everything the report is made from."""

    classes: list[str]  # evaluated classes (= the checkpoint's, or the shared ones)
    y_true: np.ndarray  # (N,) int, index into classes
    probs: np.ndarray  # (N, C) float32
    paths: list[str] | None  # source file of each image, when from disk
    seconds: float  # wall-clock time of decoding + inference
    mistakes: list[report.Mistake] = field(default_factory=list)  # most confident first
    failed: list[tuple[str, str]] = field(default_factory=list)  # unreadable files and why
    predicted_outside: int | None = None  # --shared-classes: top class of the full model not in `classes`
    known: np.ndarray | None = None  # (N,) the unknown rule's scores (None: no rule)
    unknown: UnknownRule | None = None  # the rule: a score below its threshold rejects the image

    @property
    def y_pred(self) -> np.ndarray:
        return self.probs.argmax(axis=1)


class KnownOutputs(NamedTuple):
    """A model's fp32 outputs of every image of a dataset, in order, computed before the evaluation (training's
    unknown rule reads them: :func:`vit_flowers.inference.calibration.calibration`), without TTA."""

    logits: np.ndarray  # (N, C)
    features: np.ndarray  # (N, dim): the unknown rule's (the mean of the patch tokens)
    seconds: float  # what computing them took (the report's images / s)


# ---------------------------------------------------------------------------------------------- classes


def match_classes(data_classes: Sequence[str], model_classes: Sequence[str], shared: bool = False,
                  where: str = "the data") -> list[str]:
    """The classes to evaluate, in the checkpoint's order.

    Same set (in any order): the checkpoint's classes. Otherwise raise `ClassMismatchError` listing the
    classes only in the data, only in the checkpoint, and likely renames; with ``shared``, return the
    shared classes (error if there are none).
    """
    data_set, model_set = set(data_classes), set(model_classes)
    if data_set == model_set:
        return list(model_classes)
    data_only = sorted(data_set - model_set)
    model_only = sorted(model_set - data_set)
    common = [c for c in model_classes if c in data_set]
    if shared:
        if not common:
            raise ClassMismatchError(f"{where} shares no class with the checkpoint: data classes "
                                     f"{sorted(data_set)}, checkpoint classes {list(model_classes)}")
        logger.warning("evaluating the %d shared classes only (%s); left out: only in the data %s, only in the "
                       "checkpoint %s", len(common), ", ".join(common), data_only or "none", model_only or "none")
        return common
    renames = []
    for name in data_only:
        close = difflib.get_close_matches(name, model_only, n=1, cutoff=0.6) or [
            m for m in model_only if m.lower() == name.lower()]
        if close:
            renames.append(f"'{name}' -> '{close[0]}'?")
    lines = [f"the classes of {where} differ from the checkpoint's:",
             f"  only in the data:       {', '.join(data_only) or 'none'}",
             f"  only in the checkpoint: {', '.join(model_only) or 'none'}"]
    if renames:
        lines.append(f"  possibly renamed:       {', '.join(renames)}")
    if any(name.lower() in synonyms for name in data_set for synonyms in SPLIT_SYNONYMS.values()):
        lines.append("  (the folder has train/val/test sub-folders: point --data at one of them)")
    lines.append(f"rename the folders to match, or pass --shared-classes to evaluate on the {len(common)} shared "
                 f"class(es){': ' + ', '.join(common) if common else ''}")
    raise ClassMismatchError("\n".join(lines))


def _class_mapping(data_classes: Sequence[str], model_classes: Sequence[str], shared: bool,
                   where: str) -> tuple[list[str], dict[int, int], list[int]]:
    """(evaluated classes, data label -> evaluated label, model output column of each evaluated class)."""
    classes = match_classes(data_classes, model_classes, shared, where)
    to_eval = {list(data_classes).index(c): i for i, c in enumerate(classes)}
    return classes, to_eval, [list(model_classes).index(c) for c in classes]


# ---------------------------------------------------------------------------------------------- predicting


class _MistakeHeap:
    """Keeps the ``k`` most confident mistakes seen so far (images copied, so memory stays bounded)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.heap: list[tuple[float, int, report.Mistake]] = []
        self.count = 0

    def add(self, images: torch.Tensor, y_true: np.ndarray, probs: np.ndarray, paths: Sequence[str] | None) -> None:
        pred = probs.argmax(axis=1)
        conf = probs.max(axis=1)
        for i in np.flatnonzero(pred != y_true):
            self.count += 1
            item = (float(conf[i]), self.count)
            if len(self.heap) >= self.k and item <= self.heap[0][:2]:
                continue
            image = images[i].permute(1, 2, 0).numpy().copy()  # (H, W, 3)
            m = report.Mistake(image, int(y_true[i]), int(pred[i]), float(conf[i]), paths[int(i)] if paths else None)
            entry = (*item, m)
            if len(self.heap) < self.k:
                heapq.heappush(self.heap, entry)
            else:
                heapq.heapreplace(self.heap, entry)

    def most_confident(self) -> list[report.Mistake]:
        return [m for *_, m in sorted(self.heap, key=lambda e: e[:2], reverse=True)]


def _collect(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor, np.ndarray, list[str] | None, np.ndarray | None]],
    classes: list[str],
    columns: list[int],
    num_model_classes: int,
) -> tuple[np.ndarray, np.ndarray, list[str], list[report.Mistake], int | None, np.ndarray | None]:
    """Gather (y_true, probs over `classes`, paths, mistakes, predicted_outside, unknown scores or None) from
    batches of (uint8 images, full model probs, y_true, paths, unknown scores or None)."""
    restrict = len(columns) < num_model_classes  # --shared-classes: renormalise over the shared ones
    ys, ps, all_paths, known = [], [], [], []
    heap = _MistakeHeap(MAX_MISTAKES)
    outside = 0
    for images, probs_full, y, paths, scores in batches:
        shared = probs_full[:, columns]  # (B, C') in the order of `classes`
        if restrict:
            outside += int((~np.isin(probs_full.argmax(1).numpy(), columns)).sum())
            shared = shared / shared.sum(dim=1, keepdim=True).clamp_min(1e-12)  # renormalise over the shared classes
        probs = shared.numpy()
        heap.add(images, y, probs, paths)
        ys.append(y)
        ps.append(probs)
        all_paths.extend(paths or [])
        if scores is not None:
            known.append(scores)
    y_true = np.concatenate(ys) if ys else np.empty(0, dtype=np.int64)
    probs = np.concatenate(ps) if ps else np.empty((0, len(classes)), dtype=np.float32)
    scores = np.concatenate(known) if known else None
    return y_true, probs, all_paths, heap.most_confident(), (outside if restrict else None), scores


def evaluate_model_on_dataset(
    model: Classifier, dataset: TensorImageDataset, *, mean: Sequence[float], std: Sequence[float],
    device: torch.device | str, batch_size: int = 256, model_classes: Sequence[str] | None = None,
    shared_classes: bool = False, progress: bool = False, tta: bool = False, amp_dtype: torch.dtype | None = None,
    unknown: UnknownRule | None = None, outputs: KnownOutputs | None = None,
) -> EvalResult:
    """Predict every image of an in-memory dataset (labels index ``dataset.classes``); ``tta``: flip TTA;
    ``amp_dtype``: autocast dtype (None: fp32); ``unknown``: the rule whose scores are kept. ``outputs``: the
    model's fp32 outputs of every image of ``dataset``, already computed: read instead of running the model
    (neither ``tta`` nor ``amp_dtype`` then)."""
    if outputs is not None and (tta or amp_dtype is not None):
        raise ValueError("outputs computed without TTA in fp32 cannot stand for a pass with tta or amp_dtype")
    model_classes = list(model_classes or dataset.classes)
    classes, to_eval, columns = _class_mapping(dataset.classes, model_classes, shared_classes, "the dataset")
    labels = dataset.labels.numpy()
    keep = np.flatnonzero(np.isin(labels, list(to_eval)))
    lut = np.full(len(dataset.classes), -1)
    lut[list(to_eval)] = list(to_eval.values())

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray, list[str] | None, np.ndarray | None]]:
        starts = range(0, len(keep), batch_size)
        for s in tracked(tqdm(starts, desc="evaluate", unit="batch", leave=False, disable=None if progress else True),
                         "the report: predicting the photos", len(starts)):
            idx = keep[s:s + batch_size]
            images = dataset.images[idx]  # (B, 3, S, S)
            paths = [dataset.paths[i] for i in idx] if dataset.paths else None
            if outputs is None:
                probs, scores = score_batch(model, images, mean, std, device, tta, amp_dtype, unknown)
            else:
                probs, scores = _scored(outputs.logits[idx], outputs.features[idx], unknown)
            yield images, probs, lut[labels[idx]], paths, scores

    start = time.perf_counter()
    y_true, probs, paths, mistakes, outside, known = _collect(batches(), classes, columns, len(model_classes))
    seconds = time.perf_counter() - start + (outputs.seconds if outputs is not None else 0.0)
    return EvalResult(classes, y_true, probs, paths or None, seconds, mistakes, [], outside, known, unknown)


def _scored(logits: np.ndarray, features: np.ndarray,
            unknown: UnknownRule | None) -> tuple[torch.Tensor, np.ndarray | None]:
    """What :func:`~vit_flowers.inference.batches.score_batch` gives for these fp32 outputs of a batch: (class
    probabilities (B, C), the ``unknown`` rule's scores or None)."""
    scores = unknown.scores(logits, features if unknown.needs_features else None) if unknown is not None else None
    return torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32)).softmax(dim=-1), scores


def evaluate_files(
    model: Classifier, samples: Sequence[tuple[str | os.PathLike, int]], data_classes: Sequence[str], *,
    model_classes: Sequence[str], image_size: int, mean: Sequence[float], std: Sequence[float],
    device: torch.device | str, batch_size: int = 128, shared_classes: bool = False, where: str = "the data",
    progress: bool = True, tta: bool = False, amp_dtype: torch.dtype | None = None,
    unknown: UnknownRule | None = None,
) -> EvalResult:
    """Predict labelled image files, streamed in batches (memory bounded by two batches of images).

    ``samples`` are (path, index into ``data_classes``), as from `data.splits.scan_class_folders`. Unreadable files
    are logged, listed in ``EvalResult.failed`` and left out of the metrics.
    """
    model_classes = list(model_classes)
    classes, to_eval, columns = _class_mapping(data_classes, model_classes, shared_classes, where)
    samples = [(Path(p), to_eval[y]) for p, y in samples if y in to_eval]
    if not samples:
        raise ValueError(f"no images to evaluate in {where}")
    failed: list[tuple[str, str]] = []

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray, list[str] | None, np.ndarray | None]]:
        for batch, probs, scores in predict_files(model, [p for p, _ in samples], image_size=image_size, mean=mean,
                                                  std=std, device=device, batch_size=batch_size, progress=progress,
                                                  tta=tta, amp_dtype=amp_dtype, unknown=unknown):
            failed.extend((str(e.path), e.reason) for e in batch.errors)
            yield batch.images, probs, np.array([samples[i][1] for i in batch.indices], dtype=np.int64), \
                [str(p) for p in batch.paths], scores

    start = time.perf_counter()
    y_true, probs, paths, mistakes, outside, known = _collect(batches(), classes, columns, len(model_classes))
    seconds = time.perf_counter() - start
    if failed:
        logger.warning("%d of %d files could not be read and are left out:\n  %s", len(failed), len(samples),
                       "\n  ".join(f"{p}: {r}" for p, r in failed[:20]) + ("\n  ..." if len(failed) > 20 else ""))
    if len(y_true) == 0:
        raise ValueError(f"none of the {len(samples)} images in {where} could be read")
    return EvalResult(classes, y_true, probs, paths, seconds, mistakes, failed, outside, known, unknown)


# ---------------------------------------------------------------------------------------------- metrics


def default_top_k(num_classes: int) -> int:
    """5 for many classes; 2 for a handful (top-5 of 5 classes is always 100%)."""
    return 5 if num_classes > 10 else min(2, num_classes)


def compute_metrics(result: EvalResult, top_k: int | None = None) -> dict[str, Any]:
    """Accuracy, top-k accuracy, per-class precision / recall / F1 / support, macro and weighted averages,
    all from sklearn. ``top_k`` (default `default_top_k`) is capped at the number of classes."""
    n_classes = len(result.classes)
    labels = list(range(n_classes))
    y_true, y_pred = result.y_true, result.y_pred
    k = max(1, min(top_k or default_top_k(n_classes), n_classes))
    rep = classification_report(y_true, y_pred, labels=labels, target_names=result.classes, output_dict=True,
                                zero_division=0)
    if k == n_classes:
        top = 1.0  # every class is in the top k
    elif k == 1:
        top = float(rep["accuracy"])
    else:
        top = float(top_k_accuracy_score(y_true, result.probs, k=k, labels=labels))

    def row(d: dict[str, float]) -> dict[str, Any]:
        return {"precision": float(d["precision"]), "recall": float(d["recall"]), "f1": float(d["f1-score"]),
                "support": int(d["support"])}

    n = len(y_true)
    metrics: dict[str, Any] = {
        "accuracy": float(rep["accuracy"]),
        "top_k": k,
        "top_k_accuracy": top,
        "n_images": n,
        "n_failed": len(result.failed),
        "images_per_second": n / result.seconds if result.seconds > 0 else None,
        "seconds": result.seconds,
        "classes": list(result.classes),
        "per_class": {name: row(rep[name]) for name in result.classes},
        "macro_avg": row(rep["macro avg"]),
        "weighted_avg": row(rep["weighted avg"]),
    }
    if result.predicted_outside is not None:
        metrics["predicted_outside_shared"] = result.predicted_outside
    if result.unknown is not None and result.known is not None:
        metrics["unknown"] = unknown_metrics(result)
    return metrics


def unknown_metrics(result: EvalResult) -> dict[str, Any]:
    """What the unknown rule does on these images (all of known classes): how many it accepts and rejects, and
    the accuracy on those it accepts."""
    rule, known = result.unknown, result.known
    if rule is None or known is None:
        raise ValueError("unknown_metrics: the result has no unknown rule")
    accepted, right = ~rule.rejects(known), np.asarray(result.y_pred == result.y_true)
    return {"rule": rule.rule, "threshold": rule.threshold, "accepted": int(accepted.sum()),
            "rejected": int((~accepted).sum()), "accepted_fraction": float(accepted.mean()) if accepted.size else None,
            "accuracy_accepted": float(right[accepted].mean()) if accepted.any() else None}


def write_report(
    result: EvalResult,
    out_dir: str | os.PathLike,
    *,
    top_k: int | None = None,
    title: str = "Evaluation report",
    info: dict[str, Any] | None = None,
    run_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Write every report file of ``result`` into ``out_dir`` and return the metrics.

    Files: metrics.json, predictions.csv, confusion_matrix.png / .csv, classification_report.txt,
    misclassified.png, report.md, report.html (+ training_curves.png when ``run_dir`` has a metrics.csv).
    ``info`` adds keys to metrics.json (checkpoint, dataset, device, ...).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    classes = result.classes
    metrics = {**(info or {}), **compute_metrics(result, top_k)}
    labels = list(range(len(classes)))
    cm = confusion_matrix(result.y_true, result.y_pred, labels=labels)  # (C, C) rows = true

    (out / "metrics.json").write_text(json.dumps(_finite(metrics), indent=2, allow_nan=False) + "\n")
    (out / "classification_report.txt").write_text(
        classification_report(result.y_true, result.y_pred, labels=labels, target_names=classes, digits=4,
                              zero_division=0))
    report.write_confusion_csv(cm, classes, out / "confusion_matrix.csv")
    report.plot_confusion_matrix(cm, classes, out / "confusion_matrix.png",
                                 title=f"{metrics.get('dataset', '')}  ·  accuracy {metrics['accuracy']:.1%}")
    mistakes = [report.Mistake(report.thumbnail(m.path, m.image) if m.path else m.image, m.true, m.pred,
                               m.confidence, m.path) for m in result.mistakes]
    report.plot_mistakes(mistakes, classes, out / "misclassified.png")
    _write_predictions(result, out / "predictions.csv")

    figures = {"Confusion matrix": "confusion_matrix.png", "Most confident mistakes": "misclassified.png"}
    if run_dir is not None and (Path(run_dir) / runs.METRICS).is_file():
        try:
            if _training_curves(Path(run_dir), out / "training_curves.png"):
                figures["Training curves"] = "training_curves.png"
        except (OSError, ValueError) as exc:
            logger.warning("could not plot the training curves of %s: %s", run_dir, exc)
    confusions = report.top_confusions(cm, classes)
    report.write_markdown(metrics, out / "report.md", figures, confusions, title)
    report.write_html(metrics, out / "report.html", figures, confusions, title, _cells_html(result))
    _log_summary(metrics)
    logger.info("report written to %s (open %s)", out, out / "report.html")
    return metrics


def _cells_html(result: EvalResult) -> str:
    """The confusion matrix whose counts open their photos (files only: none for in-memory images)."""
    from .confusion_cells import CONFUSION_CSS, CellPhoto, confusion_html

    if not result.paths:
        return ""
    confidence = result.probs.max(axis=1)
    photos = [CellPhoto(str(path), result.classes[t], result.classes[p], float(c))
              for path, t, p, c in zip(result.paths, result.y_true, result.y_pred, confidence)]
    return f"<style>{CONFUSION_CSS}</style>" + confusion_html(result.classes, photos)


def _finite(value: Any) -> Any:
    """``value`` (metrics: dicts, lists, numbers) with every NaN or infinite float as None: JSON has no NaN."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _training_curves(run_dir: Path, png: Path) -> bool:
    """The run's training curves into ``png``: its curves.png copied when drawn after its metrics.csv was last
    written (training draws it after each epoch's row, from the same rows: the figure once, not twice), else
    drawn from metrics.csv. False when there is nothing to draw yet."""
    metrics, drawn = run_dir / runs.METRICS, run_dir / runs.CURVES
    if drawn.is_file() and drawn.stat().st_mtime_ns >= metrics.stat().st_mtime_ns:
        shutil.copyfile(drawn, png)
        return True
    return report.plot_training_curves(metrics, png, kept_weights(run_dir)) is not None


def _write_predictions(result: EvalResult, path: Path) -> None:
    """One row per image: path (or index), true and predicted class, confidence, correct; with an unknown rule, its
    score and whether it rejects the image (1: ``unknown``; the same test as metrics.json's counts)."""
    known, rule = result.known, result.unknown
    rejected = rule.rejects(known) if rule is not None and known is not None else None
    with open(path, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
        writer = csv.writer(f)
        writer.writerow(["path" if result.paths else "index", "true", "predicted", "confidence", "correct"]
                        + (["known_score", "unknown"] if rejected is not None else []))
        for i, (t, p, conf) in enumerate(zip(result.y_true, result.y_pred, result.probs.max(axis=1))):
            extra = [f"{known[i]:.6g}", int(rejected[i])] if known is not None and rejected is not None else []
            writer.writerow([printable_name(result.paths[i]) if result.paths else i, result.classes[t],
                             result.classes[p], f"{conf:.4f}", int(t == p), *extra])
        blank = ["", ""] if rejected is not None else []
        for p, reason in result.failed:
            writer.writerow([printable_name(p), "", "", "", f"error: {reason}", *blank])


def _log_summary(metrics: dict[str, Any]) -> None:
    width = max(12, *(len(c) for c in metrics["per_class"]))
    ips = metrics.get("images_per_second")
    lines = [f"accuracy {metrics['accuracy']:.2%} | top-{metrics['top_k']} {metrics['top_k_accuracy']:.2%} | "
             f"macro F1 {metrics['macro_avg']['f1']:.3f} | {metrics['n_images']:,} images"
             + (f" | {ips:,.0f} images/s" if ips else "")]
    found = metrics.get("unknown")
    if found:
        accuracy = found["accuracy_accepted"]
        lines.append(f"unknown ({found['rule']} >= {found['threshold']:.4g}): {found['accepted']:,} accepted, "
                     f"{found['rejected']:,} rejected as unknown; accuracy on the accepted "
                     + (f"{accuracy:.2%}" if accuracy is not None else "n/a"))
    lines.append(f"{'class':<{width}}  precision  recall     F1  support")
    for name, r in [*metrics["per_class"].items(), ("macro avg", metrics["macro_avg"]),
                    ("weighted avg", metrics["weighted_avg"])]:
        lines.append(f"{name:<{width}}  {r['precision']:9.3f}  {r['recall']:6.3f}  {r['f1']:5.3f}  {r['support']:7,}")
    logger.info("\n".join(lines))


# ---------------------------------------------------------------------------------------------- entry points


def evaluate_dataset(
    model: Classifier,
    dataset: TensorImageDataset,
    ckpt: ModelFacts,
    out_dir: str | os.PathLike,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 256,
    top_k: int | None = None,
    run_dir: str | os.PathLike | None = None,
    progress: bool = False,
    title: str | None = None,
    info: dict[str, Any] | None = None,
    outputs: KnownOutputs | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` (on ``device``, eval mode) on an in-memory dataset and write the full report into
    ``out_dir``; returns the metrics (as in metrics.json).

    ``ckpt`` is the model's checkpoint (``classes``, ``mean``, ``std``; the model's outputs follow
    ``ckpt["classes"]``, the dataset's labels follow ``dataset.classes``; the two must name the same classes).
    ``run_dir``: the training run folder, whose metrics.csv is plotted into the report. ``outputs``: the model's
    outputs of ``dataset`` already computed (:func:`evaluate_model_on_dataset`).
    """
    result = evaluate_model_on_dataset(model, dataset, mean=ckpt["mean"], std=ckpt["std"], device=device,
                                       batch_size=batch_size, model_classes=ckpt["classes"], progress=progress,
                                       unknown=rule_from_checkpoint(ckpt), outputs=outputs)
    run_name = Path(run_dir).name if run_dir is not None else None
    info = {"checkpoint": str(Path(run_dir) / runs.BEST) if run_dir is not None and run_name else None,
            "dataset": f"validation set, {len(dataset):,} images", "device": str(device), **(info or {})}
    title = title or (f"Evaluation of {run_name}" if run_name else "Evaluation report")
    return write_report(result, out_dir, top_k=top_k, title=title, info=info, run_dir=run_dir)
