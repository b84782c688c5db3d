"""What a hybrid run's photos can hold (#52): how long its head start is, whether end-to-end fine-tuning follows,
and when an end-to-end epoch may replace the head start as best.pt.

Counted in epochs, a head start is as long as the folder is large: 124 photos at batch 64 made six epochs of 12
optimizer steps in all, and the encoder stopped where it had barely started (train accuracy still climbing). Counted
in optimizer steps (about ``head_start_steps``), it converges on 50 photos as on 3,000: a small folder passes over its
cached trunk outputs several times in each of the ``token_epochs`` epochs; a large one needs no more than one pass.

End-to-end fine-tuning of the whole network follows only where every class has ``end_to_end_min_per_class``
training photos: on fewer, it pulled validation down before climbing back short of the head start, and cost most of
the budget (benchmarks/README.md, "Few photos"). Below the rule the run ends with its head start: a small folder
takes a minute, not the whole budget.

A validation set of a few photos a class is noisy (one photo of 26 is 3.8 points), so an end-to-end epoch replaces
the head start's weights only when it beats them by more than that noise (one binomial standard error of the
head start's validation accuracy): :func:`beats_head_start`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

__all__ = ["Recipe", "plan_recipe", "after_feature_start", "noise_margin", "beats_head_start", "head_start_kept",
           "row_score"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The head start's and the end-to-end part's shape for one folder of photos."""

    passes: int  # passes over the cached training outputs in each head-start epoch (1 on a large folder)
    steps_per_pass: int  # optimizer steps of one pass (its full batches; a folder smaller than a batch: one step)
    head_epochs: int  # the head start's epochs (token_epochs)
    end_to_end: bool  # whether end-to-end epochs follow the head start
    reason: str  # the log's line: what was chosen and why

    @property
    def head_steps(self) -> int:
        """Optimizer steps of the whole head start."""
        return self.head_epochs * self.passes * self.steps_per_pass


def plan_recipe(train_counts: Sequence[int], *, batch_size: int, token_epochs: int, head_start_steps: int,
                end_to_end_min_per_class: int, classes: Sequence[str] | None = None) -> Recipe:
    """The recipe for training photos counted per class (``train_counts``, one entry a class) under the config's
    ``batch_size``, ``token_epochs`` (> 0), ``head_start_steps`` and ``end_to_end_min_per_class`` (0: always
    end to end)."""
    total = sum(train_counts)
    steps = max(1, total // batch_size)
    # rounded, not ceiled: a folder a few steps short (flowers5: 6 x 32 = 192) keeps one pass, not twice the time
    passes = max(1, round(head_start_steps / max(1, steps * token_epochs)))
    fewest = min(train_counts) if train_counts else 0
    end_to_end = fewest >= end_to_end_min_per_class
    weakest = f" ({classes[list(train_counts).index(fewest)]})" if classes and len(set(train_counts)) > 1 else ""
    per_class = (f"{fewest} a class" if len(set(train_counts)) == 1
                 else f"{fewest}-{max(train_counts)} a class, the fewest{weakest}")
    head = (f"head start {token_epochs} epochs x {passes} pass{'es' if passes > 1 else ''} x {steps} step"
            f"{'s' if steps > 1 else ''} = {token_epochs * passes * steps} steps")
    if end_to_end:
        then = "then end-to-end fine-tuning for what the budget leaves"
    else:
        then = (f"head start only: end-to-end fine-tuning starts at {end_to_end_min_per_class} training photos in "
                f"every class (end_to_end_min_per_class)")
    reason = f"{total} training photos, {per_class}: {head}; {then}"
    return Recipe(passes, steps, token_epochs, end_to_end, reason)


def after_feature_start(recipe: Recipe) -> Recipe:
    """``recipe`` for a hybrid that starts as the frozen-feature fit (:mod:`.feature_start`): its head start shrunk to
    one epoch of one pass. The encoder trained on top for the whole head start beat that start on no folder measured
    (benchmarks/README.md, "Few photos") and took most of the command's time; one pass keeps the run's files (an epoch
    in metrics.csv, last.pt) and the encoder's chance, at a second's cost."""
    then = "then end-to-end fine-tuning" if recipe.end_to_end else "no end-to-end fine-tuning"
    steps = f"{recipe.steps_per_pass} step{'s' if recipe.steps_per_pass > 1 else ''}"
    reason = (f"{recipe.reason.split(':', 1)[0]}: the frozen-feature start, then 1 epoch x 1 pass x {steps} of the "
              f"encoder on top (kept only where it beats the start); {then}")
    return dataclasses.replace(recipe, passes=1, head_epochs=1, reason=reason)


def noise_margin(accuracy: float, n_val: int) -> float:
    """One binomial standard error of a validation accuracy measured on ``n_val`` photos (1.0: no photos)."""
    if n_val <= 0:
        return 1.0
    return math.sqrt(max(accuracy * (1 - accuracy), 1 / n_val) / n_val)


def beats_head_start(score: float, head_start_best: float, n_val: int) -> bool:
    """Whether an end-to-end epoch's validation ``score`` replaces the head start's best weights: by more than
    the noise of ``n_val`` validation photos."""
    return score > head_start_best + noise_margin(head_start_best, n_val)


def row_score(row: dict[str, float]) -> float:
    """A metrics row's validation score: the better of the raw and the EMA weights (EMA's nan: not measured)."""
    ema = row.get("val_acc_ema", float("nan"))
    return row["val_acc"] if ema != ema else max(row["val_acc"], ema)  # (nan != nan)


def head_start_kept(history: Sequence[dict[str, float]], n_val: int, last_wins: bool = False) -> bool:
    """Whether best.pt still holds a head-start epoch after ``history`` (metrics rows, ``trunk_frozen`` 1 for the
    head start's), by the rule the trainer applies epoch after epoch (:func:`beats_head_start`; ``last_wins``:
    ``train_on_val``, where every epoch replaces best.pt): read from the rows, so a resumed run keeps to it."""
    if last_wins:
        return bool(history) and history[-1].get("trunk_frozen") == 1
    best, from_head = -1.0, False
    for row in history:
        head = row.get("trunk_frozen") == 1
        score = row_score(row)
        improved = beats_head_start(score, best, n_val) if from_head and not head else score > best
        if improved:
            best, from_head = score, head
    return from_head
