"""An epoch's steps and its validation: one pass over the training photos (micro-batches, mixup, the objective,
the optimizer, the schedule, EMA), reseeded from (seed, epoch, rank) so that a resumed run draws what an
uninterrupted one would, and the validation loss and accuracy of a model."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DistributedSampler
from tqdm import tqdm

from ..data.augment import IMAGENET_MEAN, IMAGENET_STD, eval_transform, resize_square
from ..data.datasets import SEED_STRIDE, TensorImageDataset
from ..data.progress import tracked
from ..inference.precision import autocast
from ..models.efficientnet import set_batchnorm_mode
from ..models.vit import ViT
from .config import ConfigError, TrainConfig
from .distributed import Dist, agree, all_sum
from .objectives import Batch, Logs
from .optim import pretrained_trunk
from .state import Run

if TYPE_CHECKING:
    from ..inference.features import Outputs

__all__ = ["TrainingError", "seed_everything", "epoch_seed", "set_trunk_batchnorm", "train_one_epoch", "validate",
           "validate_outputs"]

log = logging.getLogger("vit_flowers.train")


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN); the message says what was kept."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(cfg: TrainConfig, epoch: int, rank: int) -> int:
    """Each epoch reseeds every RNG from (seed, epoch, rank): a run resumed at an epoch
    boundary draws exactly the random numbers an uninterrupted run would."""
    return (cfg.run.seed * SEED_STRIDE + epoch * 1009 + rank) % 2**31


def set_trunk_batchnorm(model: ViT, mode: str, freeze_stages: int = 0) -> None:
    """``cfg.model.backbone_bn`` and ``freeze_stages`` on a hybrid's pretrained CNN (nothing to do for the other
    patch embeddings)."""
    trunk = pretrained_trunk(model)
    if trunk is not None:
        set_batchnorm_mode(trunk, mode)
        try:
            trunk.freeze_stages(freeze_stages)
        except ValueError as exc:
            raise ConfigError(f"config key 'freeze_stages': {exc}") from None


def _step_loss(run: Run, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, Logs]:
    """(loss, logits, logs) of (a part of) one batch of views under the run's autocast: the model's logits at its
    input size, then the run's objective on them (:mod:`vit_flowers.training.objectives`)."""
    with autocast(run.device, run.steps.amp_dtype):
        logits = run.step_net(resize_square(batch.views, run.cfg.data.image_size)).float()
        loss, logs = run.steps.objective.loss(logits, batch)
    return loss, logits, logs


def _add_logs(into: Logs, logs: Logs, weight: float) -> None:
    """``into[name] += weight * logs[name]`` for every figure of ``logs`` (detached: nothing here is trained)."""
    for name, value in logs.items():
        part = value.detach() * weight
        into[name] = into[name] + part if name in into else part


def _accumulate_gradients(run: Run, images: torch.Tensor,
                          labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Logs]:
    """Backward of one batch's mean loss, ``cfg.optim.micro_batch`` images at a time (mixup pairs drawn on the whole
    batch first, so the update is the batch's); returns the detached (loss, logits, objective's logs) of the whole
    batch (each log the mean over its micro-batches, as the loss)."""
    micro = run.cfg.optim.micro_batch or len(images)
    batch = Batch(images, labels)
    if run.steps.mixup is not None and len(images) % 2 == 0:
        mixed, targets = run.steps.mixup(images, labels)
        batch = Batch(mixed, labels, targets)
    total, logits = torch.zeros((), device=images.device), []
    logs: Logs = {}
    for part in range(0, len(images), micro):
        chunk, last = slice(part, part + micro), part + micro >= len(images)
        no_sync = getattr(run.step_net, "no_sync", None)  # DistributedDataParallel: average the gradients at the end
        with no_sync() if no_sync is not None and not last else contextlib.nullcontext():
            loss, out, step_logs = _step_loss(run, batch[chunk])
            if not torch.isfinite(loss):
                return loss.detach(), out.detach(), {}  # the caller stops the run; no step is taken
            (loss * (len(out) / len(images))).backward()
        total += loss.detach() * (len(out) / len(images))
        _add_logs(logs, step_logs, len(out) / len(images))
        logits.append(out.detach())
    return total, torch.cat(logits), logs


def _epoch_stats(totals: torch.Tensor, log_sums: dict[str, float], seconds: float, ctx: Dist) -> dict[str, float]:
    """An epoch's training figures, reduced over ranks: loss, accuracy, throughput and the objective's logs
    (``train_<name>``, each the mean over the epoch's images)."""
    names = sorted(log_sums)
    totals = torch.cat([totals, torch.tensor([log_sums[n] for n in names], dtype=torch.float64)])
    all_sum(totals, ctx)  # (every rank runs the same objective: the same names, in the same order)
    count = totals[2].item()
    stats = {"train_loss": totals[0].item() / count, "train_acc": totals[1].item() / count,
             "seconds": seconds, "images_per_s": count / seconds}
    return {**stats, **{f"train_{n}": totals[3 + i].item() / count for i, n in enumerate(names)}}


