"""What ``teach`` says before the user relies on a taught class: an estimate of how often it will be recognised.

:func:`cross_validate` fits teach's head (:func:`vit_flowers.training.calibration.fit_head`, a logistic regression
on frozen features) :data:`FOLDS` times more, each time without a third of every taught class's photos (and their
mirror images), and predicts the photos left out: each taught class's recall measured on photos its head never saw,
and the classes it took the others for. :func:`advice` turns that into one line that says what would help.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runs.checkpoint import TaughtEstimate
from ..training.calibration import fit_head

__all__ = ["FOLDS", "FEW_PHOTOS", "GOOD_RECALL", "TaughtPhotos", "cross_validate", "recall", "advice"]

FOLDS = 3  # each fold leaves out a third of every taught class's photos
FEW_PHOTOS = 5  # fewer photos of a class than this: a warning (5-20 are enough to start)
GOOD_RECALL = 0.8  # below this estimate, teach says what would help


@dataclass
class TaughtPhotos:
    """A taught class's photos as the head reads them: its class number, and the features of the photos (n, d) and
    of their mirror images (n, d), row for row."""

    label: int
    plain: np.ndarray
    mirrored: np.ndarray


def _folds(taught: list[TaughtPhotos], seed: int) -> list[np.ndarray]:
    """For each taught class, the fold (0 to FOLDS - 1) of each of its photos: spread evenly, in a random order."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(len(t.plain)) % FOLDS for t in taught]


def cross_validate(old_x: np.ndarray, old_y: np.ndarray, taught: list[TaughtPhotos], names: list[str],
                   seed: int = 0) -> list[TaughtEstimate]:
    """A :class:`TaughtEstimate` of each class of ``taught`` with two photos or more (a class of one cannot be left
    out and still be taught): ``old_x``, ``old_y`` are the features the head is fitted on besides the taught photos
    (the run's kept training photos), ``names`` every class's name by number."""
    folds = _folds(taught, seed)
    found = {t.label: TaughtEstimate(name=names[t.label], photos=len(t.plain), correct=0, confused={})
             for t in taught if len(t.plain) >= 2}
    for f in range(FOLDS):
        xs, ys, tests = [old_x], [old_y], []
        for t, fold in zip(taught, folds):
            keep = fold != f if t.label in found else np.ones(len(fold), bool)
            xs += [t.plain[keep], t.mirrored[keep]]
            ys += [np.full(2 * int(keep.sum()), t.label)]
            if t.label in found and (~keep).any():
                tests.append((t.label, t.plain[~keep]))
        if not tests:
            continue
        weight, bias = fit_head(np.concatenate(xs), np.concatenate(ys), len(names))
        for label, x in tests:
            predicted = (x @ weight.numpy().T + bias.numpy()).argmax(axis=1)
            _count(found[label], [names[p] for p in predicted])
    return list(found.values())


def _count(estimate: TaughtEstimate, predicted: list[str]) -> None:
    """Add the predictions of some of ``estimate``'s photos to it (in place)."""
    for name in predicted:
        if name == estimate["name"]:
            estimate["correct"] += 1
        else:
            estimate["confused"][name] = estimate["confused"].get(name, 0) + 1


def recall(estimate: TaughtEstimate) -> float:
    """The share of its photos that a head fitted without them recognised."""
    return estimate["correct"] / max(estimate["photos"], 1)


def advice(estimate: TaughtEstimate) -> str:
    """One line: the estimate, what the misses were called, and what would help when it is low (below
    :data:`GOOD_RECALL`, or from fewer than :data:`FEW_PHOTOS` photos)."""
    name, n = estimate["name"], estimate["photos"]
    line = (f"{name}: about {recall(estimate):.0%} will be recognised ({estimate['correct']} of {n} photos, each "
            f"predicted by a head fitted without it)")
    confused = sorted(estimate["confused"].items(), key=lambda kv: (-kv[1], kv[0]))
    if confused:
        line += "; " + ", ".join(f"called {other} in {count} of {n}" for other, count in confused)
    if recall(estimate) < GOOD_RECALL or n < FEW_PHOTOS:
        line += (f": add photos (about {max(20, 2 * n)}), or train with a folder that holds {name} "
                 f"(vit-flowers train --data)")
    return line
