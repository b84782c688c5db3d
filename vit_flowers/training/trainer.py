"""The parts of a training run, in the order they happen:

1. :func:`start_run`: merge a resumed run's settings, make the run folder (a new run never in another run's:
   :mod:`vit_flowers.runs.folders`), load the data, build the model, optimizer, schedule, EMA and augmentation
   (:func:`build_run`), restore a resumed state (:func:`restore_state`), choose the precision
   (:func:`choose_precision`), and only then write config.yaml and split.json (:func:`record_run`): a start that
   fails leaves no run folder behind;
2. :func:`fit`: for each planned epoch :func:`train_one_epoch`, :func:`validate` (raw and EMA weights) and
   :func:`save_epoch` (``best.pt``, ``last.pt``, ``metrics.csv``, ``curves.png``);
3. :func:`final_report`: the evaluation report of ``best.pt``.

``python -m vit_flowers.train`` wires these together (:func:`vit_flowers.train.train`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import random
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.optim import create_optimizer_v2, param_groups_weight_decay
from timm.scheduler import CosineLRScheduler, PolyLRScheduler
from timm.utils import ModelEmaV3
from torch import nn
from torch.utils.data import DistributedSampler
from tqdm import tqdm

from ..data.augment import IMAGENET_MEAN, IMAGENET_STD, TrainAugment, eval_transform, resize_square
from ..data.datasets import SEED_STRIDE, Datasets, TensorImageDataset, create_dataset
from ..data.progress import tracked
from ..data.splits import save_split
from ..inference.precision import autocast, autocast_dtype, bf16_speedup, dtype_name, parse_dtype, probe_key
from ..models.efficientnet import EfficientNetTrunk, set_batchnorm_mode
from ..models.patch_embed import hybrid_embed
from ..models.vit import ViT, create_vit
from ..runs import folders as runs
from ..runs.checkpoint import (
    Checkpoint,
    CheckpointError,
    atomic_write_text,
    latest_run,
    load_checkpoint,
    make_checkpoint,
    mark_latest,
    resolve_checkpoint,
    save_checkpoint,
)
from .budget import FORWARD_OVER_STEP, epoch_ends, plan_epochs, run_end_seconds
from .config import ConfigError, TrainConfig, config_defaults, load_config, save_config
from .distributed import Dist, agree, all_sum, broadcast_path, set_threads
from .feature_start import (
    FeatureStart,
    feature_extras,
    refit_on_every_photo,
    start_from_features,
    wants_feature_head,
)
from .objectives import Batch, Logs, Objective, make_objective, objective_state, restore_objective
from .pretrained import PretrainedError, load_pretrained
from .recipe import Recipe, after_feature_start, beats_head_start, head_start_kept, noise_margin, plan_recipe, row_score
from .token_cache import TokenPhase

if TYPE_CHECKING:  # (imported when the report is written: its libraries are not needed to train)
    from ..inference.calibration import Calibration
    from ..inference.features import Outputs
    from ..reporting.evaluation import KnownOutputs

__all__ = ["Run", "TrainingError", "METRIC_COLUMNS", "start_run", "fit", "final_report",
           "train_one_epoch", "validate", "create_model", "make_scheduler"]

log = logging.getLogger("vit_flowers.train")
LRSchedule = CosineLRScheduler | PolyLRScheduler  # (timm's base Scheduler has no t_initial, which fit moves)

METRIC_COLUMNS = ["epoch", "train_loss", "train_acc", "val_loss", "val_acc", "val_acc_ema", "lr", "seconds",
                  "images_per_s", "elapsed", "trunk_frozen"]  # seconds: this epoch's training; elapsed: the run's
#                 wall clock so far; trunk_frozen: 1 for an epoch on the cached trunk outputs (token_cache.py)
SMALL_VAL = 50  # validation photos below which the log says that best.pt is chosen on little evidence (#52)
NOT_RESUMED = ("resume", "run_name", "out_dir", "overwrite")  # keys that say where a run is, not how it trains


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN); the message says what was kept."""


@dataclasses.dataclass
class Run:
    """Everything a training run holds between epochs."""

    cfg: TrainConfig  # the resolved configuration (a resumed run's own, with what the user gave on top)
    ctx: Dist  # this process's place in a torchrun job
    device: torch.device
    run_dir: Path  # checkpoints/<run>/
    data: Datasets  # train / val images in memory
    model: ViT  # the network being trained (raw weights)
    optimizer: torch.optim.Optimizer
    scheduler: LRSchedule  # warmup, then cosine or linear decay to min_lr at the end of the last planned epoch
    ema: ModelEmaV3 | None  # moving average of the weights
    mixup: Mixup | None  # mixup / CutMix of whole batches
    augment: TrainAugment  # crops, flips, TrivialAugment / RandAugment on uint8 batches (at the objective's view
    #                        size: the larger of the model's and, distilling, the teacher's input sizes)
    steps_per_epoch: int
    warmup_steps: int
    objective: Objective  # what each step minimises: cross-entropy, distillation, ... (objectives.py)
    amp_dtype: torch.dtype | None = None  # bf16 autocast, or None for fp32
    net: nn.Module | None = None  # the model as a step runs it (DistributedDataParallel, torch.compile)
    start_epoch: int = 0  # first epoch to train (> 0 when resumed)
    best_acc: float = -1.0  # best validation accuracy so far (raw or EMA weights)
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)  # one metrics row per epoch
    resumed_amp: str | None = None  # the precision a resumed run chose, kept so that it does not change
    stopped_early: bool = False  # fit() returned at stop_after, before the planned epochs
    # the head start's trunk outputs of the train and val photos, kept while the trunk has not trained since (a run
    # that ends with its head start): the unknown rule's features are read from them (attach_unknown)
    trunk_cache: tuple[torch.Tensor, torch.Tensor] | None = None
    recipe: Recipe | None = None  # a head start's shape and whether end-to-end epochs follow (recipe.py)
    # what the time budget plans the end of the run with (budget.run_end_seconds), measured as the run goes: the
    # seconds of an evaluation forward pass per photo (the last validation, or the head start's trunk pass), of one
    # over the cached trunk outputs, and of the last epoch's checkpoint writes and curves
    forward_per_photo: float = 0.0
    cached_per_photo: float = 0.0
    save_seconds: float = 0.0
    # the validation outputs of the weights best.pt keeps (its epoch, the fp32 Outputs and their seconds), when the
    # epoch that gave best.pt kept them (_validate_epoch): the end of the run reads them instead of another pass
    val_outputs: tuple[int, Outputs, float] | None = None
    # the end of the run for best.pt's head-start weights, computed over the trunk cache before the trunk trains
    # (seconds; calibrate_head_start): read at the end when no end-to-end epoch replaced the head start in best.pt
    head_start_end: Calibration | None = None
    # a feature head's start (feature_start.py), and whether best.pt still holds it (no head-start epoch beat it)
    feature_start: FeatureStart | None = None
    start_kept: bool = False

    @property
    def step_net(self) -> nn.Module:
        """``net``, which :func:`start_run` sets before any step."""
        if self.net is None:
            raise RuntimeError("the run has no net: start_run sets it")
        return self.net

    @property
    def token_epochs_done(self) -> int:
        """Epochs trained on the cached trunk outputs: the end-to-end schedule and EMA count steps after them."""
        return sum(1 for row in self.history if row.get("trunk_frozen") == 1)


