"""What the end of training adds to a run's ``best.pt`` (:func:`calibrate_checkpoint`), from the features of
:mod:`vit_flowers.inference.features`, all read from one balanced sample of the training photos (up to
:data:`TEACH_PER_CLASS` a class, :data:`SAMPLE_PHOTOS` in all, :func:`sample_indices`): the photos each class's means
are taken over (``class_means``, their counts), the unknown rule chosen on its validation photos (``unknown``,
:mod:`vit_flowers.inference.unknown`; its class means and precision from the sample) and ``teach_sample``: the
:data:`TEACH_INPUT` features (the CLS token and the patch mean, each L2-normalised) of the sample's photos (float16;
~0.6 MB for four classes), and for a hybrid their pooled trunk outputs (``trunk``, 320-d for Lite0: ~1 MB more). A
model that ``teach`` fits a new head for keeps their mirror images too; a hybrid, whose taught classes get a gate on
the pooled trunk outputs, keeps the photos alone (:func:`keeps_mirrors`: the gate's figures in benchmarks/README.md
were measured on such samples, and the mirror images' pass would be a third of the end of the run).

``teach`` fits on those and on a new class's photos (and their mirror images) a logistic regression, each class
weighted alike (:func:`fit_head`, seconds): for a hybrid, the gate of its taught classes on the trunk outputs
(:mod:`vit_flowers.teaching.gate`); for another model, an ordinary linear head of a ViT whose ``head_input``
is :data:`TEACH_INPUT`. Either way a taught run is an ordinary checkpoint that exports to ONNX.
(What it wrote before, the nearest class mean of the CLS token, kept the new class's photos out:
benchmarks/HISTORY.md, "Unknown and teach (#37)".)
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import numpy as np
import torch

from ..data.datasets import TensorImageDataset
from ..models.patch_embed import HybridPatchEmbed
from ..models.vit import ViT
from ..runs.checkpoint import Checkpoint, ClassMeans, TeachSample, UnknownState
from .features import Outputs, batch_outputs, head_inputs
from .unknown import DEFAULT_RULE, RULES, UnknownRule, calibrate, known_scores, shared_precision

__all__ = ["SAMPLE_PHOTOS", "TEACH_INPUT", "TEACH_PER_CLASS", "TEACH_C", "class_means", "class_counts",
           "balanced_sample", "sample_indices", "keeps_mirrors", "teach_sample", "fit_head", "unknown_state",
           "calibrate_checkpoint", "Calibration", "calibration", "calibration_passes"]

log = logging.getLogger(__name__)

# what a taught head reads (a ViT's head_input) and how it is fitted: measured in benchmarks/HISTORY.md (#37)
TEACH_INPUT = "cls+patches"
TEACH_PER_CLASS = 200  # training photos a class that the end of a run reads: the class means, the rule, teach's sample
# at most this many in all (fewer a class when there are many classes): a pass over them is ~20 s on 2 AVX2 cores,
# and the rule from 200 photos a class is the rule from all of them (benchmarks/README.md, #53)
SAMPLE_PHOTOS = 1000
TEACH_C = 1.0  # the logistic regression's inverse regularisation


def class_counts(labels: np.ndarray, num_classes: int) -> ClassMeans:
    """``class_means`` of a checkpoint: the photos of each class (``counts``) that its means are taken over.
    Raises ValueError naming a class without photos."""
    counts = np.bincount(np.asarray(labels), minlength=num_classes)[:num_classes]
    if (counts == 0).any():
        raise ValueError(f"no photos of class number(s) {np.flatnonzero(counts == 0).tolist()} to take a mean of")
    return {"counts": counts.tolist()}


def class_means(features: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(C, dim) float32: the mean of each class's rows of ``features``. Raises ValueError naming a class without
    photos."""
    features, labels = np.asarray(features, dtype=np.float64), np.asarray(labels)
    class_counts(labels, num_classes)
    return np.stack([features[labels == c].mean(axis=0) for c in range(num_classes)]).astype(np.float32)


def balanced_sample(labels: np.ndarray, per_class: int) -> np.ndarray:
    """Indices of up to ``per_class`` items of each label, evenly spaced among that label's, in order."""
    labels = np.asarray(labels)
    keep = [mine[np.unique(np.linspace(0, len(mine) - 1, min(per_class, len(mine))).round().astype(int))]
            for mine in (np.flatnonzero(labels == c) for c in np.unique(labels))]
    return np.sort(np.concatenate(keep)) if keep else np.empty(0, int)


