"""A hybrid that starts where the frozen-feature recipe ends (#60).

Teachable Machine and Create ML fit a logistic regression on a frozen ImageNet network's pooled features, on every
photo they are given. A hybrid with a feature head (:class:`~vit_flowers.models.feature_head.FeatureHead`) holds
that classifier: :func:`start_from_features` fits it on the head start's cached trunk outputs (at the peers' C, its
accuracy cross-validated on the training photos for the log) and sets the encoder's head to zero, so that the model
at its first step *is* that recipe; the head-start epochs then train the encoder on top, and replace the start in
best.pt only where they beat it by more than the noise of the validation photos (:func:`.recipe.beats_head_start`).
At the end of a run that ends with its head start, :func:`refit_on_every_photo` fits the classifier again on the
training *and* validation photos, as the peer does: no photo is lost to choosing.

    >>> start = start_from_features(model, train_grids, train_labels)    # seconds
    >>> start.describe()    # 'the frozen-feature fit on 120 photos of Lite0 + Lite2's features, C 0.1 (cross-...)'
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging

import numpy as np
import torch
from torch import nn

from ..inference.calibration import fit_head
from ..models.feature_head import FeatureHead
from ..models.vit import ViT

__all__ = ["FEATURE_HEADS", "FEATURE_EXTRAS", "EXTRAS_MAX_PHOTOS", "wants_feature_head", "feature_extras", "C",
           "FeatureStart", "pooled_features", "cross_validate", "start_from_features", "refit_on_every_photo"]

log = logging.getLogger("vit_flowers.train")

FEATURE_HEADS: tuple[str, ...] = ("auto", "on", "off")  # the config key feature_head
FEATURE_EXTRAS: tuple[str, ...] = ("auto", "none", "lite1", "lite2", "lite1+lite2")  # the config key feature_extras
# auto reads Lite2 beside the trunk up to this many photos (train and val): its pass costs about what the trunk's
# does, seconds a hundred photos on 2 cores; its features and Lite0's side by side separated unseen flowers5 photos
# better than either alone (benchmarks/README.md, "Few photos")
EXTRAS_MAX_PHOTOS = 1000
AUTO_EXTRA = "lite2"
# the logistic regression's inverse regularisation: the peers' usual value; chosen by cross-validation among 0.03 to
# 1 it read the same on held-out photos and cost a fit per fold and value (benchmarks/HISTORY.md, "Few photos")
C = 0.1
MAX_FOLDS = 5


@dataclasses.dataclass(frozen=True)
class FeatureStart:
    """What the start was fitted with, for the log and the report."""

    c: float  # the logistic regression's inverse regularisation
    cv_accuracy: float | None  # its cross-validated accuracy on the training photos (None: too few to fold)
    folds: int  # the folds of that cross-validation (0: none)
    photos: int  # the photos it was fitted on
    networks: str = "Lite0"  # whose pooled features it reads, e.g. "Lite0 + Lite2"

    def describe(self) -> str:
        evidence = (f"cross-validated {100 * self.cv_accuracy:.1f}% over {self.folds} folds"
                    if self.cv_accuracy is not None else "too few photos a class to cross-validate")
        networks = f"{self.networks}'s features"
        return f"the frozen-feature fit on {self.photos} photos of {networks}, C {self.c:g} ({evidence})"


def wants_feature_head(setting: str, *, hybrid_at_32: bool, imagenet: bool, head_start: bool,
                       fewest: int, end_to_end_min_per_class: int) -> bool:
    """Whether a run builds its hybrid with a feature head: ``setting`` (the config key) "on" or "off", or "auto":
    a hybrid cut at stride 32 (``hybrid_at_32``) from ImageNet weights with a head start, whose photos hold no more
    than that head start (the ``fewest`` photos of a class below ``end_to_end_min_per_class``)."""
    if setting != "auto":
        return setting == "on"
    return hybrid_at_32 and imagenet and head_start and fewest < end_to_end_min_per_class


def feature_extras(setting: str, photos: int) -> str:
    """The ViT's ``feature_extras`` for the config key's ``setting`` on ``photos`` photos: "auto" is Lite2 up to
    :data:`EXTRAS_MAX_PHOTOS` photos where its package is installed (else none, said in the log), "none" none."""
    if setting != "auto":
        return "" if setting == "none" else setting
    if photos > EXTRAS_MAX_PHOTOS:
        return ""
    from ..models.efficientnet import LITE_VARIANTS

    variant = LITE_VARIANTS[AUTO_EXTRA]
    if importlib.util.find_spec(variant.module) is None:
        log.info("feature head: %s would add its features (%s)", variant.title, variant.install_hint())
        return ""
    return AUTO_EXTRA


def _feature_head(model: ViT) -> FeatureHead:
    if model.feature_head is None:
        raise ValueError("the model has no feature head (feature_head)")
    return model.feature_head


@torch.inference_mode()
def pooled_features(model: ViT, grids: torch.Tensor, batch_size: int = 256) -> np.ndarray:
    """A hybrid's trunk outputs (N, C, h, w), e.g. the head start's float16 cache -> its feature head's pooled
    ImageNet features, float64 (N, num_features)."""
    head = _feature_head(model)
    device = next(head.parameters()).device
    parts = [head.features(chunk.to(device).float()).double().cpu().numpy() for chunk in grids.split(batch_size)]
    return np.concatenate(parts) if parts else np.empty((0, head.num_features))


def cross_validate(x: np.ndarray, y: np.ndarray, num_classes: int, c: float = C) -> tuple[float | None, int]:
    """(accuracy, folds) of the logistic regression at ``c`` on features ``x`` of labels ``y`` over stratified folds
    (as many as the smallest class allows, at most :data:`MAX_FOLDS`): what the start is worth on photos it did not
    see, for the log and the report; (None, 0) where a class has fewer than 2 photos."""
    from sklearn.model_selection import StratifiedKFold

    folds = int(min(MAX_FOLDS, np.bincount(y, minlength=num_classes).min()))
    if folds < 2:
        return None, 0
    correct = 0
    for fit_i, held_i in StratifiedKFold(folds, shuffle=True, random_state=0).split(x, y):
        weight, bias = fit_head(x[fit_i], y[fit_i], num_classes, c)
        correct += int(((x[held_i] @ weight.double().numpy().T + bias.double().numpy()).argmax(1) == y[held_i]).sum())
    return correct / len(y), folds


def _set_classifier(model: ViT, weight: torch.Tensor, bias: torch.Tensor) -> None:
    fc = _feature_head(model).fc
    with torch.no_grad():
        fc.weight.copy_(weight)
        fc.bias.copy_(bias)


def start_from_features(model: ViT, grids: torch.Tensor, labels: torch.Tensor) -> FeatureStart:
    """Fit ``model``'s feature head on the trunk outputs ``grids`` (N, C, h, w) of its training photos (``labels``,
    every class present) and zero the encoder's head: the model is then the frozen-feature recipe. Logged."""
    x, y = pooled_features(model, grids), labels.numpy()
    cv, folds = cross_validate(x, y, model.num_classes)
    _set_classifier(model, *fit_head(x, y, model.num_classes, C))
    if isinstance(model.mlp_head, nn.Linear):
        with torch.no_grad():
            model.mlp_head.weight.zero_()
            model.mlp_head.bias.zero_()
    head = _feature_head(model)
    networks = " + ".join(v.title() for v in (head.variant, *head.extras))
    start = FeatureStart(C, cv, folds, len(y), networks)
    log.info("start: %s; the encoder learns on top and is kept only where it beats that start", start.describe())
    return start


def refit_on_every_photo(model: ViT, grids: torch.Tensor, labels: torch.Tensor, c: float) -> None:
    """Fit ``model``'s feature head again, at ``c``, on the trunk outputs of every labelled photo (the training and
    validation photos: the validation photos chose; they are no longer needed to choose)."""
    x = pooled_features(model, grids)
    _set_classifier(model, *fit_head(x, labels.numpy(), model.num_classes, c))
