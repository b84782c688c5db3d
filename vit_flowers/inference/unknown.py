""""None of these": the rule that tells a photo of a known class from anything else, and its threshold.

At the end of training (:func:`vit_flowers.inference.calibration.calibrate_checkpoint`) a run scores its own validation
photos and keeps the threshold that accepts :data:`ACCEPT_FRACTION` of them; ``predict``, ``evaluate``, the app
and ONNX exports then label a photo whose score is below it ``unknown``. Every score is "higher = more like a
known class":

- ``max_softmax``: the top class probability (what the app's old fixed 0.5 "Not sure" cut-off used);
- ``energy``: the log-sum-exp of the logits (Liu et al. 2020);
- ``distance``, ``cosine``, ``mahalanobis``: minus the Euclidean distance / the cosine (about the classes' centre)
  / minus the squared Mahalanobis distance under one covariance shared by the classes (Lee et al. 2018) of a
  photo's features to the nearest class mean of the training photos' features. The features are the mean of the
  patch tokens after the final norm (:func:`vit_flowers.models.vit.logits_and_features`).

Which one separates flowers from non-flowers best was measured (benchmarks/HISTORY.md, "Unknown and teach (#37)"):
:data:`DEFAULT_RULE`. This module needs only numpy, so that an ONNX deployment applies the rule without torch.
A checkpoint stores the rule under ``unknown``: rule, threshold, accept, val_accepted, n_val, and what a feature
rule needs, ``means`` (C, dim) and ``precision`` (dim, dim; mahalanobis), and a taught run's ``offsets`` (C,; an
allowance per class, :mod:`vit_flowers.teaching.rule`); an ONNX export carries it as JSON.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data.class_names import UNKNOWN  # the label of a rejected photo (a class may not be named so)

__all__ = ["RULES", "FEATURE_RULES", "DEFAULT_RULE", "ACCEPT_FRACTION", "SHRINKAGE", "UNKNOWN", "SCALES",
           "NEARLY_ALL", "UnknownRule", "known_scores", "shared_precision", "calibrate", "finite_threshold",
           "rule_from_checkpoint", "rejection_warning", "metadata_entries", "from_metadata"]

log = logging.getLogger("vit_flowers.unknown")

RULES = ("max_softmax", "energy", "distance", "cosine", "mahalanobis")
FEATURE_RULES = ("distance", "cosine", "mahalanobis")  # the rules that need the model's features and class means
# the best separation of flowers from scikit-image's non-flowers (AUROC 0.99; benchmarks/README.md, #37)
DEFAULT_RULE = "mahalanobis"
SHRINKAGE = 1e-3  # the shared covariance gets this fraction of its mean variance on the diagonal (invertible)
ACCEPT_FRACTION = 0.95  # the threshold accepts this fraction of the run's own validation photos
# what each rule's score is, so that a threshold on the wrong scale can be told (higher: more like a known class)
SCALES: dict[str, str] = {
    "max_softmax": "the top class probability (0 to 1)",
    "energy": "the log-sum-exp of the logits",
    "distance": "minus the Euclidean distance of a photo's features to the nearest class mean (0 or less)",
    "cosine": "the cosine of a photo's features to the nearest class mean (-1 to 1)",
    "mahalanobis": "minus the squared Mahalanobis distance of a photo's features to the nearest class mean "
                   "(0 or less)",
}
NEARLY_ALL = 0.9  # a threshold that rejects at least this share of the photos given is warned about


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def known_scores(rule: str, logits: np.ndarray, features: np.ndarray | None = None,
                 means: np.ndarray | None = None, precision: np.ndarray | None = None,
                 offsets: np.ndarray | None = None) -> np.ndarray:
    """(B,) scores of ``rule`` (higher: more like a known class) from logits (B, C) and, for the feature rules,
    features (B, dim), class means (C, dim) and (mahalanobis) the shared precision matrix (dim, dim) and the
    optional per-class ``offsets`` (C,), taken off each class's squared distance (a taught run's)."""
    logits = np.asarray(logits, dtype=np.float64)
    if rule == "max_softmax":
        return _softmax(logits).max(axis=1)
    if rule == "energy":
        top = logits.max(axis=1, keepdims=True)
        return (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))[:, 0]
    if rule not in FEATURE_RULES:
        raise ValueError(f"unknown rule {rule!r}: choose one of {', '.join(RULES)}")
    if features is None or means is None or (rule == "mahalanobis" and precision is None):
        raise ValueError(f"the {rule} rule needs the model's features and the class means")
    f, m = np.asarray(features, dtype=np.float64), np.asarray(means, dtype=np.float64)
    if rule == "mahalanobis":
        p = np.asarray(precision, dtype=np.float64)
        fp = f @ p
        d2 = (fp * f).sum(1, keepdims=True) - 2 * fp @ m.T + ((m @ p) * m).sum(1)[None]
        if offsets is not None:
            d2 = d2 - np.asarray(offsets, dtype=np.float64)[None]
        return -d2.min(axis=1)
    if rule == "distance":
        d2 = (f * f).sum(1, keepdims=True) - 2 * f @ m.T + (m * m).sum(1)[None]
        return -np.sqrt(np.clip(d2.min(axis=1), 0, None))
    center = m.mean(axis=0, keepdims=True)  # cosines about the classes' centre, not the origin
    f, m = f - center, m - center
    f /= np.linalg.norm(f, axis=1, keepdims=True).clip(1e-12)
    m /= np.linalg.norm(m, axis=1, keepdims=True).clip(1e-12)
    return (f @ m.T).max(axis=1)


def shared_precision(features: np.ndarray, labels: np.ndarray, means: np.ndarray) -> np.ndarray:
    """The inverse of the covariance of ``features`` about their class ``means`` (one for every class), shrunk
    towards its mean variance by :data:`SHRINKAGE`."""
    z = np.asarray(features, dtype=np.float64) - np.asarray(means, dtype=np.float64)[labels]
    cov = z.T @ z / max(len(z), 1)
    spread = np.trace(cov) / len(cov)
    if not spread > 0:  # one photo a class (or copies of one): no spread about the means to measure
        log.warning("unknown: no spread of the training photos about their class means (one photo a class?): the "
                    "rule measures plain distances to the means")
        return np.eye(len(cov), dtype=np.float32)
    cov += SHRINKAGE * spread * np.eye(len(cov))
    return np.linalg.inv(cov).astype(np.float32)


@dataclass
class UnknownRule:
    """A rule and its threshold: a photo whose :func:`known_scores` is below ``threshold`` is ``unknown``."""

    rule: str
    threshold: float
    means: np.ndarray | None = None  # (C, dim) class means, for the feature rules
    precision: np.ndarray | None = None  # (dim, dim) the shared precision matrix, for mahalanobis
    accept: float = ACCEPT_FRACTION  # the fraction of validation photos it was chosen to accept
    val_accepted: float | None = None  # the fraction it does accept (ties can make it more)
    n_val: int | None = None  # how many validation photos it was chosen on
    calibrated: float | None = None  # the threshold the run chose (a checkpoint's rule; kept when one is given)
    offsets: np.ndarray | None = None  # (C,) allowances on the squared distance (mahalanobis; a taught run's)

    @property
    def needs_features(self) -> bool:
        return self.rule in FEATURE_RULES

    def scores(self, logits: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        return known_scores(self.rule, logits, features, self.means, self.precision, self.offsets)

    def rejects(self, scores: np.ndarray) -> np.ndarray:
        """(N,) bool: which of these :meth:`scores` are ``unknown`` (below the threshold; a NaN score too). The one
        test that predict, evaluate's metrics and its predictions.csv all apply."""
        return ~(np.asarray(scores, dtype=np.float64) >= self.threshold)

    def state(self) -> dict[str, Any]:
        """What a checkpoint's ``unknown`` key holds (``means`` and ``precision`` as float32 arrays, or None;
        ``offsets`` only where there are some)."""
        arrays = {k: None if v is None else np.asarray(v, dtype=np.float32)
                  for k, v in (("means", self.means), ("precision", self.precision), ("offsets", self.offsets))
                  if k != "offsets" or v is not None}
        return {"rule": self.rule, "threshold": float(self.threshold), "accept": float(self.accept),
                "val_accepted": self.val_accepted, "n_val": self.n_val, **arrays}

    def describe(self) -> str:
        kept = f", accepts {self.val_accepted:.1%} of {self.n_val} validation photos" if self.n_val else ""
        return f"{self.rule} >= {self.threshold:.4g}{kept}"