def keeps_mirrors(model: ViT, cached: bool = False) -> bool:
    """Whether the teach sample of ``model`` keeps its photos' mirror images (a pass of the model over them): not
    for a hybrid, whose taught classes ``teach`` fits a gate on the pooled trunk outputs (their figures were measured
    on samples of the photos alone), nor over cached trunk outputs (``cached``), where the mirror image would be the
    flipped grid, whose pooled output is the photo's own."""
    return not cached and not isinstance(model.to_patch_embedding, HybridPatchEmbed)  # (teaching.gate.reads_trunk)


def teach_sample(model: ViT, images: torch.Tensor, labels: np.ndarray, mean: Any, std: Any,
                 device: torch.device | str = "cpu", head_input: str = TEACH_INPUT,
                 per_class: int = TEACH_PER_CLASS, seen: Outputs | None = None, cached: bool = False,
                 ) -> TeachSample:
    """A checkpoint's ``teach_sample``: the ``head_input`` features of up to ``per_class`` photos of each class
    (evenly spaced), and of their mirror images where :func:`keeps_mirrors`: ``features`` (n or 2n, d) float16,
    ``labels``, ``head_input``, and for a hybrid ``trunk`` (n, C_trunk) float16, their pooled trunk outputs. What
    ``teach`` refits a head (or a hybrid's gate) on, so that it need not read the training photos again. ``seen``:
    the :class:`Outputs` of ``images`` when already computed; ``cached``: ``images`` are a hybrid's cached trunk
    outputs (as :func:`batch_outputs`)."""
    idx = balanced_sample(labels, per_class)
    picked = images[torch.from_numpy(idx)]
    plain = Outputs(*(part[idx] for part in seen)) if seen is not None else batch_outputs(
        model, picked, mean, std, device, cached=cached)
    views = [plain, batch_outputs(model, picked, mean, std, device, mirror=True)] if keeps_mirrors(
        model, cached) else [plain]
    sample: TeachSample = {
        "head_input": head_input,
        "features": torch.from_numpy(np.concatenate([head_inputs(o, head_input) for o in views])).half(),
        "labels": torch.from_numpy(np.tile(np.asarray(labels)[idx], len(views)).astype(np.int64))}
    if plain.trunk.shape[1]:  # a hybrid's
        sample["trunk"] = torch.from_numpy(np.concatenate([o.trunk for o in views])).half()
    return sample


def fit_head(features: np.ndarray, labels: np.ndarray, num_classes: int, c: float = TEACH_C,
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (C, d), bias (C,)) of a multinomial logistic regression of ``labels`` on ``features``, each class
    weighted alike (a class of 10 taught photos counts as much as one of 200 training photos): seconds on a CPU."""
    from sklearn.linear_model import LogisticRegression

    labels = np.asarray(labels)
    counts = np.bincount(labels, minlength=num_classes)
    if (counts == 0).any():
        raise ValueError(f"no photos of class number(s) {np.flatnonzero(counts == 0).tolist()} to fit a head on")
    weights = len(labels) / (num_classes * counts[labels])
    clf = LogisticRegression(C=c, max_iter=5000).fit(np.asarray(features, dtype=np.float64), labels,
                                                      sample_weight=weights)
    weight, bias = clf.coef_, clf.intercept_
    if num_classes == 2:  # scikit-learn's binary model: one row, the second class's logit
        weight, bias = np.vstack([-weight / 2, weight / 2]), np.r_[-bias / 2, bias / 2]
    return torch.from_numpy(weight.astype(np.float32)), torch.from_numpy(bias.astype(np.float32))


def sample_indices(labels: np.ndarray) -> np.ndarray:
    """The training photos the end of a run reads (:func:`calibration`): a balanced sample of up to
    :data:`TEACH_PER_CLASS` a class and :data:`SAMPLE_PHOTOS` in all, evenly spaced within each class."""
    labels = np.asarray(labels)
    classes = max(len(np.unique(labels)), 1)
    return balanced_sample(labels, max(1, min(TEACH_PER_CLASS, SAMPLE_PHOTOS // classes)))


def _sample(dataset: TensorImageDataset, cache: torch.Tensor | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """The images of :func:`sample_indices` of ``dataset`` (or their rows of ``cache``, its trunk outputs) and their
    labels."""
    idx = torch.from_numpy(sample_indices(dataset.labels.numpy()))
    return (dataset.batch(idx) if cache is None else cache[idx]), dataset.labels[idx].numpy()


def calibration_passes(train_labels: np.ndarray, mirrors: bool) -> int:
    """How many training photos (or their cached trunk outputs) :func:`calibration` passes the model over, what
    the time budget plans the end of a run with: the sample of :func:`sample_indices`, and its mirror images where
    the teach sample keeps them (``mirrors``, :func:`keeps_mirrors`). (The validation photos are counted apart:
    the last validation pass is read instead when it was of best.pt's weights.)"""
    return len(sample_indices(train_labels)) * (2 if mirrors else 1)


def unknown_state(rule: UnknownRule) -> UnknownState:
    """A rule as a checkpoint's ``unknown`` key: its arrays as tensors (``torch.load(weights_only=True)`` reads
    those, not numpy arrays)."""
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in rule.state().items()}


