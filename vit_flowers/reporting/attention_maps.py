"""Where does the ViT look? Attention rollout and per-head CLS attention of a batch, drawn over the photo.

Attention rollout (Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers"): average each
layer's attention over heads, add the identity (the residual connection) and renormalise the rows, then
multiply the layers together; the CLS row of the product says how much each patch fed the class token.
The last layer's CLS attention of every head is shown too. Maps come from ``ViT.attention_maps`` (the
explicit softmax path) and are drawn over the model's centre crop of the original, full-size photo. The
``explain`` command (:mod:`vit_flowers.explain`), ``predict --attention`` and the app's overlays use it:

    exp = explain(model, batch.images, ckpt["mean"], ckpt["std"], device)   # exp.rollout: (B, g, g) in [0, 1]
    overlay(photo, exp.rollout[0]).save("rollout.png")
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image

from ..data.augment import eval_transform
from ..data.images import ImageLoadError, load_image, printable_name
from ..models.vit import ViT

__all__ = ["Explanation", "attention_rollout", "explain", "heatmap_for_image", "overlay", "attention_figure",
           "output_name", "save_explanations"]

logger = logging.getLogger(__name__)


class Explanation(NamedTuple):
    """Per-image attention of a batch; maps are (grid, grid) per image, min-max scaled to [0, 1]."""

    probs: torch.Tensor  # (B, C)
    rollout: torch.Tensor  # (B, g, g)
    last_heads: torch.Tensor  # (B, heads, g, g): last layer, CLS -> patch attention per head


def attention_rollout(attentions: Sequence[torch.Tensor]) -> torch.Tensor:
    """Rollout of per-layer attention (each (B, heads, 1+N, 1+N)) -> CLS-to-patch relevance (B, N)."""
    if not attentions:
        raise ValueError("attention_rollout needs the attention of at least one layer")
    b, _, t, _ = attentions[0].shape
    eye = torch.eye(t, device=attentions[0].device)
    rollout = eye.expand(b, t, t)
    for attn in attentions:
        a = attn.float().mean(dim=1) + eye  # (B, T, T): heads averaged, plus the residual
        a = a / a.sum(dim=-1, keepdim=True)  # rows sum to 1 again
        rollout = a @ rollout  # (B, T, T)
    return rollout[:, 0, 1:]  # (B, N)


def _minmax(x: torch.Tensor) -> torch.Tensor:
    """Scale each map of (..., g, g) to [0, 1] (a constant map becomes 0)."""
    flat = x.flatten(-2)
    lo, hi = flat.amin(-1, keepdim=True), flat.amax(-1, keepdim=True)
    return ((flat - lo) / (hi - lo).clamp_min(1e-12)).view_as(x)


@torch.inference_mode()
def explain(model: ViT, images_uint8: torch.Tensor, mean: Sequence[float], std: Sequence[float],
            device: torch.device | str) -> Explanation:
    """Probabilities, attention rollout and last-layer per-head CLS attention for a uint8 batch (B, 3, H, W)."""
    g = model.grid_size
    x = eval_transform(images_uint8.to(device), model.image_size, mean, std)  # (B, 3, S, S)
    logits, maps = model.attention_maps(x)  # maps: depth x (B, heads, 1+N, 1+N)
    rollout = attention_rollout(maps).view(-1, g, g)  # (B, g, g)
    heads = maps[-1][:, :, 0, 1:].float()  # (B, heads, N)
    heads = heads.view(heads.shape[0], heads.shape[1], g, g)  # (B, heads, g, g)
    return Explanation(logits.float().softmax(-1).cpu(), _minmax(rollout).cpu(), _minmax(heads).cpu())


def _crop_box(width: int, height: int) -> tuple[int, int, int, int]:
    """The centre square that `images.preprocess` keeps (shorter side, centred): (left, top, right, bottom)."""
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def heatmap_for_image(heat: torch.Tensor | np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A (g, g) map in [0, 1] -> float (H, W) for an image of ``size`` = (W, H): smoothly upsampled over the
    centre crop the model saw, 0 outside it."""
    width, height = size
    left, top, right, bottom = _crop_box(width, height)
    small = Image.fromarray(np.asarray(heat, dtype=np.float32), mode="F")
    crop = np.asarray(small.resize((right - left, bottom - top), Image.Resampling.BICUBIC))  # (side, side)
    full = np.zeros((height, width), dtype=np.float32)
    full[top:bottom, left:right] = np.clip(crop, 0.0, 1.0)
    return full


