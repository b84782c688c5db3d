"""Typed training configuration in sections (data, model, optim, augment, distill, run): dataclass defaults,
overridden by a small YAML file in ``configs/`` and then by ``--key value`` on the command line.

The sections structure the code (``cfg.optim.lr``); each key's name is unique across them, so the command line and
YAML files stay flat (``--lr``, ``lr:``). Unknown keys and wrong types fail before any work starts, with a message that
names the key (and the file) at fault and lists the valid keys; each section checks its own ranges, the config what
ties two sections together.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from ..data.config import ConfigError, DataConfig, read_yaml, setting
from ..inference import INFERENCE_BATCH
from ..runs.checkpoint import atomic_write_text
from ..runs.folders import RUNS_HOME
from .retired import FRACTALS_REMOVED

__all__ = ["TrainConfig", "DataConfig", "ModelConfig", "OptimConfig", "AugmentConfig", "DistillConfig", "RunConfig",
           "SECTIONS", "ConfigError", "UserConfig", "LR_SCHEDULES", "config_keys", "config_defaults", "read_yaml",
           "shipped_recipe", "read_config", "load_config", "key_choices", "field_help", "add_config_arguments",
           "config_from_args", "save_config"]

LR_SCHEDULES: tuple[str, ...] = ("cosine", "linear")  # the lr decays after warmup (optim.make_scheduler)
# keys that are gone, each with the value that meant "off" (or its default, for a key that did nothing outside a
# gone feature): the config.yaml of an older run (resumed, or read back by evaluate) still holds them, and is read
# as long as it kept that value; any other value is refused
RETIRED_KEYS: dict[str, tuple[Any, str]] = {
    "drloc": (0.0, "the relative-localization loss was removed: within noise of the recipe (benchmarks/HISTORY.md)"),
    "drloc_pairs": (None, "the relative-localization loss was removed (benchmarks/HISTORY.md)"),
    "fractal_classes": (1000, FRACTALS_REMOVED),
    "fractal_train_per_class": (50, FRACTALS_REMOVED),
    "fractal_val_per_class": (2, FRACTALS_REMOVED),
    "fractal_render": ("cached", FRACTALS_REMOVED),
}
# values that are gone from a key that stays: refused with why
RETIRED_VALUES: dict[tuple[str, Any], str] = {("dataset", "fractals"): FRACTALS_REMOVED}


def _check_ranges(section: Any, positive: tuple[str, ...] = (), at_least_zero: tuple[str, ...] = (),
                  unit: tuple[str, ...] = ()) -> None:
    """Range checks that the type system cannot express (a None value: the key is off); raise ConfigError."""
    for names, bad, bounds in ((positive, lambda v: v <= 0, "positive"), (at_least_zero, lambda v: v < 0, ">= 0"),
                               (unit, lambda v: not 0.0 <= v <= 1.0, "in [0, 1]")):
        for name in names:
            value = getattr(section, name)
            if value is not None and bad(value):
                raise ConfigError(f"config key '{name}' must be {bounds}, got {value}")


@dataclass
class ModelConfig:
    preset: str = setting("vit_tiny_cpu", "the preset shape of the ViT (patch size, width, depth, heads), "
        "overridable below", key="model")
    patch_size: int | None = setting(None, "override the preset's patch size")
    dim: int | None = setting(None, "override the preset's token width")
    depth: int | None = setting(None, "override the preset's number of blocks")
    heads: int | None = setting(None, "override the preset's attention heads")
    mlp_dim: int | None = setting(None, "override the preset's MLP width")
    patch_embed: str = setting("linear", "linear (the paper's) | conv | conv_deep | cct (conv stems; patch a power "
        "of 2) | lite0 | lite1 | lite2 (hybrid: EfficientNet-Lite0/1/2 up to stride patch_size 8, 16 or 32; "
        "lite1/lite2 deeper, their weights from the imagenet-large extra)")
    pos_init: str = setting("trunc_normal", "learnable positions start as trunc_normal (std 0.02) | sincos (2-D "
        "sin-cos)")
    dropout: float = setting(0.0, "dropout inside attention and MLP")
    drop_path: float = setting(0.1, "stochastic depth of the last block")
    pretrained: str | None = setting(None, "start from: imagenet (the lite0/1/2 hybrid's CNN, from a registry "
        "package) | a local .pt/.pth/.safetensors file | a timm ViT name")
    backbone_lr_scale: float = setting(1.0, "the hybrid's pretrained CNN stages learn at this times lr (new parts "
        "at lr)")
    backbone_bn: str = setting("train", "the hybrid's BatchNorm layers: train (batch statistics) | frozen_stats "
        "(ImageNet's running statistics kept, scale and shift learned) | frozen (both kept)")
    pretrained_heads: int | None = setting(None, "heads of that model when a bare state dict is given")
    feature_head: str = setting("auto", "a hybrid cut at stride 32 also classifies its pooled ImageNet features "
        "(the frozen-feature recipe, models/feature_head.py), started as that recipe's logistic regression with the "
        "encoder learning on top (training/feature_start.py): auto (where a run ends with its head start: fewer "
        "than end_to_end_min_per_class photos in a class) | on | off")
    feature_extras: str = setting("auto", "other EfficientNet-Lites whose whole networks add their pooled features "
        "to the feature head's, on the same photos: auto (lite2 where the folder has at most 1,000 photos and its "
        "package is installed: a second pass over few photos costs seconds) | none | lite1 | lite2 | lite1+lite2")
    freeze_stages: int = setting(0, "the hybrid's stem and first N pretrained stages stay as ImageNet made them in "
        "the end-to-end epochs: run forward only, no activations kept, no gradients (a cheaper step; 0 = all learn)")

    @property
    def hybrid(self) -> bool:
        """A CNN trunk (EfficientNet-Lite stages) as the patch embedding."""
        from ..models.patch_embed import HYBRID_EMBEDS

        return self.patch_embed in HYBRID_EMBEDS

    def validate(self) -> None:
        _check_ranges(self, positive=("patch_size", "dim", "depth", "heads", "mlp_dim", "backbone_lr_scale"),
                      at_least_zero=("freeze_stages",), unit=("dropout",))
        if not 0.0 <= self.drop_path < 1.0:
            raise ConfigError(f"config key 'drop_path' must be in [0, 1), got {self.drop_path}")
        from ..models.patch_embed import HYBRID_EMBEDS

        hybrids = " | ".join(HYBRID_EMBEDS)
        if self.pretrained == "imagenet" and not self.hybrid:
            raise ConfigError(f"config key 'pretrained': imagenet weights fill a hybrid patch embedding; set "
                              f"patch_embed to {hybrids} (got {self.patch_embed!r}), e.g. "
                              f"--config configs/flowers5-imagenet.yaml")
        if self.backbone_bn != "train" and not self.hybrid:
            raise ConfigError(f"config key 'backbone_bn' ({self.backbone_bn!r}) applies to a hybrid patch embedding's "
                              f"BatchNorm layers; patch_embed {self.patch_embed!r} has none")
        if self.feature_head == "on" and not (self.hybrid and self.patch_size == 32):
            raise ConfigError(f"config key 'feature_head' (on) reads a hybrid's trunk cut at its last stage: set "
                              f"patch_embed to {hybrids} and patch_size to 32 (got {self.patch_embed!r}, "
                              f"{self.patch_size})")
        if self.freeze_stages and not self.hybrid:
            raise ConfigError(f"config key 'freeze_stages' ({self.freeze_stages}) applies to a hybrid patch "
                              f"embedding's pretrained stages; patch_embed {self.patch_embed!r} has none")

    def kwargs(self, image_size: int) -> dict[str, Any]:
        """Keyword arguments for :func:`vit_flowers.models.vit.create_vit` beyond the preset."""
        kw: dict[str, Any] = {k: getattr(self, k) for k in ("patch_size", "dim", "depth", "heads", "mlp_dim")
                              if getattr(self, k) is not None}
        return {**kw, "image_size": image_size, "dropout": self.dropout, "drop_path": self.drop_path,
                "patch_embed": self.patch_embed, "pos_init": self.pos_init}


@dataclass
class OptimConfig:
    epochs: int = setting(25, "training epochs (the most epochs when time_budget is set)")
    time_budget: float = setting(0.0, "minutes of the whole command (setting up, training, the end of the run's "
        "rule and report); > 0 fits the epochs to it (budget.py); 0 = no limit: every epoch runs")
    token_epochs: int = setting(0, "a hybrid's head start: epochs of its new parts (projection, encoder, head) on "
        "its frozen trunk's outputs, computed once per photo, before the end-to-end epochs (0 = off; "
        "token_cache.py); a time budget decides how many of either fit")
    token_lr: float = setting(1e-3, "peak AdamW learning rate of those epochs")
    head_start_steps: int = setting(200, "about how many optimizer steps the head start takes: a small folder "
        "passes over its cached trunk outputs several times an epoch, so that it converges on 50 photos as on 3,000 "
        "(recipe.py)")
    end_to_end_min_per_class: int = setting(200, "end-to-end epochs follow a head start only when every class has "
        "at least this many training photos; below, the run ends with its head start (0 = always; recipe.py)")
    stop_after: float = setting(0.0, "minutes: this process stops at the first epoch end past it (a chunk of a "
        "long run; --resume continues on the same schedule); 0 = run to the end")
    batch_size: int = setting(64, "images per step (per process with torchrun)")
    micro_batch: int = setting(0, "images per forward/backward pass, their gradients summed into the step's (0 = "
        "the whole batch): the same update with a fraction of the activations' memory (a BatchNorm in train mode "
        "sees the smaller batches)")
    lr: float = setting(1e-3, "peak AdamW learning rate")
    min_lr: float = setting(1e-5, "learning rate at the end of the decay")
    lr_schedule: str = setting("cosine", "decay after warmup, ending with the last planned epoch: cosine | linear")
    weight_decay: float = setting(0.05, "AdamW weight decay (not on norms, biases, positions, CLS)")
    warmup_epochs: float = setting(2.0, "epochs of linear warmup from 1% of lr up to lr")
    label_smoothing: float = setting(0.1, "cross-entropy label smoothing (when mixup is off)")
    clip_grad: float | None = setting(1.0, "gradient norm clip (None = off)")
    ema: bool = setting(True, "keep an exponential moving average of the weights (timm ModelEmaV3)")
    ema_decay: float = setting(0.998, "EMA decay per step")

    def validate(self) -> None:
        _check_ranges(self, positive=("epochs", "batch_size", "lr", "token_lr", "ema_decay"),
                      at_least_zero=("min_lr", "weight_decay", "warmup_epochs", "time_budget", "stop_after",
                                     "token_epochs", "micro_batch", "head_start_steps",
                                     "end_to_end_min_per_class"),
                      unit=("label_smoothing",))
        if self.ema_decay >= 1.0:
            raise ConfigError(f"config key 'ema_decay' must be below 1, got {self.ema_decay}")


@dataclass
class AugmentConfig:
    policy: str = setting("trivial", "automatic augmentation per image: none, randaugment or trivial "
        "(TrivialAugmentWide)", key="augment")
    randaug_num_ops: int = setting(2, "RandAugment: operations per image")
    randaug_magnitude: int = setting(9, "RandAugment: strength of each operation (0 to 30)")
    crop_scale_min: float = setting(0.35, "RandomResizedCrop: smallest area share")
    random_erasing: float = setting(0.0, "probability of random erasing per image")
    mixup: float = setting(0.0, "mixup alpha (0 = off)")
    cutmix: float = setting(0.0, "CutMix alpha (0 = off)")
    mixup_prob: float = setting(1.0, "probability of applying mixup or CutMix to a batch")

    def validate(self) -> None:
        _check_ranges(self, at_least_zero=("mixup", "cutmix"), unit=("random_erasing", "mixup_prob"))
        if not 0.0 < self.crop_scale_min <= 1.0:
            raise ConfigError(f"config key 'crop_scale_min' must be in (0, 1], got {self.crop_scale_min}")


@dataclass
class DistillConfig:
    teacher: str | None = setting(None, "a trained run folder or checkpoint (e.g. the hybrid's) whose predictions "
        "on each batch's views teach this model (None = no distillation; training/distill.py)")
    distill_weight: float = setting(1.0, "with a teacher, the loss is this share KL to its predictions, the rest "
        "cross-entropy to the labels (1 = the teacher alone, as in function matching)")
    distill_temperature: float = setting(1.0, "softmax temperature of both sides of that KL")

    def validate(self) -> None:
        _check_ranges(self, positive=("distill_temperature",), unit=("distill_weight",))


@dataclass
class RunConfig:
    seed: int = setting(0, "seed of the weights, the batch order and the augmentations")
    deterministic: bool = setting(False, "deterministic algorithms (bit-exact resume on CPU)")
    device: str = setting("auto", "where to train: auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    threads: int = setting(0, "torch intra-op threads (0 = all cores of this machine)")
    precision: str = setting("auto", "fp32, bf16 autocast, or auto: bf16 where a timed probe finds it faster "
        "(precision.py)")
    precision_probe: str = setting("cached", "precision auto's probe: cached (this machine's verdict for this model "
        "shape, from $XDG_CACHE_HOME/vit_flowers/precision.json, ~/.cache/... by default; timed once and kept "
        "there), or fresh (timed again, and kept)")
    compile: bool = setting(False, "torch.compile the model (about a minute of compile time; pays off on long "
        "runs)")
    eval_batch_size: int = setting(INFERENCE_BATCH, "photos the model runs on at once when it only predicts: "
        "validation, the head start's trunk pass, the report (the memory it takes: vit_flowers/inference)")
    out_dir: str = setting(RUNS_HOME, "runs are written to out_dir/run_name")
    run_name: str | None = setting(None, "the run folder's name (none: <dataset>-<date>-<time>, -2, -3, ... when "
        "taken)")
    resume: str | None = setting(None, "a checkpoint / run folder, or \"auto\" for the newest run")
    overwrite: bool = setting(False, "a new run may replace the run in out_dir/run_name: its whole folder is "
        "deleted first (without it an existing run is refused: vit_flowers/runs/folders.py)")
    progress: bool = setting(True, "progress bars (on a terminal only)")
    report: bool = setting(True, "write the evaluation report of best.pt at the end")

    def validate(self) -> None:
        _check_ranges(self, positive=("eval_batch_size",), at_least_zero=("threads",))
        if self.overwrite and self.resume:
            raise ConfigError("config keys 'overwrite' and 'resume' contradict each other: --overwrite deletes the "
                              "run folder to start afresh, --resume continues the run in it; give one of them")


# The sections, in the order --help and a run's config.yaml list them. A key's name is its field's (or its
# metadata "key"), unique across sections: the command line and YAML files stay flat (--lr, lr:).
SECTIONS: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig,
                             "augment": AugmentConfig, "distill": DistillConfig, "run": RunConfig}


@dataclass
class TrainConfig:
    """A training run's settings in sections; each section checks its own keys, :meth:`validate` what ties two
    together."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)  # which images, split and cached how
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)  # the network and its starting weights
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)  # epochs, clock, optimiser, EMA
    augment: AugmentConfig = dataclasses.field(default_factory=AugmentConfig)  # what each training view goes through
    distill: DistillConfig = dataclasses.field(default_factory=DistillConfig)  # a teacher's predictions as targets
    run: RunConfig = dataclasses.field(default_factory=RunConfig)  # where it is written, seed, device, precision

    def validate(self) -> None:
        """Each section's checks, then the choices and the rules across sections; raise ConfigError."""
        for key, choices in key_choices().items():
            if self.get(key) not in choices:
                raise ConfigError(f"config key '{key}' must be one of {', '.join(choices)}; got {self.get(key)!r}")
        try:
            self.data.validate()
        except ValueError as exc:
            raise ConfigError(f"config key {exc}") from None
        for section in (self.model, self.optim, self.augment, self.distill, self.run):
            section.validate()
        shape = self._check_shape()
        if self.model.freeze_stages and self.model.hybrid:  # the trunk's stage count, before any photo is read
            from ..models.efficientnet import check_frozen_stages

            try:
                check_frozen_stages(self.model.freeze_stages, shape["patch_embed"], shape["patch_size"])
            except ValueError as exc:
                raise ConfigError(f"config key 'freeze_stages': {exc}") from None
        if self.optim.token_epochs and not self.model.hybrid:
            from ..models.patch_embed import HYBRID_EMBEDS

            raise ConfigError(f"config key 'token_epochs' trains on a hybrid's frozen trunk outputs; patch_embed "
                              f"{self.model.patch_embed!r} has no pretrained trunk: set token_epochs 0 or patch_embed "
                              f"to {' | '.join(HYBRID_EMBEDS)}")

    def _check_shape(self) -> dict[str, Any]:
        """The model's shape (its preset with the config's overrides), checked."""
        from ..models.vit import PRESETS, check_shape

        shape = {**PRESETS[self.model.preset], **self.model_kwargs()}
        try:
            check_shape(**{k: shape[k] for k in ("image_size", "patch_size", "dim", "depth", "heads", "mlp_dim",
                                                 "patch_embed", "pos_init")})
        except ValueError as exc:
            keys = "model/image_size/patch_size/dim/heads/patch_embed/pos_init"
            raise ConfigError(f"config keys {keys}: {exc}") from None
        return shape

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`vit_flowers.models.vit.create_vit` beyond the preset."""
        return self.model.kwargs(self.data.image_size)

    def get(self, key: str) -> Any:
        """The value of the flat key ``key`` (its name on the command line and in YAML files)."""
        section, name = config_keys()[key][:2]
        return getattr(getattr(self, section), name)

    def flat(self) -> dict[str, Any]:
        """Every key and its value, flat: what a run's config.yaml and its checkpoints hold, and what
        :func:`load_config` reads back."""
        return {key: self.get(key) for key in config_keys()}


@functools.cache
def config_keys() -> dict[str, tuple[str, str, Any]]:
    """Each flat key: (its section, its field's name there, its type annotation), in the sections' order."""
    keys: dict[str, tuple[str, str, Any]] = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            keys[f.metadata.get("key") or f.name] = (section, f.name, hints[f.name])
    return keys


def config_defaults() -> dict[str, Any]:
    """TrainConfig's defaults, flat."""
    return TrainConfig().flat()


def _coerce(key: str, value: Any, annotation: Any, where: str) -> Any:
    """Check (and gently convert) one value against its annotation."""
    args = typing.get_args(annotation)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), annotation) if args else annotation
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and optional):
        if optional:
            return None
        raise ConfigError(f"{where}: key '{key}' may not be empty (expected {base.__name__})")
    if isinstance(value, str) and base is not str:
        text = value.strip().lower()
        try:
            if base is bool:
                if text not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError
                value = text in ("true", "1", "yes", "on")
            else:
                value = base(value)
        except ValueError:
            raise ConfigError(f"{where}: key '{key}' expects {base.__name__}, got {value!r}") from None
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, base) or (base is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: key '{key}' expects {base.__name__}, got {type(value).__name__} {value!r}")
    if base is float and not math.isfinite(value):  # nan passes every range check; inf overflows a plan
        raise ConfigError(f"{where}: key '{key}' must be a finite number, got {value}")
    return value


def _apply(cfg: TrainConfig, values: dict[str, Any], where: str) -> set[str]:
    """Set each flat ``key: value`` of ``values`` in its section, checked; the keys set (retired ones left out)."""
    keys, applied = config_keys(), set()
    for key, value in values.items():
        if key in RETIRED_KEYS:
            off, why = RETIRED_KEYS[key]
            if off is None or value in (off, None):
                continue
            raise ConfigError(f"{where}: key '{key}' is no longer a setting ({why}); remove it")
        if isinstance(value, str) and (key, value) in RETIRED_VALUES:
            raise ConfigError(f"{where}: {key} {value!r} is no longer available ({RETIRED_VALUES[key, value]})")
        if key not in keys:
            close = difflib.get_close_matches(str(key), keys, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}: unknown key '{key}'{hint}. Valid keys: {', '.join(keys)}")
        section, name, annotation = keys[key]
        setattr(getattr(cfg, section), name, _coerce(key, value, annotation, where))
        applied.add(key)
    return applied


# The recipe that `train --data PHOTOS` trains without --config (train.PHOTO_DEFAULTS; the web app's Train tab
# offers up to its time budget).
PHOTO_RECIPE = "flowers5-imagenet.yaml"


def shipped_recipe(name: str) -> dict[str, Any]:
    """The recipe ``configs/<name>`` as a mapping. The project's configs/ folder ships inside the package as
    ``vit_flowers.configs`` (pyproject.toml), so a command's own defaults live there once, readable and runnable
    with ``--config``, and an installed package finds them without the checkout."""
    return read_yaml(resources.files("vit_flowers.configs") / name)


class UserConfig(NamedTuple):
    """A config and the keys that the user set: in the YAML file or on the command line, whatever their value (on
    ``--resume`` exactly these replace the resumed run's settings)."""

    cfg: TrainConfig
    given: frozenset[str]


def read_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                base: dict[str, Any] | None = None) -> UserConfig:
    """Defaults (``base`` on top of the dataclasses': a command's own defaults), then the YAML file at ``path``,
    then ``overrides``; validated, with the keys that the file and ``overrides`` set."""
    cfg = TrainConfig()
    given: set[str] = set()
    if base:
        _apply(cfg, base, "defaults")
    if path is not None:
        given |= _apply(cfg, read_yaml(Path(path)), str(path))
    if overrides:
        given |= _apply(cfg, overrides, "command line")
    if cfg.data.infer_dataset():  # --data PATH alone means "train on this folder"
        given.add("dataset")
    if cfg.model.pretrained not in (None, "imagenet"):
        _take_pretrained_shape(cfg, frozenset(given))
    cfg.validate()
    return UserConfig(cfg, frozenset(given))


