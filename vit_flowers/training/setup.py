"""A run ready to train, in the order it is made (:func:`start_run`): merge a resumed run's settings, make the run
folder (a new run never in another run's: :mod:`vit_flowers.runs.folders`), load the photos, build the model, its
plan (:mod:`.plan`), optimizer, schedule, EMA and augmentation (:func:`build_run`), restore a resumed state
(:func:`restore_state`), choose the precision, and only then write config.yaml, split.json and plan.json
(:func:`record_run`): a start that fails leaves no run folder behind."""

from __future__ import annotations

import functools
import logging
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import torch
from timm.data import Mixup
from timm.optim import create_optimizer_v2
from timm.utils import ModelEmaV3
from torch import nn

from ..data.augment import IMAGENET_MEAN, IMAGENET_STD, TrainAugment
from ..data.datasets import Datasets, create_dataset
from ..data.splits import save_split
from ..inference.precision import autocast_dtype, bf16_speedup, parse_dtype, probe_key
from ..models.patch_embed import hybrid_embed
from ..models.vit import ViT, create_vit
from ..runs import folders as runs
from ..runs.checkpoint import Checkpoint, CheckpointError, latest_run, load_checkpoint, mark_latest, resolve_checkpoint
from .config import ConfigError, TrainConfig, config_defaults, load_config, save_config
from .distributed import Dist, agree, broadcast_path, set_threads
from .feature_start import FeatureStart, feature_extras, wants_feature_head
from .objectives import make_objective, restore_objective
from .optim import make_scheduler, param_groups, pretrained_trunk
from .plan import Plan, make_plan
from .pretrained import PretrainedError, load_pretrained
from .recipe import noise_margin
from .saving import plot_curves, write_metrics
from .state import Run, Steps
from .steps import seed_everything, set_trunk_batchnorm

__all__ = ["start_run", "create_model", "merge_resumed_config", "load_run_data"]

log = logging.getLogger("vit_flowers.train")

SMALL_VAL = 50  # validation photos below which the log says that best.pt is chosen on little evidence (#52)
NOT_RESUMED = ("resume", "run_name", "out_dir", "overwrite")  # keys that say where a run is, not how it trains


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


def record_run(cfg: TrainConfig, run_dir: Path, data: Datasets, plan: Plan) -> None:
    """A started run's folder (rank 0): cleared first with ``overwrite``, then config.yaml, split.json and
    plan.json; the run marked as the newest."""
    if cfg.run.overwrite:
        runs.clear_run_dir(run_dir)
    save_config(cfg, run_dir / runs.CONFIG)
    if data.split is not None:
        save_split(run_dir / runs.SPLIT, data.split)
    plan.write(run_dir)
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
    """Model, plan, optimizer, schedule, EMA, mixup, objective and augmentation for a fresh run."""
    feature_head = with_feature_head(cfg, data)
    model = create_model(cfg, len(data.classes), feature_head).to(device)
    # before the optimizer: frozen layers have no parameters to train
    set_trunk_batchnorm(model, cfg.model.backbone_bn, cfg.model.freeze_stages)
    counts = torch.bincount(data.train.labels, minlength=len(data.classes)).tolist()
    plan = make_plan(cfg, counts, list(data.classes), has_trunk=pretrained_trunk(model) is not None,
                     feature_head=feature_head[0], world=ctx.world, ema=cfg.optim.ema)
    optimizer = create_optimizer_v2(param_groups(model, cfg.optim.weight_decay, cfg.model.backbone_lr_scale), "adamw",
                                    lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                                    fused=device.type in ("cpu", "cuda"))  # the same update in one kernel
    scheduler = make_scheduler(optimizer, cfg, decay_steps=cfg.optim.epochs * plan.steps_per_epoch - plan.warmup_steps,
                               warmup_steps=plan.warmup_steps)
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
    return Run(cfg, ctx, device, run_dir, data, model, Steps(optimizer, scheduler, ema, mixup, augment, objective),
               plan)


def restore_state(run: Run, resumed: Checkpoint, resume_path: Path) -> None:
    """Put a resumed run's weights, optimizer, schedule, EMA, objective state, history, and a head start's own
    state back."""
    ts, steps = resumed["train_state"], run.steps
    assert ts is not None, resume_path  # (start_run checked)
    try:
        run.model.load_state_dict(ts["model"])
        steps.optimizer.load_state_dict(ts["optimizer"])
        steps.scheduler.load_state_dict(ts["scheduler"])
        if steps.ema is not None and ts.get("ema") is not None:
            steps.ema.module.load_state_dict(ts["ema"])
        restore_objective(steps.objective, ts.get("objective"))  # (none in a last.pt from before objectives)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # e.g. a size mismatch: another model
        raise CheckpointError(f"cannot resume {resume_path}: its training state does not fit this model "
                              f"({str(exc).strip().splitlines()[-1].strip()}). Resume without changing the "
                              f"model settings, or start a new run.") from None
    run.history = list(ts["history"])
    run.kept.best_acc = resumed["best_accuracy"] or 0.0  # (None: a hand-made file of format 1)
    run.kept.head_state, run.kept.start_kept = ts.get("head_start"), bool(ts.get("start_kept"))
    if ts.get("feature_start"):
        run.kept.feature_start = FeatureStart(**ts["feature_start"])
    if run.ctx.main:
        write_metrics(run.run_dir, run.history)  # killed between last.pt and metrics.csv: bring them up to date
        plot_curves(run.run_dir)
        log.info("resuming %s at epoch %d", resume_path, len(run.history) + 1)


def choose_precision(run: Run, resumed: str | None) -> torch.dtype | None:
    """The autocast dtype of this run: ``precision`` as configured; "auto" times a few training steps of this
    model at this batch shape in fp32 and bf16 (:mod:`vit_flowers.inference.precision`), or reads that verdict from
    this machine's cache (``precision_probe``). A resumed "auto" run keeps the choice it made when it started, and
    every rank uses rank 0's (``resumed``: the resumed run's choice)."""
    return _agreed_precision(run, run.model, run.cfg.data.image_size, train=True, what="training step",
                             resumed=resumed)


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
        run.steps.amp_dtype = choose_precision(run, (resumed["train_state"] or {}).get("amp") if resumed else None)
        run.steps.objective.setup(functools.partial(_agreed_precision, run, train=False))
        run.steps.net = wrap_for_steps(run)
    except BaseException:
        runs.remove_new_folders(made)  # a start that fails leaves no empty run folder behind
        raise
    if ctx.main:
        record_run(cfg, run_dir, data, run.plan)
        log_start(run)
    return run


def log_start(run: Run) -> None:
    """The log's lines on the model and its plan (the head start's recipe with its reason), and a warning where
    best.pt will be chosen on few validation photos."""
    cfg, plan = run.cfg, run.plan
    n_params = sum(p.numel() for p in run.model.parameters())
    log.info("model: %s, %.2fM parameters, on %s (%d threads, %s)", cfg.model.preset, n_params / 1e6, run.device,
             torch.get_num_threads(), "bf16 autocast" if run.steps.amp_dtype else "fp32")
    if plan.head_start is not None:
        log.info("recipe: %s", plan.head_start.reason)
    log.info("plan: %s", plan.describe())
    n_val = len(run.data.val)
    if plan.head_start is not None and 0 < n_val < SMALL_VAL:
        log.warning("validation: %d photos (one photo is %.1f points, the noise about +-%.0f): best.pt is chosen "
                    "on little evidence; more photos a class, or a val/ folder of your own, make it surer",
                    n_val, 100 / n_val, 100 * noise_margin(0.8, n_val))
