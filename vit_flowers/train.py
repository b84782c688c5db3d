"""Train a ViT flower classifier.

Examples:

    # offline quick start: the built-in synthetic flowers, about five minutes on 2 CPU cores
    python -m vit_flowers.train

    # your own photos (one folder per class, or train/ and val/ folders)
    python -m vit_flowers.train --data path/to/photos
    python -m vit_flowers.train --config configs/flowers5.yaml --data ../shared/data/flowers5

    # as many epochs as fit in 15 minutes (the cosine schedule follows the clock), bf16 where the hardware has it
    python -m vit_flowers.train --data path/to/photos --time-budget 15 --precision auto

    # public datasets (downloaded into data/ when online)
    python -m vit_flowers.train --config configs/flowers102.yaml
    python -m vit_flowers.train --dataset flower_photos

    # fine-tune timm's pretrained ViT-Ti/16 (a timm name when online, or a local weights file)
    python -m vit_flowers.train --data photos --model vit_ti16 --image-size 224 --pretrained vit_tiny_patch16_224

    # continue the newest run where it stopped
    python -m vit_flowers.train --resume auto

    # two processes with DistributedDataParallel (gloo on CPU, nccl on GPU)
    torchrun --nproc_per_node 2 -m vit_flowers.train --config configs/smoke.yaml

Every run writes checkpoints/<run>/ : last.pt, best.pt, config.yaml, metrics.csv,
curves.png, split.json (folder datasets) and the evaluation report of best.pt.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import logging
import math
import os
import random
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3
from torch import nn
from torch.utils.data import DistributedSampler
from tqdm import tqdm

from .augment import IMAGENET_MEAN, IMAGENET_STD, TrainAugment, eval_transform
from .checkpoint import (
    FORMAT,
    CheckpointError,
    atomic_write_text,
    latest_run,
    load_checkpoint,
    mark_latest,
    resolve_checkpoint,
    save_checkpoint,
)
from .config import ConfigError, TrainConfig, add_config_arguments, config_from_args, load_config
from .data import Datasets, TensorImageDataset, load_datasets, save_split
from .drloc import RelativeLocalization
from .inference import pick_device
from .runtime import keep_freed_memory
from .vit import ViT, create_vit

log = logging.getLogger("vit_flowers.train")

METRIC_COLUMNS = ["epoch", "train_loss", "train_acc", "val_loss", "val_acc", "val_acc_ema", "lr", "seconds",
                  "images_per_s", "elapsed"]  # seconds: this epoch's training; elapsed: the run's wall clock so far


@dataclasses.dataclass
class TrainResult:
    run_dir: Path  # the run folder (checkpoints, metrics, report)
    model: ViT  # the trained model (raw weights of the last epoch)
    best_accuracy: float  # best validation accuracy (raw or EMA weights)


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN); the message says what was kept."""


# --------------------------------------------------------------------------- set-up
@dataclasses.dataclass
class Dist:
    """Where this process stands in a torchrun job (world 1 without torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str) -> tuple[Dist, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), pick_device(device_name)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local_rank), device


def set_threads(cfg: TrainConfig, ctx: Dist) -> None:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    elif ctx.world > 1:  # share this machine's cores between the local processes
        local = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(cfg: TrainConfig, epoch: int, rank: int) -> int:
    """Each epoch reseeds every RNG from (seed, epoch, rank): a run resumed at an epoch
    boundary draws exactly the random numbers an uninterrupted run would."""
    return (cfg.seed * 1_000_003 + epoch * 1009 + rank) % 2**31


def autocast(device: torch.device, amp_dtype: torch.dtype | None) -> torch.autocast:
    """``torch.autocast`` to ``amp_dtype`` on ``device``, or a disabled one for plain fp32 (``amp_dtype`` None):
    the one context of a training step and of the per-epoch validation."""
    return torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``precision`` on ``device``: bf16, or None for plain fp32.

    "auto" picks bf16 only where it is faster than fp32: CUDA GPUs with bf16 support and CPUs with AMX
    (Intel Sapphire Rapids and later: ~1.5x a training step here, same accuracy, see benchmarks/README.md).
    On other CPUs bf16 is emulated and slower, so "auto" stays fp32 there; MPS always stays fp32.
    """
    if precision == "fp32" or device.type == "mps":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private, hence the guard
    return torch.bfloat16 if device.type == "cpu" and amx is not None and amx() else None


