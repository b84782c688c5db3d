"""A hybrid's head start (:mod:`.token_cache`): where the model has a feature head, first the frozen-feature start
(saved as best.pt, epoch 0: what later epochs must beat beyond the noise), then the plan's epochs on the cached trunk
outputs, from where a resumed run stopped; at the end of the run that ends with it, best.pt's feature head refitted on
every photo."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch
from timm.utils import ModelEmaV3

from ..runs import folders as runs
from ..runs.checkpoint import save_checkpoint
from .budget import STEP_OVER_FORWARD
from .distributed import broadcast_module
from .epoch_end import end_epoch
from .feature_start import refit_on_every_photo, start_from_features
from .run_end import budget_watch
from .saving import checkpoint_of
from .state import Run
from .steps import epoch_seed, seed_everything
from .token_cache import TokenPhase

if TYPE_CHECKING:
    from ..inference.calibration import Calibration

__all__ = ["run_head_start", "start_as_peer", "refit_best", "calibrate_head_start"]

log = logging.getLogger("vit_flowers.train")


def _phase(run: Run) -> TokenPhase:
    """The head start's cached trunk outputs (one pass, or read from the photo cache), optimizer and schedule."""
    cfg, recipe = run.cfg, run.plan.head_start
    assert recipe is not None
    return TokenPhase(run.model, run.data.train, run.data.val, recipe=recipe, lr=cfg.optim.token_lr,
                      weight_decay=cfg.optim.weight_decay, batch_size=cfg.optim.batch_size,
                      label_smoothing=cfg.optim.label_smoothing, device=run.device, amp_dtype=run.steps.amp_dtype,
                      progress=cfg.run.progress and run.ctx.main, cache=run.data.cache,
                      trunk_batch=cfg.run.eval_batch_size)


def run_head_start(run: Run, clock_zero: float) -> float | None:
    """The plan's head start, from the epoch a resumed run stopped at (its optimizer and schedule from last.pt), as
    many epochs as the time budget leaves room for; the trunk's cached outputs kept for the end of the run. Returns
    what an end-to-end epoch should take (seconds), for the plan of the epochs after it; None where the plan has no
    head start or the trunk has trained since (a run resumed end to end). Under torchrun every process trains the
    same steps on all the photos and then takes rank 0's weights. It may leave the process on one thread
    (:meth:`TokenPhase.fastest_threads`): the end of a run that ends here passes over the same cached outputs;
    :func:`.trainer.fit` gives an end-to-end epoch its threads back."""
    cfg, recipe = run.cfg, run.plan.head_start
    if recipe is None or run.trunk_trained:
        return None
    phase = _phase(run)
    run.speeds.forward = phase.forward_per_photo
    done = run.head_epochs_done
    if run.kept.head_state is not None:  # resumed inside the head start
        phase.load_state_dict(run.kept.head_state)
        run.kept.head_state = None
    if run.plan.feature_start and done == 0:
        start_as_peer(run, phase)
    elif run.plan.feature_start:  # resumed: the start is in the weights, its fields in last.pt
        phase.fix_feature_logits()
    planned, epoch, threads = recipe.head_epochs, done, torch.get_num_threads()
    if epoch < planned and not cfg.run.deterministic:  # (a deterministic run keeps its threads: the same sums)
        chosen, on_many, on_one = phase.fastest_threads()
        if chosen != threads and run.ctx.main:
            log.info("head start: 1 thread (a step %.2f s, against %.2f s on %d: the cores are shared with other "
                     "work)", on_one, on_many, threads)
    while epoch < planned:
        start = time.perf_counter()
        seed = epoch_seed(cfg, epoch, run.ctx.rank)  # as an end-to-end epoch: a resumed run draws the same
        seed_everything(seed)
        # the first epoch runs whole, as an end-to-end run's first: on a machine too busy for the budget, a run of
        # one head-start epoch is a model worth having (cut to a step or two it read 72% instead of 87%)
        watch = budget_watch(run, clock_zero, cached=True) if epoch else None
        stats = phase.train_epoch(torch.Generator().manual_seed(seed), f"head start, epoch {epoch + 1}/{planned}",
                                  watch)
        end_epoch(run, epoch, planned, stats, time.perf_counter() - clock_zero, token_phase=phase)
        epoch += 1
        run.speeds.cached = stats["seconds"] / max(len(phase.train_y) * recipe.passes, 1) / STEP_OVER_FORWARD
        if run.plan.time_budget:  # as many as the clock leaves, the cosine ending with the last of them
            left = run.plan.time_budget - (time.perf_counter() - clock_zero)
            planned = min(planned, epoch + int(left / (time.perf_counter() - start) + 0.5))
            phase.plan(planned)
    broadcast_module(run.model, run.ctx)
    if run.steps.ema is not None:  # the average starts from the head start's weights, not from the random ones
        run.steps.ema = ModelEmaV3(run.model, decay=cfg.optim.ema_decay, use_warmup=True)
    run.kept.trunk_cache = (phase.train_x, phase.val_x)
    return phase.end_to_end_epoch_estimate(len(run.data.train))


def start_as_peer(run: Run, phase: TokenPhase) -> None:
    """The frozen-feature start (:func:`.feature_start.start_from_features`) on the head start's cached training
    outputs, validated on its cached val outputs and saved as best.pt (epoch 0): what the head-start epochs must beat
    by more than the noise."""
    run.kept.feature_start = start_from_features(run.model, phase.train_x, phase.train_y)
    phase.fix_feature_logits()
    _, accuracy = phase.validate()
    run.kept.best_acc, run.kept.start_kept = accuracy, True
    if run.ctx.main:
        save_checkpoint(checkpoint_of(run, 0, use_ema=False), run.run_dir / runs.BEST)
        log.info("start: val %.1f%% on %d photos (saved as best.pt)", 100 * accuracy, len(phase.val_y))


def refit_best(run: Run) -> None:
    """A run that ends with its head start and a feature start: best.pt's feature head fitted again on every
    labelled photo (the training and validation photos' cached trunk outputs; the report and the unknown rule, made
    before, keep the held-out figures). Nothing to do for other runs, or where the val photos were trained on."""
    from ..runs.checkpoint import load_model

    start, cache = run.kept.feature_start, run.kept.trunk_cache
    if start is None or cache is None or run.cfg.data.train_on_val or not len(run.data.val) or not run.ctx.main:
        return
    path = run.run_dir / runs.BEST
    model, state = load_model(path, run.device)
    grids, labels = torch.cat(cache), torch.cat([run.data.train.labels, run.data.val.labels])
    refit_on_every_photo(model, grids, labels, start.c)
    state["model"] = model.state_dict()
    save_checkpoint(state, path)
    log.info("best.pt: its feature head fitted again on all %d photos (train and val, C %g); the report's figures "
             "are from before, on the %d val photos held out", len(labels), start.c, len(run.data.val))


def calibrate_head_start(run: Run) -> Calibration | None:
    """What the end of the run adds to best.pt (:func:`.calibration`) while best.pt holds a head-start
    epoch, over the head start's trunk cache before the trunk trains and the cache goes stale: seconds, where a
    pass of the end-to-end model over the photos would take half a minute or more if best.pt ends with the head
    start (:func:`attach_unknown`). None without a report."""
    from ..inference.calibration import calibration
    from ..runs.checkpoint import load_model

    if not (run.cfg.run.report and len(run.data.val) and run.ctx.main and run.kept.trunk_cache is not None):
        return None
    model, state = load_model(run.run_dir / runs.BEST, run.device)
    return calibration(model, state, run.data.train, run.data.val, run.device, trunk_cache=run.kept.trunk_cache)

