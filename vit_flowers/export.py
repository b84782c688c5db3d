"""Export a trained checkpoint to ONNX, checked against PyTorch on real photos; optionally an int8 copy too.

    python -m vit_flowers.export                                   # newest run's best.pt -> <run>/model.onnx
    python -m vit_flowers.export --checkpoint checkpoints/my-run --output flowers.onnx
    python -m vit_flowers.export --int8                            # also <run>/model.int8.onnx
    python -m vit_flowers.predict photos/ --checkpoint checkpoints/latest/model.onnx   # predict without torch

The model gets a dynamic batch axis and, in its metadata, what predict needs: class names, image size, mean
and std, and the source checkpoint. Before anything is written, ONNX Runtime runs it next to PyTorch on real
images (the run's validation photos when they are found, else synthetic flowers): when a logit differs by
more than --tolerance (1e-4), nothing is written and the largest difference is named. --int8 adds a copy
with int8 weights and activations (ONNX Runtime's static quantization, calibrated on a few hundred training
photos), and prints the validation accuracy it keeps next to fp32's; one that loses more than 2 points
(INT8_MAX_LOSS) is not written unless --force (the fp32 file is).

Needs the onnx extra: pip install -e ".[onnx]". Exit status: 0 when written, 1 when the checkpoint is
unusable, the export disagrees with PyTorch, or the int8 copy was refused.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .cli import add_checkpoint_arguments, command_parser, setup_logging
from .data.config import ConfigError
from .inference.onnx_export import (
    CALIBRATION_PHOTOS,
    CHECK_PHOTOS,
    INT8_MAX_LOSS,
    TOLERANCE,
    export_checked,
    int8_path,
    onnx_missing,
    write_int8,
)
from .inference.run_data import training_photos, validation_photos
from .runs import folders as runs
from .runs.checkpoint import CheckpointError, load_model, resolve_checkpoint
from .runs.folders import check_new_output

__all__ = ["build_parser", "export_checkpoint", "main"]

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("export", __doc__)
    add_checkpoint_arguments(p)
    p.add_argument("--output", help="the .onnx file to write (default: model.onnx next to the checkpoint)")
    p.add_argument("--int8", action="store_true", help="also write an int8 copy, <output>.int8.onnx")
    p.add_argument("--overwrite", action="store_true",
                   help="let the export replace an existing .onnx file (otherwise it refuses, naming it)")
    p.add_argument("--force", action="store_true",
                   help=f"write the int8 copy even when it loses more than {100 * INT8_MAX_LOSS:g} points against fp32")
    p.add_argument("--data", help="check on this class-folder tree (default: the run's validation photos)")
    p.add_argument("--tolerance", type=float, default=TOLERANCE,
                   help="largest logit difference allowed against PyTorch (default: %(default)g)")
    p.add_argument("--max-images", type=int, default=CHECK_PHOTOS,
                   help="the most images the export is checked on (default: %(default)s)")
    p.add_argument("--calibration-images", type=int, default=CALIBRATION_PHOTOS,
                   help="training images that set the int8 ranges (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="print warnings only")
    return p


def export_checkpoint(checkpoint: str | Path | None = None, out_dir: str | Path = runs.RUNS_HOME,
                      output: str | Path | None = None, *, data: str | Path | None = None, int8: bool = False,
                      tolerance: float = TOLERANCE, max_images: int = CHECK_PHOTOS,
                      calibration_images: int = CALIBRATION_PHOTOS,
                      force: bool = False, overwrite: bool = False) -> Path:
    """Export ``checkpoint`` (a file or run folder; default: the newest run in ``out_dir``) to ``output`` (default:
    the run's model.onnx), checked on up to ``max_images`` photos of ``data`` (default: the run's validation
    photos) within ``tolerance``; with ``int8`` also <output>.int8.onnx, unless it loses more than INT8_MAX_LOSS
    (ValueError; ``force`` writes it). An existing output file is replaced only with ``overwrite`` (ValueError naming
    it, before any work). Returns the .onnx file written."""
    source = resolve_checkpoint(checkpoint, out_dir)
    output = Path(output) if output else source.parent / runs.ONNX
    if output.suffix.lower() != ".onnx":
        raise ValueError(f"--output {output}: use a file name ending in .onnx")
    for path in (output, int8_path(output)) if int8 else (output,):
        check_new_output(path, overwrite)
    model, ckpt = load_model(source, "cpu")
    val = validation_photos(ckpt, source.parent, data, max_images)
    done = export_checked(model, ckpt, source, val, output, tolerance)
    if int8:
        write_int8(done.fp32, training_photos(ckpt, source.parent, calibration_images), ckpt, source, val,
                   done.logits, output, force)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(quiet=args.quiet)
    if args.max_images <= 0 or args.calibration_images <= 0:
        logger.error("error: --max-images and --calibration-images must be positive")
        return 2
    missing = onnx_missing()
    if missing:
        logger.error("error: export needs %s", missing)
        return 1
    try:
        export_checkpoint(args.checkpoint, args.runs, args.output, data=args.data, int8=args.int8,
                          tolerance=args.tolerance, max_images=args.max_images,
                          calibration_images=args.calibration_images, force=args.force,
                          overwrite=args.overwrite)
    except (CheckpointError, ConfigError, OSError, ValueError) as exc:
        logger.error("error: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
