"""Formula-drawn pretraining images: deterministic, distinct per category, learnable; the pretrain command
writes weights that train --pretrained fine-tunes at another image size with a new head."""

import numpy as np
import pytest
import torch
from helpers import smoke_config

from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD, eval_transform
from vit_flowers.data.datasets import load_fractals
from vit_flowers.data.fractals import FILL_RANGE, FractalStream, chaos_game, fill_rate, make_fractal_dataset, sample_ifs
from vit_flowers.runs.checkpoint import load_checkpoint
from vit_flowers.train import train


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


def test_streamed_fractals_are_fresh_every_batch_and_repeat_with_the_generator():
    stream = FractalStream(num_classes=3, per_class=4, size=32, seed=5)
    assert len(stream) == 12 and stream.labels.tolist() == make_fractal_dataset(3, 4, 32, seed=5)[1].tolist()
    idx = torch.tensor([0, 5, 11, 5])
    a = stream.batch(idx, torch.Generator().manual_seed(1))
    assert a.shape == (4, 3, 32, 32) and a.dtype == torch.uint8
    assert torch.equal(a, stream.batch(idx, torch.Generator().manual_seed(1)))
    assert not torch.equal(a[1], a[3])  # the same category twice in a batch: two instances
    assert not torch.equal(a, stream.batch(idx, torch.Generator().manual_seed(2)))
    assert (a.float().flatten(1).std(1) > 10).all()  # a drawn attractor, not a blank frame
    for c in range(3):  # the categories of the cached sets, formula for formula
        ifs = sample_ifs(np.random.default_rng([5, c]))
        k = len(ifs.probs)
        assert torch.allclose(stream.maps[c, :k].double(), torch.from_numpy(ifs.maps), atol=1e-6)
        assert (stream.probs[c, k:] == 0).all()


def test_a_small_model_tells_the_categories_apart():
    """A small CNN learns 4 formulas from 80 drawn instances each and names unseen instances of them: the
    categories are told apart by their shape (colours, backgrounds and poses are drawn per instance), and
    instances from the torch renderer (``FractalStream``) are the same categories, drawn alike."""
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
        labels = torch.arange(4).repeat(32)
        streamed = FractalStream(num_classes=4, per_class=1, size=32, seed=1).draw(labels, torch.Generator())
        acc_streamed = (model(eval_transform(streamed, 32, IMAGENET_MEAN, IMAGENET_STD)).argmax(1) == labels
                        ).float().mean().item()
    assert acc >= 0.45, acc  # chance is 0.25
    assert acc_streamed >= 0.4, acc_streamed  # 128 instances: 4 standard errors above chance


def test_fractal_sets_are_cached_and_read_back(tmp_path):
    first = load_fractals(image_size=16, num_classes=2, train_per_class=3, val_per_class=1, seed=2, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("fractals-*.pt"))) == 2
    again = load_fractals(image_size=16, num_classes=2, train_per_class=3, val_per_class=1, seed=2, cache_dir=tmp_path)
    assert torch.equal(first.train.images, again.train.images) and again.classes == ["ifs_0000", "ifs_0001"]


def test_a_streamed_pretraining_draws_new_images_each_epoch(tmp_path):
    cfg = smoke_config(tmp_path, dataset="fractals", fractal_classes=5, fractal_train_per_class=8,
                       fractal_val_per_class=3, fractal_render="stream", report=False, epochs=2, run_name="st",
                       data_root=str(tmp_path / "data"))
    result = train(cfg)
    assert not (tmp_path / "data").exists()  # nothing drawn into a cache
    best = load_checkpoint(result.run_dir / "best.pt")
    assert best["classes"] == [f"ifs_{c:04d}" for c in range(5)] and best["config"]["fractal_render"] == "stream"
    from vit_flowers.data.datasets import load_fractals as load
    data = load(image_size=32, num_classes=5, train_per_class=8, val_per_class=3, seed=cfg.seed, render="stream")
    assert len(data.train) == 40 and data.val.images.shape == (15, 3, 32, 32)  # val drawn once, from its own seed
    again = load(image_size=32, num_classes=5, train_per_class=8, val_per_class=3, seed=cfg.seed, render="stream")
    assert torch.equal(data.val.images, again.val.images)
    g = torch.Generator().manual_seed(0)
    assert not torch.equal(data.train.batch(torch.arange(8), g), data.train.batch(torch.arange(8), g))
