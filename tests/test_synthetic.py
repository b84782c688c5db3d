"""Tests for the built-in synthetic flower dataset (vit_flowers.data.synthetic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vit_flowers.data.synthetic import CLASSES, make_synthetic_flowers, render_flower


@pytest.fixture(scope="module")
def small_set() -> tuple[torch.Tensor, torch.Tensor]:
    """200 images (40 per class) at 32 px, shared by the statistics tests."""
    return make_synthetic_flowers(40, 32, seed=0)


def test_classes() -> None:
    assert CLASSES == ("daisy", "dandelion", "rose", "sunflower", "tulip")


def test_shapes_dtypes_and_balance() -> None:
    images, labels = make_synthetic_flowers(3, 24, seed=1)
    assert images.shape == (15, 3, 24, 24) and images.dtype == torch.uint8
    assert labels.shape == (15,) and labels.dtype == torch.int64
    assert images.is_contiguous()
    assert labels.tolist() == [0, 1, 2, 3, 4] * 3  # classes interleaved
    assert torch.bincount(labels, minlength=5).tolist() == [3] * 5


def test_empty_set() -> None:
    images, labels = make_synthetic_flowers(0, 16)
    assert images.shape == (0, 3, 16, 16) and labels.shape == (0,)


def test_same_seed_identical_different_seed_differs() -> None:
    a, la = make_synthetic_flowers(2, 32, seed=3)
    b, lb = make_synthetic_flowers(2, 32, seed=3)
    c, lc = make_synthetic_flowers(2, 32, seed=4)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert torch.equal(la, lc)
    for i in range(len(a)):  # every single image changes with the seed
        assert not torch.equal(a[i], c[i])


def test_image_depends_only_on_seed_and_index() -> None:
    ten, _ = make_synthetic_flowers(2, 32, seed=7)
    twenty, _ = make_synthetic_flowers(4, 32, seed=7)
    assert torch.equal(ten, twenty[:10])


def test_some_images_of_a_set_are_drawn_alone() -> None:
    """``indices`` draws those images of the set and no other: what a run's photos found again draw."""
    every, labels = make_synthetic_flowers(3, 24, seed=2)
    some, some_labels = make_synthetic_flowers(3, 24, seed=2, indices=[14, 0, 7])
    assert torch.equal(some, every[[14, 0, 7]]) and some_labels.tolist() == [4, 0, 2] == labels[[14, 0, 7]].tolist()
    with pytest.raises(ValueError, match="indices must be between 0 and 14"):
        make_synthetic_flowers(3, 24, seed=2, indices=[15])


def test_render_flower_uses_the_given_rng() -> None:
    a = np.asarray(render_flower(2, 32, np.random.default_rng(11)))
    b = np.asarray(render_flower(2, 32, np.random.default_rng(11)))
    c = np.asarray(render_flower(2, 32, np.random.default_rng(12)))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("size", [32, 64, 224])
@pytest.mark.parametrize("label", range(len(CLASSES)))
def test_every_class_renders_at_every_size(label: int, size: int) -> None:
    img = render_flower(label, size, np.random.default_rng([5, label, size]))
    assert isinstance(img, Image.Image)
    assert img.mode == "RGB" and img.size == (size, size)
    assert np.asarray(img).std() > 5  # not a flat colour


@pytest.mark.parametrize("label, size", [(-1, 32), (5, 32), (0, 4)])
def test_render_flower_rejects_bad_arguments(label: int, size: int) -> None:
    with pytest.raises(ValueError, match="label|size"):
        render_flower(label, size, np.random.default_rng(0))


def test_images_are_not_constant(small_set: tuple[torch.Tensor, torch.Tensor]) -> None:
    images, _ = small_set
    per_image_std = images.float().flatten(1).std(dim=1)            # (N,)
    assert per_image_std.min() > 5
    # and the images are not near-copies of one another
    flat = images.float().flatten(1)                                 # (N, 3*S*S)
    assert torch.cdist(flat[:50], flat[:50]).fill_diagonal_(1e9).min() > 100


def test_classes_differ_in_colour_statistics(small_set: tuple[torch.Tensor, torch.Tensor]) -> None:
    images, labels = small_set
    # the centre of the image (where the main flower sits) in each class
    centre = images[:, :, 8:24, 8:24].float()                      # (N, 3, 16, 16)
    rgb = centre.mean(dim=(2, 3))                                    # (N, 3)
    means = torch.stack([rgb[labels == k].mean(0) for k in range(5)])  # (5, 3)
    daisy, dandelion, rose, sunflower, _ = means
    assert daisy[2] > dandelion[2] + 15 and daisy[2] > sunflower[2] + 15   # white petals: more blue
    assert dandelion[0] - dandelion[2] > 40                               # yellow heads
    assert rose[0] > rose[1] + 12                                           # mostly red / pink
    assert sunflower.mean() < dandelion.mean() - 10                        # dark seed disc
    # ...but no class has one colour: per-class spread of the centre colour is wide
    for k in range(5):
        assert rgb[labels == k].std(0).mean() > 15, CLASSES[k]


def test_colour_alone_is_informative_but_not_enough() -> None:
    """A linear model on colour histograms of the image centre beats chance (20%) clearly,
    yet stays far from perfect: shape has to be learnt too."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def histograms(images: torch.Tensor) -> np.ndarray:
        q = images[:, :, 8:24, 8:24].numpy() // 64                      # (N, 3, 16, 16), 4 levels
        codes = (q[:, 0].astype(np.int64) * 16 + q[:, 1] * 4 + q[:, 2]).reshape(len(images), -1)  # (N, 256)
        return np.stack([np.bincount(c, minlength=64) / c.size for c in codes])  # (N, 64)

    train_x, train_y = make_synthetic_flowers(100, 32, seed=0)
    test_x, test_y = make_synthetic_flowers(40, 32, seed=1)
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=3000))
    clf.fit(histograms(train_x), train_y.numpy())
    accuracy = clf.score(histograms(test_x), test_y.numpy())
    assert 0.35 < accuracy < 0.85
