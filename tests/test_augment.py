"""Tests for vit_flowers.data.augment: batched train augmentation and the eval transform."""

from __future__ import annotations

import pytest
import torch

from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD, TrainAugment, eval_transform

MEAN = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
LOW, HIGH = (0 - MEAN) / STD, (1 - MEAN) / STD  # range of normalised values


def random_images(b: int = 8, s: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (b, 3, s, s), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def x_ramp(b: int = 4, s: int = 32) -> torch.Tensor:
    """Images whose pixel value grows with the column: (B, 3, S, S) uint8."""
    ramp = torch.linspace(0, 255, s).round().to(torch.uint8)
    return ramp.view(1, 1, 1, s).expand(b, 3, s, s).contiguous()


def denormalise(x: torch.Tensor) -> torch.Tensor:
    return (x * STD + MEAN) * 255


@pytest.mark.parametrize("auto_augment", ["none", "trivial", "randaugment"])
@pytest.mark.parametrize("random_erasing", [0.0, 0.5])
def test_output_shape_dtype_range(auto_augment: str, random_erasing: float) -> None:
    aug = TrainAugment(16, auto_augment=auto_augment, random_erasing=random_erasing)
    out = aug(random_images(6, 20))
    assert out.shape == (6, 3, 16, 16) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert (out >= LOW - 1e-4).all() and (out <= HIGH + 1e-4).all()


@pytest.mark.parametrize("auto_augment", ["none", "trivial", "randaugment"])
def test_deterministic_given_generator(auto_augment: str) -> None:
    aug = TrainAugment(16, auto_augment=auto_augment, random_erasing=0.5)
    x = random_images()
    a = aug(x, torch.Generator().manual_seed(1))
    b = aug(x, torch.Generator().manual_seed(1))
    c = aug(x, torch.Generator().manual_seed(2))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_deterministic_given_global_seed() -> None:
    aug = TrainAugment(16, auto_augment="trivial", random_erasing=0.5)
    x = random_images()
    torch.manual_seed(3)
    a = aug(x)
    torch.manual_seed(3)
    assert torch.equal(a, aug(x))


def test_generator_leaves_global_rng_alone() -> None:
    aug = TrainAugment(16, auto_augment="randaugment", random_erasing=1.0)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    aug(random_images(), torch.Generator().manual_seed(5))
    assert torch.equal(torch.rand(3), expected)


def test_full_crop_without_flip_is_identity() -> None:
    x = random_images(4, 16)
    aug = TrainAugment(16, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0)
    assert torch.allclose(aug(x), eval_transform(x, 16), atol=1e-5)


def test_flip_really_flips() -> None:
    x = random_images(4, 16)
    aug = TrainAugment(16, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=1.0)
    assert torch.allclose(aug(x), eval_transform(x.flip(-1), 16), atol=1e-5)
    ramp = denormalise(aug(x_ramp(2, 16)))[:, 0]  # (B, H, W): a flipped ramp decreases along x
    assert (ramp[..., 1:] < ramp[..., :-1]).all()


def test_flip_is_per_sample() -> None:
    aug = TrainAugment(16, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.5)
    out = denormalise(aug(x_ramp(32, 16), torch.Generator().manual_seed(0)))[:, 0]  # (B, H, W)
    increasing = (out[:, :, -1] > out[:, :, 0]).all(dim=1)
    assert 0 < increasing.sum() < 32  # some flipped, some not


def test_crop_is_a_resized_part_of_the_image() -> None:
    aug = TrainAugment(16, scale=(0.2, 0.5), hflip=0.0)
    out = denormalise(aug(x_ramp(16, 48), torch.Generator().manual_seed(0)))[:, 0]  # (B, H, W)
    assert (out[..., 1:] > out[..., :-1]).all()  # not flipped: still increasing along x
    widths = out[:, 0, -1] - out[:, 0, 0]
    assert (widths < 255 * 0.9).all()  # a part of the ramp, not all of it
    # rows are identical in a horizontal ramp, whatever the vertical crop
    assert torch.allclose(out, out[:, :1].expand_as(out), atol=1e-3)


def test_crop_differs_per_sample() -> None:
    x = random_images(1, 32).expand(16, -1, -1, -1).contiguous()  # 16 copies of one image
    out = TrainAugment(16, hflip=0.0)(x, torch.Generator().manual_seed(0))
    flat = out.flatten(1)
    distinct = {tuple(row.tolist()) for row in flat.round(decimals=3)}
    assert len(distinct) == 16


def test_crop_boxes_within_image_and_scale() -> None:
    aug = TrainAugment(16, scale=(0.3, 0.6), ratio=(0.75, 1.333))
    boxes = aug.crop_boxes(500, 40, 40, torch.Generator().manual_seed(0))  # (B, 4)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 40).all() and (boxes[:, 3] <= 40).all()
    area = w * h / 1600
    assert area.min() > 0.25 and area.max() < 0.65  # scale range, up to rounding
    assert (w / h).min() > 0.7 and (w / h).max() < 1.4


def test_crop_boxes_fallback_is_centre_crop() -> None:
    aug = TrainAugment(16, scale=(1.0, 1.0), ratio=(2.0, 3.0))  # a 2:1 crop of full area never fits a square
    boxes = aug.crop_boxes(3, 40, 40)
    assert boxes.tolist() == [[0.0, 10.0, 40.0, 30.0]] * 3  # whole width, ratio clamped to 2, centred


def test_random_erasing_per_sample() -> None:
    aug = TrainAugment(16, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0, random_erasing=1.0)
    x = torch.full((8, 3, 16, 16), 255, dtype=torch.uint8)  # white: normalised values far from 0
    out = aug(x, torch.Generator().manual_seed(0))
    erased = (out == 0).all(dim=1)  # (B, H, W): erased pixels are 0 in every channel
    assert erased.flatten(1).any(dim=1).all()  # every sample has an erased patch
    assert len({tuple(m.flatten().tolist()) for m in erased}) > 1  # not the same patch for all


def test_eval_transform() -> None:
    x = random_images(3, 16)
    out = eval_transform(x, 16)
    expected = (x.float() / 255 - MEAN) / STD
    assert out.dtype == torch.float32 and torch.allclose(out, expected, atol=1e-6)
    assert eval_transform(random_images(2, 20), 16).shape == (2, 3, 16, 16)
    single = eval_transform(x[0], 16)
    assert single.shape == (3, 16, 16) and torch.allclose(single, out[0])
    flat = torch.full((1, 3, 20, 20), 128, dtype=torch.uint8)
    assert torch.allclose(eval_transform(flat, 8), eval_transform(flat[..., :8, :8], 8), atol=1e-5)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="auto_augment.*randaugment"):
        TrainAugment(16, auto_augment="autoaugment")
    with pytest.raises(ValueError, match="scale"):
        TrainAugment(16, scale=(0.0, 1.0))
    aug = TrainAugment(16)
    with pytest.raises(TypeError, match="uint8"):
        aug(torch.zeros(2, 3, 16, 16))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        aug(torch.zeros(2, 1, 16, 16, dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8"):
        eval_transform(torch.zeros(1, 3, 8, 8), 8)
