"""The end of every epoch: validate the raw and the EMA weights, record the metrics row, decide whether best.pt
changes (beyond the noise where it holds the head start or the frozen-feature start), save, log."""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from .recipe import beats_head_start, head_start_kept, noise_margin, row_score
from .saving import save_epoch
from .state import Run
from .steps import validate, validate_outputs

if TYPE_CHECKING:
    from ..inference.features import Outputs
    from .token_cache import TokenPhase

__all__ = ["end_epoch", "holds_head_start"]

log = logging.getLogger("vit_flowers.train")


def holds_head_start(run: Run) -> bool:
    """Whether best.pt holds a head-start epoch (or the frozen-feature start), read from the metrics rows by the
    rule :func:`end_epoch` keeps: the one answer to that question."""
    return head_start_kept(run.history, len(run.data.val), last_wins=run.cfg.data.train_on_val)


def _validate_epoch(run: Run, last: bool) -> tuple[float, float, float, tuple[Outputs, ...] | None]:
    """(val loss, val accuracy, EMA val accuracy or NaN, the fp32 Outputs of the raw and EMA weights or None) of
    an end-to-end epoch. A single process with a report to write keeps what it saw (:func:`validate_outputs`), for
    the end of the run to read instead of another pass, in every epoch where the run trains in fp32 (the same pass:
    best.pt's outputs are at hand whichever epoch it keeps), else in the ``last`` planned one (in fp32; the others
    validate under the run's autocast)."""
    cfg, ctx, val, amp, ema = run.cfg, run.ctx, run.data.val, run.steps.amp_dtype, run.steps.ema
    if not (ctx.world == 1 and cfg.run.report and len(val) and (last or amp is None)):
        loss, acc = validate(run.model, val, cfg, ctx, run.device, amp)
        ema_acc = validate(ema.module, val, cfg, ctx, run.device, amp)[1] if ema else float("nan")
        return loss, acc, ema_acc, None
    loss, acc, raw = validate_outputs(run.model, val, run.device, cfg.run.eval_batch_size)
    if ema is None:
        return loss, acc, float("nan"), (raw,)
    _, ema_acc, ema_out = validate_outputs(ema.module, val, run.device, cfg.run.eval_batch_size)
    return loss, acc, ema_acc, (raw, ema_out)


def _improves(run: Run, score: float, on_tokens: bool) -> bool:
    """Whether an epoch's validation ``score`` replaces best.pt: beyond the noise where best.pt holds the head
    start (or the frozen-feature start); every epoch under ``train_on_val`` (nothing held out to choose by)."""
    kept, n_val = run.kept, len(run.data.val)
    noisy = run.kept.start_kept if on_tokens else holds_head_start(run)
    improved = beats_head_start(score, kept.best_acc, n_val) if noisy else score > kept.best_acc
    if noisy and not improved and score > kept.best_acc and run.ctx.main:
        what = "the frozen-feature start" if on_tokens else "the head start"
        log.info("epoch %d: val %.1f%% is within the noise (+-%.1f points on %d photos) of %s's %.1f%%: best.pt "
                 "keeps %s", len(run.history) + 1, 100 * score, 100 * noise_margin(kept.best_acc, n_val), n_val,
                 what, 100 * kept.best_acc, what)
    return improved or run.cfg.data.train_on_val


def end_epoch(run: Run, epoch: int, planned: int, stats: dict[str, float], elapsed: float,
              token_phase: TokenPhase | None = None) -> None:
    """Validate the raw and the EMA weights (an epoch of ``token_phase``: the raw weights on its cached val
    outputs), record the epoch, save, log."""
    outputs: tuple[Outputs, ...] | None = None
    head_state: dict[str, Any] | None = None
    seconds = 0.0
    if token_phase is not None:
        (val_loss, val_acc), ema_acc = token_phase.validate(), float("nan")
        lr, head_state = token_phase.optimizer.param_groups[0]["lr"], token_phase.state_dict()
    else:
        start = time.perf_counter()
        val_loss, val_acc, ema_acc, outputs = _validate_epoch(run, last=epoch + 1 == planned)
        seconds = time.perf_counter() - start
        passes = len(run.data.val) * run.plan.val_passes
        photos = stats["images_per_s"] * stats["seconds"] / run.ctx.world
        if passes and photos:  # the forward pass and the step, measured under the same load
            run.speeds.forward, run.speeds.step = seconds / passes, stats["seconds"] / photos
        lr = run.steps.optimizer.param_groups[0]["lr"]
    use_ema = token_phase is None and run.steps.ema is not None and (ema_acc > val_acc or run.cfg.data.train_on_val)
    row = {"epoch": epoch + 1, **stats, "val_loss": val_loss, "val_acc": val_acc, "val_acc_ema": ema_acc,
           "lr": lr, "elapsed": elapsed, "trunk_frozen": int(token_phase is not None)}
    score = row_score(row)  # the rule holds_head_start reads the rows back with
    improved = _improves(run, score, token_phase is not None)
    run.history.append(row)
    if improved:
        run.kept.best_acc, run.kept.start_kept = max(run.kept.best_acc, score), False
        # the outputs of the weights best.pt now keeps, when this epoch kept them
        run.kept.val_outputs = None if outputs is None else (epoch + 1, outputs[1] if use_ema else outputs[0],
                                                             seconds / len(outputs))
    if run.ctx.main:
        start = time.perf_counter()
        save_epoch(run, epoch + 1, use_ema, improved, head_state)
        run.speeds.save = time.perf_counter() - start
        log.info("epoch %d/%d  train loss %.3f acc %.1f%%  val loss %.3f acc %.1f%%%s  lr %.2e  %.0fs  %.0f img/s%s",
                 epoch + 1, planned, stats["train_loss"], 100 * stats["train_acc"], val_loss, 100 * val_acc,
                 f" (EMA {100 * ema_acc:.1f}%)" if not math.isnan(ema_acc) else "", row["lr"], stats["seconds"],
                 stats["images_per_s"], "  *best*" if improved else "")