# --------------------------------------------------------------------------- set-up
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(cfg: TrainConfig, epoch: int, rank: int) -> int:
    """Each epoch reseeds every RNG from (seed, epoch, rank): a run resumed at an epoch
    boundary draws exactly the random numbers an uninterrupted run would."""
    return (cfg.run.seed * SEED_STRIDE + epoch * 1009 + rank) % 2**31


def resolve_resume(cfg: TrainConfig) -> Path | None:
    """The ``last.pt`` that ``cfg.run.resume`` names, or None for a new run. ``--resume auto`` with nothing to resume
    is refused (CheckpointError): starting a new run instead would train what the resumed run's settings are not
    there to say (the quick start, not the photo recipe), or hide a mistyped --out-dir behind a run of many minutes."""
    if not cfg.run.resume:
        return None
    if cfg.run.resume == "auto":
        run = latest_run(cfg.run.out_dir)
        if run is None or not (run / runs.LAST).is_file():
            why = "no run folder" if run is None else f"its newest run, {run.name}, ended no epoch"
            raise CheckpointError(f"--resume auto: nothing to resume in {cfg.run.out_dir}/ ({why}): start a new run "
                                  f"with the same command without --resume")
        return run / runs.LAST
    return resolve_checkpoint(cfg.run.resume, cfg.run.out_dir, name=runs.LAST)


def merge_resumed_config(cfg: TrainConfig, saved: dict[str, Any], resume_path: Path,
                         given: frozenset[str] | None = None) -> TrainConfig:
    """The resumed run's saved config with every key the user gave this time (``given``: whatever its value, a value
    that equals the default still wins over the saved one) on top; each change is logged. Without ``given`` (a
    config built in code) the keys whose value differs from the defaults."""
    current = cfg.flat()
    if given is None:
        defaults = config_defaults()
        given = frozenset(k for k, v in current.items() if v != defaults[k])
    overrides = {k: current[k] for k in given if k not in NOT_RESUMED}
    for key in sorted(overrides):
        if saved.get(key) != overrides[key]:
            log.info("--resume: %s changed from %r to %r", key, saved.get(key), overrides[key])
    kept = {k: v for k, v in saved.items() if k not in NOT_RESUMED}
    merged = load_config(None, {**kept, **overrides})
    merged.run.run_name, merged.run.out_dir = resume_path.parent.name, str(resume_path.parent.parent)
    return merged


def make_run_dir(cfg: TrainConfig, resumed: bool) -> tuple[Path, list[Path]]:
    """(the run folder, the folders made for it): a resumed run's own; a new run's ``run_name`` (refused when that
    folder holds a run, unless ``overwrite``: :func:`vit_flowers.runs.folders.check_new_run`), or a free name from the
    dataset and the clock."""
    if cfg.run.run_name:
        run_dir = Path(cfg.run.out_dir) / cfg.run.run_name
        if not resumed:
            runs.check_new_run(run_dir, cfg.run.overwrite)
    else:
        run_dir = runs.free_run_dir(cfg.run.out_dir, f"{cfg.data.dataset}-{datetime.now():%Y%m%d-%H%M%S}")
    return run_dir, runs.make_run_dir(run_dir)


def load_run_data(cfg: TrainConfig, ctx: Dist, run_dir: Path, resumed: Checkpoint | None,
                  resume_path: Path | None) -> Datasets:
    """The run's images: a folder's split reused from the run's split.json (not one that ``overwrite`` is about to
    delete). Writes nothing (:func:`record_run` does, once the run has started)."""
    split_file = run_dir / runs.SPLIT
    reuse = split_file.is_file() and not cfg.run.overwrite  # (overwrite: never a resumed run, see TrainConfig.validate)
    data = create_dataset(cfg.data, seed=cfg.run.seed, split_file=split_file if reuse else None,
                          progress=cfg.run.progress and ctx.main)
    if resumed is not None and list(resumed["classes"]) != list(data.classes):  # before the run is rewritten
        raise CheckpointError(f"cannot resume {resume_path}: it was trained on the classes {resumed['classes']}, but "
                              f"the data now has {data.classes}. Resume with the same data, or start a new run.")
    if ctx.main:
        log.info("data: %s | %d classes | %d train, %d val images%s", data.source, len(data.classes), len(data.train),
                 len(data.val), " (trained on too: train_on_val)" if cfg.data.train_on_val else "")
    return data


def record_run(cfg: TrainConfig, run_dir: Path, data: Datasets) -> None:
    """A started run's folder (rank 0): cleared first with ``overwrite``, then config.yaml and split.json; the run
    marked as the newest."""
    if cfg.run.overwrite:
        runs.clear_run_dir(run_dir)
    save_config(cfg, run_dir / runs.CONFIG)
    if data.split is not None:
        save_split(run_dir / runs.SPLIT, data.split)
    mark_latest(run_dir)


