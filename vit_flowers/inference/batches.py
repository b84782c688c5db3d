"""Batched inference shared by evaluation, prediction and attention maps.

Files are decoded (`images.decode_pixels`) a batch at a time, split over a few threads, and each batch is
resized in one go (`images.resize_crop`, the same pixels as training), so memory stays bounded by two
batches for any folder size and one unreadable file only costs its own row. For a model on a GPU the next
batch is decoded while the model works on this one; for a model on the CPU each batch is decoded when it is
needed, on all cores at once (decoding beside a CPU model only takes the cores its own threads wait for):

    model, ckpt = load_model(resolve_checkpoint(None), pick_device())
    for batch, probs, _ in predict_files(model, paths, image_size=ckpt["image_size"], mean=ckpt["mean"],
                                         std=ckpt["std"], device=pick_device()):
        ...  # batch.paths[i] -> probs[i] (num_classes,), batch.errors: [FileError(index, path, reason)]
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..data.augment import eval_transform, resize_square
from ..data.image_files import FileError, decode_in_chunks
from ..data.images import decode_pixels, resize_crop
from ..models.vit import ViT, logits_and_features
from .precision import autocast
from .unknown import UnknownRule

if TYPE_CHECKING:
    from ..models.vit import ViT

__all__ = [
    "Classifier",
    "FileError",
    "ImageBatch",
    "iter_image_batches",
    "predict_batch",
    "score_batch",
    "predict_files",
    "TwoScaleTTA",
    "with_features",
    "gives_features",
]

logger = logging.getLogger(__name__)


class Classifier(Protocol):
    """What the pipelines run (a ViT, an ONNX export's OnnxModule, :class:`TwoScaleTTA`): normalised images
    (B, 3, image_size, image_size) -> logits (B, num_classes); with their features where a rule needs them."""

    image_size: int
    num_classes: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class TwoScaleTTA(nn.Module):
    """Test-time augmentation at two sizes (``--tta-scales``): the mean of the logits of each image and its mirror
    at the model's own size and at one patch more a side (positions resampled). A model trained on random crops
    sees its objects larger than a centre crop shows them, so a larger test size suits it (Touvron et al. 2019,
    "Fixing the train-test resolution discrepancy"); the measured gain is in benchmarks/README.md.

    Inputs come at the larger size, ``self.image_size``; the pipelines prepare them so, as for any model.
    """

    def __init__(self, model: ViT) -> None:
        super().__init__()
        self.model = model
        self.larger = model.at_image_size(model.image_size + model.patch_size)
        self.image_size: int = self.larger.image_size
        self.num_classes: int = model.num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised images (B, 3, S + p, S + p) -> logits (B, num_classes)."""
        return self.forward_with_features(x)[0]

    def forward_with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the mean logits, the mean features) of the four views."""
        small = resize_square(x, self.model.image_size)
        views = ((self.model, small), (self.model, small.flip(-1)), (self.larger, x), (self.larger, x.flip(-1)))
        (l0, f0), (l1, f1), (l2, f2), (l3, f3) = [logits_and_features(m, y) for m, y in views]
        return (l0 + l1 + l2 + l3) / 4, (f0 + f1 + f2 + f3) / 4


class ImageBatch(NamedTuple):
    """One batch of decoded files: ``images[i]`` is ``paths[i]``, the ``indices[i]``-th input path."""

    paths: list[Path]
    images: torch.Tensor  # uint8 (B, 3, S, S), B = len(paths), possibly 0
    errors: list[FileError]  # files of this chunk that could not be read
    indices: list[int]  # positions of `paths` in the input sequence (to look up labels)


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
    files = [Path(p) for p in paths]
    chunks = decode_in_chunks(files, lambda path: decode_pixels(path, image_size), batch_size, num_threads,
                              read_ahead)
    for indices, pixels, errors in chunks:
        images = resize_crop(pixels, image_size)  # (B, 3, S, S), B possibly 0
        yield ImageBatch([files[i] for i in indices], images, errors, indices)


def with_features(model: Classifier, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, the unknown rule's features) of a ViT (:func:`vit_flowers.models.vit.logits_and_features`) or of a
    model that wraps one and says how (``forward_with_features``: :class:`TwoScaleTTA`, an ONNX export's module)."""
    if isinstance(model, ViT):
        return logits_and_features(model, x)
    # not part of Classifier: a wrapper's own method, which gives_features checked for
    forward_with_features: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    forward_with_features = getattr(model, "forward_with_features")  # noqa: B009 (typed through the annotation)
    return forward_with_features(x)


