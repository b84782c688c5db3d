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
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from .cli import add_model_arguments, apply_tta, command_parser, setup_logging, unknown_rule
from .data.image_files import printable_name
from .inference import TOP_K
from .inference.onnx_runtime import is_onnx_path
from .inference.predictions import (
    Prediction,
    PredictionWriter,
    collect_files,
    predict_images,
    predict_images_onnx,
    skipped_rows,
)
from .inference.runtime import keep_freed_memory
from .inference.unknown import UNKNOWN, UnknownRule, rejection_warning
from .runs.errors import CheckpointError

if TYPE_CHECKING:
    from .inference.batches import ImageBatch
    from .runs.checkpoint import ModelFacts

__all__ = ["build_parser", "open_predictor", "main"]

logger = logging.getLogger(__name__)


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
    p.add_argument("--top-k", type=int, default=TOP_K,
                   help="the most probable labels to report per image, at most all classes (default: %(default)s)")
    p.add_argument("--output", help="also write the predictions to this .csv or .json file (a new one, unless "
                                    "--overwrite)")
    p.add_argument("--overwrite", action="store_true", help="let --output replace an existing file")
    p.add_argument("--recursive", action="store_true", help="also look into sub-folders of folders")
    add_model_arguments(p, tta=True)
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
    draw = _attention_maps(Path(args.attention), loaded.model, ckpt, loaded.device) if args.attention else None
    return ckpt["classes"], lambda files, show: predict_images(
        model, files, ckpt["classes"], image_size=model.image_size, mean=ckpt["mean"], std=ckpt["std"],
        device=loaded.device, top_k=args.top_k, batch_size=args.batch_size, progress=show, tta=flip, unknown=rule,
        amp_dtype=inference_dtype(loaded, len(files), precision=args.precision, batch_size=args.batch_size),
        each_batch=draw), rule


def _attention_maps(out_dir: Path, model: Any, ckpt: ModelFacts, device: Any) -> Callable[[ImageBatch], object]:
    """``--attention``: what :func:`predict_images` calls with each batch, one attention-map PNG per photo in
    ``out_dir`` (``model`` is the ViT itself: under --tta-scales, the one inside the wrapper that predicts)."""
    from .reporting.attention_maps import save_explanations  # matplotlib only when asked for

    used: set[str] = set()
    return lambda batch: save_explanations(model, batch.paths, batch.images, ckpt["classes"], ckpt["mean"],
                                           ckpt["std"], device, out_dir, used)


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
    warning = rejection_warning(rule, n_unknown, n_ok) if rule else None
    if warning:
        logger.warning(warning)
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
