"""Export a trained checkpoint to ONNX, checked against PyTorch on real photos; optionally an int8 copy too.

    python -m vit_flowers.export                                   # newest run's best.pt -> <run>/model.onnx
    python -m vit_flowers.export --checkpoint checkpoints/my-run --output flowers.onnx
    python -m vit_flowers.export --int8                            # also <run>/model.int8.onnx
    python -m vit_flowers.predict photos/ --checkpoint checkpoints/latest/model.onnx   # predict without torch
    python -m vit_flowers.export --checkpoint checkpoints/my-run --web site/   # a web page that runs it in a browser

The model gets a dynamic batch axis and, in its metadata, what predict needs: class names, image size, mean
and std, and the source checkpoint. Before anything is written, ONNX Runtime runs it next to PyTorch on real
images (the run's validation photos when they are found, else synthetic flowers): when a logit differs by
more than --tolerance (1e-4), nothing is written and the largest difference is named. --int8 adds a copy
with int8 weights and activations (ONNX Runtime's static quantization, calibrated on a few hundred training
photos), and prints the validation accuracy it keeps next to fp32's; one that loses more than 2 points
(INT8_MAX_LOSS) is not written unless --force (the fp32 file is).

--web DIR writes a static page that classifies photos (chosen, dropped, or the webcam's) in the browser, with no
Python and no server-side code: index.html, the checked model (the int8 copy with --int8), config.json (classes,
preprocessing, the run's "not sure" rule) and ONNX Runtime Web, copied from the repository's `npm ci` install in
web/ (or loaded from a CDN with --web-cdn).
docs/export.md says how to put it on a site. --tflite FILE writes the model for LiteRT (converted by
litert-torch from the PyTorch model, checked by the ai-edge-litert interpreter against PyTorch; int8 weights with
--int8) and FILE's .json beside it (classes, preprocessing, the unknown rule). With --web or --tflite and no
--output, no .onnx file is written beside the run.

Needs the onnx extra: pip install -e ".[onnx]". Exit status: 0 when written, 1 when the checkpoint is
unusable, the export disagrees with PyTorch, or the int8 copy was refused.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
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
from .inference.tflite_export import tflite_int8_path, tflite_missing, write_tflite
from .inference.web_export import check_web_output, find_ort, rule_arrays, web_config, write_web_folder
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
    p.add_argument("--web", metavar="DIR",
                   help="also write a static web page that runs the model in the browser into DIR (refused when DIR "
                        "exists, unless --overwrite)")
    p.add_argument("--web-cdn", action="store_true",
                   help="the page loads ONNX Runtime Web from a CDN (jsDelivr) instead of a copy beside it")
    p.add_argument("--tflite", metavar="FILE",
                   help="also write the model for LiteRT (Android, the Raspberry Pi) to FILE (.tflite), checked "
                        "against PyTorch; with --int8 also FILE's .int8.tflite copy (needs the tflite extra)")
    p.add_argument("--quiet", action="store_true", help="print warnings only")
    return p


def export_checkpoint(checkpoint: str | Path | None = None, out_dir: str | Path = runs.RUNS_HOME,
                      output: str | Path | None = None, *, data: str | Path | None = None, int8: bool = False,
                      tolerance: float = TOLERANCE, max_images: int = CHECK_PHOTOS,
                      calibration_images: int = CALIBRATION_PHOTOS, force: bool = False, overwrite: bool = False,
                      web: str | Path | None = None, web_cdn: bool = False, tflite: str | Path | None = None) -> Path:
    """Export ``checkpoint`` (a file or run folder; default: the newest run in ``out_dir``) to ``output`` (default:
    the run's model.onnx), checked on up to ``max_images`` photos of ``data`` (default: the run's validation
    photos) within ``tolerance``; with ``int8`` also <output>.int8.onnx, unless it loses more than INT8_MAX_LOSS
    (ValueError; ``force`` writes it). An existing output file is replaced only with ``overwrite`` (ValueError naming
    it, before any work). With ``web``, also the web page there (:func:`write_web_folder`); with ``tflite``, the
    LiteRT model (:func:`write_tflite`); with either and no ``output``, no .onnx file beside the run. Returns the
    .onnx file written (the web folder's, or a removed temporary one, with ``web`` or ``tflite`` and no ``output``)."""
    source = resolve_checkpoint(checkpoint, out_dir)
    web, tflite = (Path(p) if p is not None else None for p in (web, tflite))
    ort = find_ort(web_cdn) if web is not None else None  # before any work: `npm ci` missing is said at once
    if web is not None:
        check_web_output(web, overwrite)
    if tflite is not None:
        _check_tflite_output(tflite, int8, overwrite)
    with tempfile.TemporaryDirectory() as tmp:  # the ONNX files of a --web / --tflite export without --output
        target = _onnx_target(output, source, Path(tmp), elsewhere=web is not None or tflite is not None)
        if target.suffix.lower() != ".onnx":
            raise ValueError(f"--output {target}: use a file name ending in .onnx")
        for path in (target, int8_path(target)) if int8 else (target,):
            check_new_output(path, overwrite)
        model, ckpt = load_model(source, "cpu")
        val = validation_photos(ckpt, source.parent, data, max_images)
        done = export_checked(model, ckpt, source, val, target, tolerance)
        if int8:
            write_int8(done.fp32, training_photos(ckpt, source.parent, calibration_images), ckpt, source, val,
                       done.logits, target, force)
        if web is not None and ort is not None:
            precision = "int8" if int8 else "fp32"
            write_web_folder(web, int8_path(target) if int8 else target, web_config(ckpt, source, precision, ort),
                             rule_arrays(ckpt), ort, overwrite)
            target = web / runs.ONNX if output is None else target
        if tflite is not None:
            write_tflite(model, ckpt, source, val, tflite, tolerance, int8, force)
    return target


def _onnx_target(output: str | Path | None, source: Path, tmp: Path, elsewhere: bool) -> Path:
    """Where the .onnx file goes: ``output``; else model.onnx beside the run, unless the export goes ``elsewhere``
    (--web, --tflite), when the user asked for those files, not for one more beside the run: then into ``tmp``."""
    if output:
        return Path(output)
    return (tmp if elsewhere else source.parent) / runs.ONNX


def _check_tflite_output(path: Path, int8: bool, overwrite: bool) -> None:
    """Refuse, before any work, a --tflite name that is no .tflite file, files that exist (unless ``overwrite``),
    and a missing converter (ValueError saying what to install)."""
    if path.suffix.lower() != ".tflite":
        raise ValueError(f"--tflite {path}: use a file name ending in .tflite")
    for file in (path, tflite_int8_path(path)) if int8 else (path,):
        check_new_output(file, overwrite, option="--tflite")
    missing = tflite_missing()
    if missing:
        raise ValueError(missing)


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
                          overwrite=args.overwrite, web=args.web, web_cdn=args.web_cdn, tflite=args.tflite)
    except (CheckpointError, ConfigError, OSError, ValueError) as exc:
        logger.error("error: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