def calibrate(rule: str, scores: np.ndarray, accept: float = ACCEPT_FRACTION, means: np.ndarray | None = None,
              precision: np.ndarray | None = None) -> UnknownRule:
    """The threshold of ``rule`` that accepts ``accept`` of the photos whose ``scores`` are given (a run's own
    validation photos): their (1 - accept) quantile."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        raise ValueError("no validation photos to choose an unknown threshold on")
    threshold = float(np.quantile(scores, 1 - accept, method="lower"))
    return UnknownRule(rule, threshold, means, precision, accept, float((scores >= threshold).mean()),
                       int(scores.size))


def _array(found: Any) -> np.ndarray | None:
    """A stored array (a torch tensor in a checkpoint, a list in an export's metadata) as float32, or None."""
    if found is None:
        return None
    return np.asarray(found.float().numpy() if hasattr(found, "numpy") else found, dtype=np.float32)


def finite_threshold(value: float | str, where: str = "--unknown-threshold") -> float:
    """``value`` as a float, or ValueError naming ``where`` when it is no number or not finite (nan, inf: a rule
    would then call every photo known, or every photo unknown)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a number, not {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{where} must be a finite number, not {value!r}: the rule's scores are compared with it "
                         f"(--no-unknown turns the rule off)")
    return number


def rule_from_checkpoint(ckpt: Mapping[str, Any], *, threshold: float | None = None, off: bool = False,
                         where: str = "the checkpoint") -> UnknownRule | None:
    """The unknown rule of a loaded checkpoint (or an export's metadata in the same layout), with the command
    line's overrides: ``off`` (``--no-unknown``): None; ``threshold`` (``--unknown-threshold``) replaces the
    stored one. A checkpoint trained before the rule existed has none: unknown is off, unless a threshold is given,
    which is then one of ``max_softmax`` (the top probability, as the app's old "Not sure" cut-off)."""
    if off:
        return None
    if threshold is not None:
        threshold = finite_threshold(threshold)
    stored = ckpt.get("unknown")
    if not stored:
        return UnknownRule("max_softmax", threshold) if threshold is not None else None
    try:
        rule = UnknownRule(str(stored["rule"]), finite_threshold(stored["threshold"], "threshold"),
                           _array(stored.get("means")),
                           _array(stored.get("precision")), float(stored.get("accept", ACCEPT_FRACTION)),
                           stored.get("val_accepted"), stored.get("n_val"), offsets=_array(stored.get("offsets")))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: its unknown rule is unreadable ({exc!r}); pass --no-unknown") from None
    if rule.rule not in RULES or (rule.needs_features and rule.means is None) or (
            rule.rule == "mahalanobis" and rule.precision is None) or (
            rule.offsets is not None and (rule.means is None or rule.offsets.shape != (len(rule.means),))):
        raise ValueError(f"{where}: unknown rule {rule.rule!r} without what it needs (class means, precision, an "
                         f"offset per class); pass --no-unknown")
    rule.calibrated = rule.threshold
    if threshold is not None:
        rule.threshold, rule.val_accepted, rule.n_val = float(threshold), None, None
    return rule


def rejection_warning(rule: UnknownRule, rejected: int, total: int) -> str | None:
    """What to warn when ``rule`` rejects ``rejected`` of ``total`` photos, at least :data:`NEARLY_ALL` of them
    (else None): the share, what the rule's scores are and its calibrated threshold, so that a threshold on the
    wrong scale (a probability for a distance) shows."""
    if total <= 0 or rejected < NEARLY_ALL * total:
        return None
    scale = (f"this run's rule ({rule.rule}) scores {SCALES.get(rule.rule, rule.rule)}; higher is more like a known "
             f"class; its calibrated threshold is {rule.calibrated:.4g}" if rule.calibrated is not None else
             f"this model has no calibrated rule: the threshold is compared with {SCALES.get(rule.rule, rule.rule)}")
    return (f"unknown: {rejected} of {total} photos ({rejected / total:.0%}) rejected by the threshold "
            f"{rule.threshold:.4g}: {scale} (another --unknown-threshold on that scale, or --no-unknown, changes it)")


def metadata_entries(ckpt: Mapping[str, Any]) -> dict[str, str]:
    """A checkpoint's ``unknown`` as JSON metadata of its ONNX export (empty without)."""
    stored = ckpt.get("unknown")
    if not stored:
        return {}
    plain = dict(stored)
    for key in ("means", "precision", "offsets"):
        found = _array(plain.get(key))
        if found is not None:
            plain[key] = found.tolist()
    return {"unknown": json.dumps(plain)}


def from_metadata(meta: dict[str, str]) -> dict[str, Any]:
    """The ``unknown`` key of a checkpoint, from an export's metadata (absent: empty)."""
    return {"unknown": json.loads(meta["unknown"])} if "unknown" in meta else {}
