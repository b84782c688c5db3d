"""Batched inference shared by evaluation, prediction and attention maps.

Files are decoded (`images.decode_pixels`) a batch at a time, split over a few threads, and each batch is
resized in one go (`images.resize_crop`, the same pixels as training), so memory stays bounded by two
batches for any folder size and one unreadable file only costs its own row. For a model on a GPU the next
batch is decoded while the model works on this one; for a model on the CPU each batch is decoded when it is
needed, on all cores at once (decoding beside a CPU model only takes the cores its own threads wait for):

    model, ckpt = load_model(resolve_checkpoint(None), pick_device())
    for batch, probs in predict_files(model, paths, image_size=ckpt["image_size"], mean=ckpt["mean"],
                                      std=ckpt["std"], device=pick_device()):
        ...  # batch.paths[i] -> probs[i] (num_classes,), batch.errors: [FileError(index, path, reason)]
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from tqdm.auto import tqdm

from .data.augment import eval_transform
from .data.images import DECODE_THREADS, decode_pixels, resize_crop
from .precision import autocast

__all__ = [
    "FileError",
    "ImageBatch",
    "iter_image_batches",
    "predict_batch",
    "predict_files",
]

logger = logging.getLogger(__name__)



class FileError(NamedTuple):
    """A file that could not be read: its position in the input, its path and the reason."""

    index: int
    path: Path
    reason: str


class ImageBatch(NamedTuple):
    """One batch of decoded files: ``images[i]`` is ``paths[i]``, the ``indices[i]``-th input path."""

    paths: list[Path]
    images: torch.Tensor  # uint8 (B, 3, S, S), B = len(paths), possibly 0
    errors: list[FileError]  # files of this chunk that could not be read
    indices: list[int]  # positions of `paths` in the input sequence (to look up labels)


def _decode_all(paths: Sequence[Path], image_size: int) -> list[torch.Tensor | str]:
    """:func:`images.decode_pixels` of each path, in order; a decoder bug on one odd file costs only that file."""
    out: list[torch.Tensor | str] = []
    for path in paths:
        try:
            out.append(decode_pixels(path, image_size))
        except Exception as exc:  # noqa: BLE001
            out.append(f"{type(exc).__name__}: {exc}")
    return out


def iter_image_batches(
    paths: Sequence[str | os.PathLike],
    image_size: int,
    batch_size: int = 64,
    num_threads: int | None = None,
    read_ahead: bool = True,
) -> Iterator[ImageBatch]:
    """Decode ``paths`` in chunks of ``batch_size`` into uint8 batches.

    Each chunk is split into ``num_threads`` parts (default :data:`DECODE_THREADS`) decoded side by side.
    ``read_ahead``: decode the next chunk while the consumer works on this one (the right thing when the
    consumer leaves the CPU free: a model on a GPU); otherwise decode each chunk when it is asked for, the
    calling thread taking one part (for a model on the CPU, whose threads would otherwise wait for the
    cores the decoders took: predict / model-only 0.87 against 0.79 on the 2-core dev machine).

    Every input path ends up in exactly one batch, either in ``paths`` or in ``errors``; batches follow the
    input order. At most two chunks are decoded or held at a time.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    paths = [Path(p) for p in paths]
    if not paths:
        return
    threads = max(1, num_threads or DECODE_THREADS)
    starts = range(0, len(paths), batch_size)

    def parts(start: int) -> list[list[Path]]:
        chunk = paths[start:start + batch_size]
        step = -(-len(chunk) // threads)
        return [chunk[i:i + step] for i in range(0, len(chunk), step)]

    with ThreadPoolExecutor(max_workers=threads if read_ahead else max(1, threads - 1)) as pool:

        def submit(chunk_parts: list[list[Path]]) -> list[Future]:
            return [pool.submit(_decode_all, part, image_size) for part in chunk_parts]

        pending = submit(parts(0)) if read_ahead else []
        for start in starts:
            if read_ahead:
                futures = pending
                if start + batch_size < len(paths):
                    pending = submit(parts(start + batch_size))  # decode the next chunk while this one is used
                results: list[torch.Tensor | str] = []
            else:
                first, *rest = parts(start)
                futures = submit(rest)
                results = _decode_all(first, image_size)  # this thread decodes a part too
            results += [r for future in futures for r in future.result()]
            ok_paths: list[Path] = []
            ok_pixels: list[torch.Tensor] = []  # (3, H_i, W_i) each, resized together below
            indices: list[int] = []
            errors: list[FileError] = []
            for i, result in enumerate(results, start):
                if isinstance(result, str):
                    errors.append(FileError(i, paths[i], result))
                else:
                    ok_paths.append(paths[i])
                    ok_pixels.append(result)
                    indices.append(i)
            images = resize_crop(ok_pixels, image_size)  # (B, 3, S, S), B possibly 0
            yield ImageBatch(ok_paths, images, errors, indices)


@torch.inference_mode()
def predict_batch(
    model: nn.Module,
    images_uint8: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    device: torch.device | str,
    tta: bool = False,
    amp_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> class probabilities float32 (B, num_classes) on the CPU.

    Images are resized to the model's input size if needed (``augment.eval_transform``) and normalised on
    ``device``. The model must already be on ``device`` and in eval mode. ``tta``: test-time augmentation,
    the mean of the logits of each image and its left-right mirror (twice the compute). ``amp_dtype``: run the
    model under that autocast dtype (:mod:`vit_flowers.precision`), None for fp32.
    """
    image_size = model.image_size
    if images_uint8.shape[0] == 0:
        return torch.empty(0, model.num_classes)
    x = images_uint8.to(device, non_blocking=True)
    x = eval_transform(x, image_size, mean, std)  # (B, 3, S, S) float
    with autocast(torch.device(device), amp_dtype):
        logits = model(x).float()  # (B, C)
        if tta:
            logits = (logits + model(x.flip(-1)).float()) / 2
    return logits.softmax(dim=-1).cpu()


def predict_files(
    model: nn.Module,
    paths: Sequence[str | os.PathLike],
    *,
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    device: torch.device | str,
    batch_size: int = 64,
    num_threads: int | None = None,
    progress: bool = False,
    tta: bool = False,
    amp_dtype: torch.dtype | None = None,
) -> Iterator[tuple[ImageBatch, torch.Tensor]]:
    """Stream ``(batch, probs (B, num_classes))`` over image files: on a GPU the next batch is decoded while the
    model runs, on the CPU each batch is decoded on all cores just before it (see :func:`iter_image_batches`).

    Unreadable files are in ``batch.errors`` and never stop the stream. ``progress`` shows a bar over files
    when stderr is a terminal.
    """
    read_ahead = torch.device(device).type != "cpu"  # a CPU model needs every core while it runs
    with tqdm(total=len(paths), desc="predict", unit="img", disable=None if progress else True, leave=False) as bar:
        for batch in iter_image_batches(paths, image_size, batch_size, num_threads, read_ahead=read_ahead):
            probs = predict_batch(model, batch.images, mean, std, device, tta, amp_dtype)
            bar.update(len(batch.paths) + len(batch.errors))
            yield batch, probs