# keys that only a hybrid's pretrained trunk takes: back to their defaults when fine-tuning weights that have none
HYBRID_ONLY_KEYS = ("backbone_bn", "freeze_stages", "token_epochs")


def _take_pretrained_shape(cfg: TrainConfig, given: frozenset[str]) -> None:
    """A fine-tune's model is its weights' (:func:`vit_flowers.training.pretrained.pretrained_shape`): each shape
    key that the user left out is taken from them, one set otherwise is refused; weights without a hybrid's trunk
    put the hybrid-only keys the user left out back to their defaults. So ``--data PHOTOS --pretrained RUN/best.pt``
    (a command's defaults train a hybrid) fine-tunes whatever RUN trained, and config.yaml says what it is. With
    every shape key set (a run's own config.yaml, read back) the weights are not read."""
    from .pretrained import SHAPE_KEYS, PretrainedError, pretrained_shape

    if given.issuperset(SHAPE_KEYS):
        return
    try:
        shape = pretrained_shape(str(cfg.model.pretrained))
    except PretrainedError as exc:
        raise ConfigError(str(exc)) from None
    for key, value in shape.items():
        if key in given and cfg.get(key) != value:
            raise ConfigError(f"config key '{key}' ({cfg.get(key)!r}) differs from the pretrained weights' "
                              f"({value!r}): {cfg.model.pretrained} brings its own {key}; leave it out")
    _apply(cfg, shape, f"pretrained {cfg.model.pretrained}")
    if not cfg.model.hybrid:
        typed = config_defaults()
        _apply(cfg, {k: typed[k] for k in HYBRID_ONLY_KEYS if k not in given}, "defaults")


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                base: dict[str, Any] | None = None) -> TrainConfig:
    """The config of :func:`read_config`, for callers that need not know which keys were given."""
    return read_config(path, overrides, base).cfg


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    """A run's config.yaml: every key, flat (as ``--config`` reads it), each section under a comment."""
    flat = cfg.flat()
    blocks = []
    for section in SECTIONS:
        keys = {k: flat[k] for k, (s, _, _) in config_keys().items() if s == section}
        blocks.append(f"# ---- {section}\n" + yaml.safe_dump(keys, sort_keys=False))
    atomic_write_text(Path(path), "".join(blocks))


