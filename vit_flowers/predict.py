"""Predict the flower in image files and folders with a trained checkpoint.

One row per file: path, predicted label, confidence, the next best labels with their probabilities, and
an error for files that cannot be read (those never stop the run). Folders are streamed in batches, so
any number of photos fits in memory. JPEG, PNG (also RGBA and palette), grayscale, WebP, BMP, GIF, TIFF, HEIC /
HEIF (iPhone photos) and AVIF are read with their EXIF rotation applied; a file in a folder that is not an image
by its extension gets a row saying it was skipped. An exported model (`python -m vit_flowers.export`)
runs through ONNX Runtime without importing torch: `--checkpoint model.onnx`. An existing `--output` file is
replaced only with `--overwrite`.

    python -m vit_flowers.predict photo.jpg                      # newest run's best.pt, table in the terminal
    python -m vit_flowers.predict holiday/ --recursive --top-k 3 --output predictions.csv
    python -m vit_flowers.predict a.png b.webp --checkpoint checkpoints/latest --output predictions.json
    python -m vit_flowers.predict photos/ --attention attention/   # also save attention maps per image
    python -m vit_flowers.predict photos/ --checkpoint checkpoints/latest/model.onnx   # ONNX Runtime, no torch

Exit status: 0 when at least one image was predicted, 1 when none could be (or the checkpoint is unusable).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from .cli import add_model_arguments, apply_tta, command_parser, setup_logging, unknown_rule
from .data.image_files import IMAGE_EXTENSIONS, FileError, list_images, printable_name
from .inference.onnx_runtime import is_onnx_path
from .inference.runtime import keep_freed_memory
from .inference.unknown import UNKNOWN, UnknownRule
from .runs.errors import CheckpointError
from .runs.folders import check_new_output

if TYPE_CHECKING:  # torch is imported only for a PyTorch checkpoint
    from torch import nn

    from .inference.onnx_runtime import OnnxClassifier

__all__ = ["Prediction", "PredictionWriter", "collect_files", "skipped_rows", "predict_images", "predict_images_onnx",
           "main"]

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
    model: nn.Module,
    files: Sequence[str | os.PathLike],
    classes: Sequence[str],
    *,
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    device: Any = "cpu",
    top_k: int = 3,
    batch_size: int = 64,
    progress: bool = False,
    attention_dir: str | os.PathLike | None = None,
    tta: bool = False,
    amp_dtype: Any = None,
    unknown: UnknownRule | None = None,
) -> Iterator[list[Prediction]]:
    """Yield the predictions of each batch of ``files``, in input order, errors included; with an ``unknown``
    rule, a photo it rejects is labelled ``unknown``.

    With ``attention_dir``, an attention-map PNG per predicted image is written there as well.
    """
    from .inference.batches import predict_files

    used: set[str] = set()
    for batch, probs, scores in predict_files(model, files, image_size=image_size, mean=mean, std=std,
                                              device=device, batch_size=batch_size, progress=progress, tta=tta,
                                              amp_dtype=amp_dtype, unknown=unknown):
        if attention_dir is not None and batch.paths:
            from .reporting.attention_maps import save_explanations  # matplotlib figures only when asked for

            explained = getattr(model, "model", model)  # under --tta-scales, the ViT inside TwoScaleTTA
            save_explanations(explained, batch.paths, batch.images, classes, mean, std, device, Path(attention_dir),
                              used)
        yield _rows(batch.paths, batch.indices, probs.numpy(), batch.errors, classes, top_k, scores, unknown)


def predict_images_onnx(
    model: OnnxClassifier,
    files: Sequence[str | os.PathLike],
    *,
    top_k: int = 3,
    batch_size: int = 64,
    progress: bool = False,
    tta: bool = False,
) -> Iterator[list[Prediction]]:
    """:func:`predict_images` for an exported model, through ONNX Runtime (:mod:`vit_flowers.inference.onnx_runtime`)
    and torch-free pixels: the same rows, errors included."""
    from .inference.onnx_runtime import predict_files

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
    rows: list[tuple[int, Prediction]] = []
    for i, path in enumerate(paths):
        top = [(classes[j], float(probs[i, j])) for j in best[i]]
        score = float(scores[i]) if unknown is not None and scores is not None else None
        label = UNKNOWN if score is not None and score < unknown.threshold else top[0][0]
        rows.append((indices[i], Prediction(str(path), label, top[0][1], top, known_score=score)))
    rows += [(e.index, Prediction(str(e.path), error=e.reason)) for e in errors]
    return [p for _, p in sorted(rows, key=lambda r: r[0])]


# ---------------------------------------------------------------------------------------------- output


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
            self.file: IO[str] = open(path, "w" if overwrite else "x", newline="", encoding="utf-8",
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


def _display_path(path: str, width: int) -> str:
    path = printable_name(path)
    try:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    except ValueError:  # another drive on Windows
        pass
    return path if len(path) <= width else "…" + path[-(width - 1):]


def _table_lines(rows: list[Prediction], width: int) -> list[str]:
    out = []
    for row in rows:
        name = _display_path(row.path, width)
        if row.error:
            out.append(f"{name:<{width}}  ERROR: {row.error}")
        else:
            others = ", ".join(f"{label} {p:.1%}" for label, p in row.top_k[1 if row.label != UNKNOWN else 0:])
            out.append(f"{name:<{width}}  {row.label:<14} {row.confidence:>6.1%}  {others}")
    return out


# ---------------------------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("predict", __doc__)
    p.add_argument("paths", nargs="+", metavar="PATH", help="image files and folders of images to predict")
    p.add_argument("--top-k", type=int, default=3,
                   help="the most probable labels to report per image, at most all classes (default: %(default)s)")
    p.add_argument("--output", help="also write the predictions to this .csv or .json file (a new one, unless "
                                    "--overwrite)")
    p.add_argument("--overwrite", action="store_true", help="let --output replace an existing file")
    p.add_argument("--recursive", action="store_true", help="also look into sub-folders of folders")
    add_model_arguments(p, batch_size=64, tta=True)
    p.add_argument("--attention", metavar="DIR", help="also save an attention map PNG per image into DIR")
    p.add_argument("--quiet", action="store_true", help="no table and no progress bar (use with --output)")
    return p


Predictor = Callable[[Sequence[Path], bool], Iterator[list[Prediction]]]  # (files, progress) -> batches of rows


def open_predictor(args: argparse.Namespace) -> tuple[list[str], Predictor, UnknownRule | None]:
    """(classes, predictor, unknown rule) of the model that ``--checkpoint`` names: an exported ``.onnx`` file runs
    through ONNX Runtime (torch is never imported), anything else is a PyTorch checkpoint or run folder. Raises
    CheckpointError or ValueError with a message for the user."""
    if is_onnx_path(args.checkpoint):
        from .inference.onnx_runtime import load_onnx

        if args.attention:
            raise ValueError("--attention needs a PyTorch checkpoint: an ONNX export has no attention maps")
        onnx_model = load_onnx(args.checkpoint)
        onnx_model.unknown = unknown_rule(args, onnx_model.checkpoint_keys(), onnx_model, str(args.checkpoint))
        _, flip = apply_tta(onnx_model, args.tta)
        return onnx_model.classes, lambda files, show: predict_images_onnx(
            onnx_model, files, top_k=args.top_k, batch_size=args.batch_size, progress=show, tta=flip), \
            onnx_model.unknown
    from .cli import load_model_from_args
    from .inference.precision import inference_dtype

    loaded = load_model_from_args(args)
    ckpt = loaded.ckpt
    model, flip = apply_tta(loaded.model, args.tta)
    rule = unknown_rule(args, ckpt, model, str(loaded.path))
    return ckpt["classes"], lambda files, show: predict_images(
        model, files, ckpt["classes"], image_size=model.image_size, mean=ckpt["mean"], std=ckpt["std"],
        device=loaded.device, top_k=args.top_k, batch_size=args.batch_size, progress=show,
        attention_dir=args.attention, tta=flip, unknown=rule,
        amp_dtype=inference_dtype(loaded, len(files), precision=args.precision, batch_size=args.batch_size)), rule


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    keep_freed_memory()
    if args.top_k <= 0 or args.batch_size <= 0:
        logger.error("error: --top-k and --batch-size must be positive")
        return 2
    try:
        classes, predictor, rule = open_predictor(args)
        writer = (PredictionWriter(Path(args.output), min(args.top_k, len(classes)), args.overwrite, rule is not None)
                  if args.output else None)
    except (CheckpointError, ValueError, OSError) as exc:
        logger.error("error: %s", exc)
        return 1
    if args.top_k > len(classes):
        logger.info("--top-k %d is more than the model's %d classes: showing all %d", args.top_k, len(classes),
                    len(classes))
    skipped: list[Path] = []
    files = collect_files(args.paths, args.recursive, skipped)
    show = not args.quiet
    batches = predictor(files, show)  # (a PyTorch checkpoint picks its precision here)
    width = min(48, max([len(_display_path(str(f), 10_000)) for f in files] + [4]))
    if show and files:
        tqdm.write(f"{'file':<{width}}  {'prediction':<14} {'conf':>6}  next best", file=sys.stdout)
    n_ok = n_err = n_unknown = 0
    start = time.perf_counter()
    try:
        for rows in batches:
            n_err += sum(r.error is not None for r in rows)
            n_ok += sum(r.error is None for r in rows)
            n_unknown += sum(r.label == UNKNOWN for r in rows)
            if writer:
                writer.write(rows)
            if show:
                for line in _table_lines(rows, width):
                    tqdm.write(line, file=sys.stdout)
        if writer and skipped:
            writer.write(skipped_rows(skipped))
    finally:
        if writer:
            writer.close()
    seconds = time.perf_counter() - start
    logger.info("predicted %d of %d file(s) in %.1f s%s%s%s%s", n_ok, len(files), seconds,
                f" ({n_unknown} unknown)" if rule else "", f"; {n_err} could not be read" if n_err else "",
                f"; {len(skipped)} non-image file(s) skipped" if skipped else "",
                f"; wrote {args.output} (every file a row)" if writer else "")
    if n_ok == 0:
        logger.error("error: no image could be predicted%s", "" if files else " (no image files found)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
