"""Typed training configuration: dataclass defaults, overridden by a small YAML file
in ``configs/`` and then by ``--key value`` on the command line.

Unknown keys and wrong types fail before any work starts, with a message that names
the key (and the file) at fault and lists the valid keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # importlib.resources.abc is Python 3.11's; only the annotation needs it
    from importlib.resources.abc import Traversable

__all__ = ["TrainConfig", "ConfigError", "LR_SCHEDULES", "read_yaml", "shipped_recipe", "load_config", "key_choices",
           "field_help", "add_config_arguments", "config_from_args", "save_config"]

LR_SCHEDULES: tuple[str, ...] = ("cosine", "linear")  # the lr decays after warmup (trainer.make_scheduler)
FRACTALS_REMOVED = ("the fractal start was removed on 2026-12-04: it trailed training from scratch on "
                    "full-resolution photos, 79.5% against 81.8% (benchmarks/README.md)")
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


class ConfigError(ValueError):
    """A configuration problem, with a message meant for the user."""


def _setting(default: Any, help: str) -> Any:
    """A config field: its default and its help text (what ``--help`` says of the key)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    # ---- data
    dataset: str = _setting("synthetic", "the images: synthetic (built in), folder (--data PATH, which alone means "
        "folder), flowers102 or flower_photos (downloaded)")
    data: str | None = _setting(None, "a folder of photos in the ImageFolder layout")
    data_root: str = _setting("data", "where flowers102 / flower_photos are downloaded")
    download: bool = _setting(True, "allow downloading flowers102 / flower_photos when absent")
    val_fraction: float = _setting(0.2, "held-out share when a folder has no val/ split")
    split_seed: int = _setting(0, "seed of that stratified split (kept in the run's split.json)")
    train_on_val: bool = _setting(False, "train on the val photos too (a final model: best.pt is then the last "
        "epoch's weights, EMA's when ema is on, and the val figures are of trained-on photos)")
    synthetic_train_per_class: int = _setting(500, "synthetic set: training images per class")
    synthetic_val_per_class: int = _setting(100, "synthetic set: validation images per class")
    image_size: int = _setting(64, "model input size in pixels")
    cache_size: int = _setting(72, "training images are cached at this size, then randomly cropped to image_size")
    # ---- model
    model: str = _setting("vit_tiny_cpu", "the preset shape of the ViT (patch size, width, depth, heads), "
        "overridable below")
    patch_size: int | None = _setting(None, "override the preset's patch size")
    dim: int | None = _setting(None, "override the preset's token width")
    depth: int | None = _setting(None, "override the preset's number of blocks")
    heads: int | None = _setting(None, "override the preset's attention heads")
    mlp_dim: int | None = _setting(None, "override the preset's MLP width")
    patch_embed: str = _setting("linear", "linear (the paper's) | conv | conv_deep | cct (conv stems; patch a power "
        "of 2) | lite0 | lite1 | lite2 (hybrid: EfficientNet-Lite0/1/2 up to stride patch_size 8, 16 or 32; "
        "lite1/lite2 deeper, their weights from the imagenet-large extra)")
    pos_init: str = _setting("trunc_normal", "learnable positions start as trunc_normal (std 0.02) | sincos (2-D "
        "sin-cos)")
    dropout: float = _setting(0.0, "dropout inside attention and MLP")
    drop_path: float = _setting(0.1, "stochastic depth of the last block")
    pretrained: str | None = _setting(None, "start from: imagenet (the lite0/1/2 hybrid's CNN, from a registry "
        "package) | a local .pt/.pth/.safetensors file | a timm ViT name")
    backbone_lr_scale: float = _setting(1.0, "the hybrid's pretrained CNN stages learn at this times lr (new parts "
        "at lr)")
    backbone_bn: str = _setting("train", "the hybrid's BatchNorm layers: train (batch statistics) | frozen_stats "
        "(ImageNet's running statistics kept, scale and shift learned) | frozen (both kept)")
    pretrained_heads: int | None = _setting(None, "heads of that model when a bare state dict is given")
    # ---- optimisation
    epochs: int = _setting(25, "training epochs (the most epochs when time_budget is set)")
    time_budget: float = _setting(0.0, "minutes of training wall clock (validation included); > 0 fits the epochs "
        "to it")
    token_epochs: int = _setting(0, "a hybrid's head start: epochs of its new parts (projection, encoder, head) on "
        "its frozen trunk's outputs, computed once per photo, before the end-to-end epochs (0 = off; "
        "token_cache.py); a time budget decides how many of either fit")
    token_lr: float = _setting(1e-3, "peak AdamW learning rate of those epochs")
    stop_after: float = _setting(0.0, "minutes: this process stops at the first epoch end past it (a chunk of a "
        "long run; --resume continues on the same schedule); 0 = run to the end")
    batch_size: int = _setting(64, "images per step (per process with torchrun)")
    micro_batch: int = _setting(0, "images per forward/backward pass, their gradients summed into the step's (0 = "
        "the whole batch): the same update with a fraction of the activations' memory (a BatchNorm in train mode "
        "sees the smaller batches)")
    lr: float = _setting(1e-3, "peak AdamW learning rate")
    min_lr: float = _setting(1e-5, "learning rate at the end of the decay")
    lr_schedule: str = _setting("cosine", "decay after warmup, ending with the last planned epoch: cosine | linear")
    weight_decay: float = _setting(0.05, "AdamW weight decay (not on norms, biases, positions, CLS)")
    warmup_epochs: float = _setting(2.0, "epochs of linear warmup from 1% of lr up to lr")
    label_smoothing: float = _setting(0.1, "cross-entropy label smoothing (when mixup is off)")
    clip_grad: float | None = _setting(1.0, "gradient norm clip (None = off)")
    augment: str = _setting("trivial", "automatic augmentation per image: none, randaugment or trivial "
        "(TrivialAugmentWide)")
    randaug_num_ops: int = _setting(2, "RandAugment: operations per image")
    randaug_magnitude: int = _setting(9, "RandAugment: strength of each operation (0 to 30)")
    crop_scale_min: float = _setting(0.35, "RandomResizedCrop: smallest area share")
    random_erasing: float = _setting(0.0, "probability of random erasing per image")
    mixup: float = _setting(0.0, "mixup alpha (0 = off)")
    cutmix: float = _setting(0.0, "CutMix alpha (0 = off)")
    mixup_prob: float = _setting(1.0, "probability of applying mixup or CutMix to a batch")
    ema: bool = _setting(True, "keep an exponential moving average of the weights (timm ModelEmaV3)")
    ema_decay: float = _setting(0.998, "EMA decay per step")
    # ---- distillation (vit_flowers/training/distill.py)
    teacher: str | None = _setting(None, "a trained run folder or checkpoint (e.g. the hybrid's) whose predictions "
        "on each batch's views teach this model (None = no distillation)")
    distill_weight: float = _setting(1.0, "with a teacher, the loss is this share KL to its predictions, the rest "
        "cross-entropy to the labels (1 = the teacher alone, as in function matching)")
    distill_temperature: float = _setting(1.0, "softmax temperature of both sides of that KL")
    # ---- run
    seed: int = _setting(0, "seed of the weights, the batch order and the augmentations")
    deterministic: bool = _setting(False, "deterministic algorithms (bit-exact resume on CPU)")
    device: str = _setting("auto", "where to train: auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    threads: int = _setting(0, "torch intra-op threads (0 = all cores of this machine)")
    precision: str = _setting("auto", "fp32, bf16 autocast, or auto: bf16 where a timed probe finds it faster "
        "(precision.py)")
    compile: bool = _setting(False, "torch.compile the model (about a minute of compile time; pays off on long "
        "runs)")
    eval_batch_size: int = _setting(256, "batch size for validation")
    out_dir: str = _setting("checkpoints", "runs are written to out_dir/run_name")
    run_name: str | None = _setting(None, "the run folder's name (none: <dataset>-<date>-<time>, -2, -3, ... when "
        "taken)")
    resume: str | None = _setting(None, "a checkpoint / run folder, or \"auto\"for the newest run")
    overwrite: bool = _setting(False, "a new run may replace the run in out_dir/run_name: its whole folder is "
        "deleted first (without it an existing run is refused: vit_flowers/runs/folders.py)")
    progress: bool = _setting(True, "progress bars (on a terminal only)")
    report: bool = _setting(True, "write the evaluation report of best.pt at the end")

    def validate(self) -> None:
        """Range checks that the type system cannot express; raise ConfigError."""
        positive = ["image_size", "cache_size", "epochs", "batch_size", "eval_batch_size",
                    "synthetic_train_per_class", "synthetic_val_per_class"]
        positive += [k for k in ("patch_size", "dim", "depth", "heads", "mlp_dim") if getattr(self, k) is not None]
        for key in positive:
            if getattr(self, key) <= 0:
                raise ConfigError(f"config key '{key}' must be positive, got {getattr(self, key)}")
        for key in ("lr", "ema_decay", "backbone_lr_scale", "distill_temperature", "token_lr"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"config key '{key}' must be positive, got {getattr(self, key)}")
        for key in ("min_lr", "weight_decay", "warmup_epochs", "label_smoothing", "mixup", "cutmix", "threads",
                    "time_budget", "stop_after", "token_epochs", "micro_batch"):
            if getattr(self, key) < 0:
                raise ConfigError(f"config key '{key}' must be >= 0, got {getattr(self, key)}")
        for key in ("dropout", "drop_path", "random_erasing", "mixup_prob", "label_smoothing", "distill_weight"):
            if not 0.0 <= getattr(self, key) <= 1.0 or (key == "drop_path" and self.drop_path >= 1.0):
                bounds = "[0, 1)" if key == "drop_path" else "[0, 1]"
                raise ConfigError(f"config key '{key}' must be in {bounds}, got {getattr(self, key)}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"config key 'val_fraction' must be between 0 and 1, got {self.val_fraction}")
        if not 0.0 < self.crop_scale_min <= 1.0:
            raise ConfigError(f"config key 'crop_scale_min' must be in (0, 1], got {self.crop_scale_min}")
        if self.ema_decay >= 1.0:
            raise ConfigError(f"config key 'ema_decay' must be below 1, got {self.ema_decay}")
        if self.overwrite and self.resume:
            raise ConfigError("config keys 'overwrite' and 'resume' contradict each other: --overwrite deletes the "
                              "run folder to start afresh, --resume continues the run in it; give one of them")
        self._check_choices()
        self._check_model()

    def _check_choices(self) -> None:
        for key, choices in key_choices().items():
            if getattr(self, key) not in choices:
                raise ConfigError(f"config key '{key}' must be one of {', '.join(choices)}; got {getattr(self, key)!r}")
        from ..data.datasets import check_options

        try:
            check_options(self.dataset, image_size=self.image_size, cache_size=self.cache_size,
                          train_on_val=self.train_on_val)
        except ValueError as exc:
            raise ConfigError(f"config key {exc}") from None
        if self.dataset == "folder" and not self.data:
            raise ConfigError("dataset 'folder' needs 'data': the path of a folder of photos (--data PATH)")

    def _check_model(self) -> None:
        from ..models.vit import PRESETS, check_shape

        shape = {**PRESETS[self.model], **self.model_kwargs()}
        try:
            check_shape(**{k: shape[k] for k in ("image_size", "patch_size", "dim", "depth", "heads", "mlp_dim",
                                                 "patch_embed", "pos_init")})
        except ValueError as exc:
            keys = "model/image_size/patch_size/dim/heads/patch_embed/pos_init"
            raise ConfigError(f"config keys {keys}: {exc}") from None
        from ..models.patch_embed import HYBRID_EMBEDS

        if self.pretrained == "imagenet" and self.patch_embed not in HYBRID_EMBEDS:
            raise ConfigError(f"config key 'pretrained': imagenet weights fill a hybrid patch embedding; set "
                              f"patch_embed to {' | '.join(HYBRID_EMBEDS)} (got {self.patch_embed!r}), e.g. "
                              f"--config configs/flowers5-imagenet.yaml")
        if self.token_epochs and self.patch_embed not in HYBRID_EMBEDS:
            raise ConfigError(f"config key 'token_epochs' trains on a hybrid's frozen trunk outputs; patch_embed "
                              f"{self.patch_embed!r} has no pretrained trunk: set token_epochs 0 or patch_embed "
                              f"to {' | '.join(HYBRID_EMBEDS)}")
        if self.backbone_bn != "train" and self.patch_embed not in HYBRID_EMBEDS:
            raise ConfigError(f"config key 'backbone_bn' ({self.backbone_bn!r}) applies to a hybrid patch embedding's "
                              f"BatchNorm layers; patch_embed {self.patch_embed!r} has none")
        if self.pretrained not in (None, "imagenet") and self.patch_embed != "linear":
            raise ConfigError("config key 'patch_embed' cannot be set when fine-tuning 'pretrained' weights: they "
                              "bring their own patch embedding")

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`vit_flowers.models.vit.create_vit` beyond the preset."""
        kw: dict[str, Any] = {k: getattr(self, k) for k in ("patch_size", "dim", "depth", "heads", "mlp_dim")
                              if getattr(self, k) is not None}
        return {**kw, "image_size": self.image_size, "dropout": self.dropout, "drop_path": self.drop_path,
                "patch_embed": self.patch_embed, "pos_init": self.pos_init}


def _field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig)}


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
    return value


def _apply(cfg: TrainConfig, values: dict[str, Any], where: str) -> None:
    types_ = _field_types()
    for key, value in values.items():
        if key in RETIRED_KEYS:
            off, why = RETIRED_KEYS[key]
            if off is None or value in (off, None):
                continue
            raise ConfigError(f"{where}: key '{key}' is no longer a setting ({why}); remove it")
        if isinstance(value, str) and (key, value) in RETIRED_VALUES:
            raise ConfigError(f"{where}: {key} {value!r} is no longer available ({RETIRED_VALUES[key, value]})")
        if key not in types_:
            close = difflib.get_close_matches(str(key), types_, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}: unknown key '{key}'{hint}. Valid keys: {', '.join(types_)}")
        setattr(cfg, key, _coerce(key, value, types_[key], where))


def read_yaml(path: Path | Traversable) -> dict[str, Any]:
    """The ``key: value`` mapping of the YAML file at ``path`` (a config file, or a recipe shipped in the package),
    with an error naming the file when it is missing, not YAML or not a mapping."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of key: value, got {type(values).__name__}")
    return values


def shipped_recipe(name: str) -> dict[str, Any]:
    """The recipe ``configs/<name>`` as a mapping. The project's configs/ folder ships inside the package as
    ``vit_flowers.configs`` (pyproject.toml), so a command's own defaults live there once, readable and runnable
    with ``--config``, and an installed package finds them without the checkout."""
    return read_yaml(resources.files("vit_flowers.configs") / name)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                base: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults (``base`` on top of the dataclass's: a command's own defaults), then the YAML file at ``path``,
    then ``overrides``; validated.

    ``cfg.given`` is the set of keys that the file or ``overrides`` set (whatever their value): on ``--resume``
    exactly these replace the resumed run's settings.
    """
    cfg = TrainConfig()
    given: set[str] = set()
    if base:
        _apply(cfg, base, "defaults")
    if path is not None:
        values = read_yaml(Path(path))
        _apply(cfg, values, str(path))
        given |= set(values)
    if overrides:
        _apply(cfg, overrides, "command line")
        given |= set(overrides)
    if cfg.data and cfg.dataset == "synthetic":
        cfg.dataset = "folder"  # --data PATH alone means "train on this folder"
        given.add("dataset")
    cfg.validate()
    cfg.given = frozenset(given)  # not a field: never saved, never compared
    return cfg


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))


def key_choices() -> dict[str, tuple[str, ...]]:
    """The keys whose value is one of a fixed set, and that set: what :meth:`TrainConfig.validate` checks and
    ``--help`` lists (each tuple lives with the code that uses it; imported here, when asked for)."""
    from ..data.augment import AUTO_AUGMENTS
    from ..data.datasets import DATASETS
    from ..inference.precision import PRECISIONS
    from ..models.efficientnet import BATCHNORM_MODES
    from ..models.patch_embed import PATCH_EMBEDS
    from ..models.vit import POS_INITS, PRESETS

    return {"dataset": DATASETS, "model": tuple(sorted(PRESETS)),
            "patch_embed": PATCH_EMBEDS, "pos_init": POS_INITS, "lr_schedule": LR_SCHEDULES,
            "augment": AUTO_AUGMENTS, "precision": PRECISIONS,
            "backbone_bn": BATCHNORM_MODES}


def field_help() -> dict[str, str]:
    """Each field's help text (its ``metadata["help"]``, the one home of what the key means)."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(TrainConfig)}


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def add_config_arguments(parser: argparse.ArgumentParser, defaults: dict[str, Any] | None = None) -> None:
    """One ``--key`` option per config field, its help the field's help text with its choices and default (the
    command's own ``defaults`` over TrainConfig's); values are parsed, checked and reported by
    :func:`load_config`, for the command line and YAML files alike."""
    comments, choices = field_help(), key_choices()
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for name, annotation in _field_types().items():
        base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
        kind = getattr(base, "__name__", str(base))
        flag = "--" + name.replace("_", "-")
        default = _shown((defaults or {}).get(name, fields[name].default))
        if base is bool:
            default += f"; {flag} false turns it off" if default == "true" else f"; {flag} alone turns it on"
        text = f"{comments.get(name, f'({kind})')} (default: {default})".replace("%", "%%")  # argparse's % format
        metavar = "{" + ",".join(choices[name]) + "}" if name in choices else "BOOL" if base is bool else kind.upper()
        parser.add_argument(flag, dest=name, default=None, metavar=metavar, help=text,
                            **({"nargs": "?", "const": "true"} if base is bool else {}))


def config_from_args(args: argparse.Namespace, base: dict[str, Any] | None = None) -> TrainConfig:
    """The config that parsed ``--config FILE --key value ...`` options describe, over ``base`` defaults."""
    overrides = {k: v for k, v in vars(args).items() if k in _field_types() and v is not None}
    return load_config(getattr(args, "config", None), overrides, base)
