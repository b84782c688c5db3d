"""Training: end-to-end CLI smoke run, resume equivalence, NaN stop, DDP."""

import csv
import itertools
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import SMOKE, smoke_config

from vit_flowers import train as train_mod
from vit_flowers.runs.checkpoint import load_checkpoint
from vit_flowers.training import budget, epoch_end, optim, run_end, setup, steps, trainer
from vit_flowers.training.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_cli_end_to_end(tmp_path):
    code = train_mod.main(["--config", str(SMOKE), "--out-dir", str(tmp_path / "ck"), "--run-name", "smoke",
                           "--progress", "false", "--epochs", "2"])
    assert code == 0
    run = tmp_path / "ck" / "smoke"
    for name in ("last.pt", "best.pt", "config.yaml", "metrics.csv", "curves.png"):
        assert (run / name).stat().st_size > 0, name
    assert (tmp_path / "ck" / "latest").resolve() == run.resolve()
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert all(0.0 <= float(r["val_acc"]) <= 1.0 and float(r["images_per_s"]) > 0 for r in rows)
    best = load_checkpoint(run / "best.pt")
    assert best["classes"] == ["daisy", "dandelion", "rose", "sunflower", "tulip"]
    assert best["image_size"] == 32 and best["train_state"] is None
    assert (run / "report" / "metrics.json").is_file()


def test_cli_bad_config_exits_with_message(tmp_path, caplog):
    with pytest.raises(SystemExit):  # argparse rejects unknown flags itself
        train_mod.main(["--epochz", "2"])
    assert train_mod.main(["--config", str(SMOKE), "--out-dir", str(tmp_path), "--image-size", "30"]) == 2
    assert "image_size (30) must be divisible by patch_size (8)" in caplog.text
    assert not any(tmp_path.iterdir())  # nothing started