def calibrate_checkpoint(model: ViT, ckpt: Checkpoint, train: TensorImageDataset, val: TensorImageDataset,
                         device: torch.device | str = "cpu", rule: str = DEFAULT_RULE,
                         trunk_cache: tuple[torch.Tensor, torch.Tensor] | None = None) -> Checkpoint:
    """A copy of ``ckpt`` with ``class_means`` (the counts of ``train``'s photos read), the ``unknown`` rule (``rule``,
    its class means and precision from ``train``, its threshold chosen on ``val``; logs what every rule's threshold
    would be) and
    ``teach_sample`` (:func:`teach_sample` of ``train``). ``trunk_cache``: a hybrid's cached trunk outputs of
    ``train`` and ``val``, row for row, when its trunk has not trained since (a run that ended with its head
    start): read instead of the photos (a pass of a minute or more becomes seconds)."""
    return calibration(model, ckpt, train, val, device, rule, trunk_cache).ckpt


class Calibration(NamedTuple):
    """:func:`calibration`'s result: the checkpoint and the :class:`Outputs` of every validation photo, in order,
    that its threshold was chosen on (without a trunk cache: the model's fp32 outputs of the photos themselves,
    which the evaluation report of those photos reads instead of passing over them again)."""

    ckpt: Checkpoint
    val: Outputs
    val_seconds: float  # what the pass over the validation photos (or their cached trunk outputs) took


def calibration(model: ViT, ckpt: Checkpoint, train: TensorImageDataset, val: TensorImageDataset,
                device: torch.device | str = "cpu", rule: str = DEFAULT_RULE,
                trunk_cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                val_outputs: tuple[Outputs, float] | None = None) -> Calibration:
    """:func:`calibrate_checkpoint`, with the validation photos' outputs it read. ``val_outputs``: the model's
    :class:`Outputs` of ``val`` in fp32 and the seconds they took, already computed (training's last validation
    pass of these weights): read instead of another pass."""
    cached = trunk_cache is not None
    train_cache, val_cache = trunk_cache if trunk_cache is not None else (None, None)
    images, labels = _sample(train, train_cache)
    seen = batch_outputs(model, images, ckpt["mean"], ckpt["std"], device, cached=cached)
    num_classes = len(ckpt["classes"])
    means = class_means(seen.features, labels, num_classes)
    precision = shared_precision(seen.features, labels, means)
    start = time.perf_counter()
    if val_outputs is not None:
        held, val_seconds = val_outputs
    else:
        held = batch_outputs(model, val.images if val_cache is None else val_cache, ckpt["mean"], ckpt["std"],
                             device, cached=cached)
        val_seconds = time.perf_counter() - start
    chosen: UnknownRule | None = None
    for name in RULES:
        found = calibrate(name, known_scores(name, held.logits, held.features, means, precision), means=means,
                          precision=precision if name == "mahalanobis" else None)
        log.debug("unknown rule %s would be %s", name, found.describe())
        chosen = found if name == rule else chosen
    assert chosen is not None, rule
    log.info("unknown: %s (the threshold chosen on the validation photos)", chosen.describe())
    calibrated = ckpt.copy()
    calibrated["class_means"] = class_counts(labels, num_classes)
    calibrated["unknown"] = unknown_state(chosen)
    calibrated["teach_sample"] = teach_sample(model, images, labels, ckpt["mean"], ckpt["std"], device, seen=seen,
                                              cached=cached)
    return Calibration(calibrated, held, val_seconds)
