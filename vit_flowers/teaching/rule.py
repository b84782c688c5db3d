""""None of these" after teaching: the trained run's Mahalanobis rule measured again with the taught classes in.

Teach does not change the network's features (its head alone is refitted), so the old classes' means stay what
they were. The taught run's rule (:func:`recalibrate`):

- each taught class's mean is that of its photos (a class the run has: its photos join its mean, weighted by
  count), as ``teach`` adds them;
- the shared covariance takes in the taught photos' spread about their class means, weighted by photo count
  against the photos it was measured on (the run's :data:`~vit_flowers.inference.unknown.SHRINKAGE` kept): 10
  photos against thousands move it little, and a few photos cannot make it singular;
- the threshold is scaled by (N + n) / N (N photos before, n taught): the most the covariance's update can lengthen
  an old photo's distance, so that no photo of an old class whose mean did not move (photos added to a class move
  its mean) that the run accepted is turned away;
- each taught class with two photos or more gets an allowance (``offsets``, taken off its squared distance): the
  :data:`~vit_flowers.inference.unknown.ACCEPT_FRACTION` quantile of how far its photos, each measured against the
  mean of the others under the covariance without it (leave one out), fall outside the threshold. A mean of 10
  photos lies further from a new photo of the class than a mean of thousands does, and the class's features are
  more spread out than those of a class the network trained on, so the old threshold alone turned many of them away
  (#46).

So held-out photos of a taught class are accepted about as often as those of the old classes (as far as the photos
given show its spread: a class of a few photos may spread wider than they do), and those of the old classes no less
than before. Numpy only, as :mod:`vit_flowers.inference.unknown`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..inference.unknown import ACCEPT_FRACTION, UnknownRule

__all__ = ["taught_rule", "recalibrate", "leave_one_out_d2"]


def taught_rule(rule: UnknownRule | None, counts: list[int], taught: dict[int, np.ndarray]) -> UnknownRule | None:
    """The rule of a run taught ``taught`` (each class's photos' features (n, dim) by class number; a new class
    numbered after the others, in order) from ``rule``, the run's before (``counts``: the photos each class's mean
    is taken over): its class means with the photos in (weighted by count); a mahalanobis rule then
    :func:`recalibrate`-d, another feature rule at its threshold. None where there is none or it reads the old head's
    logits (its threshold belongs to that head). ``rule`` is not changed."""
    if rule is None or not rule.needs_features or rule.means is None:
        return None
    means, offsets, after = np.asarray(rule.means, np.float64), rule.offsets, list(counts)
    for c, x in sorted(taught.items()):
        n = after[c] if c < len(after) else 0
        row = (means[c] * n if c < len(means) else 0.0) + np.asarray(x, np.float64).sum(axis=0)
        if c < len(means):
            means[c], after[c] = row / (n + len(x)), n + len(x)
        else:
            means, after = np.vstack([means, row / len(x)]), [*after, len(x)]
            offsets = None if offsets is None else np.r_[offsets, 0.0].astype(np.float32)  # taught again
    found = replace(rule, means=means.astype(np.float32), offsets=offsets)
    return recalibrate(found, sum(counts), taught, after) if rule.rule == "mahalanobis" else found


def leave_one_out_d2(x: np.ndarray, mean: np.ndarray, count: int, precision: np.ndarray, total: int) -> np.ndarray:
    """(n,) squared Mahalanobis distance of each row of ``x`` to the mean of the other ``count - 1`` photos of its
    class (``mean``: of all ``count``, ``x`` among them), under the covariance without it: ``precision`` is of a
    covariance that took in each photo's spread about ``mean`` over ``total`` photos, and each photo's share is taken
    out again (Sherman-Morrison). Otherwise a class of a few photos, which shapes the covariance in its own
    directions, would look nearer to itself than a new photo of it will be."""
    x, p = np.asarray(x, np.float64), np.asarray(precision, np.float64)
    z = x - np.asarray(mean, np.float64)[None]  # about the mean of all of them
    u = z * count / (count - 1)  # about the mean of the others
    pz = z @ p
    own = (pz * z).sum(axis=1)  # each photo's leverage on the covariance (< total)
    return (u @ p * u).sum(axis=1) + (u * pz).sum(axis=1) ** 2 / np.clip(total - own, 1e-6, None)


def _pooled_precision(rule: UnknownRule, before: int, taught: dict[int, np.ndarray]) -> tuple[np.ndarray, float]:
    """(the precision of the covariance with the taught photos' spread in, the share ``a`` of the old covariance in
    it): covariance = a * old + (scatter of the taught photos about their class means) / (before + n)."""
    assert rule.means is not None and rule.precision is not None, "a mahalanobis rule"
    n = sum(len(x) for x in taught.values())
    scatter = np.zeros((rule.means.shape[1],) * 2)
    for c, x in taught.items():
        z = np.asarray(x, np.float64) - np.asarray(rule.means[c], np.float64)[None]
        scatter += z.T @ z
    share = before / (before + n)
    cov = share * np.linalg.inv(np.asarray(rule.precision, np.float64)) + scatter / (before + n)
    return np.linalg.inv(cov), share


def recalibrate(rule: UnknownRule, before: int, taught: dict[int, np.ndarray], counts: list[int],
                accept: float = ACCEPT_FRACTION) -> UnknownRule:
    """The taught run's rule (see the module's docstring) from ``rule``, a mahalanobis rule whose ``means`` already
    hold every class (the taught ones' with their photos in, as ``teach`` adds them): ``before`` the photos its
    covariance was measured on, ``taught`` each taught class's photos' features (n, dim) by class number,
    ``counts`` the photos each class's mean is taken over. ``rule`` is not changed."""
    assert rule.rule == "mahalanobis" and rule.means is not None, rule.rule
    precision, share = _pooled_precision(rule, before, taught)
    threshold = rule.threshold / share if rule.threshold < 0 else rule.threshold
    offsets = np.zeros(len(rule.means))
    if rule.offsets is not None:  # a taught run taught again: its classes keep their allowances
        offsets[:len(rule.offsets)] = rule.offsets
    for c, x in taught.items():
        if counts[c] >= 2:
            d2 = leave_one_out_d2(x, rule.means[c], counts[c], precision, before + sum(map(len, taught.values())))
            outside = d2 + threshold  # > 0: turned away
            # interpolated: the "higher" quantile (the largest of 10 photos) let in far more non-flowers (#46)
            offsets[c] = max(0.0, float(np.quantile(outside, accept)))
    return UnknownRule("mahalanobis", threshold, rule.means, precision.astype(np.float32), rule.accept,
                       rule.val_accepted, rule.n_val, offsets=offsets.astype(np.float32))
