"""Objectives (vit_flowers/training/objectives.py): cross-entropy and distillation give the losses they always gave,
bit for bit; an objective's state survives --resume; a new objective plugs into the trainer's step without touching
the loop, and what it logs reaches metrics.csv."""

from __future__ import annotations

import csv
import logging
import types

import pytest
import torch
import torch.nn.functional as F
from helpers import smoke_config

from vit_flowers import train as train_mod
from vit_flowers.models.vit import create_vit
from vit_flowers.runs.checkpoint import load_checkpoint
from vit_flowers.training import saving, setup, steps
from vit_flowers.training.config import load_config
from vit_flowers.training.distill import Teacher, distill_loss
from vit_flowers.training.objectives import (
    Batch,
    CrossEntropy,
    Distillation,
    Objective,
    make_objective,
    objective_state,
    restore_objective,
)


def _batch(n=6, classes=5, size=32, mixed=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    targets = torch.softmax(torch.randn(n, classes, generator=g), -1) if mixed else None
    return torch.randn(n, classes, generator=g), Batch(torch.randn(n, 3, size, size, generator=g), labels, targets)


def test_cross_entropy_is_torchs_with_label_smoothing_or_the_soft_targets_one():
    logits, batch = _batch()
    loss, logs = CrossEntropy(label_smoothing=0.1).loss(logits, batch)
    assert torch.equal(loss, F.cross_entropy(logits, batch.labels, label_smoothing=0.1)) and logs == {}
    assert not torch.equal(loss, F.cross_entropy(logits, batch.labels))  # the smoothing is applied
    logits, mixed = _batch(mixed=True)
    soft, _ = CrossEntropy(label_smoothing=0.1).loss(logits, mixed)  # mixup's targets carry their own smoothing
    by_hand = (-mixed.targets * F.log_softmax(logits, -1)).sum(-1).mean()
    torch.testing.assert_close(soft, by_hand, rtol=1e-6, atol=1e-7)


def _teacher(image_size=48, seed=1):
    torch.manual_seed(seed)
    return Teacher(create_vit("vit_micro", num_classes=5, image_size=image_size), image_size)


@pytest.mark.parametrize("mixed", [False, True])
def test_distillation_is_the_weighted_kl_to_the_teacher_plus_the_cross_entropy(mixed):
    teacher = _teacher()
    logits, batch = _batch(size=48, mixed=mixed)
    w, t = 0.7, 2.0
    objective = Distillation(teacher, w, t, labels=CrossEntropy(0.1))
    loss, logs = objective.loss(logits, batch)
    ce = CrossEntropy(0.1).loss(logits, batch)[0]
    # the trainer's formula before objectives, op for op: the same bits
    assert torch.equal(loss, (1 - w) * ce + w * distill_loss(logits, teacher(batch.views), t))
    p = F.softmax(teacher(batch.views) / t, -1)  # the KL written out
    kl = (p * (p.log() - F.log_softmax(logits / t, -1))).sum(-1).mean() * t * t
    torch.testing.assert_close(logs["kl"], kl, rtol=1e-5, atol=1e-6)
    assert torch.equal(logs["ce"], ce) and not logs["kl"].requires_grad
    torch.testing.assert_close(loss, (1 - w) * ce + w * kl, rtol=1e-5, atol=1e-6)
    assert objective.view_size(32) == 48 and objective.view_size(64) == 64 and CrossEntropy().view_size(32) == 32


def test_distillation_probes_its_teachers_precision_and_a_resumed_run_keeps_it():
    teacher, calls = _teacher(), []

    def probe(model, size, *, what, resumed=None):
        calls.append((model, size, what, resumed))
        return torch.bfloat16 if resumed in (None, "bf16") else None

    objective = Distillation(teacher, 0.5)
    objective.setup(probe)
    assert calls == [(teacher.model, 48, "teacher's forward pass", None)] and teacher.amp_dtype == torch.bfloat16
    saved = objective_state(objective)
    assert saved == {"name": "distillation", "state": {"teacher_amp": "bf16"}}
    again = Distillation(_teacher(), 0.5)
    restore_objective(again, {"name": "distillation", "state": {"teacher_amp": "fp32"}})
    again.setup(probe)
    assert calls[-1][3] == "fp32" and again.teacher.amp_dtype is None  # the probe was told the resumed choice


def test_state_from_another_objective_or_an_old_checkpoint_is_not_given(caplog):
    class Remembers(CrossEntropy):
        name = "remembers"
        state: dict = {}

        def load_state_dict(self, state):
            self.state = state

    objective = Remembers()
    restore_objective(objective, None)  # a last.pt from before objectives had state
    with caplog.at_level(logging.INFO):
        restore_objective(objective, {"name": "distillation", "state": {"teacher_amp": "bf16"}})
    assert objective.state == {} and "objective changed from distillation to remembers" in caplog.text
    restore_objective(objective, {"name": "remembers", "state": {"n": 3}})
    assert objective.state == {"n": 3}


def test_make_objective_reads_the_config():
    plain = make_objective(load_config(None, {"label_smoothing": 0.2}), ["a", "b"], torch.device("cpu"))
    assert type(plain) is CrossEntropy and plain.label_smoothing == 0.2


class Counting(Objective):
    """A test's own objective: cross-entropy plus a constant, logging the constant and each micro-batch's size;
    its state counts the micro-batches it has seen (kept across --resume)."""

    name = "counting"

    def __init__(self, extra: float = 0.25) -> None:
        self.extra, self.calls, self.resumed_calls = extra, 0, None

    def loss(self, logits, batch):
        self.calls += 1
        return (F.cross_entropy(logits, batch.labels) + self.extra,
                {"extra": torch.tensor(self.extra), "size": torch.tensor(float(len(batch)))})

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.resumed_calls = self.calls = state["calls"]


def test_a_new_objective_plugs_into_the_step_and_its_logs_come_back():
    """The trainer's step (:func:`steps._accumulate_gradients`) on a run holding a test-defined objective: an
    uneven micro-batch split (6 = 4 + 2) calls it twice, the loss is its loss, each log the batch's mean."""
    torch.manual_seed(0)
    model = create_vit("vit_micro", num_classes=5, image_size=32).eval()  # no dropout: one forward to compare
    cfg = load_config(None, {"micro_batch": 4, "image_size": 32, "cache_size": 32, "model": "vit_micro"})
    parts = types.SimpleNamespace(mixup=None, amp_dtype=None, objective=Counting())
    run = types.SimpleNamespace(cfg=cfg, steps=parts, step_net=model, model=model, device=torch.device("cpu"))
    _, batch = _batch(size=32)
    loss, logits, logs = steps._accumulate_gradients(run, batch.views, batch.labels)
    assert parts.objective.calls == 2
    torch.testing.assert_close(loss, F.cross_entropy(model(batch.views), batch.labels) + 0.25, rtol=1e-5, atol=1e-6)
    assert logs["extra"].item() == pytest.approx(0.25)
    assert logs["size"].item() == pytest.approx((4 * 4 + 2 * 2) / 6)  # weighted by each part's share, as the loss
    assert logits.shape == (6, 5) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_new_objectives_logs_reach_metrics_csv_and_its_state_survives_resume(tmp_path, monkeypatch):
    made: list[Counting] = []

    def make(cfg, classes, device):
        made.append(Counting())
        return made[-1]

    monkeypatch.setattr(setup, "make_objective", make)
    first = train_mod.train(smoke_config(tmp_path, run_name="own", epochs=2, report=False)).run_dir
    rows = list(csv.DictReader((first / "metrics.csv").open()))
    assert list(rows[0])[:len(saving.METRIC_COLUMNS)] == saving.METRIC_COLUMNS  # today's columns, in order
    assert [float(r["train_extra"]) for r in rows] == pytest.approx([0.25, 0.25])
    saved = load_checkpoint(first / "last.pt")["train_state"]["objective"]
    assert saved == {"name": "counting", "state": {"calls": made[0].calls}} and made[0].calls > 0
    train_mod.train(load_config(None, {"resume": str(first), "epochs": 3, "progress": False, "report": False}))
    assert made[1].resumed_calls == made[0].calls and made[1].calls > made[0].calls
    assert len(list(csv.DictReader((first / "metrics.csv").open()))) == 3
