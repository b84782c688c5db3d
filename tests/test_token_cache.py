"""The hybrid's head start (token_cache.py): epochs on the frozen trunk's cached outputs, then end to end."""

import logging
import math

import pytest
import torch
from helpers import smoke_config

from vit_flowers import train as train_mod
from vit_flowers.data.datasets import load_synthetic
from vit_flowers.models.vit import create_vit
from vit_flowers.training import steps, trainer
from vit_flowers.training.budget import plan_epochs
from vit_flowers.training.config import ConfigError, load_config
from vit_flowers.training.distributed import Dist
from vit_flowers.training.recipe import plan_recipe
from vit_flowers.training.token_cache import TokenPhase

CPU = torch.device("cpu")


def _hybrid(image_size=64):
    return create_vit("vit_micro", 5, image_size=image_size, patch_size=32, patch_embed="lite0")


def test_the_cached_trunk_outputs_give_what_the_photos_give():
    model = _hybrid().eval()
    img = torch.randn(3, 3, 64, 64)
    embed = model.to_patch_embedding
    with torch.no_grad():
        tokens = model.forward_features(embed.tokens(embed.trunk_features(img)), embedded=True)
        assert torch.allclose(model.forward_head(tokens), model(img), atol=1e-5)


@pytest.fixture(scope="module")
def synthetic():
    return load_synthetic(image_size=64, train_per_class=8, val_per_class=4, seed=1)


def _phase(model, data, epochs=2):
    recipe = plan_recipe([8] * 5, batch_size=16, token_epochs=epochs, head_start_steps=0, end_to_end_min_per_class=0)
    return TokenPhase(model, data.train, data.val, recipe=recipe, lr=1e-3, weight_decay=0.05, batch_size=16,
                      label_smoothing=0.1, device=CPU, amp_dtype=None, progress=False)


def test_an_epoch_on_cached_outputs_trains_all_but_the_trunk(synthetic):
    model = _hybrid()
    phase = _phase(model, synthetic)
    assert phase.train_x.dtype == torch.float16 and phase.train_x.shape == (40, 320, 2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = phase.train_epoch(torch.Generator().manual_seed(0))
    assert stats["train_loss"] > 0 and 0 <= stats["train_acc"] <= 1
    after = model.state_dict()
    for name, value in after.items():
        unchanged = torch.equal(before[name], value)
        assert unchanged == name.startswith("to_patch_embedding.trunk."), name


def test_validating_on_cached_outputs_equals_validating_on_the_images(synthetic):
    model = _hybrid()
    phase = _phase(model, synthetic)
    phase.train_epoch(torch.Generator().manual_seed(0))
    cfg = load_config(None, {"patch_embed": "lite0", "image_size": 64, "patch_size": 32, "model": "vit_micro"})
    loss, acc = steps.validate(model, synthetic.val, cfg, Dist(), CPU)
    cached_loss, cached_acc = phase.validate()
    assert cached_acc == acc and cached_loss == pytest.approx(loss, abs=1e-2)  # float16 storage of the outputs


def test_a_run_starts_on_tokens_then_trains_end_to_end(tmp_path):
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", patch_size=32, image_size=64,
                       cache_size=64, token_epochs=2, epochs=1, report=False, end_to_end_min_per_class=0)
    result = train_mod.train(cfg)
    rows = (result.run_dir / "metrics.csv").read_text().splitlines()
    assert rows[0].split(",")[-1] == "trunk_frozen"
    assert [r.split(",")[-1] for r in rows[1:]] == ["1", "1", "0"]
    ema_column = [r.split(",")[5] for r in rows[1:]]
    assert ema_column[:2] == ["nan", "nan"] and not math.isnan(float(ema_column[2]))


def test_the_budget_plans_end_to_end_epochs_from_their_own_cost():
    def plan(history, **kwargs):  # 50 end-to-end epochs at most, a minute in all
        return plan_epochs(50, 60.0, history, **kwargs)

    tokens = [{"elapsed": 20.0, "seconds": 2, "trunk_frozen": 1}, {"elapsed": 22.0, "seconds": 2, "trunk_frozen": 1}]
    assert plan(tokens, first_estimate=10.0) == 2 + 3  # 38 s left: 3 epochs of 10 s end in time, not 4
    assert plan(tokens, first_estimate=10.0, reserve=9.0) == 2 + 2  # the end of the run's 9 s kept
    assert plan(tokens, first_estimate=100.0) == 2  # not half an epoch left: the head start is all
    full = tokens + [{"elapsed": 34.0, "seconds": 12, "trunk_frozen": 0}]
    assert plan(full, first_estimate=1.0) == 3 + 2  # measured: 12 s an epoch, 26 s left
    assert plan_epochs(5, 0, tokens) == 2 + 5  # no budget: epochs after the head start


