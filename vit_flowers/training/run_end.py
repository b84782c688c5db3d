"""The end of a run: best.pt gets the "none of these" rule and what teach reads (inference/calibration.py), then its
evaluation report; and what that end should take, for the time budget to keep it (:func:`end_of_run_seconds`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..runs import folders as runs
from ..runs.checkpoint import Checkpoint, save_checkpoint
from .budget import STEP_OVER_FORWARD, run_end_seconds
from .epoch_end import holds_head_start
from .recipe import row_score
from .state import Run

if TYPE_CHECKING:
    from ..models.vit import ViT
    from ..reporting.evaluation import KnownOutputs

__all__ = ["end_of_run_seconds", "budget_watch", "rule_at_hand", "data_check_info", "model_choice_info",
           "attach_unknown", "final_report"]

log = logging.getLogger("vit_flowers.train")


def end_of_run_seconds(run: Run, cached: bool, forward: float | None = None,
                       cached_forward: float | None = None) -> float:
    """What :func:`final_report` should take (:func:`.budget.run_end_seconds`, from what the run measured): the
    rule's pass over its training sample (:func:`calibration_passes`; over the trunk cache when the
    run ends with its head start, ``cached``, or none where best.pt holds the head start whose end was computed
    before the trunk trained, ``head_start_end``) and a pass over the validation photos unless best.pt's epoch kept
    its outputs (``val_outputs``). Between epochs, where best.pt holds the head start, a later epoch may replace it:
    its own end is counted too. ``forward``, ``cached_forward``: the seconds a photo to count instead of the
    measured ones (:func:`budget_watch`, before they are measured). 0 without a report."""
    from ..inference.calibration import calibration_passes, keeps_mirrors

    val = len(run.data.val)
    if not run.cfg.run.report or not val:
        return 0.0
    passes = calibration_passes(run.data.train.labels.numpy(), keeps_mirrors(run.model, cached))
    per_photo, save = run.speeds.forward if forward is None else forward, run.speeds.save
    if cached:
        return run_end_seconds(per_photo, val, save, passes,
                               run.speeds.cached if cached_forward is None else cached_forward)
    if run.kept.val_outputs is not None:  # best.pt's epoch kept its validation outputs
        return run_end_seconds(per_photo, passes, save)
    if run.kept.head_start_end is not None and holds_head_start(run):  # the report's pass, or a later epoch's
        keeps = run.steps.amp_dtype is None  # (that epoch keeps its outputs: _validate_epoch)
        return run_end_seconds(per_photo, max(val, passes) if keeps else val + passes, save)
    return run_end_seconds(per_photo, passes + val, save)


def budget_watch(run: Run, clock_zero: float, cached: bool = False) -> Callable[[float, float], bool] | None:
    """What an epoch asks before each step, given the seconds a photo and a step its steps take so far: whether it
    must stop for its next step, its validation, checkpoint writes and the end of the run to end within the time
    budget (:meth:`.budget.Speeds.late`); None without a budget. ``cached``: a head-start epoch, whose validation
    reads cached outputs (seconds) and after which the end of the run passes over them. Before a pass has been
    timed, it is estimated from the steps themselves (a forward pass 1 / :data:`.budget.STEP_OVER_FORWARD` of a
    step)."""
    budget = run.plan.time_budget
    if not budget:
        return None
    val = 0.0 if cached else len(run.data.val) * run.plan.val_passes

    def late(step_now: float, next_step: float) -> bool:
        speeds = run.speeds
        if cached:
            after = speeds.save + end_of_run_seconds(run, True, cached_forward=speeds.cached
                                                     or step_now / STEP_OVER_FORWARD)
        else:
            forward = speeds.forward or step_now / STEP_OVER_FORWARD
            after = forward * val + speeds.save + end_of_run_seconds(run, False, forward)
        return speeds.late(time.perf_counter() - clock_zero, budget, step_now, next_step, after)

    return late


def rule_at_hand(run: Run) -> bool:
    """Whether the end of the run reads the unknown rule's features from the head start (its trunk cache, or its end
    computed before the trunk trained while best.pt still holds it), not from a pass of the model over the photos."""
    return run.kept.trunk_cache is not None or (run.kept.head_start_end is not None and holds_head_start(run))


def data_check_info(split: dict | None, data: str | None) -> dict[str, str]:
    """The report's line on the duplicates a folder's split found (split.json's "duplicates", absent from runs
    before it was recorded), with the command that finds the rest."""
    found = (split or {}).get("duplicates")
    if found is None:
        return {}
    return {"data_check": f"{found['groups']} groups of duplicate photos ({found['photos']} photos), each kept on "
                          f"one side of the train/val split; crops, conflicting labels and likely wrong labels: "
                          f"vit-flowers check {data or 'PHOTOS'} --output DIR"}


def model_choice_info(run: Run, epoch: int) -> dict[str, str]:
    """The report's line on what best.pt holds, for a run with a frozen-feature start (:func:`start_as_peer`): the
    start or the encoder learnt on top, on what evidence, and the refit on every photo that follows the report."""
    start = run.kept.feature_start
    if start is None:
        return {}
    rows = {int(row["epoch"]): row_score(row) for row in run.history}
    if epoch == 0:
        kept = (f"the frozen-feature start, no head-start epoch beat it by more than the noise of "
                f"{len(run.data.val)} val photos")
    else:
        kept = f"the encoder learnt on top of it, head-start epoch {epoch} (val {100 * rows.get(epoch, 0.0):.1f}%)"
    refit = ("; after this report its feature head was fitted again on every photo, val included"
             if not run.cfg.data.train_on_val and len(run.data.val) else "")
    return {"model_choice": f"started from {start.describe()}; best.pt holds {kept}{refit}"}


def attach_unknown(run: Run) -> tuple[ViT, Checkpoint, KnownOutputs | None]:
    """best.pt gets the class means of its training photos' features and the "none of these" rule chosen on the
    validation photos (:func:`.calibration`). Returns best.pt's model, its
    checkpoint as saved, and (when they came from the photos, not from the head start's trunk cache) the model's
    outputs of the validation photos, which the report reads instead of a second pass."""
    from ..inference.calibration import calibration
    from ..inference.unknown import ACCEPT_FRACTION
    from ..reporting.evaluation import KnownOutputs
    from ..runs.checkpoint import load_model

    path = run.run_dir / runs.BEST
    model, state = load_model(path, run.device)
    if len(run.data.val) == 0:
        return model, state, None
    early, cache = run.kept.head_start_end, run.kept.trunk_cache
    head_start = early is not None and holds_head_start(run)  # best.pt still holds the head start
    cached = cache is not None or head_start
    if early is not None and head_start:
        found = early
    else:
        seen = run.kept.val_outputs
        seen = seen if seen is not None and seen[0] == state["epoch"] else None
        found = calibration(model, state, run.data.train, run.data.val, run.device, trunk_cache=cache,
                            val_outputs=seen[1:] if seen is not None else None)
    save_checkpoint(found.ckpt, path)
    if run.cfg.data.train_on_val:
        log.warning("train_on_val: the unknown threshold was chosen on photos the model trained on, so it may "
                    "reject more than %.0f%% of new photos of known classes", 100 * (1 - ACCEPT_FRACTION))
    if cached:  # the trunk cache's outputs stand in for the rule's, not for the report's
        return model, found.ckpt, None
    return model, found.ckpt, KnownOutputs(found.val.logits, found.val.features, found.val_seconds)


def final_report(run: Run) -> None:
    """The unknown rule (:func:`attach_unknown`), then the evaluation report of best.pt on the validation images
    (from the rule's pass over them where it made one), and where everything is."""
    from ..reporting.evaluation import evaluate_dataset

    model, state, outputs = attach_unknown(run)
    report_dir = run.run_dir / runs.REPORT
    metrics = evaluate_dataset(model, run.data.val, state, report_dir, device=run.device,
                               batch_size=run.cfg.run.eval_batch_size, run_dir=run.run_dir,
                               progress=run.cfg.run.progress,
                               info={**data_check_info(run.data.split, run.cfg.data.path),
                                     **model_choice_info(run, state["epoch"])}, outputs=outputs)
    log.info("best validation accuracy %.1f%% (epoch %d, %s weights)", 100 * run.kept.best_acc, state["epoch"],
             state["weights"])
    if run.cfg.data.train_on_val:
        log.warning("train_on_val: the model trained on the validation photos too, so the report's figures are not "
                    "held out; score it on photos it never saw (python -m vit_flowers.evaluate --data FOLDER)")
    log.info("run folder: %s", run.run_dir)
    for name in (runs.BEST, runs.LAST, runs.CONFIG, runs.PLAN, runs.METRICS, runs.CURVES, runs.SPLIT):
        if (run.run_dir / name).exists():
            log.info("  %-12s %s", name, run.run_dir / name)
    log.info("  %-12s %s (accuracy %.1f%%)", runs.REPORT, report_dir / "report.html", 100 * metrics["accuracy"])