def key_choices() -> dict[str, tuple[str, ...]]:
    """The keys whose value is one of a fixed set, and that set: what :meth:`TrainConfig.validate` checks and
    ``--help`` lists (each tuple lives with the code that uses it; imported here, when asked for)."""
    from ..data.augment import AUTO_AUGMENTS
    from ..data.datasets import dataset_names
    from ..inference import PROBE_MODES
    from ..inference.precision import PRECISIONS
    from ..models.efficientnet import BATCHNORM_MODES
    from ..models.patch_embed import PATCH_EMBEDS
    from ..models.vit import POS_INITS, PRESETS
    from .feature_start import FEATURE_EXTRAS, FEATURE_HEADS

    return {"dataset": dataset_names(), "model": tuple(sorted(PRESETS)),
            "patch_embed": PATCH_EMBEDS, "pos_init": POS_INITS, "lr_schedule": LR_SCHEDULES,
            "augment": AUTO_AUGMENTS, "precision": PRECISIONS, "precision_probe": PROBE_MODES,
            "backbone_bn": BATCHNORM_MODES, "feature_head": FEATURE_HEADS, "feature_extras": FEATURE_EXTRAS}


def field_help() -> dict[str, str]:
    """Each key's help text (its field's ``metadata["help"]``, the one home of what the key means)."""
    return {key: _field(section, name).metadata.get("help", "") for key, (section, name, _) in config_keys().items()}


