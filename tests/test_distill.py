"""Distillation (vit_flowers/training/distill.py): the loss, the frozen teacher at its own input size, the checks on a
teacher file, and a student that really learns the teacher's function rather than the labels."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from helpers import smoke_config

from vit_flowers import train as train_mod
from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD
from vit_flowers.data.synthetic import CLASSES
from vit_flowers.inference import precision
from vit_flowers.models.vit import create_vit
from vit_flowers.runs.checkpoint import CheckpointError, load_checkpoint, load_model, make_checkpoint, save_checkpoint
from vit_flowers.training import setup, trainer
from vit_flowers.training.config import ConfigError, load_config
from vit_flowers.training.distill import Teacher, distill_loss, load_teacher
from vit_flowers.training.distributed import Dist


def test_distill_loss_is_the_kl_to_the_teacher_times_t_squared():
    torch.manual_seed(0)
    student, teacher = torch.randn(8, 5), torch.randn(8, 5)
    assert distill_loss(teacher, teacher).item() == pytest.approx(0.0, abs=1e-6)
    p = F.softmax(teacher / 2, -1)
    kl = (p * (p.log() - F.log_softmax(student / 2, -1))).sum(-1).mean()
    assert distill_loss(student, teacher, temperature=2.0).item() == pytest.approx(4 * kl.item(), rel=1e-5)
    student.requires_grad_(True)
    distill_loss(student, teacher).backward()
    assert student.grad.abs().sum() > 0  # the student gets gradients, the teacher's logits are targets


def test_teacher_stays_frozen_in_eval_mode_and_sees_views_at_its_own_size():
    model = create_vit("vit_micro", num_classes=5, image_size=48, dropout=0.5)
    teacher = Teacher(model, image_size=48)
    teacher.train()  # what the trainer does to everything it trains: the teacher must not follow
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    views = torch.randn(3, 3, 32, 32)  # the student's size
    out = teacher(views)
    assert out.shape == (3, 5) and out.dtype == torch.float32 and not out.requires_grad
    big = F.interpolate(views, size=(48, 48), mode="bilinear", antialias=True, align_corners=False)
    assert torch.allclose(out, model(big), atol=1e-5)
    assert torch.equal(teacher(views), out)  # eval mode: dropout off, the same views give the same logits


def test_teacher_runs_under_its_own_precision_not_the_callers():
    """The student's bf16 autocast must not reach the teacher chosen fp32, nor the reverse."""
    torch.manual_seed(0)
    model = create_vit("vit_micro", num_classes=5, image_size=32)
    views = torch.randn(4, 3, 32, 32)
    exact = model.eval()(views)
    fp32_teacher, bf16_teacher = Teacher(model, image_size=32), Teacher(model, image_size=32,
                                                                       amp_dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.allclose(fp32_teacher(views), exact, atol=1e-5)  # the caller's bf16 did not apply
    in_bf16 = bf16_teacher(views)
    assert in_bf16.dtype == torch.float32 and not torch.allclose(in_bf16, exact, atol=1e-5)
    assert torch.allclose(in_bf16, exact, atol=0.3)  # bf16 arithmetic: close, not equal


def test_auto_precision_probes_the_teacher_apart_from_the_student(tmp_path, caplog, monkeypatch):
    """Under ``precision: auto`` the trainer times the teacher's own forward pass (eval, no autograd) and
    keeps its choice on the teacher: here a probe that finds bf16 fast for the teacher only."""
    teacher = _save_teacher(tmp_path / "teacher.pt")
    probed = []

    def fake_speedup(model, example, *, train):
        probed.append((type(model).__name__, train, tuple(example.shape[-2:])))
        return 1.0 if train else 2.0
    monkeypatch.setattr(setup, "bf16_speedup", fake_speedup)
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: None)  # the fake probe decides, whatever this CPU
    cfg = smoke_config(tmp_path, run_name="student", teacher=str(teacher), precision="auto", epochs=1,
                       cache_size=48, report=False)
    with caplog.at_level(logging.INFO):
        run = trainer.start_run(cfg, Dist(), torch.device("cpu"))
    assert run.steps.amp_dtype is None and run.steps.objective.teacher.amp_dtype == torch.bfloat16
    assert ("ViT", False, (48, 48)) in probed and any(train for _, train, _ in probed)
    assert "teacher's forward pass ran 2.00x" in caplog.text