def create_model(cfg: TrainConfig, num_classes: int, feature_head: tuple[bool, str] = (False, "")) -> ViT:
    """The ViT to train: a preset with the config's overrides (``feature_head``: with one and its extra networks,
    :mod:`.feature_start`), or ``cfg.model.pretrained``'s weights with a new head."""
    if not cfg.model.pretrained or cfg.model.pretrained == "imagenet":
        model = create_vit(cfg.model.preset, num_classes, **cfg.model_kwargs(), feature_head=feature_head[0],
                           feature_extras=feature_head[1])
        if cfg.model.pretrained == "imagenet":
            from ..models.efficientnet import ImageNetWeightsError, load_imagenet_trunk
            from ..models.feature_head import load_imagenet_head

            try:
                load_imagenet_trunk(hybrid_embed(model.to_patch_embedding).trunk)
                if model.feature_head is not None:
                    load_imagenet_head(model.feature_head)
            except ImageNetWeightsError as exc:
                raise ConfigError(str(exc)) from None
        return model
    try:
        return load_pretrained(cfg.model.pretrained, num_classes=num_classes,
                               image_size=cfg.data.image_size, heads=cfg.model.pretrained_heads or cfg.model.heads,
                               dropout=cfg.model.dropout, drop_path=cfg.model.drop_path)
    except PretrainedError as exc:
        raise ConfigError(str(exc)) from None


def pretrained_trunk(model: ViT) -> EfficientNetTrunk | None:
    """A hybrid's pretrained CNN stages (None for the other patch embeddings)."""
    trunk = getattr(model.to_patch_embedding, "trunk", None)
    return trunk if isinstance(trunk, EfficientNetTrunk) else None


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


def param_groups(model: ViT, weight_decay: float, backbone_lr_scale: float) -> list[dict[str, Any]]:
    """AdamW's parameter groups: timm's (no weight decay on norms, biases, positions and the CLS token), each split
    so that a hybrid's pretrained CNN stages learn at ``backbone_lr_scale`` times the lr (timm's schedulers apply
    ``lr_scale``); the new parts come first, since the run logs ``param_groups[0]``'s lr."""
    trunk = pretrained_trunk(model)
    pretrained = {id(p) for p in trunk.parameters()} if trunk is not None else set()
    groups = []
    for group in param_groups_weight_decay(model, weight_decay, no_weight_decay_list=model.no_weight_decay()):
        for scale, in_trunk in ((1.0, False), (backbone_lr_scale, True)):
            params = [p for p in group["params"] if (id(p) in pretrained) == in_trunk]
            if params:
                groups.append({**group, "params": params, "lr_scale": scale})
    return sorted(groups, key=lambda g: g["lr_scale"] != 1.0)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, decay_steps: int,
                   warmup_steps: int) -> LRSchedule:
    """A linear warmup from 1% of ``cfg.optim.lr``, then ``cfg.optim.lr_schedule``'s decay to ``cfg.optim.min_lr`` over
    ``decay_steps`` optimizer steps (``fit`` moves that end with the time budget's plan)."""
    common: dict[str, Any] = dict(t_initial=decay_steps, lr_min=cfg.optim.min_lr, warmup_t=warmup_steps,
                                  warmup_lr_init=cfg.optim.lr * 0.01, warmup_prefix=True, t_in_epochs=False)
    if cfg.optim.lr_schedule == "linear":
        return PolyLRScheduler(optimizer, power=1.0, **common)  # a straight line from the peak to min_lr
    return CosineLRScheduler(optimizer, **common)


def with_feature_head(cfg: TrainConfig, data: Datasets) -> tuple[bool, str]:
    """Whether this run's hybrid has a feature head (:func:`.feature_start.wants_feature_head` of the config and the
    training photos of each class), and its extra networks (:func:`.feature_start.feature_extras`)."""
    counts = torch.bincount(data.train.labels, minlength=len(data.classes))
    wanted = wants_feature_head(cfg.model.feature_head, hybrid_at_32=cfg.model.hybrid and cfg.model.patch_size == 32,
                                imagenet=cfg.model.pretrained == "imagenet", head_start=cfg.optim.token_epochs > 0,
                                fewest=int(counts.min()) if len(counts) else 0,
                                end_to_end_min_per_class=cfg.optim.end_to_end_min_per_class)
    return wanted, feature_extras(cfg.model.feature_extras, len(data.train) + len(data.val)) if wanted else ""


