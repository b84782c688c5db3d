"""train --pretrained: a run's weights (its best.pt, or written as a .safetensors file) fine-tuned at another
image size with a new head; sources that cannot be used are refused with a message naming them."""

import pytest
import torch
from helpers import smoke_config
from safetensors import safe_open

from vit_flowers.runs.checkpoint import load_checkpoint, load_model, save_safetensors
from vit_flowers.train import train
from vit_flowers.training.config import ConfigError
from vit_flowers.training.pretrained import PretrainedError, load_pretrained


def test_a_runs_weights_fine_tune_at_another_size_with_a_new_head(tmp_path):
    run = train(smoke_config(tmp_path, patch_embed="conv", report=False, epochs=1, run_name="first")).run_dir
    model, _ = load_model(run / "best.pt")
    weights = save_safetensors(model, tmp_path / "first.safetensors", half=True, extra={"note": "a test"})
    with safe_open(str(weights), framework="pt") as f:
        assert f.get_tensor("pos_embedding").dtype == torch.float16 and f.metadata()["note"] == "a test"
    loaded = load_pretrained(weights, num_classes=3, image_size=64)  # 8x8 patches instead of 4x4
    assert loaded.num_classes == 3 and loaded.pos_embedding.shape[1] == 1 + 8 * 8
    assert loaded.config["patch_embed"] == "conv"
    tuned = train(smoke_config(tmp_path, pretrained=str(weights), image_size=64, cache_size=72, epochs=1,
                               run_name="tuned", report=False))
    best = load_checkpoint(tuned.run_dir / "best.pt")
    assert best["model_config"]["patch_embed"] == "conv" and best["model_config"]["image_size"] == 64
    from_checkpoint = load_pretrained(run / "best.pt", num_classes=5, image_size=32)  # a .pt works as well
    assert from_checkpoint.config["dim"] == best["model_config"]["dim"]
    assert torch.equal(from_checkpoint.pos_embedding, model.pos_embedding)  # same size, same classes: kept as is


def test_bad_pretrained_sources_name_the_file(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(PretrainedError, match="junk.safetensors"):
        load_pretrained(junk, num_classes=3, image_size=32)
    bare = tmp_path / "bare.pth"
    torch.save({"w": torch.zeros(2)}, bare)
    with pytest.raises(PretrainedError, match="bare state dict"):
        load_pretrained(bare, num_classes=3, image_size=32)
    with pytest.raises(ConfigError, match="junk.safetensors"):
        train(smoke_config(tmp_path, pretrained=str(junk)))


def test_the_removed_fractal_start_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file named "fractal" here: the name alone
    with pytest.raises(PretrainedError, match=r"pretrained: 'fractal' is no longer available \(the fractal start was "
                                              r"removed on 2026-12-04"):
        load_pretrained("fractal", num_classes=3, image_size=32)
    with pytest.raises(ConfigError, match="'fractal' is no longer available"):  # before any run folder is made
        train(smoke_config(tmp_path, pretrained="fractal", run_name="old"))
    assert not (tmp_path / "ck" / "old").exists()