def _save_teacher(path, classes=CLASSES, mean=IMAGENET_MEAN, image_size=48, favourite=None):
    """A vit_micro checkpoint; with ``favourite`` its head ignores the image and always predicts that class."""
    model = create_vit("vit_micro", num_classes=len(classes), image_size=image_size)
    if favourite is not None:
        with torch.no_grad():
            model.mlp_head.weight.zero_()
            model.mlp_head.bias.copy_(torch.full((len(classes),), -4.0).index_fill_(0, torch.tensor(favourite),
                                                                                           4.0))
    cfg = load_config(None, {"model": "vit_micro", "image_size": image_size}).flat()
    save_checkpoint(make_checkpoint(model, classes=list(classes), image_size=image_size, mean=list(mean),
                                    std=list(IMAGENET_STD), config=cfg, epoch=1, best_accuracy=0.9), path)
    return path


def test_a_teacher_must_exist_know_the_same_classes_and_normalise_alike(tmp_path):
    with pytest.raises(CheckpointError, match=r"teacher: .*not found.*Train the teacher first"):
        load_teacher(tmp_path / "nowhere.pt", CLASSES, IMAGENET_MEAN, IMAGENET_STD, torch.device("cpu"))
    other = _save_teacher(tmp_path / "other.pt", classes=list(reversed(CLASSES)))
    with pytest.raises(CheckpointError, match=r"other\.pt was trained on the classes"):
        load_teacher(other, CLASSES, IMAGENET_MEAN, IMAGENET_STD, torch.device("cpu"))
    shifted = _save_teacher(tmp_path / "shifted.pt", mean=[0.5, 0.5, 0.5])
    with pytest.raises(CheckpointError, match=r"shifted\.pt normalises its input with mean"):
        load_teacher(shifted, CLASSES, IMAGENET_MEAN, IMAGENET_STD, torch.device("cpu"))
    folder = tmp_path / "run"
    _save_teacher(folder / "best.pt")
    assert load_teacher(folder, CLASSES, IMAGENET_MEAN, IMAGENET_STD, torch.device("cpu")).image_size == 48


def test_distillation_keys_are_checked():
    with pytest.raises(ConfigError, match="distill_weight"):
        load_config(None, {"distill_weight": 1.5})
    with pytest.raises(ConfigError, match="distill_temperature"):
        load_config(None, {"distill_temperature": 0})


def test_a_missing_teacher_fails_the_start_and_leaves_no_run_folder(tmp_path):
    """Named before the photos are read (#53): here they are a folder that does not exist, the error otherwise."""
    cfg = smoke_config(tmp_path, teacher=str(tmp_path / "no-teacher"), run_name="student", dataset="folder",
                       data=str(tmp_path / "no-photos"))
    with pytest.raises(CheckpointError, match="Train the teacher first"):
        train_mod.train(cfg)
    assert not (tmp_path / "ck" / "student").exists()


def _val_predictions(run_dir):
    model, ckpt = load_model(run_dir / "last.pt")
    from vit_flowers.data.augment import eval_transform
    from vit_flowers.data.synthetic import make_synthetic_flowers

    images, _ = make_synthetic_flowers(6, 32, seed=99)
    with torch.no_grad():
        return model(eval_transform(images, 32, ckpt["mean"], ckpt["std"])).argmax(-1)


def test_the_student_learns_the_teachers_function_not_the_labels(tmp_path, caplog):
    """A teacher that calls every image its favourite class: a student taught by it alone (distill_weight 1)
    predicts that class everywhere; with distill_weight 0 the teacher is ignored and the labels rule."""
    teacher = _save_teacher(tmp_path / "teacher.pt", favourite=2)  # 48 px: the views are made at 48 and resized
    common = dict(teacher=str(teacher), epochs=4, lr=3e-3, warmup_epochs=0, mixup=0.8, cutmix=1.0, mixup_prob=0.5,
                  cache_size=48, report=False)
    with caplog.at_level(logging.INFO):
        taught = train_mod.train(smoke_config(tmp_path, run_name="taught", distill_weight=1.0, **common)).run_dir
    assert "teacher: " in caplog.text and "48 px" in caplog.text
    labels_only = train_mod.train(smoke_config(tmp_path, run_name="labels", distill_weight=0.0, **common)).run_dir
    assert (_val_predictions(taught) == 2).float().mean() > 0.9
    assert (_val_predictions(labels_only) == 2).float().mean() < 0.6
    saved = load_checkpoint(taught / "last.pt")
    resumed = setup.merge_resumed_config(load_config(None, {"resume": str(taught), "epochs": 5}), saved["config"],
                                           taught / "last.pt")
    # a resumed student keeps its teacher
    assert resumed.distill.teacher == str(teacher) and resumed.distill.distill_weight == 1.0
