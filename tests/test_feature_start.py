"""The hybrid that starts where the frozen-feature recipe ends (#60): the feature head is the peers' network
(models/feature_head.py), the start is their logistic regression (training/feature_start.py), and a small folder's
run keeps that start unless its encoder beats it, then fits it again on every photo."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from helpers import smoke_config, write_class_folders
from sklearn.linear_model import LogisticRegression

from vit_flowers import train as train_mod
from vit_flowers.export import main as export_main
from vit_flowers.inference.calibration import fit_head
from vit_flowers.models.efficientnet import imagenet_state
from vit_flowers.models.feature_head import FeatureHead, load_imagenet_head
from vit_flowers.models.vit import create_vit
from vit_flowers.runs.checkpoint import load_checkpoint, load_model
from vit_flowers.training.config import ConfigError, load_config
from vit_flowers.training.feature_start import (
    C,
    cross_validate,
    pooled_features,
    start_from_features,
    wants_feature_head,
)


def _hybrid(num_classes: int = 3, image_size: int = 64):
    from vit_flowers.models.efficientnet import load_imagenet_trunk

    model = create_vit("vit_micro", num_classes, image_size=image_size, patch_size=32, patch_embed="lite0",
                       feature_head=True)
    load_imagenet_trunk(model.to_patch_embedding.trunk)
    load_imagenet_head(model.feature_head)
    return model.eval()


def test_the_feature_head_reads_what_timms_whole_network_pools():
    import timm

    torch.manual_seed(0)
    model = _hybrid()
    net = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    net.load_state_dict(imagenet_state("lite0"))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        _, grid = model.embed(x)
        ours = model.feature_head.features(grid)
        theirs = net.forward_head(net.forward_features(x * model.to_patch_embedding.input_scale
                                                       + model.to_patch_embedding.input_shift), pre_logits=True)
    assert ours.shape == (2, 1280)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_the_feature_head_is_frozen_and_refuses_a_trunk_it_cannot_read():
    head = FeatureHead("lite0", 320, 4)
    head.train()
    assert not any(p.requires_grad for p in head.parameters()) and not head.norm.training
    with pytest.raises(ValueError, match="reads 320 channels, the trunk gives 112"):
        FeatureHead("lite0", 112, 4)
    with pytest.raises(ValueError, match="feature_head reads a hybrid's trunk cut at its last stage"):
        create_vit("vit_micro", 3, image_size=64, patch_size=16, patch_embed="lite0", feature_head=True)


def test_at_its_start_the_model_is_the_logistic_regression_on_its_pooled_features():
    torch.manual_seed(0)
    model = _hybrid()
    images, labels = torch.randn(24, 3, 64, 64), torch.arange(24) % 3
    images[labels == 1] += 0.8  # classes a linear model can tell apart
    with torch.no_grad():
        _, grids = model.embed(images)
    start = start_from_features(model, grids, labels)
    x = pooled_features(model, grids)
    weight, bias = fit_head(x, labels.numpy(), 3, start.c)
    with torch.no_grad():
        logits = model(images)
    assert start.c == C and start.folds == 5 and start.photos == 24
    assert not model.mlp_head.weight.any() and not model.mlp_head.bias.any()  # the encoder adds nothing yet
    torch.testing.assert_close(logits.double(), torch.from_numpy(x) @ weight.double().T + bias.double(),
                               atol=1e-3, rtol=1e-3)
    # and that fit is scikit-learn's own (class-balanced weights: the classes here are of one size)
    clf = LogisticRegression(C=start.c, max_iter=5000).fit(x, labels.numpy())
    assert (logits.argmax(1).numpy() == clf.predict(x)).all()


def test_the_start_is_cross_validated_where_every_class_can_be_folded():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 4)
    x = rng.normal(size=(12, 8)) + 3 * np.eye(8)[y]  # separable
    assert cross_validate(x, y, 3) == (1.0, 4)  # four folds: the smallest class has four photos
    y[0] = 1  # a fold with a photo of class 1 held out is scored by a fit that saw the others
    assert cross_validate(x, y, 3)[1] == 3
    assert cross_validate(x[[0, 4, 8, 1]], np.array([0, 1, 2, 0]), 3) == (None, 0)  # one photo of a class


def test_auto_builds_a_feature_head_only_where_the_run_ends_with_its_head_start():
    common = dict(hybrid_at_32=True, imagenet=True, head_start=True, end_to_end_min_per_class=200)
    assert wants_feature_head("auto", fewest=30, **common)
    assert not wants_feature_head("auto", fewest=200, **common)  # end to end: the full folder as before
    assert not wants_feature_head("auto", fewest=30, **{**common, "imagenet": False})
    assert not wants_feature_head("off", fewest=30, **common)
    assert wants_feature_head("on", fewest=500, **common)


def test_config_checks_feature_head():
    with pytest.raises(ConfigError, match="'feature_head' must be one of auto, on, off"):
        load_config(None, {"feature_head": "yes"})
    with pytest.raises(ConfigError, match=r"'feature_head' \(on\) reads a hybrid's trunk cut at its last stage"):
        load_config(None, {"feature_head": "on", "patch_embed": "lite0", "patch_size": 16})


def test_a_small_folder_starts_as_the_peer_and_ends_refitted_on_every_photo(tmp_path, caplog):
    data = write_class_folders(tmp_path / "photos", per_class=10)
    cfg = smoke_config(tmp_path, dataset="folder", data=str(data), pretrained="imagenet", patch_embed="lite0",
                       patch_size=32, image_size=64, cache_size=64, token_epochs=2, epochs=3, head_start_steps=8,
                       val_fraction=0.3, photo_cache=False)  # token_epochs 2: the feature start shrinks them to one
    with caplog.at_level(logging.INFO, logger="vit_flowers.train"):
        result = train_mod.train(cfg)
    text = caplog.text
    assert "start: the frozen-feature fit on" in text and "start: val" in text
    assert "its feature head fitted again on all" in text
    model, state = load_model(result.run_dir / "best.pt")
    assert model.feature_head is not None and model.feature_head.fc.weight.any()
    rows = (result.run_dir / "metrics.csv").read_text().splitlines()[1:]
    assert len(rows) == 1 and rows[0].endswith(",1")  # one head-start epoch on top of the start, no end-to-end one
    if state["epoch"] == 0:  # the start kept: the encoder's head is still zero
        assert not model.mlp_head.weight.any()
    assert load_checkpoint(result.run_dir / "best.pt")["unknown"] is not None  # the report's end ran before the refit
    report = (result.run_dir / "report" / "report.md").read_text()
    assert "What the run chose" in report and "started from the frozen-feature fit on" in report
    # ONNX carries the feature head and its extra network: export checks its logits against PyTorch's
    assert model.feature_head.extras == ("lite2",)  # auto: a folder this small reads Lite2 too
    assert export_main(["--checkpoint", str(result.run_dir / "best.pt"), "--output", str(tmp_path / "m.onnx")]) == 0


def test_an_extra_network_adds_its_pooled_features_and_follows_the_trunk_in_the_grid():
    import timm

    from vit_flowers.models.efficientnet import load_imagenet_trunk

    torch.manual_seed(0)
    model = create_vit("vit_micro", 3, image_size=64, patch_size=32, patch_embed="lite0", feature_head=True,
                       feature_extras="lite2")
    load_imagenet_trunk(model.to_patch_embedding.trunk)
    load_imagenet_head(model.feature_head)
    model.eval()
    x = torch.randn(2, 3, 64, 64)
    lite = x * model.to_patch_embedding.input_scale + model.to_patch_embedding.input_shift
    with torch.no_grad():
        tokens, grid = model.embed(x)
        features = model.feature_head.features(grid)
        pooled = []
        for variant in ("lite0", "lite2"):
            net = timm.create_model(f"tf_efficientnet_{variant}", pretrained=False).eval()
            net.load_state_dict(imagenet_state(variant))
            pooled.append(net.forward_head(net.forward_features(lite), pre_logits=True))
        plain = create_vit("vit_micro", 3, image_size=64, patch_size=32, patch_embed="lite0").eval()
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("feature_head.")})
        plain_tokens, plain_grid = plain.embed(x)
    assert grid.shape == (2, 320 + 352, 2, 2) and features.shape == (2, 2560)
    torch.testing.assert_close(features, torch.cat(pooled, dim=1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(tokens, plain_tokens)  # the encoder reads the trunk's own channels alone
    torch.testing.assert_close(model.pooled_trunk(grid), plain_grid.mean((2, 3)))  # and so does a gate
    with pytest.raises(ValueError, match="feature_extras are EfficientNet-Lites"):
        create_vit("vit_micro", 3, image_size=64, patch_size=32, patch_embed="lite0", feature_extras="lite2")


def test_auto_reads_lite2_beside_the_trunk_on_small_folders_only():
    from vit_flowers.training.feature_start import EXTRAS_MAX_PHOTOS, feature_extras

    assert feature_extras("auto", 150) == "lite2" and feature_extras("auto", EXTRAS_MAX_PHOTOS + 1) == ""
    assert feature_extras("none", 150) == "" and feature_extras("lite1+lite2", 5000) == "lite1+lite2"