def test_token_epochs_need_a_hybrid():
    with pytest.raises(ConfigError, match="token_epochs"):
        load_config(None, {"token_epochs": 3})
    with pytest.raises(ConfigError, match="token_lr"):
        load_config(None, {"patch_embed": "lite0", "token_lr": 0})


def test_a_short_budget_ends_the_head_starts_cosine_with_the_epochs_that_fit(tmp_path, monkeypatch):
    """Two seconds an epoch against a 5-second budget: two epochs on tokens (of 8 asked), their cosine ending at
    the second."""
    clock = [0.0]

    def perf_counter():  # every reading a microsecond later, so that no duration is zero
        clock[0] += 1e-6
        return clock[0]

    monkeypatch.setattr(trainer.time, "perf_counter", perf_counter)
    real_epoch = TokenPhase.train_epoch

    def two_seconds(self, generator, desc="head start", late=None):
        clock[0] += 2.0
        return real_epoch(self, generator, desc, late)

    monkeypatch.setattr(TokenPhase, "train_epoch", two_seconds)
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", patch_size=32, image_size=64,
                       cache_size=64, token_epochs=8, epochs=3, time_budget=5 / 60, ema=False, report=False,
                       feature_head="off")  # the head start's own plan (a feature start shrinks it to one pass)
    result = train_mod.train(cfg)
    rows = [r.split(",") for r in (result.run_dir / "metrics.csv").read_text().splitlines()[1:]]
    on_tokens = [r for r in rows if r[-1] == "1"]
    assert len(on_tokens) == 2 and rows[0][-1] == rows[1][-1] == "1"
    assert float(on_tokens[-1][6]) == pytest.approx(0.0, abs=1e-9)  # lr: the cosine's end


def test_a_cpu_too_slow_for_an_end_to_end_epoch_is_told_so(tmp_path, monkeypatch, caplog):
    """An end-to-end epoch estimated at 1,000 s against a 1-minute budget: the run ends with its head start and the
    log says why (#53), instead of starting an epoch that ends past the budget."""
    monkeypatch.setattr(TokenPhase, "end_to_end_epoch_estimate", lambda self, n: 1000.0)
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", patch_size=32, image_size=64,
                       cache_size=64, token_epochs=2, epochs=3, time_budget=1.0, ema=False, report=False,
                       end_to_end_min_per_class=0)  # the photos would hold a fine-tune: the clock alone says no
    with caplog.at_level(logging.INFO):
        result = train_mod.train(cfg)
    rows = [r.split(",") for r in (result.run_dir / "metrics.csv").read_text().splitlines()[1:]]
    assert [r[-1] for r in rows] == ["1", "1"]  # the head start, and no end-to-end epoch
    assert "an end-to-end epoch (about 1000 s on this machine) does not fit" in caplog.text
    assert "the run ends with its head start" in caplog.text


def test_the_unknown_rule_read_from_the_cached_outputs_matches_the_photos(synthetic):
    """A run that ends with its head start (its trunk never trained) takes the unknown rule's features from the
    head start's cache: the same class means, threshold and teach features as a pass over the photos gives (float16
    storage aside; a hybrid's teach sample holds the photos alone either way, #53)."""
    from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD
    from vit_flowers.inference.calibration import calibrate_checkpoint

    model = _hybrid()
    phase = _phase(model, synthetic)
    phase.train_epoch(torch.Generator().manual_seed(0))
    ckpt = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD, "classes": synthetic.classes}
    photos = calibrate_checkpoint(model, ckpt, synthetic.train, synthetic.val, CPU)
    cached = calibrate_checkpoint(model, ckpt, synthetic.train, synthetic.val, CPU,
                                  trunk_cache=(phase.train_x, phase.val_x))
    assert cached["class_means"] == photos["class_means"]
    assert cached["unknown"]["threshold"] == pytest.approx(photos["unknown"]["threshold"], rel=0.05, abs=0.05)
    assert torch.equal(cached["teach_sample"]["labels"], photos["teach_sample"]["labels"])
    for key in ("features", "trunk"):
        assert torch.allclose(cached["teach_sample"][key].float(), photos["teach_sample"][key].float(),
                              atol=2e-2), key


@pytest.mark.parametrize("cached", [False, True])
def test_the_outputs_of_each_batch_are_kept_as_copies_not_as_views_of_its_tokens(synthetic, monkeypatch, cached):
    """The CLS token and the head's input are views of a batch's tokens (B, 1 + N, dim): kept as views, every
    batch's tokens stayed alive until the pass ended (20,000 cached validation photos: +2.3 GB, #53)."""
    from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD
    from vit_flowers.inference import features

    model = _hybrid()
    images = _phase(model, synthetic).val_x if cached else synthetic.val.images
    kept: list = []
    real = features.np.concatenate
    monkeypatch.setattr(features.np, "concatenate", lambda parts, *a, **k: kept.extend(parts) or real(parts, *a, **k))
    out = features.batch_outputs(model, images, IMAGENET_MEAN, IMAGENET_STD, batch_size=8, cached=cached)
    assert len(kept) == 5 * math.ceil(len(images) / 8) and len(out.cls) == len(images)
    assert all(part.base is None for part in kept)  # owns its rows: no batch's tensor behind it


