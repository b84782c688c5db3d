"""Predictions of image files, one row per file, and the file they are written to: the files named on a command
line (folders searched, non-images kept aside as rows of their own), their top-k rows through a PyTorch model
(:func:`predict_images`) or an ONNX export (:func:`predict_images_onnx`, torch-free), errors included, and the
.csv / .json writer. Torch is imported only for a PyTorch model. The ``predict`` command
(:mod:`vit_flowers.predict`) and the app's folder tab use it:

    for rows in predict_images(model, collect_files(["holiday/"]), ckpt["classes"], image_size=ckpt["image_size"],
                               mean=ckpt["mean"], std=ckpt["std"]):
        writer.write(rows)  # writer = PredictionWriter(Path("predictions.csv"), top_k=3)
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ..data.image_files import IMAGE_EXTENSIONS, FileError, list_images, printable_name
from ..runs.folders import check_new_output
from . import TOP_K
from .unknown import UNKNOWN, UnknownRule

if TYPE_CHECKING:  # torch is imported only for a PyTorch checkpoint
    from .batches import Classifier, ImageBatch
    from .onnx_runtime import OnnxClassifier

__all__ = ["Prediction", "PredictionWriter", "collect_files", "skipped_rows", "predict_images", "predict_images_onnx"]

logger = logging.getLogger(__name__)


@dataclass
class Prediction:
    """The result for one file: ``top_k`` = [(label, probability)], best first; or an ``error``. ``label`` is the
    best class, or ``unknown`` when the unknown rule's ``known_score`` is below its threshold."""

    path: str
    label: str | None = None
    confidence: float | None = None
    top_k: list[tuple[str, float]] = field(default_factory=list)
    error: str | None = None
    known_score: float | None = None  # the unknown rule's score (None: no rule)


def collect_files(inputs: Sequence[str | os.PathLike], recursive: bool = False,
                  skipped_out: list[Path] | None = None) -> list[Path]:
    """Files named on the command line (whatever their extension) and the images inside named folders; the other
    files of those folders are appended to ``skipped_out`` when given.

    A path that does not exist is kept: it gets a "file not found" error row like any unreadable file.
    """
    files: list[Path] = []
    for item in map(Path, inputs):
        if not item.is_dir():
            files.append(item)
            continue
        images, skipped = list_images(item, recursive=recursive)
        if skipped_out is not None:
            skipped_out += skipped
        if skipped:
            names = ", ".join(printable_name(p.relative_to(item)) for p in skipped[:5]) + ", ..." * (len(skipped) > 5)
            logger.info("%s: skipped %d non-image file(s) (not %s): %s", printable_name(item),
                        len(skipped), " ".join(sorted(IMAGE_EXTENSIONS)), names)
        unsearched = not recursive and any(p.is_dir() and not p.name.startswith(".") for p in item.iterdir())
        if not images:
            logger.warning("no images found in %s%s", printable_name(item),
                           " (it has sub-folders: add --recursive to search them)" if unsearched else "")
        elif unsearched:
            logger.info("%s has sub-folders that were not searched: add --recursive to include them",
                        printable_name(item))
        files += images
    return files


def predict_images(
    model: Classifier,
    files: Sequence[str | os.PathLike],
    classes: Sequence[str],
    *,
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    device: Any = "cpu",
    top_k: int = TOP_K,
    batch_size: int = 64,
    progress: bool = False,
    tta: bool = False,
    amp_dtype: Any = None,
    unknown: UnknownRule | None = None,
    each_batch: Callable[[ImageBatch], object] | None = None,
) -> Iterator[list[Prediction]]:
    """Yield the predictions of each batch of ``files``, in input order, errors included; with an ``unknown``
    rule, a photo it rejects is labelled ``unknown``.

    ``each_batch`` is called with every decoded batch that holds a photo (its paths and pixels) before its rows
    are yielded: ``predict --attention`` draws its attention maps there.
    """
    from .batches import predict_files

    for batch, probs, scores in predict_files(model, files, image_size=image_size, mean=mean, std=std,
                                              device=device, batch_size=batch_size, progress=progress, tta=tta,
                                              amp_dtype=amp_dtype, unknown=unknown):
        if each_batch is not None and batch.paths:
            each_batch(batch)
        yield _rows(batch.paths, batch.indices, probs.numpy(), batch.errors, classes, top_k, scores, unknown)


def predict_images_onnx(
    model: OnnxClassifier,
    files: Sequence[str | os.PathLike],
    *,
    top_k: int = TOP_K,
    batch_size: int = 64,
    progress: bool = False,
    tta: bool = False,
) -> Iterator[list[Prediction]]:
    """:func:`predict_images` for an exported model, through ONNX Runtime (:mod:`vit_flowers.inference.onnx_runtime`)
    and torch-free pixels: the same rows, errors included."""
    from .onnx_runtime import predict_files

    paths = [Path(f) for f in files]
    with tqdm(total=len(paths), desc="predict", unit="img", disable=None if progress else True, leave=False) as bar:
        for indices, probs, errors, scores in predict_files(model, paths, batch_size=batch_size, tta=tta):
            bar.update(len(indices) + len(errors))
            yield _rows([paths[i] for i in indices], indices, probs, errors, model.classes, top_k, scores,
                        model.unknown)