def build_model(cfg: TrainConfig, num_classes: int) -> ViT:
    if not cfg.pretrained:
        return create_vit(cfg.model, num_classes, **cfg.model_kwargs())
    reg = dict(dropout=cfg.dropout, drop_path=cfg.drop_path)
    path = Path(cfg.pretrained)
    if path.is_file():
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any unreadable file gets one clear message
                raise ConfigError(f"pretrained: cannot read {path} as a weights file: {exc}") from None
            state = state.get("model", state.get("state_dict", state)) if isinstance(state, dict) else state
        heads = cfg.pretrained_heads or cfg.heads
        if heads is None:
            raise ConfigError(f"pretrained: {path} is a bare state dict; set pretrained_heads (e.g. 3 for ViT-Ti, 6 for ViT-S)")
        model = ViT.from_timm(state, heads=heads, num_classes=num_classes, image_size=cfg.image_size, **reg)
    else:
        import timm

        log.info("loading timm model %s with pretrained weights (needs the network the first time)", cfg.pretrained)
        try:
            source = timm.create_model(cfg.pretrained, pretrained=True)
        except Exception as exc:  # noqa: BLE001 - offline, unknown name, ...
            raise ConfigError(f"pretrained: cannot load timm model {cfg.pretrained!r}: {exc}. Offline? Pass a local "
                              f"weights file instead.") from None
        model = ViT.from_timm(source, num_classes=num_classes, image_size=cfg.image_size, **reg)
    log.info("fine-tuning from %s (%d blocks, dim %d)", cfg.pretrained, model.config["depth"], model.config["dim"])
    return model


# --------------------------------------------------------------------------- epochs
def train_one_epoch(
    model: nn.Module, data: TensorImageDataset, cfg: TrainConfig, ctx: Dist, epoch: int, *,
    optimizer: torch.optim.Optimizer, scheduler: CosineLRScheduler, augment: TrainAugment,
    mixup: Mixup | None, ema: ModelEmaV3 | None, device: torch.device, steps_per_epoch: int, planned_epochs: int,
    amp_dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """One pass over this rank's shard; returns loss, accuracy and throughput (reduced over ranks)."""
    seed = epoch_seed(cfg, epoch, ctx.rank)
    seed_everything(seed)
    sampler = DistributedSampler(data, num_replicas=ctx.world, rank=ctx.rank, shuffle=True, seed=cfg.seed)
    sampler.set_epoch(epoch)
    order = torch.tensor(list(sampler))
    generator = torch.Generator().manual_seed(seed)
    soft_loss = SoftTargetCrossEntropy()
    model.train()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    start = time.perf_counter()
    bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{planned_epochs}", leave=False,
               disable=not (cfg.progress and ctx.main), dynamic_ncols=True)
    for step in bar:
        idx = order[step * cfg.batch_size: (step + 1) * cfg.batch_size]
        images = augment(data.images[idx], generator=generator).to(device, non_blocking=True)  # (B, 3, S, S)
        labels = data.labels[idx].to(device, non_blocking=True)
        with autocast(device, amp_dtype):
            targets = None
            if mixup is not None and len(idx) % 2 == 0:
                images, targets = mixup(images, labels)
            out = model(images)
            logits, aux = out if isinstance(out, tuple) else (out, None)  # aux: relative-localization loss
            logits = logits.float()
            if targets is not None:
                loss = soft_loss(logits, targets)
            else:
                loss = F.cross_entropy(logits, labels, label_smoothing=cfg.label_smoothing)
            if aux is not None:
                loss = loss + cfg.drloc * aux
        if not torch.isfinite(loss):
            raise TrainingError(f"the loss became {loss.item()} at epoch {epoch + 1}, step {step + 1}: training "
                                f"stopped; the last good checkpoint is kept. Try a lower lr (now {cfg.lr}) or "
                                f"clip_grad.")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip_grad:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        optimizer.step()
        scheduler.step_update(epoch * steps_per_epoch + step + 1)
        if ema is not None:
            ema.update(model, step=epoch * steps_per_epoch + step + 1)
        with torch.no_grad():
            totals += torch.tensor([loss.item() * len(idx), (logits.argmax(-1) == labels).sum().item(), len(idx)],
                                   dtype=torch.float64)
        seen = totals[2].item() * ctx.world
        bar.set_postfix(loss=f"{totals[0].item() / totals[2].item():.3f}",
                        acc=f"{totals[1].item() / totals[2].item():.1%}",
                        img_s=f"{seen / (time.perf_counter() - start):.0f}")
    seconds = time.perf_counter() - start
    if ctx.world > 1:
        dist.all_reduce(totals)
    return {"train_loss": totals[0].item() / totals[2].item(), "train_acc": totals[1].item() / totals[2].item(),
            "seconds": seconds, "images_per_s": totals[2].item() / seconds}


