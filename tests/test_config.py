import re
from pathlib import Path
from typing import get_args

import pytest
import yaml

from vit_flowers.data.config import DataConfig
from vit_flowers.train import build_parser, parse_args
from vit_flowers.training.config import (
    ConfigError,
    TrainConfig,
    config_defaults,
    config_from_args,
    config_keys,
    load_config,
    save_config,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    overrides = {"data": "photos"} if "flowers5" in path.name else {}
    cfg = load_config(path, overrides)
    assert isinstance(cfg, TrainConfig)
    for key, value in (yaml.safe_load(path.read_text()) or {}).items():  # each value arrives as written
        assert cfg.get(key) == value, f"{path.name}: {key} is {cfg.get(key)!r}, the file says {value!r}"


def test_the_commands_read_their_defaults_from_the_shipped_recipes():
    """train's two sets of defaults are configs/flowers5-imagenet.yaml and configs/default.yaml themselves (installed
    inside the package), and default.yaml says only what the quick start changes in TrainConfig's defaults."""
    from importlib import resources

    from vit_flowers.train import PHOTO_DEFAULTS, QUICK_START_DEFAULTS

    shipped = resources.files("vit_flowers.configs")
    assert sorted(p.name for p in shipped.iterdir() if p.name.endswith(".yaml")) == sorted(
        p.name for p in CONFIGS.glob("*.yaml"))
    assert yaml.safe_load((CONFIGS / "flowers5-imagenet.yaml").read_text()) == PHOTO_DEFAULTS
    assert yaml.safe_load((CONFIGS / "default.yaml").read_text()) == QUICK_START_DEFAULTS
    typed = config_defaults()
    assert QUICK_START_DEFAULTS and all(typed[k] != v for k, v in QUICK_START_DEFAULTS.items())


def test_a_missing_shipped_recipe_is_named():
    from vit_flowers.training.config import shipped_recipe

    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        shipped_recipe("nope.yaml")


def test_the_package_list_names_every_sub_package():
    """pyproject.toml lists the packages (configs/ is mapped into the package): a new sub-package must join it, or a
    wheel would leave it out."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((CONFIGS.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    package = CONFIGS.parent / "vit_flowers"
    found = {".".join(("vit_flowers", *p.parent.relative_to(package).parts)) for p in package.rglob("__init__.py")}
    assert listed == found | {"vit_flowers.configs"}


def test_yaml_then_command_line_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("epochs: 3\nlr: 0.002\n")
    cfg, given = config_from_args(parse_args(["--config", str(path), "--lr", "5e-4", "--ema", "false", "--clip-grad",
                                               "none"]))
    assert (cfg.optim.epochs, cfg.optim.lr, cfg.optim.ema, cfg.optim.clip_grad) == (3, 5e-4, False, None)
    assert given == {"epochs", "lr", "ema", "clip_grad"}  # what the file and the command line set, and only that


def test_the_config_is_in_sections_and_its_keys_stay_flat(tmp_path):
    """Each key lives in one section (three under another name there); a run's config.yaml holds every key flat, each
    section under a comment, and reads back equal."""
    keys = config_keys()
    assert {section for section, _, _ in keys.values()} == {"data", "model", "optim", "augment", "distill", "run"}
    assert (keys["data"][:2], keys["model"][:2], keys["augment"][:2]) == (("data", "path"), ("model", "preset"),
                                                                        ("augment", "policy"))
    cfg = load_config(None, {"data": "photos", "model": "vit_micro", "augment": "none", "lr": 2e-4, "seed": 5})
    assert (cfg.data.path, cfg.model.preset, cfg.augment.policy, cfg.optim.lr, cfg.run.seed) == (
        "photos", "vit_micro", "none", 2e-4, 5)
    assert cfg.flat()["data"] == "photos" and cfg.get("lr") == 2e-4
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert [line for line in text.splitlines() if line.startswith("#")] == [
        "# ---- data", "# ---- model", "# ---- optim", "# ---- augment", "# ---- distill", "# ---- run"]
    assert list(yaml.safe_load(text)) == list(keys)
    assert load_config(tmp_path / "config.yaml") == cfg


def test_each_section_checks_its_own_keys():
    from vit_flowers.training.config import OptimConfig, RunConfig

    with pytest.raises(ConfigError, match="'ema_decay' must be below 1"):
        OptimConfig(ema_decay=1.0).validate()
    with pytest.raises(ConfigError, match="'overwrite' and 'resume' contradict"):
        RunConfig(overwrite=True, resume="auto").validate()
    with pytest.raises(ValueError, match="'cache_size' \\(32\\) must be >= image_size \\(64\\)"):
        DataConfig(image_size=64, cache_size=32).validate()
    OptimConfig().validate(), RunConfig().validate(), DataConfig().validate()  # the defaults pass


def test_data_alone_means_folder():
    assert load_config(None, {"data": "photos"}).data.dataset == "folder"


@pytest.mark.parametrize(
    "text, message",
    [
        ("epoch: 3\n", r"unknown key 'epoch' \(did you mean 'epochs'\?\). Valid keys: dataset"),
        ("epochs: three\n", "key 'epochs' expects int"),
        ("epochs: 2.5\n", "key 'epochs' expects int"),
        ("lr: [1, 2]\n", "key 'lr' expects float"),
        ("ema: maybe\n", "key 'ema' expects bool"),
        ("batch_size: 0\n", "'batch_size' must be positive"),
        ("image_size: -64\n", "'image_size' must be positive"),
        ("image_size: 60\ncache_size: 72\n", r"image_size \(60\) must be divisible by patch_size \(8\)"),
        ("dim: 100\nheads: 3\n", r"dim \(100\) must be divisible by heads \(3\)"),
        ("model: vit_giant\n", "'model' must be one of"),
        ("pos_init: learned\n", "'pos_init' must be one of trunc_normal, sincos; got 'learned'"),
        ("dataset: imagenet\n", "'dataset' must be one of"),
        ("lr_schedule: step\n", "'lr_schedule' must be one of cosine, linear; got 'step'"),
        ("fractal_render: stream\n", r"key 'fractal_render' is no longer a setting \(the fractal start was removed"),
        ("dataset: fractals\n", r"dataset 'fractals' is no longer available \(the fractal start was removed"),
        ("- a\n- b\n", "expected a mapping"),
        ("epochs: [\n", "not valid YAML"),
    ],
)
def test_bad_config_files_name_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    if "key '" in message or "unknown" in message or "YAML" in message or "mapping" in message:
        assert str(path) in str(info.value)


def test_missing_config_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("nope.yaml")


def test_an_older_runs_retired_keys_are_read_while_off():
    # a config.yaml saved before drloc was removed still loads (resume, evaluate); a value that would train
    # differently is refused by name
    cfg = load_config(None, {"drloc": 0.0, "drloc_pairs": 32, "epochs": 2})
    assert cfg.optim.epochs == 2 and not hasattr(cfg, "drloc")
    with pytest.raises(ConfigError, match="key 'drloc' is no longer a setting"):
        load_config(None, {"drloc": 0.1})


def test_a_run_saved_before_the_fractal_start_left_still_loads():
    # every config.yaml of that time holds the fractal keys (at their defaults, outside a pretraining): read;
    # a pretraining's own values, or its dataset, are refused with why
    saved = {"fractal_classes": 1000, "fractal_train_per_class": 50, "fractal_val_per_class": 2,
             "fractal_render": "cached", "dataset": "synthetic", "epochs": 3}
    assert load_config(None, saved).optim.epochs == 3
    with pytest.raises(ConfigError, match=r"command line: key 'fractal_classes' is no longer a setting \(the fractal "
                                          r"start was removed on 2026-12-04"):
        load_config(None, {**saved, "fractal_classes": 6})
    with pytest.raises(ConfigError, match="command line: dataset 'fractals' is no longer available"):
        load_config(None, {**saved, "dataset": "fractals"})


def test_folder_needs_data():
    with pytest.raises(ConfigError, match="needs 'data'"):
        load_config(None, {"dataset": "folder"})


def test_each_option_is_explained_by_its_field_help():
    from vit_flowers.training.config import field_help

    comments = field_help()
    assert list(comments) == list(config_keys())  # every key of every section, once
    assert all(comments.values()), [name for name, text in comments.items() if not text]  # every field has help
    assert comments["train_on_val"].endswith("and the val figures are of trained-on photos)")
    actions = {a.dest: a for a in build_parser()._actions}
    for name, text in comments.items():
        assert actions[name].help.startswith(text.replace("%", "%%")), name


def test_validate_checks_the_choices_that_help_lists():
    from vit_flowers.training.config import key_choices

    choices = key_choices()
    assert {"dataset", "model", "augment", "precision", "patch_embed", "lr_schedule"} <= set(choices)
    for key, values in choices.items():
        with pytest.raises(ConfigError, match=re.escape(f"'{key}' must be one of {', '.join(values)}; got 'nonsense'")):
            load_config(None, {key: "nonsense"})


def test_every_float_key_must_be_finite():
    """nan passes every range check (each comparison is False) and inf overflowed the time budget's plan: every
    float key refuses both, from the command line and YAML alike, naming the key (#53)."""
    floats = [key for key, (_, _, annotation) in config_keys().items() if float in (annotation, *get_args(annotation))]
    assert {"time_budget", "lr", "val_fraction", "stop_after"} <= set(floats)
    for key in floats:
        for value in ("nan", "inf", "-inf", float("nan"), float("inf")):
            with pytest.raises(ConfigError, match=f"key '{key}' must be a finite number"):
                load_config(None, {key: value})