def skipped_rows(skipped: Sequence[Path]) -> list[Prediction]:
    """A row for each file of a folder that was not predicted because its extension is not an image's."""
    return [Prediction(str(p), error=f"skipped: not an image file by its extension ({p.suffix or 'none'}; "
                                     f"images are {' '.join(sorted(IMAGE_EXTENSIONS))})") for p in skipped]


def _rows(paths: Sequence[Path], indices: Sequence[int], probs: np.ndarray, errors: Sequence[FileError],
          classes: Sequence[str], top_k: int, scores: np.ndarray | None = None,
          unknown: UnknownRule | None = None) -> list[Prediction]:
    """One batch's predictions in input order: ``paths[i]`` (input position ``indices[i]``) has the class
    probabilities ``probs[i]`` and the ``unknown`` rule's score ``scores[i]``; each unreadable file gets its
    error."""
    k = max(1, min(top_k, len(classes)))
    best = np.argsort(-probs, axis=1, kind="stable")[:, :k]  # (B, k), most probable first
    rejected = unknown.rejects(scores) if unknown is not None and scores is not None else np.zeros(len(paths), bool)
    rows: list[tuple[int, Prediction]] = []
    for i, path in enumerate(paths):
        top = [(classes[j], float(probs[i, j])) for j in best[i]]
        score = float(scores[i]) if unknown is not None and scores is not None else None
        label = UNKNOWN if rejected[i] else top[0][0]
        rows.append((indices[i], Prediction(str(path), label, top[0][1], top, known_score=score)))
    rows += [(e.index, Prediction(str(e.path), error=e.reason)) for e in errors]
    return [p for _, p in sorted(rows, key=lambda r: r[0])]


class PredictionWriter:
    """Streams predictions to a .csv or .json file as they come (``predict --output``, the app's folder CSV): one
    row per file with its ``top_k`` labels (the first: ``unknown`` where the unknown rule rejects the photo) and,
    with ``scores``, the ``best_class`` and its ``known_score`` (the rule's score); an existing file is replaced
    only with ``overwrite``. Call
    :meth:`write` per batch, then :meth:`close`."""

    def __init__(self, path: Path, top_k: int, overwrite: bool = False, scores: bool = False) -> None:
        suffix = path.suffix.lower()
        if suffix not in (".csv", ".json"):
            raise ValueError(f"--output {path}: use a .csv or .json file name")
        check_new_output(path, overwrite)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.top_k, self.json, self.scores = path, top_k, suffix == ".json", scores
        try:  # "x": a file that appeared since the check is not replaced either
            # the file stays open across write() calls and is closed by close()
            self.file: IO[str] = open(path, "w" if overwrite else "x", newline="", encoding="utf-8",  # noqa: SIM115
                                      errors="backslashreplace")
        except FileExistsError:
            check_new_output(path, overwrite)
            raise
        self.count = 0
        if self.json:
            self.file.write("[")
        else:
            self.csv = csv.writer(self.file)
            header = ["path", "label", "confidence"]
            for r in range(2, top_k + 1):
                header += [f"label_{r}", f"confidence_{r}"]
            self.csv.writerow(header + ["best_class", "known_score"] * scores + ["error"])

    def write(self, rows: list[Prediction]) -> None:
        for row in rows:
            if self.json:
                obj = {**asdict(row), "path": printable_name(row.path)}
                obj["top_k"] = [{"label": label, "probability": round(p, 6)} for label, p in row.top_k]
                if row.confidence is not None:
                    obj["confidence"] = round(row.confidence, 6)
                if row.known_score is not None:
                    obj["known_score"] = round(row.known_score, 6)
                self.file.write(("," if self.count else "") + "\n  " + json.dumps(obj, ensure_ascii=False))
            else:
                cells: list[Any] = [printable_name(row.path)]
                for r in range(self.top_k):
                    cells += [row.top_k[r][0], f"{row.top_k[r][1]:.6f}"] if r < len(row.top_k) else ["", ""]
                if row.top_k:
                    cells[1] = row.label  # "unknown" where the rule rejects the photo
                score = [row.top_k[0][0] if row.top_k else "",
                         f"{row.known_score:.6g}" if row.known_score is not None else ""] * self.scores
                self.csv.writerow(cells + score + [row.error or ""])
            self.count += 1
        self.file.flush()

    def close(self) -> None:
        if self.json:
            self.file.write("\n]\n")
        self.file.close()