@torch.inference_mode()
def validate(model: nn.Module, data: TensorImageDataset, cfg: TrainConfig, ctx: Dist, device: torch.device,
             mean: tuple[float, ...], std: tuple[float, ...],
             amp_dtype: torch.dtype | None = None) -> tuple[float, float]:
    """(loss, accuracy) on this rank's share of ``data``, reduced over ranks; under ``amp_dtype`` autocast when
    given (training's precision, so the per-epoch check costs the time budget less)."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    indices = torch.arange(ctx.rank, len(data), ctx.world)
    for chunk in indices.split(cfg.eval_batch_size):
        images = eval_transform(data.images[chunk], cfg.image_size, mean, std).to(device)
        labels = data.labels[chunk].to(device)
        with autocast(device, amp_dtype):
            logits = model(images).float()
        totals += torch.tensor([F.cross_entropy(logits, labels, reduction="sum").item(),
                                (logits.argmax(-1) == labels).sum().item(), len(chunk)], dtype=torch.float64)
    if ctx.world > 1:
        dist.all_reduce(totals)
    return totals[0].item() / max(totals[2].item(), 1), totals[1].item() / max(totals[2].item(), 1)


# --------------------------------------------------------------------------- run folder
def make_run_dir(cfg: TrainConfig) -> Path:
    name = cfg.run_name or f"{cfg.dataset}-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = Path(cfg.out_dir) / name
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"cannot write to the run folder {run_dir}: {exc.strerror or exc}") from None
    return run_dir


def write_metrics(run_dir: Path, history: list[dict[str, float]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(history)
    atomic_write_text(run_dir / "metrics.csv", buf.getvalue())


def resolve_resume(cfg: TrainConfig) -> Path | None:
    if not cfg.resume:
        return None
    if cfg.resume == "auto":
        run = latest_run(cfg.out_dir)
        if run is None or not (run / "last.pt").is_file():
            log.info("--resume auto: no earlier run with last.pt in %s/, starting a new run", cfg.out_dir)
            return None
        return run / "last.pt"
    return resolve_checkpoint(cfg.resume, cfg.out_dir, name="last.pt")


# --------------------------------------------------------------------------- main loop
def train(cfg: TrainConfig) -> TrainResult:
    """Train according to ``cfg``."""
    ctx, device = init_distributed(cfg.device)
    try:
        return _train(cfg, ctx, device)
    finally:
        if ctx.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _train(cfg: TrainConfig, ctx: Dist, device: torch.device) -> TrainResult:
    resume_path = resolve_resume(cfg)
    resumed: dict[str, Any] | None = None
    if resume_path is not None:
        resumed = load_checkpoint(resume_path)
        if "train_state" not in resumed:
            raise CheckpointError(f"{resume_path} has no training state to resume from (use a last.pt)")
        saved = resumed["config"]
        overrides = {k: v for k, v in dataclasses.asdict(cfg).items()
                     if v != getattr(TrainConfig, k, None) and k not in ("resume", "run_name", "out_dir")}
        cfg = load_config(None, {**saved, **overrides, "resume": None})
        cfg.run_name, cfg.out_dir = resume_path.parent.name, str(resume_path.parent.parent)
    set_threads(cfg, ctx)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed_everything(cfg.seed)

    run_dir = make_run_dir(cfg) if ctx.main else Path(cfg.out_dir) / (cfg.run_name or "")
    if ctx.world > 1:  # everyone uses rank 0's run folder name
        names = [str(run_dir)]
        dist.broadcast_object_list(names, src=0)
        run_dir = Path(names[0])
    split_file = run_dir / "split.json"
    data: Datasets = load_datasets(
        cfg.dataset, data=cfg.data, data_root=cfg.data_root, image_size=cfg.image_size, cache_size=cfg.cache_size,
        val_fraction=cfg.val_fraction, split_seed=cfg.split_seed,
        split_file=split_file if split_file.is_file() else None,
        synthetic_train_per_class=cfg.synthetic_train_per_class, synthetic_val_per_class=cfg.synthetic_val_per_class,
        seed=cfg.seed, download=cfg.download, progress=cfg.progress and ctx.main,
    )
    classes = data.classes
    if resumed is not None and list(resumed["classes"]) != list(classes):  # before anything in the run is rewritten
        raise CheckpointError(f"cannot resume {resume_path}: it was trained on the classes {resumed['classes']}, but "
                              f"the data now has {classes}. Resume with the same data, or start a new run.")
    if ctx.main:
        save_config_file(cfg, run_dir)
        if data.split is not None:
            save_split(split_file, data.split)
        mark_latest(run_dir)
        log.info("data: %s | %d classes | %d train, %d val images", data.source, len(classes), len(data.train),
                 len(data.val))

    model = build_model(cfg, len(classes)).to(device)
    mean, std = IMAGENET_MEAN, IMAGENET_STD
    # fused AdamW: the same update in one kernel (+3-7% a step on a 2-core CPU, benchmarks/README.md)
    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    fused=device.type in ("cpu", "cuda"))
    trainee: nn.Module = model  # what a training step runs: the ViT, or the ViT + the relative-localization head
    if cfg.drloc > 0:
        trainee = RelativeLocalization(model, pairs=cfg.drloc_pairs).to(device)
        optimizer.add_param_group({"params": list(trainee.mlp.parameters()), "weight_decay": cfg.weight_decay})
    per_rank = math.ceil(len(data.train) / ctx.world)
    steps_per_epoch = max(1, per_rank // cfg.batch_size)  # full batches; one short batch for a tiny set
    warmup_steps = min(round(cfg.warmup_epochs * steps_per_epoch), cfg.epochs * steps_per_epoch - 1)
    scheduler = CosineLRScheduler(  # warmup, then cosine down to min_lr at the end of the last epoch
        optimizer, t_initial=cfg.epochs * steps_per_epoch - warmup_steps, lr_min=cfg.min_lr, warmup_t=warmup_steps,
        warmup_lr_init=cfg.lr * 0.01, warmup_prefix=True, t_in_epochs=False,
    )
    ema = ModelEmaV3(model, decay=cfg.ema_decay, use_warmup=True) if cfg.ema else None
    mixup = None
    if cfg.mixup > 0 or cfg.cutmix > 0:
        mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                      label_smoothing=cfg.label_smoothing, num_classes=len(classes))
    augment = TrainAugment(
        cfg.image_size, scale=(cfg.crop_scale_min, 1.0), auto_augment=cfg.augment,
        randaug_num_ops=cfg.randaug_num_ops, randaug_magnitude=cfg.randaug_magnitude,
        random_erasing=cfg.random_erasing, mean=mean, std=std,
    )

    start_epoch, best_acc, history = 0, -1.0, []
    if resumed is not None:
        ts = resumed["train_state"]
        try:
            model.load_state_dict(ts["model"])
            optimizer.load_state_dict(ts["optimizer"])
            scheduler.load_state_dict(ts["scheduler"])
            if ema is not None and ts.get("ema") is not None:
                ema.module.load_state_dict(ts["ema"])
            if isinstance(trainee, RelativeLocalization) and ts.get("drloc") is not None:
                trainee.mlp.load_state_dict(ts["drloc"])
            start_epoch, best_acc, history = resumed["epoch"], resumed["best_accuracy"], list(ts["history"])
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # e.g. a size mismatch: another model
            raise CheckpointError(f"cannot resume {resume_path}: its training state does not fit this model "
                                  f"({str(exc).strip().splitlines()[-1].strip()}). Resume without changing the "
                                  f"model settings, or start a new run.") from None
        if ctx.main:
            write_metrics(run_dir, history)  # a run killed between last.pt and metrics.csv: bring them up to date
            _plot_curves(run_dir)
            log.info("resuming %s at epoch %d", resume_path, start_epoch + 1)

    amp_dtype = autocast_dtype(cfg.precision, device)
    net: nn.Module = trainee
    if ctx.world > 1:
        net = nn.parallel.DistributedDataParallel(trainee, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        net = torch.compile(net)
    meta = {"format": FORMAT, "model_config": model.config, "classes": classes, "image_size": cfg.image_size,
            "mean": list(mean), "std": list(std), "config": dataclasses.asdict(cfg)}
    if ctx.main:
        n_params = sum(p.numel() for p in model.parameters())
        budget = f" (as many as fit in {cfg.time_budget:g} min)" if cfg.time_budget else ""
        log.info("model: %s, %.2fM parameters, on %s (%d threads, %s); up to %d epochs%s of %d steps", cfg.model,
                 n_params / 1e6, device, torch.get_num_threads(), "bf16 autocast" if amp_dtype else "fp32",
                 cfg.epochs, budget, steps_per_epoch)

    elapsed = epoch_ends(history)[-1] if history else 0.0  # wall clock of the epochs done (resume)
    planned = agree(plan_epochs(cfg, history), ctx)
    clock_zero = time.perf_counter() - elapsed  # elapsed = now - clock_zero (checkpoint writes included)
    epoch = start_epoch
    while epoch < planned:
        set_cosine_length(scheduler, planned * steps_per_epoch - warmup_steps)
        stats = train_one_epoch(net, data.train, cfg, ctx, epoch, optimizer=optimizer, scheduler=scheduler,
                                augment=augment, mixup=mixup, ema=ema, device=device, steps_per_epoch=steps_per_epoch,
                                planned_epochs=planned, amp_dtype=amp_dtype)
        val_loss, val_acc = validate(model, data.val, cfg, ctx, device, mean, std, amp_dtype)
        ema_acc = (validate(ema.module, data.val, cfg, ctx, device, mean, std, amp_dtype)[1] if ema is not None
                   else float("nan"))
        use_ema = ema is not None and ema_acc > val_acc
        score = max(val_acc, ema_acc) if ema is not None else val_acc
        elapsed = time.perf_counter() - clock_zero
        row = {"epoch": epoch + 1, **stats, "val_loss": val_loss, "val_acc": val_acc, "val_acc_ema": ema_acc,
               "lr": optimizer.param_groups[0]["lr"], "elapsed": elapsed}
        history.append(row)
        improved = score > best_acc
        best_acc = max(best_acc, score)
        if ctx.main:
            eval_weights = (ema.module if use_ema else model).state_dict()
            state = {**meta, "model": eval_weights, "epoch": epoch + 1, "best_accuracy": best_acc,
                     "weights": "ema" if use_ema else "raw"}
            if improved:
                save_checkpoint(state, run_dir / "best.pt")
            train_state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                           "scheduler": scheduler.state_dict(), "ema": ema.module.state_dict() if ema else None,
                           "drloc": trainee.mlp.state_dict() if isinstance(trainee, RelativeLocalization) else None,
                           "history": history}
            save_checkpoint({**state, "train_state": train_state}, run_dir / "last.pt")
            write_metrics(run_dir, history)
            _plot_curves(run_dir)
            log.info("epoch %d/%d  train loss %.3f acc %.1f%%  val loss %.3f acc %.1f%%%s  lr %.2e  %.0fs  %.0f img/s%s",
                     epoch + 1, planned, stats["train_loss"], 100 * stats["train_acc"], val_loss, 100 * val_acc,
                     f" (EMA {100 * ema_acc:.1f}%)" if ema is not None else "", row["lr"], stats["seconds"],
                     stats["images_per_s"], "  *best*" if improved else "")
        epoch += 1
        if cfg.time_budget:
            planned = agree(plan_epochs(cfg, history), ctx)
    if cfg.time_budget and ctx.main:
        log.info("time budget %.1f min: %d epochs in %.1f min", cfg.time_budget, len(history), elapsed / 60)

    if ctx.main:
        _final_report(run_dir, data, cfg, device, best_acc)
    return TrainResult(run_dir, model, best_acc)


def plan_epochs(cfg: TrainConfig, history: list[dict[str, float]]) -> int:
    """How many epochs the run has in all: ``cfg.epochs``, or with ``time_budget`` as many as fit in it.

    An epoch's cost (training + validation + checkpoint) is the mean of the last three, so the plan follows the
    machine when it gets busier or quieter. It is made again after every epoch and the cosine schedule is
    stretched or shrunk to end with the last planned epoch. Never more than ``cfg.epochs``; before the first
    epoch is measured the plan is ``cfg.epochs`` (warmup does not depend on it).
    """
    if not cfg.time_budget or not history:
        return cfg.epochs
    ends = epoch_ends(history)
    walls = np.diff([0.0, *ends])[-3:]
    per_epoch = max(float(walls.mean()), 1e-6)
    left = cfg.time_budget * 60 - ends[-1]
    if left < 0.5 * per_epoch:  # not even half an epoch left: stop here
        return len(history)
    return min(cfg.epochs, len(history) + max(1, round(left / per_epoch - 0.25)))


def epoch_ends(history: list[dict[str, float]]) -> list[float]:
    """The run's wall clock at the end of each epoch of ``history``. Rows written before the ``elapsed``
    column existed (a resumed older run) count their training seconds on top of the row before."""
    ends: list[float] = []
    for row in history:
        end = row.get("elapsed")
        ends.append(float(end) if end is not None else (ends[-1] if ends else 0.0) + float(row["seconds"]))
    return ends


def agree(value: int, ctx: Dist) -> int:
    """Rank 0's ``value`` on every rank (each rank times its own epochs; they must stop together)."""
    if ctx.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(t, src=0)
    return int(t.item())