def _field(section: str, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(SECTIONS[section]) if f.name == name)


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def add_config_arguments(parser: argparse.ArgumentParser, defaults: dict[str, Any] | None = None) -> None:
    """One ``--key`` option per config key, grouped by section, its help the field's help text with its choices and
    default (the command's own ``defaults`` over TrainConfig's); values are parsed, checked and reported by
    :func:`read_config`, for the command line and YAML files alike."""
    comments, choices, typed = field_help(), key_choices(), config_defaults()
    groups = {section: parser.add_argument_group(f"{section} settings") for section in SECTIONS}
    for key, (section, _, annotation) in config_keys().items():
        base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
        kind = getattr(base, "__name__", str(base))
        flag = "--" + key.replace("_", "-")
        default = _shown((defaults or {}).get(key, typed[key]))
        if base is bool:
            default += f"; {flag} false turns it off" if default == "true" else f"; {flag} alone turns it on"
        text = f"{comments[key]} (default: {default})".replace("%", "%%")  # argparse's % format
        metavar = "{" + ",".join(choices[key]) + "}" if key in choices else "BOOL" if base is bool else kind.upper()
        if base is bool:  # --flag alone means true
            groups[section].add_argument(flag, dest=key, default=None, metavar=metavar, help=text, nargs="?",
                                         const="true")
        else:
            groups[section].add_argument(flag, dest=key, default=None, metavar=metavar, help=text)


def config_from_args(args: argparse.Namespace, base: dict[str, Any] | None = None) -> UserConfig:
    """The config that parsed ``--config FILE --key value ...`` options describe, over ``base`` defaults, and the
    keys they set."""
    overrides = {k: v for k, v in vars(args).items() if k in config_keys() and v is not None}
    return read_config(getattr(args, "config", None), overrides, base)