def overlay(image: Image.Image, heat: torch.Tensor | np.ndarray, alpha: float = 0.6,
            cmap: str = "inferno") -> Image.Image:
    """The image with a (g, g) attention map in [0, 1] over it: RGB, same size as ``image``.

    Where attention is high the colour map shows, where it is low the photo is darkened; the parts of the
    photo outside the model's centre crop (never seen by the model) are greyed out.
    """
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0  # (H, W, 3)
    h = heatmap_for_image(heat, image.size)[..., None]  # (H, W, 1)
    colour = matplotlib.colormaps[cmap](h[..., 0])[..., :3]  # (H, W, 3)
    a = alpha * h
    out = (1 - a) * rgb * (0.4 + 0.6 * h) + a * colour
    left, top, right, bottom = _crop_box(*image.size)
    seen = np.zeros(h.shape[:2], dtype=bool)
    seen[top:bottom, left:right] = True
    out[~seen] = rgb[~seen].mean(axis=-1, keepdims=True) * 0.3 + 0.05  # unseen: dark grey
    return Image.fromarray((np.clip(out, 0, 1) * 255).round().astype(np.uint8))


def attention_figure(image: Image.Image, rollout: torch.Tensor, last_heads: torch.Tensor, probs: torch.Tensor,
                     classes: Sequence[str], title: str = "") -> Figure:
    """Photo, rollout overlay and the last layer's per-head CLS attention, with the top predictions."""
    heads = last_heads.shape[0]
    cols = min(6, max(3, heads))
    rows = -(-heads // cols)
    aspect = min(max(image.height / image.width, 0.25), 4.0)  # a 1 x 100,000 strip: not a 500,000-inch figure
    width = 10.0
    top_h = (width / 2) * aspect + 0.9  # two big panels + titles
    bottom_h = rows * ((width / cols) * aspect + 0.3) + 0.4
    fig = Figure(figsize=(width, top_h + bottom_h), dpi=100, layout="constrained")
    # 2 x 1: an array of two SubFigures (matplotlib's stubs give "SubFigure | ndarray" whatever the shape)
    top, bottom = fig.subfigures(2, 1, height_ratios=[top_h, bottom_h])  # type: ignore[misc]
    ax_img, ax_roll = top.subplots(1, 2)
    ax_img.imshow(image)
    ax_img.set_title("image", fontsize=10)
    ax_roll.imshow(overlay(image, rollout))
    ax_roll.set_title("attention rollout (all layers)", fontsize=10)
    p, idx = probs.topk(min(3, len(classes)))
    preds = ",  ".join(f"{classes[i]} {q:.1%}" for q, i in zip(p.tolist(), idx.tolist()))
    top.suptitle(f"{title}\n{preds}" if title else preds, fontsize=11)
    axes = np.atleast_1d(bottom.subplots(rows, cols)).ravel()
    for ax in axes:
        ax.set_axis_off()
    for h, ax in enumerate(axes[:heads]):
        ax.imshow(overlay(image, last_heads[h]))
        ax.set_title(f"head {h + 1}", fontsize=9)
    for ax in (ax_img, ax_roll):
        ax.set_axis_off()
    bottom.suptitle("last layer: CLS attention per head", fontsize=10)
    return fig


def output_name(path: Path, out_dir: Path, used: set[str]) -> Path:
    """``out_dir/<stem>_attention.png``, with ``_2``, ``_3``... when two inputs share a stem."""
    stem = f"{path.stem}_attention"
    name, n = stem, 1
    while name in used:
        n += 1
        name = f"{stem}_{n}"
    used.add(name)
    return out_dir / f"{name}.png"


def save_explanations(model: ViT, paths: Sequence[Path], images_uint8: torch.Tensor, classes: Sequence[str],
                      mean: Sequence[float], std: Sequence[float], device: torch.device | str, out_dir: Path,
                      used: set[str]) -> list[Path]:
    """Explain one decoded batch and write one PNG per image (the original file is re-read at full size)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    exp = explain(model, images_uint8, mean, std, device)
    written = []
    for i, path in enumerate(paths):
        try:
            image = load_image(path)
        except ImageLoadError as exc:  # changed since it was decoded: skip it, keep going
            logger.warning("%s", exc)
            continue
        out = output_name(path, out_dir, used)
        try:
            fig = attention_figure(image, exp.rollout[i], exp.last_heads[i], exp.probs[i], classes,
                                   title=printable_name(path.name))
            fig.savefig(out)
        except Exception as exc:  # noqa: BLE001 - one odd image costs its own map, never the run
            logger.warning("could not draw the attention map of %s: %s", printable_name(path), exc)
            continue
        written.append(out)
    return written