def gives_features(model: object) -> bool:
    """Whether :func:`with_features` can run ``model`` (an export made before the unknown rule says it cannot)."""
    if hasattr(model, "gives_features"):
        return bool(model.gives_features)
    return isinstance(model, ViT) or hasattr(model, "forward_with_features")


def _outputs(model: Classifier, x: torch.Tensor, features: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits, features or None): the features (:func:`with_features`) only when asked for."""
    if not features:
        return model(x).float(), None
    logits, feats = with_features(model, x)
    return logits.float(), feats.float()


@torch.inference_mode()
def score_batch(
    model: Classifier,
    images_uint8: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    device: torch.device | str,
    tta: bool = False,
    amp_dtype: torch.dtype | None = None,
    unknown: UnknownRule | None = None,
) -> tuple[torch.Tensor, np.ndarray | None]:
    """(class probabilities (B, C), the ``unknown`` rule's scores (B,) or None without a rule): see
    :func:`predict_batch`; under ``tta`` the features are averaged over the image and its mirror like the logits.
    A feature rule needs a model that :func:`gives_features`."""
    image_size = model.image_size
    if images_uint8.shape[0] == 0:
        return torch.empty(0, model.num_classes), (np.empty(0) if unknown else None)
    x = images_uint8.to(device, non_blocking=True)
    x = eval_transform(x, image_size, mean, std)  # (B, 3, S, S) float
    want = unknown is not None and unknown.needs_features
    with autocast(torch.device(device), amp_dtype):
        logits, feats = _outputs(model, x, want)  # (B, C), (B, dim) or None
        if tta:
            mirrored, mirrored_feats = _outputs(model, x.flip(-1), want)
            logits = (logits + mirrored) / 2
            feats = (feats + mirrored_feats) / 2 if feats is not None and mirrored_feats is not None else None
    scores = None
    if unknown is not None:
        scores = unknown.scores(logits.cpu().numpy(), feats.cpu().numpy() if feats is not None else None)
    return logits.softmax(dim=-1).cpu(), scores


def predict_batch(
    model: Classifier,
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
    model under that autocast dtype (:mod:`vit_flowers.inference.precision`), None for fp32.
    """
    return score_batch(model, images_uint8, mean, std, device, tta, amp_dtype)[0]


def predict_files(
    model: Classifier,
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
    unknown: UnknownRule | None = None,
) -> Iterator[tuple[ImageBatch, torch.Tensor, np.ndarray | None]]:
    """Stream ``(batch, probs (B, num_classes), scores (B,) of the ``unknown`` rule or None)`` over image files: on
    a GPU the next batch is decoded while the model runs, on the CPU each batch is decoded on all cores just before
    it (see :func:`iter_image_batches`).

    Unreadable files are in ``batch.errors`` and never stop the stream. ``progress`` shows a bar over files
    when stderr is a terminal.
    """
    read_ahead = torch.device(device).type != "cpu"  # a CPU model needs every core while it runs
    with tqdm(total=len(paths), desc="predict", unit="img", disable=None if progress else True, leave=False) as bar:
        for batch in iter_image_batches(paths, image_size, batch_size, num_threads, read_ahead=read_ahead):
            probs, scores = score_batch(model, batch.images, mean, std, device, tta, amp_dtype, unknown)
            bar.update(len(batch.paths) + len(batch.errors))
            yield batch, probs, scores
