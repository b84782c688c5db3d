"""A run stopped in any phase of its plan and resumed ends where an uninterrupted run ends (#62): inside the hybrid's
head start (its optimizer and schedule from last.pt, the rest of its epochs, then end to end), inside the end-to-end
epochs, and at the end of the run (a small folder's frozen-feature start: its report, unknown rule and refit made
from the head start's cached outputs again). The pure ViT's end-to-end resume: tests/test_train.py."""

from __future__ import annotations

import pytest
import torch
from helpers import smoke_config

from vit_flowers import train as train_mod
from vit_flowers.runs.checkpoint import load_checkpoint
from vit_flowers.training import trainer
from vit_flowers.training.token_cache import TokenPhase

HYBRID = dict(pretrained="imagenet", patch_embed="lite0", patch_size=32, image_size=64, cache_size=64,
              synthetic_train_per_class=8, synthetic_val_per_class=4, feature_extras="none", report=False)
THEN_END_TO_END = dict(HYBRID, token_epochs=3, epochs=2, end_to_end_min_per_class=0, feature_head="off")


def _stop_at(monkeypatch, owner, name: str, call: int) -> None:
    """``owner.name`` raises KeyboardInterrupt (Ctrl-C) at its ``call``-th call."""
    real, calls = getattr(owner, name), [0]

    def stopped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, stopped)


def _same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


def _interrupted_then_resumed(tmp_path, monkeypatch, settings: dict, owner, name: str, call: int):
    with monkeypatch.context() as m:
        _stop_at(m, owner, name, call)
        with pytest.raises(KeyboardInterrupt):
            train_mod.train(smoke_config(tmp_path, run_name="r", **settings))
    return train_mod.train(smoke_config(tmp_path, resume=str(tmp_path / "ck" / "r"), **settings)).run_dir


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return train_mod.train(smoke_config(tmp_path_factory.mktemp("full"), run_name="full",
                                        **THEN_END_TO_END)).run_dir


@pytest.mark.parametrize("phase", ["head start", "end to end"])
def test_a_run_stopped_in_its_head_start_or_end_to_end_resumes_to_the_same_weights(tmp_path, monkeypatch,
                                                                                  uninterrupted, phase):
    """Ctrl-C in the second head-start epoch (one on the cached trunk outputs saved), or in the second end-to-end
    epoch: the resumed run trains what is left of the plan, and its weights, its best.pt and every metrics row's
    validation figures are the uninterrupted run's."""
    owner, name = (TokenPhase, "train_epoch") if phase == "head start" else (trainer, "train_one_epoch")
    run_dir = _interrupted_then_resumed(tmp_path, monkeypatch, THEN_END_TO_END, owner, name, 2)
    a, b = (load_checkpoint(d / "last.pt") for d in (uninterrupted, run_dir))
    assert [r["trunk_frozen"] for r in b["train_state"]["history"]] == [1, 1, 1, 0, 0]
    assert [r["val_acc"] for r in b["train_state"]["history"]] == [r["val_acc"] for r in a["train_state"]["history"]]
    _same_weights(a["train_state"]["model"], b["train_state"]["model"])
    _same_weights(a["train_state"]["ema"], b["train_state"]["ema"])
    best_a, best_b = (load_checkpoint(d / "best.pt") for d in (uninterrupted, run_dir))
    assert best_a["epoch"] == best_b["epoch"]
    _same_weights(best_a["model"], best_b["model"])


def test_a_small_folders_run_stopped_at_its_end_resumes_its_report_and_refit(tmp_path, monkeypatch):
    """The small folder's plan (the frozen-feature start, one head-start epoch, no end to end), stopped in its report:
    the resumed run rebuilds the head start's cached outputs, writes the report and the unknown rule, and refits the
    feature head on every photo, as the uninterrupted run did."""
    settings = dict(HYBRID, report=True, token_epochs=6)
    full = train_mod.train(smoke_config(tmp_path / "full", run_name="full", **settings)).run_dir
    run_dir = _interrupted_then_resumed(tmp_path / "stopped", monkeypatch, settings, train_mod, "final_report", 1)
    a, b = (load_checkpoint(d / "best.pt") for d in (full, run_dir))
    assert b["train_state"] is None and b["unknown"] is not None and (run_dir / "report" / "report.html").is_file()
    assert len(load_checkpoint(run_dir / "last.pt")["train_state"]["history"]) == 1
    _same_weights(a["model"], b["model"])  # the refit included
    assert a["unknown"]["threshold"] == pytest.approx(b["unknown"]["threshold"], rel=1e-6)