def build_run(cfg: TrainConfig, ctx: Dist, device: torch.device, run_dir: Path, data: Datasets) -> Run:
    """Model, optimizer, schedule, EMA, mixup, objective and augmentation for a fresh run."""
    model = create_model(cfg, len(data.classes), with_feature_head(cfg, data)).to(device)
    # before the optimizer: frozen layers have no parameters to train
    set_trunk_batchnorm(model, cfg.model.backbone_bn, cfg.model.freeze_stages)
    optimizer = create_optimizer_v2(param_groups(model, cfg.optim.weight_decay, cfg.model.backbone_lr_scale), "adamw",
                                    lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                                    fused=device.type in ("cpu", "cuda"))  # the same update in one kernel
    steps = max(1, math.ceil(len(data.train) / ctx.world) // cfg.optim.batch_size)  # full batches; one short batch
    warmup = min(round(cfg.optim.warmup_epochs * steps), cfg.optim.epochs * steps - 1)
    scheduler = make_scheduler(optimizer, cfg, decay_steps=cfg.optim.epochs * steps - warmup, warmup_steps=warmup)
    mixup, aug = None, cfg.augment
    if aug.mixup > 0 or aug.cutmix > 0:
        mixup = Mixup(mixup_alpha=aug.mixup, cutmix_alpha=aug.cutmix, prob=aug.mixup_prob,
                      label_smoothing=cfg.optim.label_smoothing, num_classes=len(data.classes))
    objective = make_objective(cfg, data.classes, device)
    augment = TrainAugment(
        objective.view_size(cfg.data.image_size), scale=(aug.crop_scale_min, 1.0), auto_augment=aug.policy,
        randaug_num_ops=aug.randaug_num_ops, randaug_magnitude=aug.randaug_magnitude,
        random_erasing=aug.random_erasing, mean=IMAGENET_MEAN, std=IMAGENET_STD,
    )
    ema = ModelEmaV3(model, decay=cfg.optim.ema_decay, use_warmup=True) if cfg.optim.ema else None
    return Run(cfg, ctx, device, run_dir, data, model, optimizer, scheduler, ema, mixup, augment,
               steps, warmup, objective)


def restore_state(run: Run, resumed: Checkpoint, resume_path: Path) -> None:
    """Put a resumed run's weights, optimizer, schedule, EMA, objective state and history back."""
    ts = resumed["train_state"]
    assert ts is not None, resume_path  # (start_run checked)
    try:
        run.model.load_state_dict(ts["model"])
        run.optimizer.load_state_dict(ts["optimizer"])
        run.scheduler.load_state_dict(ts["scheduler"])
        if run.ema is not None and ts.get("ema") is not None:
            run.ema.module.load_state_dict(ts["ema"])
        restore_objective(run.objective, ts.get("objective"))  # (none in a last.pt from before objectives)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # e.g. a size mismatch: another model
        raise CheckpointError(f"cannot resume {resume_path}: its training state does not fit this model "
                              f"({str(exc).strip().splitlines()[-1].strip()}). Resume without changing the "
                              f"model settings, or start a new run.") from None
    run.start_epoch, run.history = resumed["epoch"], list(ts["history"])
    run.best_acc = resumed["best_accuracy"] or 0.0  # (None: a hand-made file of format 1)
    run.resumed_amp = ts.get("amp")
    if run.ctx.main:
        write_metrics(run.run_dir, run.history)  # killed between last.pt and metrics.csv: bring them up to date
        plot_curves(run.run_dir)
        log.info("resuming %s at epoch %d", resume_path, run.start_epoch + 1)


def choose_precision(run: Run) -> torch.dtype | None:
    """The autocast dtype of this run: ``precision`` as configured; "auto" times a few training steps of this
    model at this batch shape in fp32 and bf16 (:mod:`vit_flowers.inference.precision`), or reads that verdict from
    this machine's cache (``precision_probe``). A resumed "auto" run keeps the choice it made when it started, and
    every rank uses rank 0's."""
    return _agreed_precision(run, run.model, run.cfg.data.image_size, train=True, what="training step",
                             resumed=run.resumed_amp)


def _agreed_precision(run: Run, model: nn.Module, size: int, *, train: bool, what: str,
                      resumed: str | None = None) -> torch.dtype | None:
    """``precision`` for ``model`` at a batch of ``size`` px inputs (:func:`autocast_dtype`, probing a training
    step or a forward pass); "auto" keeps the choice a resumed run made (``resumed``); every rank uses rank 0's
    choice. With ``train=False`` it is the probe the objective's own networks get
    (:class:`vit_flowers.training.objectives.PrecisionProbe`: e.g. a teacher's forward pass apart from the
    student's step)."""
    if run.cfg.run.precision == "auto" and resumed is not None:
        return parse_dtype(resumed)
    # a training step runs micro_batch photos at a time: the probe times that shape, and a whole batch at once on a
    # copy of the model would set the run's peak memory (benchmarks/README.md, "The tail and the precision probe")
    step_batch = (run.cfg.optim.micro_batch or run.cfg.optim.batch_size) if train else run.cfg.run.eval_batch_size
    example = torch.zeros(min(step_batch, len(run.data.train)), 3, size, size, device=run.device)
    amp = autocast_dtype(run.cfg.run.precision, run.device, lambda: bf16_speedup(model, example, train=train),
                         what=what, key=probe_key(model, example, train=train),
                         fresh=run.cfg.run.precision_probe == "fresh")
    return parse_dtype(["fp32", "bf16"][agree(int(amp is not None), run.ctx)])


def wrap_for_steps(run: Run) -> nn.Module:
    """The model as a step runs it: DistributedDataParallel under torchrun, compiled with ``compile``."""
    net: nn.Module = run.model
    if run.ctx.world > 1:
        ids = [run.device.index] if run.device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(run.model, device_ids=ids)
    # (torch.compile of a Module gives an OptimizedModule, a Module: its annotation says only Callable)
    return cast(nn.Module, torch.compile(net)) if run.cfg.run.compile else net


def choose_recipe(run: Run) -> Recipe | None:
    """The head start's shape for this run's photos and whether end-to-end epochs follow
    (:func:`.recipe.plan_recipe`), logged with the reason; None for a run with no head start."""
    cfg = run.cfg
    if not cfg.optim.token_epochs or pretrained_trunk(run.model) is None or run.ctx.world > 1:
        return None
    counts = torch.bincount(run.data.train.labels, minlength=len(run.data.classes)).tolist()
    recipe = plan_recipe(counts, batch_size=cfg.optim.batch_size, token_epochs=cfg.optim.token_epochs,
                         head_start_steps=cfg.optim.head_start_steps,
                         end_to_end_min_per_class=cfg.optim.end_to_end_min_per_class, classes=run.data.classes)
    if run.model.feature_head is not None:
        recipe = after_feature_start(recipe)
    n_val = len(run.data.val)
    if run.ctx.main:
        log.info("recipe: %s", recipe.reason)
        if 0 < n_val < SMALL_VAL:
            log.warning("validation: %d photos (one photo is %.1f points, the noise about +-%.0f): best.pt is chosen "
                        "on little evidence; more photos a class, or a val/ folder of your own, make it surer",
                        n_val, 100 / n_val, 100 * noise_margin(0.8, n_val))
    return recipe


def start_run(cfg: TrainConfig, ctx: Dist, device: torch.device, given: frozenset[str] | None = None) -> Run:
    """A run ready for :func:`fit`: new, or resumed where ``cfg.run.resume`` says (``given``: the keys the user set,
    which replace the resumed run's: :func:`merge_resumed_config`)."""
    resume_path = resolve_resume(cfg)
    resumed = None
    if resume_path is not None:
        resumed = load_checkpoint(resume_path)
        if resumed["train_state"] is None:
            how = ("a run that teach wrote: train on from its network with --pretrained" if resumed["taught"]
                   else "use a last.pt")
            raise CheckpointError(f"{resume_path} has no training state to resume from ({how})")
        cfg = merge_resumed_config(cfg, resumed["config"], resume_path, given)
    if cfg.distill.teacher:  # a missing teacher is named before any photo is read
        from .distill import teacher_file

        teacher_file(cfg.distill.teacher)
    set_threads(cfg.run.threads, ctx)
    if cfg.run.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed_everything(cfg.run.seed)
    run_dir, made = Path(cfg.run.out_dir) / (cfg.run.run_name or ""), list[Path]()
    if ctx.main:
        run_dir, made = make_run_dir(cfg, resumed is not None)
    run_dir = Path(broadcast_path(str(run_dir), ctx))  # everyone uses rank 0's run folder
    try:
        data = load_run_data(cfg, ctx, run_dir, resumed, resume_path)
        run = build_run(cfg, ctx, device, run_dir, data)
        if resumed is not None and resume_path is not None:
            restore_state(run, resumed, resume_path)
        run.amp_dtype = choose_precision(run)
        run.recipe = choose_recipe(run)
        run.objective.setup(functools.partial(_agreed_precision, run, train=False))
        run.net = wrap_for_steps(run)
    except BaseException:
        runs.remove_new_folders(made)  # a start that fails leaves no empty run folder behind
        raise
    if ctx.main:
        record_run(cfg, run_dir, data)
        n_params = sum(p.numel() for p in run.model.parameters())
        budget = (f" (as many as fit in {cfg.optim.time_budget:g} min)" if cfg.optim.time_budget
                  else " (time budget 0: no limit, every epoch runs)")
        log.info("model: %s, %.2fM parameters, on %s (%d threads, %s); up to %d epochs%s of %d steps", cfg.model.preset,
                 n_params / 1e6, device, torch.get_num_threads(),
                 "bf16 autocast" if run.amp_dtype else "fp32", cfg.optim.epochs, budget, run.steps_per_epoch)
    return run


# --------------------------------------------------------------------------- epochs
def _step_loss(run: Run, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, Logs]:
    """(loss, logits, logs) of (a part of) one batch of views under the run's autocast: the model's logits at its
    input size, then the run's objective on them (:mod:`vit_flowers.training.objectives`)."""
    with autocast(run.device, run.amp_dtype):
        logits = run.step_net(resize_square(batch.views, run.cfg.data.image_size)).float()
        loss, logs = run.objective.loss(logits, batch)
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
    if run.mixup is not None and len(images) % 2 == 0:
        mixed, targets = run.mixup(images, labels)
        batch = Batch(mixed, labels, targets)
    total, logits = torch.zeros((), device=images.device), []
    logs: Logs = {}
    for part in range(0, len(images), micro):
        chunk, last = slice(part, part + micro), part + micro >= len(images)
        no_sync = getattr(run.net, "no_sync", None)  # DistributedDataParallel: average the gradients once, at the end
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


def train_one_epoch(run: Run, epoch: int, planned_epochs: int, deadline: float | None = None) -> dict[str, float]:
    """One pass over this rank's shard; returns loss, accuracy, throughput and the objective's logs (reduced over
    ranks). ``deadline``: the ``time.perf_counter()`` after which no step starts (the time budget's, when the machine
    slowed down after the epoch was planned): a shorter epoch rather than an overshoot."""
    cfg, ctx, data = run.cfg, run.ctx, run.data.train
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
    bar = tqdm(range(run.steps_per_epoch), desc=f"epoch {epoch + 1}/{planned_epochs}", leave=False,
               disable=None if cfg.run.progress and ctx.main else True, dynamic_ncols=True)  # None: only on a terminal
    for step in tracked(bar, f"epoch {epoch + 1}/{planned_epochs}", run.steps_per_epoch):
        if step and deadline is not None and agree(int(time.perf_counter() > deadline), ctx):
            if ctx.main:
                log.warning("time budget: the machine is slower than when epoch %d was planned; it stops after %d of "
                            "its %d steps so that the run ends in time", epoch + 1, step, run.steps_per_epoch)
            break
        idx = order[step * cfg.optim.batch_size: (step + 1) * cfg.optim.batch_size]
        images = run.augment(data.batch(idx), generator=generator).to(run.device, non_blocking=True)
        labels = data.labels[idx].to(run.device, non_blocking=True)
        run.optimizer.zero_grad(set_to_none=True)
        loss, logits, logs = _accumulate_gradients(run, images, labels)
        if not torch.isfinite(loss):
            raise TrainingError(f"the loss became {loss.item()} at epoch {epoch + 1}, step {step + 1}: training "
                                f"stopped; the last good checkpoint is kept. Try a lower lr (now {cfg.optim.lr}) or "
                                f"clip_grad.")
        if cfg.optim.clip_grad:
            nn.utils.clip_grad_norm_(run.step_net.parameters(), cfg.optim.clip_grad)
        run.optimizer.step()
        global_step = (epoch - run.token_epochs_done) * run.steps_per_epoch + step + 1
        run.scheduler.step_update(global_step)
        if run.ema is not None:
            run.ema.update(run.model, step=global_step)
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


# --------------------------------------------------------------------------- saving
def metric_columns(history: list[dict[str, float]]) -> list[str]:
    """metrics.csv's columns: :data:`METRIC_COLUMNS`, then what the objective logged (``train_kl``, ...) in the
    order the rows first hold them."""
    extra = dict.fromkeys(key for row in history for key in row if key not in METRIC_COLUMNS)
    return METRIC_COLUMNS + list(extra)


def write_metrics(run_dir: Path, history: list[dict[str, float]]) -> None:
    atomic_write_text(run_dir / runs.METRICS, runs.metrics_text(history, metric_columns(history)))


def plot_curves(run_dir: Path) -> None:
    from ..reporting.report import plot_training_curves
    from ..runs.checkpoint import kept_weights

    try:
        plot_training_curves(run_dir / runs.METRICS, run_dir / runs.CURVES, kept_weights(run_dir))
    except Exception as exc:  # noqa: BLE001 - a plot never stops training
        log.warning("could not draw %s: %s", run_dir / runs.CURVES, exc)


def checkpoint_of(run: Run, epoch: int, use_ema: bool, train_state: bool = False) -> Checkpoint:
    """The run's checkpoint after ``epoch`` epochs: the evaluation weights (EMA's or raw), and with
    ``train_state`` what ``--resume`` needs."""
    state = None
    if train_state:
        state = {"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
                 "scheduler": run.scheduler.state_dict(), "ema": run.ema.module.state_dict() if run.ema else None,
                 "history": run.history, "amp": dtype_name(run.amp_dtype),
                 "objective": objective_state(run.objective)}
    return make_checkpoint(
        run.model, classes=run.data.classes, image_size=run.cfg.data.image_size, mean=list(IMAGENET_MEAN),
        std=list(IMAGENET_STD), config=run.cfg.flat(), epoch=epoch, best_accuracy=run.best_acc,
        weights=(run.ema.module if use_ema and run.ema is not None else run.model).state_dict(),
        weights_kind="ema" if use_ema else "raw",
        train_state=state,
    )


def save_epoch(run: Run, epoch: int, use_ema: bool, improved: bool) -> None:
    """best.pt (when ``improved``), last.pt, metrics.csv and curves.png after ``epoch`` epochs (rank 0 only)."""
    if improved:
        save_checkpoint(checkpoint_of(run, epoch, use_ema), run.run_dir / runs.BEST)
    save_checkpoint(checkpoint_of(run, epoch, use_ema, train_state=True), run.run_dir / runs.LAST)
    write_metrics(run.run_dir, run.history)
    plot_curves(run.run_dir)


# --------------------------------------------------------------------------- the loop
def _validate_epoch(run: Run, last: bool) -> tuple[float, float, float, tuple[Outputs, ...] | None]:
    """(val loss, val accuracy, EMA val accuracy or NaN, the fp32 Outputs of the raw and EMA weights or None) of
    an end-to-end epoch. A single process with a report to write keeps what it saw (:func:`validate_outputs`), for
    the end of the run to read instead of another pass, in every epoch where the run trains in fp32 (the same pass:
    best.pt's outputs are at hand whichever epoch it keeps), else in the ``last`` planned one (in fp32; the others
    validate under the run's autocast)."""
    cfg, ctx, val = run.cfg, run.ctx, run.data.val
    if not (ctx.world == 1 and cfg.run.report and len(val) and (last or run.amp_dtype is None)):
        loss, acc = validate(run.model, val, cfg, ctx, run.device, run.amp_dtype)
        ema_acc = validate(run.ema.module, val, cfg, ctx, run.device, run.amp_dtype)[1] if run.ema else float("nan")
        return loss, acc, ema_acc, None
    loss, acc, raw = validate_outputs(run.model, val, run.device, cfg.run.eval_batch_size)
    if run.ema is None:
        return loss, acc, float("nan"), (raw,)
    _, ema_acc, ema = validate_outputs(run.ema.module, val, run.device, cfg.run.eval_batch_size)
    return loss, acc, ema_acc, (raw, ema)


def end_epoch(run: Run, epoch: int, planned: int, stats: dict[str, float], elapsed: float,
              token_phase: TokenPhase | None = None) -> None:
    """Validate the raw and the EMA weights (an epoch of ``token_phase``: the raw weights on its cached val
    outputs), record the epoch, save, log."""
    cfg, ctx = run.cfg, run.ctx
    outputs: tuple[Outputs, ...] | None = None
    if token_phase is not None:
        (val_loss, val_acc), ema_acc = token_phase.validate(), float("nan")
        lr = token_phase.optimizer.param_groups[0]["lr"]
    else:
        start = time.perf_counter()
        val_loss, val_acc, ema_acc, outputs = _validate_epoch(run, last=epoch + 1 == planned)
        seconds = time.perf_counter() - start
        passes = len(run.data.val) * (2 if run.ema is not None else 1) / ctx.world
        run.forward_per_photo = seconds / passes if passes else run.forward_per_photo
        lr = run.optimizer.param_groups[0]["lr"]
    use_ema = token_phase is None and run.ema is not None and (ema_acc > val_acc or cfg.data.train_on_val)
    row = {"epoch": epoch + 1, **stats, "val_loss": val_loss, "val_acc": val_acc, "val_acc_ema": ema_acc,
           "lr": lr, "elapsed": elapsed, "trunk_frozen": int(token_phase is not None)}
    score = row_score(row)  # the rule head_start_kept reads the rows back with
    n_val = len(run.data.val)
    # the head start stays unless beaten by more than the noise; so does the frozen-feature start
    noisy = head_start_kept(run.history, n_val) if token_phase is None else run.start_kept
    improved = beats_head_start(score, run.best_acc, n_val) if noisy else score > run.best_acc
    if noisy and not improved and score > run.best_acc and ctx.main:
        kept = "the frozen-feature start" if token_phase is not None else "the head start"
        log.info("epoch %d: val %.1f%% is within the noise (+-%.1f points on %d photos) of %s's %.1f%%: "
                 "best.pt keeps %s", epoch + 1, 100 * score,
                 100 * noise_margin(run.best_acc, n_val), n_val, kept, 100 * run.best_acc, kept)
    run.history.append(row)
    improved = improved or cfg.data.train_on_val  # nothing held out to choose an epoch by: the last
    if improved:
        run.best_acc, run.start_kept = max(run.best_acc, score), False
    if improved:  # the outputs of the weights best.pt now keeps, when this epoch kept them
        run.val_outputs = None if outputs is None else (epoch + 1, outputs[1] if use_ema else outputs[0],
                                                        seconds / len(outputs))
    if ctx.main:
        start = time.perf_counter()
        save_epoch(run, epoch + 1, use_ema, improved)
        run.save_seconds = time.perf_counter() - start
        log.info("epoch %d/%d  train loss %.3f acc %.1f%%  val loss %.3f acc %.1f%%%s  lr %.2e  %.0fs  %.0f img/s%s",
                 epoch + 1, planned, stats["train_loss"], 100 * stats["train_acc"], val_loss, 100 * val_acc,
                 f" (EMA {100 * ema_acc:.1f}%)" if not math.isnan(ema_acc) else "", row["lr"], stats["seconds"],
                 stats["images_per_s"], "  *best*" if improved else "")


def train_on_tokens(run: Run, clock_zero: float) -> float | None:
    """A new hybrid run's head start (``token_epochs``, :mod:`vit_flowers.training.token_cache`): epochs on the
    cached trunk outputs, as many as the time budget leaves room for. Returns what an end-to-end epoch should take
    (seconds),
    for the plan of the epochs after it; None when skipped."""
    cfg = run.cfg
    if run.ctx.world > 1:  # each process would cache, and train on, its own share alone
        log.warning("token_epochs %d: skipped under torchrun; the run trains end to end", cfg.optim.token_epochs)
        return None
    optim, passes = cfg.optim, run.recipe.passes if run.recipe else 1
    epochs = run.recipe.head_epochs if run.recipe else optim.token_epochs
    phase = TokenPhase(run.model, run.data.train, run.data.val, epochs=epochs, lr=optim.token_lr,
                       weight_decay=optim.weight_decay, batch_size=optim.batch_size,
                       label_smoothing=optim.label_smoothing, device=run.device, amp_dtype=run.amp_dtype,
                       progress=cfg.run.progress and run.ctx.main, passes=passes, cache=run.data.cache,
                       trunk_batch=cfg.run.eval_batch_size)
    generator = torch.Generator().manual_seed(epoch_seed(cfg, 0, run.ctx.rank))
    run.forward_per_photo = phase.forward_per_photo
    if run.model.feature_head is not None:
        start_as_peer(run, phase)
    planned, epoch = epochs, 0
    while epoch < planned:
        start = time.perf_counter()
        end_epoch(run, epoch, planned, phase.train_epoch(generator, f"head start, epoch {epoch + 1}/{planned}"),
                  time.perf_counter() - clock_zero,
                  token_phase=phase)
        epoch += 1
        run.cached_per_photo = FORWARD_OVER_STEP * run.history[-1]["seconds"] / max(len(phase.train_y) * passes, 1)
        if cfg.optim.time_budget:  # as many as the clock leaves, the cosine ending with the last of them
            left = cfg.optim.time_budget * 60 - (time.perf_counter() - clock_zero)
            planned = min(planned, epoch + int(left / (time.perf_counter() - start) + 0.5))
            phase.plan(planned)
    if run.ema is not None:  # the average starts from the head start's weights, not from the random ones
        run.ema = ModelEmaV3(run.model, decay=cfg.optim.ema_decay, use_warmup=True)
    run.trunk_cache = (phase.train_x, phase.val_x)
    return phase.end_to_end_epoch_estimate(len(run.data.train))


def start_as_peer(run: Run, phase: TokenPhase) -> None:
    """The frozen-feature start (:func:`.feature_start.start_from_features`) on the head start's cached training
    outputs, validated on its cached val outputs and saved as best.pt (epoch 0): what the head-start epochs must beat
    by more than the noise."""
    run.feature_start = start_from_features(run.model, phase.train_x, phase.train_y)
    phase.fix_feature_logits()
    _, accuracy = phase.validate()
    run.best_acc, run.start_kept = accuracy, True
    if run.ctx.main:
        save_checkpoint(checkpoint_of(run, 0, use_ema=False), run.run_dir / runs.BEST)
        log.info("start: val %.1f%% on %d photos (saved as best.pt)", 100 * accuracy, len(phase.val_y))


def refit_best(run: Run) -> None:
    """A run that ends with its head start and a feature start: best.pt's feature head fitted again on every
    labelled photo (the training and validation photos' cached trunk outputs; the report and the unknown rule, made
    before, keep the held-out figures). Nothing to do for other runs, or where the val photos were trained on."""
    from ..runs.checkpoint import load_model

    start, cache = run.feature_start, run.trunk_cache
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


def end_of_run_seconds(run: Run, cached: bool) -> float:
    """What :func:`final_report` should take (:func:`.budget.run_end_seconds`, from what the run measured): the
    rule's pass over its training sample (:func:`.calibration.calibration_passes`; over the trunk cache when the
    run ends with its head start, ``cached``, or none where best.pt holds the head start whose end was computed
    before the trunk trained, ``head_start_end``) and a pass over the validation photos unless best.pt's epoch kept
    its outputs (``val_outputs``). Between epochs, where best.pt holds the head start, a later epoch may replace it:
    its own end is counted too. 0 without a report."""
    from ..inference.calibration import calibration_passes, keeps_mirrors

    val = len(run.data.val)
    if not run.cfg.run.report or not val:
        return 0.0
    passes = calibration_passes(run.data.train.labels.numpy(), keeps_mirrors(run.model, cached))
    per_photo, save = run.forward_per_photo, run.save_seconds
    if cached:
        return run_end_seconds(per_photo, val, save, passes, run.cached_per_photo)
    if run.val_outputs is not None:  # best.pt's epoch kept its validation outputs
        return run_end_seconds(per_photo, passes, save)
    if run.head_start_end is not None and head_start_kept(run.history, val):  # the report's pass, or a later epoch's
        keeps = run.amp_dtype is None  # (that epoch keeps its outputs: _validate_epoch)
        return run_end_seconds(per_photo, max(val, passes) if keeps else val + passes, save)
    return run_end_seconds(per_photo, passes + val, save)


def epoch_deadline(run: Run, clock_zero: float) -> float | None:
    """When an end-to-end epoch's steps must stop (``time.perf_counter()``) for its validation, its checkpoint writes
    and the end of the run to end within the time budget, at the speeds the run last measured; None without a
    budget."""
    budget = run.cfg.optim.time_budget
    if not budget:
        return None
    passes = len(run.data.val) * (2 if run.ema is not None else 1) / run.ctx.world
    after = run.forward_per_photo * passes + run.save_seconds + end_of_run_seconds(run, False)
    return clock_zero + budget * 60 - after


def rule_at_hand(run: Run) -> bool:
    """Whether the end of the run reads the unknown rule's features from the head start (its trunk cache, or its end
    computed before the trunk trained while best.pt still holds it), not from a pass of the model over the photos."""
    return run.trunk_cache is not None or (run.head_start_end is not None
                                           and head_start_kept(run.history, len(run.data.val)))


def calibrate_head_start(run: Run) -> Calibration | None:
    """What the end of the run adds to best.pt (:func:`.calibration.calibration`) while best.pt holds a head-start
    epoch, over the head start's trunk cache before the trunk trains and the cache goes stale: seconds, where a
    pass of the end-to-end model over the photos would take half a minute or more if best.pt ends with the head
    start (:func:`attach_unknown`). None without a report."""
    from ..inference.calibration import calibration
    from ..runs.checkpoint import load_model

    if not (run.cfg.run.report and len(run.data.val) and run.ctx.main and run.trunk_cache is not None):
        return None
    model, state = load_model(run.run_dir / runs.BEST, run.device)
    return calibration(model, state, run.data.train, run.data.val, run.device, trunk_cache=run.trunk_cache)


def fit(run: Run, started: float | None = None) -> None:
    """Train the planned epochs (with a time budget, as many as end within it, the end of the run kept, the lr
    decay following the plan), after the epochs on cached trunk outputs of a new run with ``token_epochs``.
    ``started``: when the command started (``time.perf_counter()``), where the budget's clock starts (default:
    now); a resumed run's epochs count on top."""
    cfg = run.cfg
    elapsed = epoch_ends(run.history)[-1] if run.history else 0.0  # wall clock of the epochs done (resume)
    now = time.perf_counter()
    clock_zero = (now if started is None else started) - elapsed  # elapsed = now - clock_zero (all of it counted)
    estimate = train_on_tokens(run, clock_zero) if cfg.optim.token_epochs and not run.history else None
    planned = agree(plan_epochs(cfg, run.history, estimate, end_of_run_seconds(run, False),
                                time.perf_counter() - clock_zero), run.ctx)
    if run.recipe is not None and not run.recipe.end_to_end:  # the photos hold a head start, not a fine-tune
        planned = len(run.history)
    elif estimate is not None and cfg.optim.time_budget and planned == len(run.history) and run.ctx.main:
        left = cfg.optim.time_budget * 60 - (time.perf_counter() - clock_zero)
        log.info("time budget %g min: an end-to-end epoch (about %.0f s on this machine) does not fit in the %.0f s "
                 "left, the end of the run's %.0f s kept: the run ends with its head start (a larger --time-budget "
                 "trains end to end)", cfg.optim.time_budget, estimate, left, end_of_run_seconds(run, False))
    epoch = max(run.start_epoch, len(run.history))
    while epoch < planned:
        if cfg.optim.stop_after and agree(int(time.perf_counter() - now > cfg.optim.stop_after * 60), run.ctx):
            log.info("stop_after %.1f min: stopping after epoch %d of %d; continue with --resume auto",
                     cfg.optim.stop_after, epoch, planned)
            run.stopped_early = True
            return
        if run.trunk_cache is not None:  # the trunk trains from here on: its cached outputs go stale
            run.head_start_end, run.trunk_cache = calibrate_head_start(run), None
        # the lr decay ends with the last planned epoch
        run.scheduler.t_initial = max(1, (planned - run.token_epochs_done) * run.steps_per_epoch - run.warmup_steps)
        stats = train_one_epoch(run, epoch, planned, epoch_deadline(run, clock_zero))
        end_epoch(run, epoch, planned, stats, time.perf_counter() - clock_zero)
        epoch += 1
        if cfg.optim.time_budget:
            planned = agree(plan_epochs(cfg, run.history, reserve=end_of_run_seconds(run, False),
                                        now=time.perf_counter() - clock_zero), run.ctx)
    if cfg.optim.time_budget and run.ctx.main:
        log.info("time budget %g min: %d epochs, %.1f min of it so far; the end of the run should take %.0f s",
                 cfg.optim.time_budget, len(run.history), (time.perf_counter() - clock_zero) / 60,
                 end_of_run_seconds(run, rule_at_hand(run)))


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
    start = run.feature_start
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
    validation photos (:func:`.calibration.calibration`). Returns best.pt's model, its
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
    early = run.head_start_end
    head_start = early is not None and early.ckpt["epoch"] == state["epoch"]  # best.pt still holds the head start
    cached = run.trunk_cache is not None or head_start
    if early is not None and head_start:
        found = early
    else:
        seen = run.val_outputs if run.val_outputs is not None and run.val_outputs[0] == state["epoch"] else None
        found = calibration(model, state, run.data.train, run.data.val, run.device, trunk_cache=run.trunk_cache,
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
    log.info("best validation accuracy %.1f%% (epoch %d, %s weights)", 100 * run.best_acc, state["epoch"],
             state["weights"])
    if run.cfg.data.train_on_val:
        log.warning("train_on_val: the model trained on the validation photos too, so the report's figures are not "
                    "held out; score it on photos it never saw (python -m vit_flowers.evaluate --data FOLDER)")
    log.info("run folder: %s", run.run_dir)
    for name in (runs.BEST, runs.LAST, runs.CONFIG, runs.METRICS, runs.CURVES, runs.SPLIT):
        if (run.run_dir / name).exists():
            log.info("  %-12s %s", name, run.run_dir / name)
    log.info("  %-12s %s (accuracy %.1f%%)", runs.REPORT, report_dir / "report.html", 100 * metrics["accuracy"])