def set_cosine_length(scheduler: CosineLRScheduler, steps: int) -> None:
    """Make the cosine decay (after warmup) last ``steps`` optimizer steps in all."""
    scheduler.t_initial = max(1, steps)


def save_config_file(cfg: TrainConfig, run_dir: Path) -> None:
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))


def _plot_curves(run_dir: Path) -> None:
    from .report import plot_training_curves

    try:
        plot_training_curves(run_dir / "metrics.csv", run_dir / "curves.png")
    except Exception as exc:  # noqa: BLE001 - a plot never stops training
        log.warning("could not draw %s: %s", run_dir / "curves.png", exc)


def _final_report(run_dir: Path, data: Datasets, cfg: TrainConfig, device: torch.device, best_acc: float) -> None:
    from .checkpoint import load_model
    from .evaluate import evaluate_dataset

    best = run_dir / "best.pt"
    model, state = load_model(best, device)
    report_dir = run_dir / "report"
    metrics = evaluate_dataset(model, data.val, state, report_dir, device=device, batch_size=cfg.eval_batch_size,
                               run_dir=run_dir, progress=cfg.progress)
    log.info("best validation accuracy %.1f%% (epoch %d, %s weights)", 100 * best_acc, state["epoch"],
             state.get("weights", "raw"))
    log.info("run folder: %s", run_dir)
    for name in ("best.pt", "last.pt", "config.yaml", "metrics.csv", "curves.png", "split.json"):
        if (run_dir / name).exists():
            log.info("  %-12s %s", name, run_dir / name)
    log.info("  %-12s %s (accuracy %.1f%%)", "report", report_dir / "report.html", 100 * metrics["accuracy"])


# --------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m vit_flowers.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="YAML file of config keys (see configs/)")
    add_config_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    keep_freed_memory()
    rank = int(os.environ.get("RANK", "0"))
    if rank:
        logging.getLogger().setLevel(logging.WARNING)
    args = parse_args(argv)
    try:
        cfg = config_from_args(args)
        run_dir = train(cfg).run_dir
    except (ConfigError, CheckpointError, TrainingError, OSError, ValueError) as exc:  # OSError: e.g. a full disk
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted: the last completed epoch is saved; continue with --resume auto")
        return 130
    if rank == 0:
        log.info("done: evaluate with `python -m vit_flowers.evaluate --checkpoint %s`", run_dir / "best.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
