"""Class means in the model's feature space: what "none of these" compares a photo with, and what ``teach`` builds
a head from.

Two features of an un-augmented photo (:func:`batch_outputs`): the head's input (the CLS token after the final
norm), whose class means ``teach`` makes a head of, and the mean of the patch tokens after the final norm, which
the unknown rule compares with its own class means (they told non-flowers apart better: benchmarks/README.md).
At the end of training (:func:`calibrate_checkpoint`) the run keeps in its ``best.pt`` the head inputs' class
means (``class_means``) and the unknown rule chosen on its validation photos (``unknown``,
:mod:`vit_flowers.inference.unknown`).

A class mean is also a classifier: the nearest class mean under the Euclidean distance, with a softmax over
``-|f - mu_c|^2 / T``, is exactly a linear head (``|f|^2`` is the same for every class, and softmax ignores it):
weights ``2 mu_c / T``, bias ``-|mu_c|^2 / T`` (:func:`ncm_head`), which ``teach`` writes into the ordinary head,
so a taught run is an ordinary checkpoint that exports to ONNX unchanged.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import numpy as np
import torch

from ..data.augment import eval_transform
from ..data.datasets import TensorImageDataset
from ..models.vit import ViT
from .unknown import DEFAULT_RULE, RULES, UnknownRule, calibrate, known_scores, shared_precision

__all__ = ["MAX_MEAN_PHOTOS", "Outputs", "batch_outputs", "class_means", "ncm_head", "unknown_state",
           "calibrate_checkpoint"]

log = logging.getLogger(__name__)

MAX_MEAN_PHOTOS = 4000  # training photos a run's class means are taken from (evenly spaced): a minute at most


class Outputs(NamedTuple):
    """What a ViT gives for N photos: logits (N, C), the head's inputs (N, dim), the unknown rule's features
    (N, dim)."""

    logits: np.ndarray
    head: np.ndarray
    features: np.ndarray


@torch.inference_mode()
def batch_outputs(model: ViT, images: torch.Tensor, mean: Any, std: Any, device: torch.device | str = "cpu",
                  batch_size: int = 64) -> Outputs:  # 64 photos at 224 px: ~2 GB of activations
    """:class:`Outputs` of uint8 images (N, 3, S, S), in fp32 (thresholds are chosen on them)."""
    model.eval()
    parts: list[list[np.ndarray]] = [[], [], []]
    for start in range(0, len(images), batch_size):
        x = eval_transform(images[start:start + batch_size], model.image_size, mean, std).to(device)
        tokens = model.forward_features(x)  # (B, 1 + N, dim)
        outputs = (model.forward_head(tokens), model.forward_head(tokens, pre_logits=True), model.pool_patches(tokens))
        for part, value in zip(parts, outputs):
            part.append(value.float().cpu().numpy())
    empty = (np.empty((0, model.num_classes), np.float32), *[np.empty((0, model.config["dim"]), np.float32)] * 2)
    return Outputs(*[np.concatenate(p) if p else e for p, e in zip(parts, empty)])


def class_means(features: np.ndarray, labels: np.ndarray, num_classes: int) -> dict[str, Any]:
    """``class_means`` of a checkpoint: ``means`` (C, dim) float32 tensor, ``counts`` (photos per class) and
    ``within`` (the mean squared distance of a photo's features to its own class mean: the spread that sets a
    nearest-class-mean head's temperature). Raises ValueError naming a class without photos."""
    features, labels = np.asarray(features, dtype=np.float64), np.asarray(labels)
    counts = np.bincount(labels, minlength=num_classes)[:num_classes]
    if (counts == 0).any():
        raise ValueError(f"no photos of class number(s) {np.flatnonzero(counts == 0).tolist()} to take a mean of")
    means = np.stack([features[labels == c].mean(axis=0) for c in range(num_classes)])
    within = float(((features - means[labels]) ** 2).sum(axis=1).mean())
    return {"means": torch.from_numpy(means.astype(np.float32)), "counts": counts.tolist(), "within": within}


def ncm_head(means: torch.Tensor, within: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (C, dim), bias (C,)) of the linear head that is the nearest-class-mean classifier of ``means``:
    softmax(-|f - mu_c|^2 / T), T = 2 ``within`` / dim (a shared isotropic Gaussian per class)."""
    means = means.float()
    temperature = max(2.0 * within / means.shape[1], 1e-6)
    return 2 * means / temperature, -(means * means).sum(dim=1) / temperature


def _sample(dataset: TensorImageDataset, limit: int) -> tuple[torch.Tensor, np.ndarray]:
    """Up to ``limit`` images of ``dataset``, evenly spaced, and their labels."""
    idx = torch.from_numpy(np.unique(np.linspace(0, len(dataset) - 1, min(limit, len(dataset))).round().astype(int)))
    return dataset.batch(idx), dataset.labels[idx].numpy()


def unknown_state(rule: UnknownRule) -> dict[str, Any]:
    """A rule as a checkpoint's ``unknown`` key: its arrays as tensors (``torch.load(weights_only=True)`` reads
    those, not numpy arrays)."""
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in rule.state().items()}


def calibrate_checkpoint(model: ViT, ckpt: dict[str, Any], train: TensorImageDataset, val: TensorImageDataset,
                         device: torch.device | str = "cpu", rule: str = DEFAULT_RULE) -> dict[str, Any]:
    """``ckpt`` with ``class_means`` (of ``train``'s head inputs) and the ``unknown`` rule (``rule``, its class means
    and precision from ``train``, its threshold chosen on ``val``); logs what every rule's threshold would be."""
    images, labels = _sample(train, MAX_MEAN_PHOTOS)
    seen = batch_outputs(model, images, ckpt["mean"], ckpt["std"], device)
    num_classes = len(ckpt["classes"])
    means = class_means(seen.features, labels, num_classes)["means"].numpy()
    precision = shared_precision(seen.features, labels, means)
    held = batch_outputs(model, _sample(val, len(val))[0], ckpt["mean"], ckpt["std"], device)
    chosen: UnknownRule | None = None
    for name in RULES:
        found = calibrate(name, known_scores(name, held.logits, held.features, means, precision), means=means,
                          precision=precision if name == "mahalanobis" else None)
        log.debug("unknown rule %s would be %s", name, found.describe())
        chosen = found if name == rule else chosen
    assert chosen is not None, rule
    log.info("unknown: %s (the threshold chosen on the validation photos)", chosen.describe())
    return {**ckpt, "class_means": class_means(seen.head, labels, num_classes), "unknown": unknown_state(chosen)}
