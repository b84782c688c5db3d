"""What ``teach`` says before the user relies on a taught class: an estimate of how often it will be recognised.

:func:`cross_validate` fits what teach fits (:func:`vit_flowers.inference.calibration.fit_head`, a logistic
regression on frozen features: another model's head, or a hybrid's gate) up to :data:`FOLDS` times more, each time
without a tenth of every taught class's photos and their mirror images (one photo, for ten or fewer: leave-one-out),
and predicts the photos left out as the new run will: a hybrid's through the mixture of its trained head and that
gate with its bias (:func:`vit_flowers.models.taught.mix`), and judges them with the "none of these" rule made of
the photos fitted on (:func:`vit_flowers.teaching.rule.taught_rule`; a photo it turns away is missed). So each
taught class's recall with the rule on is measured on photos the classifier and the rule never saw, with the classes
it took the others for. From ten photos that share is known to about +/- 15 points: :func:`recall_range` says how
far (an 80% Wilson interval), and :func:`advice` turns it into one line that says what would help.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..data.class_names import UNKNOWN
from ..inference.calibration import fit_head
from ..inference.unknown import UnknownRule
from ..models.taught import mix
from ..runs.checkpoint import TaughtEstimate

__all__ = ["FOLDS", "FEW_PHOTOS", "GOOD_RECALL", "RANGE_Z", "RuleFor", "TaughtPhotos", "cross_validate", "recall",
           "recall_range", "advice"]

# the most folds: each leaves out a tenth of every taught class's photos (one photo of ten or fewer). Against 3 folds
# on flowers5's rotations (#55) the estimate is as far from the measured recall, but less below it (fitted on 9 photos
# of 10, not 7) and the same for the same photos (no random split of 10 photos into three)
FOLDS = 10
FEW_PHOTOS = 5  # fewer photos of a class than this: a warning (5-20 are enough to start)
GOOD_RECALL = 0.8  # below this estimate, teach says what would help
# the range's z: a two-sided 80% interval, so that the recall measured later falls in it about four times in five
RANGE_Z = 1.2816
# the "none of these" rule a run taught some photos would write (teaching.rule.taught_rule): their features (n, dim)
# by class number -> the rule, or None where it has none
RuleFor = Callable[[dict[int, np.ndarray]], UnknownRule | None]


@dataclass
class TaughtPhotos:
    """A taught class's photos as the fitted part reads them: its class number, the features of the photos (n, d)
    and of their mirror images (n, d), row for row, for a hybrid the trained head's logits of the photos (n, K),
    which its gate is mixed with, and the features the unknown rule compares (n, dim; None: not judged)."""

    label: int
    plain: np.ndarray
    mirrored: np.ndarray
    trained: np.ndarray | None = None
    rule_x: np.ndarray | None = None


def _folds(taught: list[TaughtPhotos], seed: int) -> list[np.ndarray]:
    """For each taught class, the fold (0 to FOLDS - 1) of each of its photos: spread evenly, in a random order (one
    photo a fold for FOLDS photos or fewer)."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(len(t.plain)) % FOLDS for t in taught]


def _predicted(x: np.ndarray, weight: torch.Tensor, bias: torch.Tensor, trained: np.ndarray | None,
               gate_bias: float) -> np.ndarray:
    """The classes a fitted head (``weight``, ``bias``) gives features ``x`` (n, d); with a hybrid's ``trained``
    head logits (n, K), the classes of its mixture with that head, the gate being the fitted one."""
    logits = torch.from_numpy(np.asarray(x, np.float32)) @ weight.T + bias
    if trained is not None:
        logits = mix(torch.from_numpy(np.asarray(trained, np.float32)), logits, gate_bias)
    return logits.argmax(dim=1).numpy()


def _turned_away(rule_for: RuleFor | None, taught: list[TaughtPhotos], fitted: list[np.ndarray], t: TaughtPhotos,
                 held: np.ndarray) -> np.ndarray:
    """(held.sum(),) bool: which of ``t``'s held-out photos the rule that ``rule_for`` makes of the photos fitted
    on (``fitted``: each taught class's kept rows) turns away; none without a rule."""
    rule = None if rule_for is None else rule_for({s.label: s.rule_x[keep] for s, keep in zip(taught, fitted)
                                                  if s.rule_x is not None})
    if rule is None or t.rule_x is None:
        return np.zeros(int(held.sum()), bool)
    x = t.rule_x[held]
    return rule.rejects(rule.scores(np.empty((len(x), 0)), x))


