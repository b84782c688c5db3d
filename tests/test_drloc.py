import pytest
import torch
from helpers import smoke_config
from torch import nn

from vit_flowers import train as train_mod
from vit_flowers import trainer
from vit_flowers.checkpoint import load_checkpoint
from vit_flowers.config import ConfigError, load_config
from vit_flowers.models.drloc import RelativeLocalization
from vit_flowers.models.vit import create_vit


class PositionTokens(nn.Module):
    """A stand-in ViT whose patch tokens are their own (row, column) one-hot codes on a k x k grid."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.grid_size, self.config = k, {"dim": 2 * k}
        rows, cols = torch.arange(k).repeat_interleave(k), torch.arange(k).repeat(k)  # row-major
        codes = torch.cat((nn.functional.one_hot(rows, k), nn.functional.one_hot(cols, k)), dim=1).float()
        self.register_buffer("codes", torch.cat((torch.zeros(1, 2 * k), codes)))  # (1 + N, 2k), CLS first

    def forward_features(self, images):
        return self.codes.expand(images.shape[0], -1, -1)

    def forward_head(self, tokens):
        return tokens[:, 0, :5]


def test_the_offsets_it_asks_for_are_the_token_distances():
    """Tokens that carry their own position make the task learnable to near zero error, and what the head
    then answers for two given tokens is their (row, column) distance over the grid side."""
    torch.manual_seed(0)
    task = RelativeLocalization(PositionTokens(6), pairs=64, hidden=64)
    opt = torch.optim.Adam(task.mlp.parameters(), lr=3e-3)
    images = torch.zeros(16, 3, 8, 8)
    first = task(images)[1].item()
    for _ in range(600):
        loss = task(images)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 0.1 and loss.item() < 0.02
    codes = task.vit.codes[1:]  # (36, 12), token r * 6 + c is at row r, column c
    with torch.no_grad():
        guess = task.mlp(torch.cat((codes[0 * 6 + 0], codes[2 * 6 + 5])))  # (0, 0) and (2, 5)
        back = task.mlp(torch.cat((codes[4 * 6 + 1], codes[1 * 6 + 3])))  # (4, 1) and (1, 3)
    torch.testing.assert_close(guess, torch.tensor([2 / 6, 5 / 6]), atol=0.05, rtol=0)  # (|rows|, |columns|) / k
    torch.testing.assert_close(back, torch.tensor([3 / 6, 2 / 6]), atol=0.05, rtol=0)


def test_logits_are_the_vits_and_the_loss_reaches_the_vit():
    torch.manual_seed(0)
    vit = create_vit("vit_micro", 5, image_size=32).eval()
    task = RelativeLocalization(vit, pairs=8)
    x = torch.randn(3, 3, 32, 32)
    logits, aux = task(x)
    torch.testing.assert_close(logits, vit(x), atol=1e-5, rtol=1e-5)
    aux.backward()
    assert aux.ndim == 0 and vit.pos_embedding.grad.abs().sum() > 0 and vit.mlp_head.weight.grad is None


def test_bad_settings_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="at least 2x2"):
        RelativeLocalization(create_vit("vit_micro", 5, image_size=32, patch_size=32))
    with pytest.raises(ValueError, match="pairs must be positive"):
        RelativeLocalization(create_vit("vit_micro", 5, image_size=32), pairs=0)
    with pytest.raises(ConfigError, match="drloc_pairs"):
        load_config(None, {"drloc_pairs": 0})
    with pytest.raises(ConfigError, match="drloc"):
        load_config(None, {"drloc": -0.1})
    with pytest.raises(ConfigError, match="'drloc' needs at least 2x2 patches"):
        load_config(None, {"drloc": 0.1, "image_size": 16, "patch_size": 16})


def test_training_with_it_keeps_the_head_on_the_schedule_and_out_of_the_checkpoint(tmp_path, monkeypatch):
    seen = {}
    real_epoch = trainer.train_one_epoch

    def spy(run, *args, **kwargs):
        out = real_epoch(run, *args, **kwargs)
        seen["lrs"] = [group["lr"] for group in run.optimizer.param_groups]
        seen["model"] = run.net
        return out

    monkeypatch.setattr(trainer, "train_one_epoch", spy)
    result = train_mod.train(smoke_config(tmp_path, deterministic=False, epochs=2, drloc=0.1))
    assert isinstance(seen["model"], RelativeLocalization)
    assert len(set(seen["lrs"])) == 1 and len(seen["lrs"]) >= 2  # the head's group follows warmup + cosine too
    best = load_checkpoint(result.run_dir / "best.pt")
    assert not any(k.startswith("mlp.0") or k.startswith("vit.") for k in best["model"])  # the ViT alone
    last = load_checkpoint(result.run_dir / "last.pt")["train_state"]["drloc"]
    torch.testing.assert_close(last["4.weight"], seen["model"].mlp[4].weight.detach())