def train_one_epoch(run: Run, epoch: int, planned_epochs: int,
                    late: Callable[[float, float], bool] | None = None) -> dict[str, float]:
    """One pass over this rank's shard; returns loss, accuracy, throughput and the objective's logs (reduced over
    ranks). ``late``: told the seconds a photo and a step that the steps take so far, whether the time budget needs
    the epoch to stop before the next step (:meth:`.budget.Speeds.late`: the machine is slower than the plan read): a
    shorter epoch, not an overshoot."""
    cfg, ctx, data, steps = run.cfg, run.ctx, run.data.train, run.steps
    per_epoch = run.plan.steps_per_epoch
    seed = epoch_seed(cfg, epoch, ctx.rank)
    seed_everything(seed)
    sampler: DistributedSampler[int] = DistributedSampler(data, num_replicas=ctx.world, rank=ctx.rank, shuffle=True,
                                                          seed=cfg.run.seed)
    sampler.set_epoch(epoch)
    order = torch.tensor(list(sampler))
    generator = torch.Generator().manual_seed(seed)
    run.step_net.train()
    set_trunk_batchnorm(run.model, cfg.model.backbone_bn, cfg.model.freeze_stages)
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    log_sums: dict[str, float] = {}  # the objective's logs, each summed over the images
    start = time.perf_counter()
    bar = tqdm(range(per_epoch), desc=f"epoch {epoch + 1}/{planned_epochs}", leave=False,
               disable=None if cfg.run.progress and ctx.main else True, dynamic_ncols=True)  # None: only on a terminal
    for step in tracked(bar, f"epoch {epoch + 1}/{planned_epochs}", per_epoch):
        took = time.perf_counter() - start
        if step and late is not None and agree(int(late(took / totals[2].item(), took / step)), ctx):
            if ctx.main:
                log.warning("time budget: the machine is slower than when epoch %d was planned; it stops after %d of "
                            "its %d steps so that the run ends in time", epoch + 1, step, per_epoch)
            break
        idx = order[step * cfg.optim.batch_size: (step + 1) * cfg.optim.batch_size]
        images = steps.augment(data.batch(idx), generator=generator).to(run.device, non_blocking=True)
        labels = data.labels[idx].to(run.device, non_blocking=True)
        steps.optimizer.zero_grad(set_to_none=True)
        loss, logits, logs = _accumulate_gradients(run, images, labels)
        if not torch.isfinite(loss):
            raise TrainingError(f"the loss became {loss.item()} at epoch {epoch + 1}, step {step + 1}: training "
                                f"stopped; the last good checkpoint is kept. Try a lower lr (now {cfg.optim.lr}) or "
                                f"clip_grad.")
        if cfg.optim.clip_grad:
            nn.utils.clip_grad_norm_(run.step_net.parameters(), cfg.optim.clip_grad)
        steps.optimizer.step()
        global_step = (epoch - run.head_epochs_done) * per_epoch + step + 1
        steps.scheduler.step_update(global_step)
        if steps.ema is not None:
            steps.ema.update(run.model, step=global_step)
        with torch.no_grad():
            totals += torch.tensor([loss.item() * len(idx), (logits.argmax(-1) == labels).sum().item(), len(idx)],
                                   dtype=torch.float64)
            for name, value in logs.items():  # (loss.item() has waited for the device already)
                log_sums[name] = log_sums.get(name, 0.0) + value.item() * len(idx)
        bar.set_postfix(loss=f"{totals[0].item() / totals[2].item():.3f}",
                        acc=f"{totals[1].item() / totals[2].item():.1%}",
                        img_s=f"{totals[2].item() * ctx.world / (time.perf_counter() - start):.0f}")
    return _epoch_stats(totals, log_sums, time.perf_counter() - start, ctx)


@torch.inference_mode()
def validate(model: nn.Module, data: TensorImageDataset, cfg: TrainConfig, ctx: Dist, device: torch.device,
             amp_dtype: torch.dtype | None = None) -> tuple[float, float]:
    """(loss, accuracy) on this rank's share of ``data``, reduced over ranks; under ``amp_dtype`` autocast when
    given (training's precision, so the per-epoch check costs the time budget less)."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    indices = torch.arange(ctx.rank, len(data), ctx.world)
    for chunk in indices.split(cfg.run.eval_batch_size):
        images = eval_transform(data.images[chunk], cfg.data.image_size, IMAGENET_MEAN, IMAGENET_STD).to(device)
        labels = data.labels[chunk].to(device)
        with autocast(device, amp_dtype):
            logits = model(images).float()
        totals += torch.tensor([F.cross_entropy(logits, labels, reduction="sum").item(),
                                (logits.argmax(-1) == labels).sum().item(), len(chunk)], dtype=torch.float64)
    all_sum(totals, ctx)
    return totals[0].item() / max(totals[2].item(), 1), totals[1].item() / max(totals[2].item(), 1)


def validate_outputs(model: nn.Module, data: TensorImageDataset, device: torch.device,
                     batch_size: int) -> tuple[float, float, Outputs]:
    """(loss, accuracy, :class:`~vit_flowers.inference.features.Outputs`) of ``model`` on every photo of ``data`` in
    fp32, as the end of the run calibrates on them (one process): the last epoch's validation, whose outputs the
    end of the run then reads instead of passing over the photos again."""
    from ..inference.features import batch_outputs

    out = batch_outputs(cast(ViT, model), data.images, IMAGENET_MEAN, IMAGENET_STD, device, batch_size)
    logits = torch.from_numpy(out.logits)
    return F.cross_entropy(logits, data.labels).item(), (logits.argmax(-1) == data.labels).float().mean().item(), out