def cross_validate(old_x: np.ndarray, old_y: np.ndarray, taught: list[TaughtPhotos], names: list[str],
                   gate_bias: float = 0.0, rule_for: RuleFor | None = None, seed: int = 0) -> list[TaughtEstimate]:
    """A :class:`TaughtEstimate` of each class of ``taught`` with two photos or more (a class of one cannot be left
    out and still be taught): ``old_x``, ``old_y`` are the features the head is fitted on besides the taught photos
    (the run's kept training photos), ``names`` every class's name by number, ``gate_bias`` the log-odds a hybrid's
    mixture adds to its taught classes (where ``taught`` holds the trained head's logits), ``rule_for`` the "none of
    these" rule the new run would write (a photo it turns away is counted as called :data:`UNKNOWN`)."""
    folds = _folds(taught, seed)
    found = {t.label: TaughtEstimate(name=names[t.label], photos=len(t.plain), correct=0, confused={})
             for t in taught if len(t.plain) >= 2}
    for f in range(FOLDS):
        xs, ys, tests, kept = [old_x], [old_y], [], []
        for t, fold in zip(taught, folds):
            keep = fold != f if t.label in found else np.ones(len(fold), bool)
            kept.append(keep)
            xs += [t.plain[keep], t.mirrored[keep]]
            ys += [np.full(2 * int(keep.sum()), t.label)]
            if t.label in found and (~keep).any():
                tests.append((t, ~keep))
        if not tests:
            continue
        weight, bias = fit_head(np.concatenate(xs), np.concatenate(ys), len(names))
        for t, held in tests:
            predicted = _predicted(t.plain[held], weight, bias, None if t.trained is None else t.trained[held],
                                   gate_bias)
            away = _turned_away(rule_for, taught, kept, t, held)
            _count(found[t.label], [UNKNOWN if out else names[p] for p, out in zip(predicted, away)])
    return list(found.values())


def _count(estimate: TaughtEstimate, predicted: list[str]) -> None:
    """Add the predictions of some of ``estimate``'s photos to it (in place)."""
    for name in predicted:
        if name == estimate["name"]:
            estimate["correct"] += 1
        else:
            estimate["confused"][name] = estimate["confused"].get(name, 0) + 1


def recall(estimate: TaughtEstimate) -> float:
    """The share of its photos that a classifier fitted without them recognised."""
    return estimate["correct"] / max(estimate["photos"], 1)


def recall_range(estimate: TaughtEstimate, z: float = RANGE_Z) -> tuple[float, float]:
    """(low, high): the Wilson score interval of :func:`recall` over the estimate's photos at ``z`` (80% by
    default): what so few photos can say of the share of the class's photos that will be recognised."""
    n = max(estimate["photos"], 1)
    p, spread = recall(estimate), z * z / n
    centre = (p + spread / 2) / (1 + spread)
    half = z * math.sqrt(p * (1 - p) / n + spread / (4 * n)) / (1 + spread)
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))  # it holds p: not rounded off


def advice(estimate: TaughtEstimate) -> str:
    """One line: the estimate (its point and range), what the misses were called, and what would help when it is
    low (below :data:`GOOD_RECALL`, or from fewer than :data:`FEW_PHOTOS` photos)."""
    name, n = estimate["name"], estimate["photos"]
    low, high = recall_range(estimate)
    line = (f"{name}: about {recall(estimate):.0%} will be recognised, likely {low:.0%} to {high:.0%} "
            f"({estimate['correct']} of {n} photos, each predicted by the new run's classifier fitted without it)")
    confused = sorted(estimate["confused"].items(), key=lambda kv: (-kv[1], kv[0]))
    if confused:
        line += "; " + ", ".join(f"{'turned away (none of these)' if other == UNKNOWN else f'called {other}'} in "
                                 f"{count} of {n}" for other, count in confused)
    if recall(estimate) < GOOD_RECALL or n < FEW_PHOTOS:
        line += (f": add photos (about {max(20, 2 * n)}), or train with a folder that holds {name} "
                 f"(vit-flowers train --data)")
    return line
