"""Where does the ViT look? Attention rollout and per-head CLS attention, drawn over the photo.

Attention rollout (Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers"): average each
layer's attention over heads, add the identity (the residual connection) and renormalise the rows, then
multiply the layers together; the CLS row of the product says how much each patch fed the class token.
The last layer's CLS attention of every head is shown too. Maps come from ``ViT.attention_maps`` (the
explicit softmax path) and are drawn over the model's centre crop of the original, full-size photo
(:mod:`vit_flowers.reporting.attention_maps` draws them).

    python -m vit_flowers.explain photo.jpg more_photos/ --checkpoint checkpoints/latest --output attention
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .cli import add_model_arguments, command_parser, load_model_from_args, setup_logging
from .data.images import list_images
from .inference.batches import iter_image_batches
from .inference.runtime import keep_freed_memory
from .reporting.attention_maps import save_explanations
from .runs.checkpoint import CheckpointError

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("explain", __doc__)
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files or folders of images to explain")
    p.add_argument("--output", default="attention", help="the folder the PNGs are written to (default: %(default)s)")
    p.add_argument("--recursive", action="store_true", help="also look into sub-folders of folders")
    add_model_arguments(p, precision=False)  # attention maps are drawn in fp32
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    keep_freed_memory()
    try:
        model, ckpt, _, device = load_model_from_args(args, "explain")
    except (CheckpointError, ValueError) as exc:
        logger.error("error: %s", exc)
        return 1
    files: list[Path] = []
    for item in map(Path, args.images):
        if item.is_dir():
            files += list_images(item, recursive=args.recursive)[0]
        else:
            files.append(item)  # a missing or unreadable file gets its error below
    out_dir, failed = Path(args.output), 0
    used: set[str] = set()  # the PNG names written so far (two photos of one name get _2)
    written: list[Path] = []
    for batch in iter_image_batches(files, ckpt["image_size"], args.batch_size, read_ahead=device.type != "cpu"):
        for err in batch.errors:
            logger.error("cannot load image %s: %s", err.path, err.reason)
        failed += len(batch.errors)
        if batch.paths:
            written += save_explanations(model, batch.paths, batch.images, ckpt["classes"], ckpt["mean"],
                                         ckpt["std"], device, out_dir, used)
    for path in written:
        logger.info("wrote %s", path)
    logger.info("%d attention map(s) in %s%s", len(written), out_dir, f", {failed} file(s) failed" if failed else "")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