def test_a_run_that_ends_on_its_head_start_keeps_each_photo_once(synthetic):
    """The cache's mirror image of a photo would be its flipped trunk grid, whose pooled output (what a taught class's
    gate reads) is the photo's own: the kept sample holds each photo once, no trunk row twice (it held every row
    twice, #55), and the same photos as a pass over the images keeps (a hybrid's, without mirror images either:
    #53)."""
    from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD
    from vit_flowers.inference.calibration import TEACH_PER_CLASS, calibrate_checkpoint

    model = _hybrid()
    phase = _phase(model, synthetic)
    ckpt = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD, "classes": synthetic.classes}
    kept = calibrate_checkpoint(model, ckpt, synthetic.train, synthetic.val, CPU,
                                trunk_cache=(phase.train_x, phase.val_x))["teach_sample"]
    photos = calibrate_checkpoint(model, ckpt, synthetic.train, synthetic.val, CPU)["teach_sample"]
    n = min(len(synthetic.train), TEACH_PER_CLASS * len(synthetic.classes))
    assert len(kept["labels"]) == len(kept["features"]) == len(kept["trunk"]) == n == len(photos["labels"])
    assert torch.equal(kept["labels"], photos["labels"])
    assert len(torch.unique(kept["trunk"], dim=0)) == n
    assert len(torch.unique(kept["features"], dim=0)) == n


@pytest.mark.parametrize("end_to_end", [False, True])
def test_the_cache_reaches_the_unknown_rule_only_while_the_trunk_is_as_cached(tmp_path, monkeypatch, end_to_end):
    from vit_flowers.inference import calibration

    given = []
    real = calibration.calibration

    def recording(*args, trunk_cache=None, **kwargs):
        given.append(trunk_cache)
        return real(*args, trunk_cache=trunk_cache, **kwargs)

    monkeypatch.setattr(calibration, "calibration", recording)
    # 30 ms: the head start's first epoch is all that fits; or no budget, and end to end on any number of photos
    budget = {"end_to_end_min_per_class": 0} if end_to_end else {"time_budget": 0.0005}
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", patch_size=32, image_size=64,
                       cache_size=64, token_epochs=2, epochs=1, feature_head="off", **budget)
    rows = (train_mod.train(cfg).run_dir / "metrics.csv").read_text().splitlines()[1:]
    assert [r.split(",")[-1] for r in rows] == (["1", "1", "0"] if end_to_end else ["1"])
    # end to end: the head start's end computed over the cache before the trunk trains (#53), then, when an
    # end-to-end epoch replaces the head start in best.pt, its own without the cache
    assert given[0] is not None and all(g is None for g in given[1:]) and len(given) <= (2 if end_to_end else 1)
    # the train and val photos' trunk outputs: Lite0 at stride 32, 320 channels, float16
    assert [(t.dtype, t.shape[1]) for t in given[0]] == [(torch.float16, 320)] * 2


def test_a_head_start_epoch_stops_at_the_step_that_would_end_past_the_budget(tmp_path, monkeypatch, caplog):
    """#62: on a busy machine one head-start epoch took 119 s of a 2-minute budget and the run ended at 4.6 min. Steps
    of 1 s on a fake clock, 20 in the epoch (10 passes of 2), a budget of 12 s: the epoch stops before the step that
    would end past the budget instead of running its 20 steps."""
    clock = [0.0]

    def perf_counter():
        clock[0] += 1e-6
        return clock[0]

    monkeypatch.setattr(trainer.time, "perf_counter", perf_counter)
    real_logits, steps = TokenPhase._logits, [0]

    def one_second(self, features, fixed=None):
        if torch.is_grad_enabled():  # a training step (validation runs under inference mode)
            clock[0] += 1.0
            steps[0] += 1
        return real_logits(self, features, fixed)

    monkeypatch.setattr(TokenPhase, "_logits", one_second)
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", patch_size=32, image_size=64,
                       cache_size=64, token_epochs=1, head_start_steps=20, synthetic_train_per_class=8,
                       synthetic_val_per_class=4, epochs=3, time_budget=12 / 60, ema=False, report=False,
                       feature_head="off")
    with caplog.at_level(logging.WARNING):
        train_mod.train(cfg)
    assert "head start, epoch 1/1 stops after" in caplog.text
    assert 2 <= steps[0] < 12 and clock[0] <= 12.0, (steps, clock)