def test_resume_after_interruption_matches_uninterrupted_run(tmp_path, monkeypatch):
    cfg = dict(epochs=3, augment="trivial", mixup=0.2, cutmix=0.5, dropout=0.1)
    full = train_mod.train(smoke_config(tmp_path / "a", **cfg))

    real_epoch = trainer.train_one_epoch
    calls = {"n": 0}

    def interrupted(*args, **kwargs):  # killed in the middle of the second epoch
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_epoch(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_one_epoch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_mod.train(smoke_config(tmp_path / "b", **cfg))
    assert load_checkpoint(tmp_path / "b" / "ck" / "latest" / "last.pt")["epoch"] == 1
    monkeypatch.setattr(trainer, "train_one_epoch", real_epoch)
    resumed = train_mod.train(smoke_config(tmp_path / "b", resume="auto", **cfg))

    assert resumed.run_dir.resolve() == (tmp_path / "b" / "ck" / "latest").resolve()
    a = load_checkpoint(full.run_dir / "last.pt")
    b = load_checkpoint(resumed.run_dir / "last.pt")
    assert b["epoch"] == 3
    for key, value in a["train_state"]["model"].items():
        assert torch.equal(value, b["train_state"]["model"][key]), key
    for key, value in a["train_state"]["ema"].items():
        assert torch.equal(value, b["train_state"]["ema"][key]), key
    assert a["train_state"]["history"][-1]["val_acc"] == b["train_state"]["history"][-1]["val_acc"]
    assert len(list(csv.DictReader((resumed.run_dir / "metrics.csv").open()))) == 3


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    result = train_mod.train(smoke_config(tmp_path, epochs=1, run_name="r"))
    good = (result.run_dir / "last.pt").read_bytes()
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", lambda *a, **k: torch.tensor(float("nan")))
    with pytest.raises(trainer.TrainingError, match="the loss became nan"):
        train_mod.train(smoke_config(tmp_path, epochs=2, run_name="r", resume="auto"))
    assert (result.run_dir / "last.pt").read_bytes() == good


DDP_SCRIPT = textwrap.dedent("""
    import json, os, sys, torch
    from vit_flowers.data.datasets import TensorImageDataset
    from vit_flowers.training.config import load_config
    from vit_flowers.train import train

    seen = []  # the photos this rank read, batch by batch: the training steps come first (rank 0 reads more at the end)
    real_batch = TensorImageDataset.batch

    def recorded(self, idx, *args, **kwargs):
        seen.append(torch.as_tensor(idx).clone())
        return real_batch(self, idx, *args, **kwargs)

    TensorImageDataset.batch = recorded
    out = sys.argv[1]
    cfg = load_config(sys.argv[2], {"out_dir": out + "/ck", "run_name": "ddp", "progress": False,
                                     "deterministic": True, "epochs": 2,
                                     "batch_size": 20,  # 2 full batches of each rank's 40 photos
                                     **json.loads(sys.argv[3])})
    result = train(cfg)
    torch.save(result.model.state_dict(), f"{out}/rank{os.environ['RANK']}.pt")
    torch.save(seen, f"{out}/seen{os.environ['RANK']}.pt")
""")


def test_torchrun_two_cpu_processes_end_with_identical_weights(tmp_path):
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           str(script), str(tmp_path), str(SMOKE), "{}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    w1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for key in w0:
        assert torch.equal(w0[key], w1[key]), key
    assert (tmp_path / "ck" / "ddp" / "best.pt").is_file()
    rows = list(csv.DictReader((tmp_path / "ck" / "ddp" / "metrics.csv").open()))
    assert len(rows) == 2  # one row an epoch, written by rank 0 alone
    # each rank drew its own half of the 80 training photos in each of the 2 epochs, and together all of them
    seen = [torch.load(tmp_path / f"seen{rank}.pt", weights_only=True) for rank in (0, 1)]
    steps = 2  # batches per epoch: each rank's 40 photos in batches of 20
    assert min(len(seen[0]), len(seen[1])) >= 2 * steps
    for epoch in range(2):
        halves = [torch.cat(s[epoch * steps:(epoch + 1) * steps]).tolist() for s in seen]
        assert len(halves[0]) == len(halves[1]) == 40
        assert not set(halves[0]) & set(halves[1]) and set(halves[0]) | set(halves[1]) == set(range(80))


def test_torchrun_runs_the_hybrids_head_start_too(tmp_path):
    """Under torchrun a hybrid's plan is the one a single process follows (#62: the head start was skipped there):
    every rank trains the head start's steps on all the cached photos, then both take rank 0's weights and train
    end to end, ending with identical weights."""
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_SCRIPT)
    hybrid = {"pretrained": "imagenet", "patch_embed": "lite0", "patch_size": 32, "image_size": 64, "cache_size": 64,
              "token_epochs": 2, "epochs": 1, "end_to_end_min_per_class": 0, "feature_head": "off", "report": False}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29534",
           str(script), str(tmp_path), str(SMOKE), json.dumps(hybrid)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "ck" / "ddp" / "metrics.csv").open()))
    assert [row["trunk_frozen"] for row in rows] == ["1", "1", "0"]
    w0, w1 = (torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1))
    # (the trunk's BatchNorm statistics: DDP sends rank 0's at each forward pass, then each rank's last batch moves its
    # own; rank 0's are the ones saved)
    weights = [key for key in w0 if not key.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert any(".trunk." in key for key in weights)
    for key in weights:
        assert torch.equal(w0[key], w1[key]), key


def _rows(walls: list[float]) -> list[dict[str, float]]:
    ends = list(itertools.accumulate(walls))
    return [{"epoch": i + 1, "seconds": w * 0.9, "elapsed": e} for i, (w, e) in enumerate(zip(walls, ends))]


def _plan(cfg, history, **kwargs) -> int:
    return budget.plan_epochs(cfg.optim.epochs, 60 * cfg.optim.time_budget, history, **kwargs)


def test_time_budget_plans_the_epochs_that_fit():
    cfg = load_config(SMOKE, {"epochs": 100, "time_budget": 1.0})  # 60 s
    assert _plan(cfg, []) == 100  # nothing measured yet: the cap
    assert _plan(cfg, _rows([10.0])) == 6  # 10 s an epoch: 50 s left = 5 more
    slower = load_config(SMOKE, {"epochs": 100, "time_budget": 2.0})  # 120 s
    assert _plan(slower, _rows([10.0, 20.0, 20.0, 20.0])) == 6  # 20 s lately: 50 s left = 2 more
    assert _plan(slower, _rows([10.0, 10.0, 10.0, 25.0])) == 6  # the last 25 s (mean 15): the busy machine believed
    assert _plan(cfg, _rows([10.0] * 6)) == 6  # the budget is spent
    assert _plan(cfg, _rows([0.5])) == 100  # 119 would fit: never above the cap
    assert _plan(load_config(SMOKE, {"epochs": 7}), _rows([10.0] * 3)) == 7  # no budget
    old = [{k: v for k, v in r.items() if k != "elapsed"} for r in _rows([10.0])]  # a row from before "elapsed"
    assert _plan(cfg, old) == 6  # 9 s of training seconds an epoch: 51 s left = 5 more
    resumed = old + [{"epoch": 2, "seconds": 9.0, "elapsed": 20.0}]  # an old run resumed with a budget
    assert budget.epoch_ends(resumed) == [9.0, 20.0]
    assert _plan(cfg, resumed) == 5  # 10 s an epoch on average, 11 s the last: 40 s left = 3 more


def test_no_epoch_starts_that_would_end_past_the_budget():
    """#53's run: 14 minutes, a head start to 141 s, end-to-end epochs of 214-223 s, 262 s left after the 8th. The old
    plan started a 9th (rounding 1.2 epochs' worth of time up, then 98 + 26 s of the end of the run on top: 18.4 min
    in all); now a 9th starts only when it and the end of the run end in time."""
    cfg = load_config(None, {"epochs": 100, "time_budget": 14.0})
    walls = [76.0, 13.0, 13.0, 13.0, 13.0, 13.0, 223.0, 214.0]  # setup and the trunk's pass in the first
    history = [{**row, "trunk_frozen": int(i < 6)} for i, row in enumerate(_rows(walls))]
    assert budget.epoch_ends(history)[-1] == 578.0
    assert _plan(cfg, history) == 9  # 262 s: one more epoch of ~218 s ends at 796 s
    assert _plan(cfg, history, reserve=124.0) == 8  # 796 + 124 s would be past 840: none
    assert _plan(cfg, history[:7], reserve=124.0) == 8  # after the 7th (364 s): the 8th, to 578 s
    assert budget.epochs_that_fit(299.9, 100.0) == 2 and budget.epochs_that_fit(-5.0, 100.0) == 0


def test_the_end_of_the_run_is_planned_from_the_photos_it_passes_over():
    from vit_flowers.inference.calibration import SAMPLE_PHOTOS, TEACH_PER_CLASS, calibration_passes, sample_indices

    labels = np.repeat(np.arange(5), 600)  # 3,000 training photos: TEACH_PER_CLASS of each class (#53: not all)
    picked = sample_indices(labels)
    assert np.bincount(labels[picked]).tolist() == [TEACH_PER_CLASS] * 5 and np.all(np.diff(picked) > 0)
    assert calibration_passes(labels, mirrors=True) == 2 * 5 * TEACH_PER_CLASS  # + the teach sample's mirror images
    assert calibration_passes(labels, mirrors=False) == 5 * TEACH_PER_CLASS  # (a hybrid's keeps the photos alone)
    many = np.repeat(np.arange(100), 300)  # many classes: fewer a class, SAMPLE_PHOTOS in all
    assert np.bincount(many[sample_indices(many)]).tolist() == [SAMPLE_PHOTOS // 100] * 100
    few = np.repeat(np.arange(3), [50, 7, 300])  # a class with fewer photos than its share: all of them
    assert np.bincount(few[sample_indices(few)]).tolist() == [50, 7, TEACH_PER_CLASS]
    assert budget.run_end_seconds(0.02, 4700, 1.5) == pytest.approx(0.02 * 4700 + budget.REPORT_OVER_SAVE * 1.5)
    assert budget.run_end_seconds(0.02, 700, 1.5, cached_photos=4700, cached_per_photo=0.001) == pytest.approx(
        14.0 + 4.7 + budget.REPORT_OVER_SAVE * 1.5)


def test_only_a_model_that_gets_a_new_head_keeps_mirror_images_for_teach(tmp_path):
    """A hybrid's taught classes get a gate on the pooled trunk outputs, measured on samples of the photos alone;
    another model's teach refits its head, on the photos and their mirror images (#53)."""
    from vit_flowers.inference.calibration import keeps_mirrors

    plain = setup.create_model(smoke_config(tmp_path), 5)
    hybrid = setup.create_model(smoke_config(tmp_path, patch_embed="lite0", image_size=64, cache_size=64,
                                               pretrained=None), 5)
    assert keeps_mirrors(plain) and not keeps_mirrors(plain, cached=True)
    assert not keeps_mirrors(hybrid) and not keeps_mirrors(hybrid, cached=True)


def _fake_clock(monkeypatch):
    """trainer's clock made fake: the clock (``clock[0]`` seconds; every reading a microsecond later, so that no
    duration is zero) and ``slow(real, seconds)``: ``real`` moving the clock on by ``seconds`` each call."""
    clock = [0.0]

    def perf_counter():
        clock[0] += 1e-6
        return clock[0]

    def slow(real, seconds):
        def wrapped(*args, **kwargs):
            clock[0] += seconds
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(trainer.time, "perf_counter", perf_counter)
    return clock, slow


def test_the_whole_command_keeps_to_its_budget_on_a_fake_clock(tmp_path, monkeypatch, caplog):
    """A fake clock: each epoch's training 10 s, each validation pass over the 30 val photos 3 s (raw and EMA: 0.1 s
    a photo), so the end of the run should take 0.1 s x 160 photos (80 for the class means, 80 mirror images; the
    validation outputs of best.pt's epoch are read, not passed over again) = 16 s. Against one minute: epoch 1 ends
    at 16 s, epoch 2 at 32 s, and a third would end at 48 s + 16 s: not started (without a report, 3 would end in
    time; the old plan ran 4, to 64 s). The log's last line says the whole command's time against its budget."""
    clock, slow = _fake_clock(monkeypatch)
    monkeypatch.setattr(trainer, "train_one_epoch", slow(trainer.train_one_epoch, 10.0))
    monkeypatch.setattr(epoch_end, "validate", slow(epoch_end.validate, 3.0))
    monkeypatch.setattr(epoch_end, "validate_outputs", slow(epoch_end.validate_outputs, 3.0))  # (fp32: every epoch's)
    flags = ["--config", str(SMOKE), "--out-dir", str(tmp_path / "ck"), "--run-name", "clock", "--epochs", "100",
             "--time-budget", "1", "--threads", "1", "--progress", "false"]
    with caplog.at_level(logging.INFO):
        assert train_mod.main(flags) == 0
    rows = list(csv.DictReader((tmp_path / "ck" / "clock" / "metrics.csv").open()))
    assert len(rows) == 2 and float(rows[-1]["elapsed"]) == pytest.approx(26.0, abs=0.1)  # (before its validation)
    assert "the end of the run should take 16 s" in caplog.text
    assert caplog.records[-1].getMessage() == "the whole command took 0.5 min of its 1-min time budget"
    assert clock[0] < 60.0


def test_an_epoch_stops_early_when_the_machine_slows_down_after_it_was_planned(tmp_path, monkeypatch, caplog):
    """A fake clock: steps of 1 s (5 an epoch), validation passes of 3 s, the end of the run 16 s. Against 64 s,
    epochs end at 11, 22 and 33 s, and a fourth (to 44 s + 16 s) is planned; then the machine gets ten times slower
    (the default's 14-minute run on flowers5 met another process's load in its last epoch: 372 s instead of 120-140,
    17.2 min in all, #53). The fourth epoch's first step takes 10 s: everything after it (its validation, checkpoint
    writes and the end of the run) is counted ten times slower too, and it stops there, not after its five steps
    of 10 s (to 105 s)."""
    clock, slow = _fake_clock(monkeypatch)
    taken = [0]
    real_step = steps._accumulate_gradients

    def step(*args, **kwargs):
        taken[0] += 1
        clock[0] += 1.0 if taken[0] <= 15 else 10.0
        return real_step(*args, **kwargs)

    monkeypatch.setattr(steps, "_accumulate_gradients", step)
    monkeypatch.setattr(epoch_end, "validate", slow(epoch_end.validate, 3.0))
    monkeypatch.setattr(epoch_end, "validate_outputs", slow(epoch_end.validate_outputs, 3.0))
    flags = ["--config", str(SMOKE), "--out-dir", str(tmp_path / "ck"), "--run-name", "slow", "--epochs", "100",
             "--time-budget", str(64 / 60), "--threads", "1", "--progress", "false"]
    with caplog.at_level(logging.INFO):
        assert train_mod.main(flags) == 0
    rows = list(csv.DictReader((tmp_path / "ck" / "slow" / "metrics.csv").open()))
    assert len(rows) == 4 and taken[0] == 15 + 1  # the fourth epoch: one slow step, then its deadline had passed
    assert "it stops after 1 of its 5 steps so that the run ends in time" in caplog.text
    assert clock[0] < 70.0  # 43 s of epochs, 6 s of validation, the end of the run (without the stop: 105 s)


def test_the_first_epoch_plans_its_validation_from_its_own_steps(tmp_path, monkeypatch, caplog):
    """A busy machine from the start (#62: the README's demo beside a test suite took 5.0 min of its 3): before any
    validation has been timed, the first epoch counts what comes after it from its own steps (a forward pass about
    1/STEP_OVER_FORWARD of a step), and no step starts that would end past what that leaves, so the whole command
    ends within its budget, instead of an epoch running to its end."""
    clock, slow = _fake_clock(monkeypatch)
    taken = [0]
    real_step = steps._accumulate_gradients

    def step(*args, **kwargs):  # 16 photos a step: 4 s a photo
        taken[0] += 1
        clock[0] += 64.0
        return real_step(*args, **kwargs)

    monkeypatch.setattr(steps, "_accumulate_gradients", step)
    monkeypatch.setattr(epoch_end, "validate_outputs", slow(epoch_end.validate_outputs, 3.0))
    flags = ["--config", str(SMOKE), "--out-dir", str(tmp_path / "ck"), "--run-name", "busy", "--epochs", "3",
             "--time-budget", "4", "--threads", "1", "--progress", "false"]
    with caplog.at_level(logging.INFO):
        assert train_mod.main(flags) == 0
    rows = list(csv.DictReader((tmp_path / "ck" / "busy" / "metrics.csv").open()))
    # after its first step (64 s, 4 s a photo): 60 validation passes and the end of the run's 190 at 4 / 4.3 s a
    # photo would end past 240 s with another step: the epoch stops (the old deadline ran all five, to 320 s);
    # validated at 0.1 s a photo, a second epoch fits, and stops before the step that would end past the budget
    assert "stops after 1 of its 5 steps so that the run ends in time" in caplog.text
    assert len(rows) == 2 and float(rows[1]["elapsed"]) == pytest.approx(198.0, abs=0.1), rows
    assert clock[0] <= 240.0


def test_time_budget_run_stops_in_time_and_ends_the_schedule(tmp_path):
    cfg = smoke_config(tmp_path, epochs=500, time_budget=0.2, warmup_epochs=1.0, min_lr=1e-6,
                       report=False)  # 12 s from the start (the setup and the first save's imports count), no report
    result = train_mod.train(cfg)
    rows = list(csv.DictReader((result.run_dir / "metrics.csv").open()))
    assert 2 <= len(rows) < 500
    elapsed = [float(r["elapsed"]) for r in rows]
    assert all(b > a for a, b in zip([0.0, *elapsed], elapsed))
    # it stopped where the budget's own plan ended (made on the clock of the moment: test_the_whole_command_keeps_to_
    # its_budget_on_a_fake_clock); no bound on the wall clock here, which a loaded machine stretches
    lrs = [float(r["lr"]) for r in rows]
    assert lrs[-1] < 0.25 * max(lrs)  # the cosine was fitted to the clock (500 epochs would still be at the top)
    last = load_checkpoint(result.run_dir / "last.pt")
    assert last["epoch"] == len(rows)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_lr_schedule_decays_from_the_peak_to_min_lr_and_follows_a_moved_end(schedule):
    cfg = load_config(SMOKE, {"lr": 1.0, "min_lr": 0.0, "lr_schedule": schedule})
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr)
    sched = optim.make_scheduler(optimizer, cfg, decay_steps=100, warmup_steps=10)

    def lr(step: int) -> float:  # the learning rate the optimizer gets after `step` updates
        sched.step_update(step)
        return optimizer.param_groups[0]["lr"]

    assert lr(0) == pytest.approx(0.01) and lr(10) == pytest.approx(1.0)  # warmup from 1% to the peak
    assert lr(60) == pytest.approx(0.5) and lr(110) == pytest.approx(0.0)  # halfway down, and the end
    quarter = {"cosine": (1 + math.cos(math.pi / 4)) / 2, "linear": 0.75}[schedule]
    assert lr(35) == pytest.approx(quarter)  # the shape: a quarter of the way down
    sched.t_initial = 200  # fit() moves the end when the time budget re-plans
    assert lr(110) == pytest.approx(0.5)


def test_bf16_training_runs_and_saves_fp32_weights(tmp_path):
    result = train_mod.train(smoke_config(tmp_path, precision="bf16", epochs=2))
    rows = list(csv.DictReader((result.run_dir / "metrics.csv").open()))
    assert all(math.isfinite(float(r["train_loss"])) for r in rows)
    best = load_checkpoint(result.run_dir / "best.pt")
    assert all(v.dtype == torch.float32 for v in best["model"].values() if v.is_floating_point())


def test_resume_applies_options_even_when_they_equal_the_defaults(tmp_path, caplog):
    """--resume auto --lr 1e-3 --epochs 2 on a run made with lr 2e-3 and 1 epoch: both values equal the dataclass
    defaults of *some* config (lr's default is 1e-3), and what the user typed must still win."""
    common = ["--config", str(SMOKE), "--out-dir", str(tmp_path / "ck"), "--progress", "false", "--threads", "1"]
    assert train_mod.main(common + ["--lr", "2e-3", "--epochs", "1"]) == 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vit_flowers.train"):
        assert train_mod.main(common + ["--resume", "auto", "--lr", "1e-3", "--epochs", "2"]) == 0
    run = (tmp_path / "ck" / "latest").resolve()
    last = load_checkpoint(run / "last.pt")
    assert last["epoch"] == 2 and last["config"]["lr"] == 1e-3
    assert "--resume: lr changed from 0.002 to 0.001" in caplog.text
    assert len(list((tmp_path / "ck").iterdir())) == 2  # the run and the latest link: no new run


def test_resume_keeps_the_values_it_was_not_given(tmp_path):
    first = train_mod.train(smoke_config(tmp_path, epochs=1, lr=2e-3))
    resumed = train_mod.train(smoke_config(tmp_path, resume=str(first.run_dir), epochs=2))
    cfg = load_checkpoint(resumed.run_dir / "last.pt")["config"]
    assert cfg["lr"] == 2e-3 and cfg["epochs"] == 2


def test_train_on_val_trains_on_every_photo_and_keeps_the_last_epoch(tmp_path, caplog):
    from helpers import write_class_folders

    write_class_folders(tmp_path / "photos", per_class=5, classes=["daisy", "rose"])  # 10 photos: 8 train, 2 val
    cfg = smoke_config(tmp_path, dataset="folder", data=str(tmp_path / "photos"), train_on_val=True, epochs=3,
                       run_name="final", report=False, ema=True)
    with caplog.at_level(logging.INFO):
        train_mod.train(cfg)
    assert "10 train, 2 val images (trained on too: train_on_val)" in caplog.text
    best = load_checkpoint(tmp_path / "ck" / "final" / "best.pt")
    assert best["epoch"] == 3 and best["weights"] == "ema"  # nothing held out to choose an earlier epoch by
    with pytest.raises(Exception, match="train_on_val' works for the datasets folder, flower_photos"):
        smoke_config(tmp_path, train_on_val=True)  # synthetic: there is no folder split to fold back


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative name -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_run_under_the_same_name_refuses_and_leaves_the_first_untouched(tmp_path, caplog):
    common = ["--config", str(SMOKE), "--out-dir", str(tmp_path / "ck"), "--run-name", "r", "--progress", "false",
              "--threads", "1", "--epochs", "1", "--report", "false"]
    assert train_mod.main(common) == 0
    run = tmp_path / "ck" / "r"
    (run / "model.onnx").write_bytes(b"an export of the first run")
    before = _files(run)
    caplog.set_level(logging.ERROR)
    assert train_mod.main(common + ["--lr", "2e-3"]) == 2
    assert _files(run) == before  # best.pt byte-identical, nothing added or removed
    message = caplog.text.strip().splitlines()[-1]
    assert f"the run folder {run} already holds a run (best.pt, last.pt, metrics.csv, model.onnx)" in message
    for way_out in ("another --run-name", f"--resume {run}", "--overwrite"):
        assert way_out in message, way_out

    assert train_mod.main(common + ["--overwrite"]) == 0  # deletes the whole folder first
    assert "model.onnx" not in _files(run) and load_checkpoint(run / "best.pt")["config"]["overwrite"] is True
    assert train_mod.main(common[:-4] + ["--resume", str(run), "--epochs", "2", "--report", "false"]) == 0
    assert load_checkpoint(run / "last.pt")["epoch"] == 2  # resuming writes into the run's folder


def test_a_start_that_fails_leaves_no_run_folder_and_keeps_the_run_it_would_overwrite(tmp_path, caplog):
    common = ["--config", str(SMOKE), "--out-dir", str(tmp_path / "ck"), "--progress", "false", "--threads", "1",
              "--epochs", "1", "--report", "false"]
    for name in (["--run-name", "a"], ["--run-name", "b"], []):  # explicit names, the default name
        assert train_mod.main(common + ["--data", str(tmp_path / "missing"), *name]) == 2
    assert "data folder not found" in caplog.text
    assert not (tmp_path / "ck").exists()  # neither the run folders nor the out_dir made for them
    assert train_mod.main(common + ["--run-name", "r"]) == 0
    before = _files(tmp_path / "ck" / "r")
    assert train_mod.main(common + ["--run-name", "r", "--overwrite", "--data", str(tmp_path / "missing")]) == 2
    assert _files(tmp_path / "ck" / "r") == before  # the folder is cleared only once the new run has started


def test_runs_with_the_default_name_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    class Frozen(setup.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2024, 6, 11, 12, 0, 0)

    monkeypatch.setattr(setup, "datetime", Frozen)
    first = train_mod.train(smoke_config(tmp_path, epochs=1, report=False))
    second = train_mod.train(smoke_config(tmp_path, epochs=1, report=False))
    assert first.run_dir.name == "synthetic-20240611-120000" and second.run_dir.name == "synthetic-20240611-120000-2"
    assert load_checkpoint(first.run_dir / "best.pt")["epoch"] == 1


def test_overwrite_and_resume_together_are_a_config_error():
    with pytest.raises(Exception, match="'overwrite' and 'resume'"):
        load_config(SMOKE, {"overwrite": True, "resume": "auto"})


def test_micro_batches_give_the_update_of_the_whole_batch(tmp_path, monkeypatch):
    """``micro_batch`` splits each step's forward/backward (mixup pairs drawn on the whole batch first): an uneven
    split (16 = 6 + 6 + 4) runs three passes a step, and the weights after two epochs equal the whole-batch run's up
    to float rounding."""
    cfg = dict(epochs=2, mixup=0.2, cutmix=0.5, dropout=0.0, drop_path=0.0)
    whole = load_checkpoint(train_mod.train(smoke_config(tmp_path / "a", **cfg)).run_dir / "last.pt")
    sizes: list[int] = []
    real = steps._step_loss

    def counted(run, batch):
        sizes.append(len(batch))
        return real(run, batch)

    monkeypatch.setattr(steps, "_step_loss", counted)
    parts = load_checkpoint(train_mod.train(smoke_config(tmp_path / "b", micro_batch=6, **cfg)).run_dir / "last.pt")
    assert sizes[:3] == [6, 6, 4] and set(sizes) <= {6, 4}
    for key, value in whole["train_state"]["model"].items():
        torch.testing.assert_close(parts["train_state"]["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert whole["train_state"]["history"][-1]["train_loss"] == pytest.approx(
        parts["train_state"]["history"][-1]["train_loss"], rel=1e-4)


def _count_calibration_passes(monkeypatch, with_cached: bool = False) -> list:
    """The passes of the end of a run over photos (calibration.batch_outputs), as they happen: each one's number of
    photos, with whether it read cached trunk outputs (``with_cached``: ``(photos, cached)``)."""
    from vit_flowers.inference import calibration

    passes: list = []
    real = calibration.batch_outputs

    def counted(model, images, *args, cached=False, **kwargs):
        passes.append((len(images), cached) if with_cached else len(images))
        return real(model, images, *args, cached=cached, **kwargs)

    monkeypatch.setattr(calibration, "batch_outputs", counted)
    return passes


def test_the_end_of_the_run_reads_the_last_validation_instead_of_another_pass(tmp_path, monkeypatch):
    """The last planned epoch validates in fp32 and keeps what it saw; when that epoch is best.pt's, the unknown
    rule reads those outputs instead of passing over the validation photos again (#53), and chooses the same
    threshold as a fresh pass over them."""
    from vit_flowers.inference import calibration
    from vit_flowers.runs.checkpoint import load_model
    from vit_flowers.training.distributed import Dist

    run = trainer.start_run(smoke_config(tmp_path, epochs=1, run_name="reuse"), Dist(), torch.device("cpu"))
    trainer.fit(run)
    assert run.kept.val_outputs is not None and run.kept.val_outputs[0] == 1
    passes = _count_calibration_passes(monkeypatch)
    trainer.final_report(run)
    n_train, n_val = len(run.data.train), len(run.data.val)
    assert passes == [n_train, n_train]  # the class means' sample and the teach sample's mirror images: no val pass
    model, ckpt = load_model(run.run_dir / "best.pt")
    fresh = calibration.calibrate_checkpoint(model, ckpt, run.data.train, run.data.val)
    assert passes[2:] == [n_train, n_val, n_train]  # (a fresh calibration passes over the val photos)
    assert fresh["unknown"]["threshold"] == pytest.approx(ckpt["unknown"]["threshold"], rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("head_start_kept", [True, False])
def test_the_end_of_a_hybrid_run_reads_the_head_starts_rule_while_best_pt_keeps_it(tmp_path, monkeypatch,
                                                                                head_start_kept):
    """Before the trunk trains, the end of the run for best.pt's head-start weights is computed over the trunk
    cache (seconds): when no end-to-end epoch replaces the head start in best.pt, the end reads it instead of passing
    the model over the training photos (#53); when one does, the rule passes over the training sample (a hybrid's:
    no mirror images) and reads that epoch's validation outputs."""
    from vit_flowers.training.distributed import Dist

    real_validate = epoch_end.validate_outputs

    def scored(model, data, device, batch_size):  # the end-to-end epochs far below the head start, or far above
        loss, _, out = real_validate(model, data, device, batch_size)
        return loss, 0.0 if head_start_kept else 1.0, out

    monkeypatch.setattr(epoch_end, "validate_outputs", scored)
    passes = _count_calibration_passes(monkeypatch, with_cached=True)
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", patch_size=32, image_size=64,
                       cache_size=64, token_epochs=2, epochs=1, end_to_end_min_per_class=0, run_name="h")
    run = trainer.start_run(cfg, Dist(), torch.device("cpu"))
    trainer.fit(run)
    assert run.kept.head_start_end is not None and run.kept.trunk_cache is None
    n_train = len(run.data.train)
    assert passes == [(n_train, True), (len(run.data.val), True)]  # over the cache, before the trunk trained
    assert run_end.rule_at_hand(run) == head_start_kept
    trainer.final_report(run)
    best = load_checkpoint(run.run_dir / "best.pt")
    assert (best["epoch"] <= 2) == head_start_kept
    if head_start_kept:  # no pass of the model over the photos: the rule computed before the trunk trained
        assert passes[2:] == []
        assert best["unknown"]["threshold"] == run.kept.head_start_end.ckpt["unknown"]["threshold"]
    else:  # the rule's pass over the training photos, the validation outputs of the epoch read
        assert passes[2:] == [(n_train, False)]


def test_an_fp32_run_reads_the_validation_of_its_best_epoch_when_that_is_not_the_last(tmp_path, monkeypatch):
    """In fp32 every end-to-end epoch keeps its validation outputs (the same pass): when best.pt keeps an earlier
    epoch than the last, the end of the run reads that epoch's outputs instead of passing over the validation photos
    again, and the plan does not count that pass (#53)."""
    from vit_flowers.training.distributed import Dist

    real_validate = epoch_end.validate_outputs
    worse = iter([0.9, 0.9, 0.1, 0.1])  # epoch 1 (raw, EMA), then a worse epoch 2

    def scored(model, data, device, batch_size):
        loss, _, out = real_validate(model, data, device, batch_size)
        return loss, next(worse), out

    monkeypatch.setattr(epoch_end, "validate_outputs", scored)
    run = trainer.start_run(smoke_config(tmp_path, epochs=2, run_name="early"), Dist(), torch.device("cpu"))
    trainer.fit(run)
    assert run.kept.val_outputs is not None and run.kept.val_outputs[0] == 1
    n_train, n_val = len(run.data.train), len(run.data.val)
    run.speeds.forward, run.speeds.save = 1.0, 0.0
    assert run_end.end_of_run_seconds(run, cached=False) == pytest.approx(2 * n_train)  # no val pass planned
    passes = _count_calibration_passes(monkeypatch)
    trainer.final_report(run)
    assert load_checkpoint(run.run_dir / "best.pt")["epoch"] == 1
    assert passes == [n_train, n_train] and n_val not in passes


def test_resume_auto_with_nothing_to_resume_refuses_in_one_line(tmp_path, caplog):
    """`train --data PHOTOS --resume auto` in a folder of no run trained the quick start (the pure ViT at 64 px),
    not the photo recipe that the same command without --resume trains: it now refuses, naming the folder."""
    from helpers import write_class_folders

    from vit_flowers.runs.checkpoint import mark_latest

    photos = write_class_folders(tmp_path / "photos", 4)
    out = tmp_path / "ck"
    argv = ["--data", str(photos), "--out-dir", str(out), "--resume", "auto", "--epochs", "1", "--time-budget", "0",
            "--threads", "1", "--progress", "false", "--report", "false", "--cache-dir", str(tmp_path / "cache")]
    caplog.set_level(logging.ERROR)
    assert train_mod.main(argv) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"--resume auto: nothing to resume in {out}/ (no run folder): start a new run with the same "
                      f"command without --resume"], errors
    assert not out.exists() or not any(out.iterdir())  # nothing started

    (out / "stopped").mkdir(parents=True)  # a run stopped in its first epoch: a folder, no last.pt
    (out / "stopped" / "config.yaml").write_text("epochs: 1\n")
    mark_latest(out / "stopped")
    caplog.clear()
    assert train_mod.main(argv) == 2
    assert "its newest run, stopped, ended no epoch" in caplog.text
    assert sorted(p.name for p in out.iterdir()) == ["latest", "stopped"]


def test_ctrl_c_names_a_command_that_continues_the_run_on_its_photos(tmp_path, monkeypatch, caplog):
    import shlex

    from helpers import write_class_folders

    photos = write_class_folders(tmp_path / "photos", 4)
    common = ["--config", str(SMOKE), "--dataset", "folder", "--data", str(photos), "--out-dir",
              str(tmp_path / "ck"), "--progress", "false", "--threads", "1", "--epochs", "3", "--report", "false",
              "--cache-dir", str(tmp_path / "cache")]
    real_epoch, calls = trainer.train_one_epoch, {"n": 0, "at": 1}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            raise KeyboardInterrupt
        return real_epoch(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_one_epoch", interrupted)
    caplog.set_level(logging.ERROR)
    assert train_mod.main(common + ["--run-name", "first"]) == 130  # in the first epoch: nothing to resume
    assert caplog.records[-1].getMessage() == ("interrupted in the first epoch: nothing to resume; run the same "
                                               "command again to start afresh")
    calls.update(n=0, at=2)
    caplog.clear()
    assert train_mod.main(common + ["--run-name", "second"]) == 130
    line = caplog.records[-1].getMessage()
    assert line.startswith("interrupted: the last completed epoch is saved; continue with `"), line
    command = shlex.split(line.split("`")[1])
    run = tmp_path / "ck" / "second"
    assert command == ["python", "-m", "vit_flowers.train", "--resume", str(run), "--data", str(photos)]
    assert train_mod.main(command[3:]) == 0  # the command given, as given
    last = load_checkpoint(run / "last.pt")
    assert last["epoch"] == 3 and last["config"]["data"] == str(photos) and last["config"]["dataset"] == "folder"


def test_time_budget_0_says_no_limit_in_its_help_and_in_the_log(tmp_path, caplog):
    option = next(a for a in train_mod.build_parser()._actions if "--time-budget" in a.option_strings)
    assert "0 = no limit" in (option.help or "")
    with caplog.at_level(logging.INFO, logger="vit_flowers.train"):
        train_mod.train(smoke_config(tmp_path, epochs=1, time_budget=0.0, report=False))
    assert "1 end-to-end epochs of 5 steps (2 of warmup); time budget 0: no limit, every epoch runs" in caplog.text
