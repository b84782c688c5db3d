"""Evaluate a trained checkpoint and write a report: metrics.json, confusion matrices, sklearn's
classification report, the most confident mistakes, report.md and a self-contained report.html. A folder
that holds an earlier report is replaced only with --overwrite.

    # the newest run's best.pt on that run's own held-out split -> checkpoints/<run>/eval-val/
    python -m vit_flowers.evaluate
    # an export of it -> checkpoints/<run>/eval-val-onnx/ (eval-val-int8/ for model.int8.onnx)
    python -m vit_flowers.evaluate --checkpoint checkpoints/latest/model.int8.onnx

    # any folder in the ImageFolder layout (one sub-folder per class), streamed in batches
    python -m vit_flowers.evaluate --checkpoint checkpoints/latest/best.pt --data /path/to/photos/val

    # a folder with only some of the checkpoint's classes (or extra ones): evaluate on the shared classes
    python -m vit_flowers.evaluate --data /path/to/photos --shared-classes --output eval-photos --top-k 3

The evaluation itself is :mod:`vit_flowers.reporting.evaluation` (training's final report uses it too).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .cli import (
    add_model_arguments,
    apply_tta,
    command_parser,
    load_model_from_args,
    setup_logging,
    unknown_rule,
)
from .data.config import ConfigError
from .data.datasets import TensorImageDataset
from .inference.onnx_runtime import is_onnx_path
from .inference.precision import dtype_name, inference_dtype
from .inference.run_data import evaluation_set, run_photo_cache
from .inference.runtime import keep_freed_memory
from .inference.unknown import rejection_warning
from .reporting.evaluation import ClassMismatchError, evaluate_files, evaluate_model_on_dataset, write_report
from .runs.errors import CheckpointError
from .runs.folders import check_new_output

__all__ = ["default_output_name", "build_parser", "main"]

logger = logging.getLogger(__name__)


def default_output_name(data_name: str, onnx_precision: str | None = None) -> str:
    """The report folder inside the run: ``eval-<data name>`` for a PyTorch checkpoint; an export's own
    (``-onnx``, ``-int8``), so that evaluating the run's exports and its best.pt keeps every report."""
    if onnx_precision is None:
        return f"eval-{data_name}"
    return f"eval-{data_name}-{'onnx' if onnx_precision == 'fp32' else onnx_precision}"


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("evaluate", __doc__)
    p.add_argument("--data", help="a folder in the ImageFolder layout (default: the run's own held-out split)")
    p.add_argument("--cache-dir", help="where training kept the run's decoded photos (default: the run's cache_dir, "
                                       "the user's cache folder): its validation photos are read there, not decoded "
                                       "again, when it holds them")
    p.add_argument("--output", help="the folder the report is written to (default: <run>/eval-<data name>, "
                                    "-onnx or -int8 added for an export); a new one, unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="let the report replace an earlier one in its folder")
    add_model_arguments(p, tta=True)
    p.add_argument("--shared-classes", action="store_true",
                   help="when the data's classes differ from the checkpoint's, evaluate on the shared ones "
                        "(predictions restricted to them)")
    p.add_argument("--top-k", type=int, help="k of the top-k accuracy (default: 5, or 2 for up to 10 classes)")
    p.add_argument("--quiet", action="store_true", help="print warnings only, without the progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(quiet=args.quiet)
    keep_freed_memory()
    if args.batch_size <= 0 or (args.top_k is not None and args.top_k <= 0):
        logger.error("error: --batch-size and --top-k must be positive")
        return 2
    onnx = is_onnx_path(args.checkpoint)  # an export: the PyTorch pipeline, the model run by ONNX Runtime
    try:
        if onnx:
            from .inference.onnx_torch import load_onnx_module

            loaded, run_dir = load_onnx_module(args.checkpoint)
        else:
            loaded = load_model_from_args(args)
            run_dir = loaded.path.parent
        model, ckpt, ckpt_path, device = loaded
        model, flip = apply_tta(model, args.tta)  # under "scales", inputs come at model.image_size (larger)
        cache = None if args.data else run_photo_cache(ckpt, run_dir, args.cache_dir)
        name, source, data = evaluation_set(ckpt, run_dir, args.data, model.image_size, cache)
        exported = model.precision if onnx else None  # an export's precision (fp32, int8), from its metadata
        out = Path(args.output) if args.output else run_dir / default_output_name(name, exported)
        check_new_output(out, args.overwrite, "folder")
        amp_dtype = None if onnx else inference_dtype(
            loaded, len(data) if isinstance(data, TensorImageDataset) else len(data[1]), precision=args.precision,
            batch_size=args.batch_size)
        common = dict(model_classes=ckpt["classes"], mean=ckpt["mean"], std=ckpt["std"], device=device,
                      batch_size=args.batch_size, shared_classes=args.shared_classes, tta=flip,
                      amp_dtype=amp_dtype, unknown=unknown_rule(args, ckpt, model, str(ckpt_path)))
        if isinstance(data, TensorImageDataset):
            data_classes = data.classes
            result = evaluate_model_on_dataset(model, data, progress=not args.quiet, **common)
        else:
            data_classes, samples = data
            result = evaluate_files(model, samples, data_classes, image_size=model.image_size, where=source,
                                    progress=not args.quiet, **common)
        info = {"checkpoint": str(ckpt_path), "dataset": source,
                "device": "onnxruntime (cpu)" if onnx else str(device), "tta": args.tta,
                "precision": exported if onnx else dtype_name(amp_dtype)}
        if set(result.classes) != set(ckpt["classes"]) or set(result.classes) != set(data_classes):
            info["excluded_classes"] = {"checkpoint_only": [c for c in ckpt["classes"] if c not in result.classes],
                                        "data_only": [c for c in data_classes if c not in result.classes]}
        write_report(result, out, top_k=args.top_k, title=f"Evaluation of {run_dir.name} on {name}", info=info,
                     run_dir=run_dir)
        if result.unknown is not None and result.known is not None:
            warning = rejection_warning(result.unknown, int(result.unknown.rejects(result.known).sum()),
                                        len(result.known))
            if warning:
                logger.warning(warning)
    except (CheckpointError, ConfigError, ClassMismatchError, OSError, ValueError) as exc:
        logger.error("error: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
