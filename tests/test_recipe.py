"""What a hybrid run's photos can hold (training/recipe.py): the head start in optimizer steps, end to end only on
enough photos a class, and an end-to-end epoch replacing the head start only beyond the validation noise."""

import logging

import pytest
from helpers import smoke_config

from vit_flowers import train as train_mod
from vit_flowers.training.recipe import beats_head_start, head_start_kept, noise_margin, plan_recipe
from vit_flowers.training.token_cache import TokenPhase

RULE = dict(batch_size=64, token_epochs=6, head_start_steps=200, end_to_end_min_per_class=200)


def test_a_small_folder_passes_over_its_photos_until_the_head_start_has_its_steps():
    recipe = plan_recipe([25, 25, 24, 25, 25], **RULE)  # 124 photos: one step a pass
    assert (recipe.steps_per_pass, recipe.passes) == (1, 33)
    assert recipe.head_steps == 198
    assert not recipe.end_to_end and "head start only" in recipe.reason and "124 training photos" in recipe.reason


def test_a_large_folder_keeps_one_pass_an_epoch_and_trains_end_to_end():
    recipe = plan_recipe([489, 674, 499, 468, 627], **RULE)  # flowers5's training share
    assert (recipe.steps_per_pass, recipe.passes, recipe.head_steps) == (43, 1, 258)
    assert plan_recipe([352, 506, 370, 400, 442], **RULE).passes == 1  # 6 x 32 = 192 steps: near enough, one pass
    assert recipe.end_to_end and "end-to-end fine-tuning" in recipe.reason


def test_one_class_short_of_the_rule_keeps_the_run_on_its_head_start_and_is_named():
    recipe = plan_recipe([400, 5], **RULE, classes=["daisy", "rose"])
    assert not recipe.end_to_end and "the fewest (rose)" in recipe.reason
    assert plan_recipe([400, 5], **{**RULE, "end_to_end_min_per_class": 0}).end_to_end  # 0: always


def test_a_folder_smaller_than_a_batch_still_steps():
    recipe = plan_recipe([1, 1], **RULE)
    assert recipe.steps_per_pass == 1 and recipe.head_steps == 198


def test_the_noise_of_a_small_validation_set_guards_the_head_start():
    assert noise_margin(0.73, 26) == pytest.approx(0.087, abs=1e-3)  # one photo of 26 is 3.8 points
    assert not beats_head_start(0.80, 0.73, 26) and beats_head_start(0.85, 0.73, 26)
    assert beats_head_start(0.935, 0.92, 683)  # ~1 point on flowers5's val
    assert noise_margin(1.0, 20) > 0 and noise_margin(0.5, 0) == 1.0  # never a zero margin


def test_the_kept_weights_are_read_back_from_the_metrics_rows():
    head = [{"val_acc": 0.70, "val_acc_ema": float("nan"), "trunk_frozen": 1},
            {"val_acc": 0.73, "val_acc_ema": float("nan"), "trunk_frozen": 1}]
    within = {"val_acc": 0.78, "val_acc_ema": 0.79, "trunk_frozen": 0}  # +6 points on 26 photos: noise
    beyond = {"val_acc": 0.80, "val_acc_ema": 0.85, "trunk_frozen": 0}
    assert head_start_kept(head, 26) and head_start_kept([*head, within], 26)
    assert not head_start_kept([*head, within, beyond], 26)
    assert not head_start_kept([*head, within], 2000)  # the same gain on 2,000 photos is real
    assert not head_start_kept([], 26)


def test_a_small_folder_trains_its_head_start_in_steps_and_stops_there(tmp_path, monkeypatch, caplog):
    steps = []
    real = TokenPhase.train_epoch

    def counting(self, generator, desc="head start", late=None):
        out = real(self, generator, desc, late)
        steps.append(self.step_count)
        return out

    monkeypatch.setattr(TokenPhase, "train_epoch", counting)
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", patch_size=32, image_size=64,
                       cache_size=64, token_epochs=2, epochs=5, head_start_steps=40, report=False,
                       feature_head="off")  # the head start's own rule: a feature start shrinks it (next test)
    with caplog.at_level(logging.INFO, logger="vit_flowers.train"):
        result = train_mod.train(cfg)
    rows = (result.run_dir / "metrics.csv").read_text().splitlines()[1:]
    assert [r.split(",")[-1] for r in rows] == ["1", "1"]  # no end-to-end epoch: 16 photos a class, not 200
    assert 35 <= steps[-1] <= 45 and steps[0] == steps[-1] // 2  # two epochs, each half of the steps
    assert any("head start only" in r.getMessage() and "end_to_end_min_per_class" in r.getMessage()
               for r in caplog.records)
    assert any("validation: 30 photos" in r.getMessage() and "little evidence" in r.getMessage()
               for r in caplog.records)  # 6 a class: one photo is 3.3 points


def test_a_class_left_with_no_readable_photo_is_refused_by_name_and_no_run_is_made(tmp_path, caplog):
    import numpy as np
    from PIL import Image

    for i in range(6):
        (tmp_path / "photos" / "daisy").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((40, 40, 3), 30 * i, np.uint8)).save(tmp_path / "photos" / "daisy" / f"{i}.png")
    (tmp_path / "photos" / "rose").mkdir()
    (tmp_path / "photos" / "rose" / "broken.jpg").write_bytes(b"not a jpeg")
    with caplog.at_level(logging.ERROR):
        status = train_mod.main(["--data", str(tmp_path / "photos"), "--out-dir", str(tmp_path / "ck"),
                                 "--progress", "false"])
    assert status == 2
    message = caplog.records[-1].getMessage()
    assert "no readable training photo" in message and message.endswith("remove them") and ": rose;" in message
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


def test_a_feature_start_shrinks_the_head_start_to_one_pass():
    from vit_flowers.training.recipe import after_feature_start

    recipe = after_feature_start(plan_recipe([24] * 5, classes=list("abcde"), **RULE))
    assert (recipe.head_epochs, recipe.passes, recipe.head_steps, recipe.end_to_end) == (1, 1, 1, False)
    assert recipe.reason == ("120 training photos, 24 a class: the frozen-feature start, then 1 epoch x 1 pass x 1 "
                             "step of the encoder on top (kept only where it beats the start); no end-to-end "
                             "fine-tuning")
