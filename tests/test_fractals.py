"""Formula-drawn pretraining images: deterministic, distinct per category, learnable; the pretrain command
writes weights that train --pretrained fine-tunes at another image size with a new head."""

import numpy as np
import pytest
import torch
from safetensors import safe_open

from vit_flowers import pretrain
from vit_flowers.checkpoint import load_checkpoint
from vit_flowers.config import ConfigError
from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD, eval_transform
from vit_flowers.data.datasets import load_fractals
from vit_flowers.data.fractals import FILL_RANGE, chaos_game, fill_rate, make_fractal_dataset, sample_ifs
from vit_flowers.models.pretrained import PretrainedError, load_pretrained
from vit_flowers.train import train

from helpers import smoke_config


def test_same_seed_same_images_and_any_image_drawn_alone():
    a, labels = make_fractal_dataset(3, 4, 32, seed=5)
    b, _ = make_fractal_dataset(3, 4, 32, seed=5)
    assert a.shape == (12, 3, 32, 32) and a.dtype == torch.uint8 and torch.equal(a, b)
    assert labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    later, _ = make_fractal_dataset(3, 2, 32, seed=5, first=2)  # instances 2 and 3 of each category
    assert torch.equal(later[0:2], a[2:4]) and torch.equal(later[4:6], a[10:12])
    other, _ = make_fractal_dataset(3, 4, 32, seed=6)
    assert not torch.equal(a, other)


def test_categories_are_contractive_systems_with_a_filled_attractor():
    rng = np.random.default_rng(0)
    for _ in range(5):
        ifs = sample_ifs(rng)
        assert np.allclose(ifs.probs.sum(), 1.0) and 2 <= len(ifs.probs) <= 4
        assert (np.linalg.svd(ifs.maps[:, :, :2], compute_uv=False) < 1).all()
        assert FILL_RANGE[0] <= fill_rate(ifs, np.random.default_rng(1)) <= FILL_RANGE[1]
        points, used = chaos_game(ifs, 2000, rng)
        assert len(points) == len(used) >= 1900 and np.isfinite(points).all()


def test_a_small_model_tells_the_categories_apart():
    """A small CNN learns 4 formulas from 80 drawn instances each and names unseen instances of them: the
    categories are told apart by their shape (colours, backgrounds and poses are drawn per instance)."""
    import timm

    torch.manual_seed(0)
    data = load_fractals(image_size=32, num_classes=4, train_per_class=80, val_per_class=16, seed=1)
    x = eval_transform(data.train.images, 32, IMAGENET_MEAN, IMAGENET_STD)
    model = timm.create_model("resnet10t", num_classes=4)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for _ in range(200):
        idx = torch.randint(0, len(x), (32,))
        loss = torch.nn.functional.cross_entropy(model(x[idx]), data.train.labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val = eval_transform(data.val.images, 32, IMAGENET_MEAN, IMAGENET_STD)
        acc = (model(val).argmax(1) == data.val.labels).float().mean().item()
    assert acc >= 0.45, acc  # chance is 0.25


def test_fractal_sets_are_cached_and_read_back(tmp_path):
    first = load_fractals(image_size=16, num_classes=2, train_per_class=3, val_per_class=1, seed=2, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("fractals-*.pt"))) == 2
    again = load_fractals(image_size=16, num_classes=2, train_per_class=3, val_per_class=1, seed=2, cache_dir=tmp_path)
    assert torch.equal(first.train.images, again.train.images) and again.classes == ["ifs_0000", "ifs_0001"]


def _tiny_pretraining(tmp_path):
    cfg = smoke_config(tmp_path, dataset="fractals", fractal_classes=6, fractal_train_per_class=8,
                       fractal_val_per_class=2, patch_embed="conv", data_root=str(tmp_path / "data"),
                       report=False, epochs=1, run_name="pt")
    return train(cfg).run_dir


def test_pretrain_then_fine_tune_at_another_size_with_a_new_head(tmp_path):
    run = _tiny_pretraining(tmp_path)
    assert not (run / "report").exists()
    weights = pretrain.export_weights(run, tmp_path / "fractal.safetensors")
    with safe_open(str(weights), framework="pt") as f:
        meta = f.metadata()
        assert f.get_tensor("pos_embedding").dtype == torch.float16
    assert "no natural image" in meta["source"] and meta["categories"] == "6"
    model = load_pretrained(weights, num_classes=3, image_size=64)  # 8x8 patches instead of 4x4
    assert model.num_classes == 3 and model.pos_embedding.shape[1] == 1 + 8 * 8
    assert model.config["patch_embed"] == "conv"
    tuned = train(smoke_config(tmp_path, pretrained=str(weights), image_size=64, cache_size=72, epochs=1,
                               run_name="ft"))
    best = load_checkpoint(tuned.run_dir / "best.pt")
    assert best["model_config"]["patch_embed"] == "conv" and best["model_config"]["num_classes"] == 5
    from_checkpoint = load_pretrained(run / "best.pt", num_classes=5, image_size=32)  # a .pt works as well
    assert from_checkpoint.config["dim"] == best["model_config"]["dim"]


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
