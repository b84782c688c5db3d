"""What a ViT gives for un-augmented photos (:func:`batch_outputs`): its logits, the head's input, the mean of the patch
tokens after the final norm (what the "none of these" rule compares with its class means: they told non-flowers
apart better than the CLS token, benchmarks/HISTORY.md), the CLS token and a hybrid's pooled trunk output (what a
taught class's gate reads); and a head's input built from them
(:func:`head_inputs`). The end of training calibrates on them and teach fits a head on them
(:mod:`vit_flowers.inference.calibration`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from ..data.augment import eval_transform
from ..data.progress import tracked
from ..models.patch_embed import HybridPatchEmbed, hybrid_embed
from ..models.vit import ViT, head_features, pool_patches
from . import INFERENCE_BATCH

__all__ = ["Outputs", "batch_outputs", "head_inputs"]


class Outputs(NamedTuple):
    """What a ViT gives for N photos: logits (N, C), the head's inputs (N, head_dim), the unknown rule's features
    (the mean of the patch tokens, N, dim), the CLS token (N, dim), a hybrid's pooled trunk output (N, C_trunk;
    what a taught model's gate reads, :meth:`ViT.embed`; (N, 0) for other models)."""

    logits: np.ndarray
    head: np.ndarray
    features: np.ndarray
    cls: np.ndarray
    trunk: np.ndarray


def _tokens(model: ViT, chunk: torch.Tensor, mean: Any, std: Any, device: torch.device | str, mirror: bool,
            cached: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chunk of uint8 photos, or of a hybrid's cached trunk outputs (``cached``) -> (normalised tokens
    (B, 1 + N, dim), a hybrid's trunk output (B, C_trunk, h, w) or None)."""
    if cached:  # the head start's cache: the mirror image is the grid flipped, as the head start trains on it
        grid = chunk.to(device).float()  # (B, C, h, w)
        grid = grid.flip(-1) if mirror else grid
        embed = hybrid_embed(model.to_patch_embedding)  # cached: a hybrid's
        return model.forward_features(embed.tokens(grid), embedded=True), grid
    x = eval_transform(chunk, model.image_size, mean, std).to(device)
    patches, trunk = model.embed(x.flip(-1) if mirror else x)  # (B, N, dim), (B, C_trunk, h, w) or None
    return model.forward_features(patches, embedded=True), trunk


@torch.inference_mode()
def batch_outputs(model: ViT, images: torch.Tensor, mean: Any, std: Any, device: torch.device | str = "cpu",
                  batch_size: int = INFERENCE_BATCH, mirror: bool = False,
                  cached: bool = False) -> Outputs:
    """:class:`Outputs` of uint8 images (N, 3, S, S) (``mirror``: of their mirror images), in fp32 (thresholds
    are chosen on them). ``cached``: ``images`` are a hybrid's trunk outputs (N, C, h, w) of the photos
    (:func:`vit_flowers.training.token_cache.trunk_outputs`) from a trunk that has not trained since: the rest of
    the network runs on them, at a small fraction of the photos' cost."""
    model.eval()
    parts: list[list[np.ndarray]] = [[], [], [], [], []]
    starts = range(0, len(images), batch_size)
    for start in tracked(starts, "the model's outputs of the photos", len(starts)):
        tokens, trunk = _tokens(model, images[start:start + batch_size], mean, std, device, mirror, cached)
        pooled = model.pooled_trunk(trunk) if trunk is not None else tokens.new_empty((len(tokens), 0))  # (B, C_trunk)
        outputs = (model.classify(tokens, trunk), model.forward_head(tokens, pre_logits=True),
                   pool_patches(tokens), tokens[:, 0], pooled)
        for part, value in zip(parts, outputs):
            # a copy: the CLS token and the head's input are views of the batch's tokens (B, 1 + N, dim), which
            # a view kept here would hold for every batch (20,000 photos: +2.3 GB)
            part.append(value.float().cpu().numpy().copy())
    dim, embed = model.config["dim"], model.to_patch_embedding
    trunk_dim = embed.trunk.out_channels if isinstance(embed, HybridPatchEmbed) else 0
    empty = [np.empty((0, n), np.float32) for n in (model.num_classes, model.head_dim, dim, dim, trunk_dim)]
    return Outputs(*[np.concatenate(p) if p else e for p, e in zip(parts, empty)])


def head_inputs(out: Outputs, head_input: str) -> np.ndarray:
    """What a head reading ``head_input`` (a ViT's) gets for these outputs, (N, d) float32: the CLS token as it
    is, else each source L2-normalised and concatenated (as :meth:`ViT.forward_head`)."""
    if head_input == "cls":
        return out.cls
    parts = tuple(head_input.split("+"))
    return head_features(torch.from_numpy(out.cls), torch.from_numpy(out.features), parts).numpy()
