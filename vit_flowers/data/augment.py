"""Batched data augmentation on in-memory uint8 image tensors.

`TrainAugment` does random-resized-crop + horizontal flip for a whole batch at once (per-sample crop boxes
through `torchvision.ops.roi_align`, no Python loop over images), then optionally RandAugment /
TrivialAugmentWide per sample on uint8, normalisation, and random erasing per sample.
`eval_transform` only resizes (if needed) and normalises.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torchvision.ops import roi_align
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

AUTO_AUGMENTS: tuple[str, ...] = ("none", "randaugment", "trivial")


def _check_uint8_batch(images: torch.Tensor) -> None:
    if images.dtype != torch.uint8:
        raise TypeError(f"expected uint8 images, got {images.dtype}")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(images.shape)}")


def _normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 or float images (B, 3, H, W) in [0, 255] -> float (x / 255 - mean) / std, float32 for uint8.

    One pass, ``x * (1 / (255 std)) - mean / std`` (one ``addcmul``), instead of four over the batch."""
    dtype = images.dtype if images.is_floating_point() else torch.float32
    mean_t = torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float64).view(1, 3, 1, 1)
    scale = (1.0 / (255.0 * std_t)).to(images.device, dtype)
    shift = (-mean_t / std_t).to(images.device, dtype)
    return torch.addcmul(shift, images, scale)


def resize_square(x: torch.Tensor, size: int) -> torch.Tensor:
    """Normalised float images (B, 3, S, S) -> (B, 3, size, size), bilinear with antialias (unchanged at ``size``):
    one view of an image at another model's input size."""
    if x.shape[-2:] == (size, size):
        return x
    return torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)


def eval_transform(
    images_uint8: torch.Tensor,
    image_size: int,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> torch.Tensor:
    """uint8 (B, 3, H, W) or (3, H, W) -> normalised float32 of side `image_size`.

    Images already `image_size` square are only normalised; others are resized (shorter side, bilinear with
    antialias) and centre-cropped.
    """
    single = images_uint8.ndim == 3
    x = images_uint8.unsqueeze(0) if single else images_uint8  # (B, 3, H, W)
    _check_uint8_batch(x)
    if x.shape[-2:] != (image_size, image_size):
        x = TF.resize(x, [image_size], antialias=True)
        x = TF.center_crop(x, [image_size, image_size])
    out = _normalize(x, mean, std)  # (B, 3, S, S) float32
    return out[0] if single else out


class TrainAugment(torch.nn.Module):
    """Training augmentation for a batch of uint8 images -> normalised float (B, 3, image_size, image_size).

    Random-resized-crop (area fraction `scale`, aspect ratio `ratio`, as torchvision's RandomResizedCrop) and
    horizontal flip with probability `hflip`, with independent parameters per sample; then `auto_augment`
    ("none" | "randaugment" | "trivial") per sample; normalisation; random erasing with probability
    `random_erasing` per sample. Deterministic given `generator` (the global RNG is then left untouched),
    or given the global torch seed when no generator is passed.
    """

    def __init__(
        self,
        image_size: int,
        *,
        scale: tuple[float, float] = (0.35, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        hflip: float = 0.5,
        auto_augment: str = "none",
        randaug_num_ops: int = 2,
        randaug_magnitude: int = 9,
        random_erasing: float = 0.0,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
    ) -> None:
        super().__init__()
        if not 0.0 < scale[0] <= scale[1] <= 1.0:
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {scale}")
        if not 0.0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {ratio}")
        if not 0.0 <= hflip <= 1.0:
            raise ValueError(f"hflip must be a probability, got {hflip}")
        if not 0.0 <= random_erasing <= 1.0:
            raise ValueError(f"random_erasing must be a probability, got {random_erasing}")
        if auto_augment not in AUTO_AUGMENTS:
            raise ValueError(f"unknown auto_augment {auto_augment!r}: choose one of {', '.join(AUTO_AUGMENTS)}")
        self.image_size = image_size
        self.scale = tuple(scale)
        self.ratio = tuple(ratio)
        self.hflip = hflip
        self.mean = tuple(mean)
        self.std = tuple(std)
        self.auto_augment = auto_augment
        if auto_augment == "randaugment":
            self.policy: v2.Transform | None = v2.RandAugment(num_ops=randaug_num_ops, magnitude=randaug_magnitude)
        elif auto_augment == "trivial":
            self.policy = v2.TrivialAugmentWide()
        else:
            self.policy = None
        self.eraser = v2.RandomErasing(p=random_erasing, value=0) if random_erasing > 0 else None

    def extra_repr(self) -> str:
        return (
            f"image_size={self.image_size}, scale={self.scale}, ratio={self.ratio}, hflip={self.hflip}, "
            f"auto_augment={self.auto_augment!r}, random_erasing={self.eraser.p if self.eraser else 0.0}"
        )

    def crop_boxes(self, batch: int, height: int, width: int, generator: torch.Generator | None = None,
                   device: torch.device | str = "cpu") -> torch.Tensor:
        """Per-sample random-resized-crop boxes (x1, y1, x2, y2) in pixels: (B, 4) float.

        Same algorithm as torchvision's RandomResizedCrop.get_params, vectorised: 10 tries per sample, the
        first that fits wins, else a centre crop of the whole image clamped to `ratio`.
        """
        tries = 10
        area = height * width
        drawn_on = generator.device if generator is not None else device  # a CPU generator may crop GPU images
        rand = torch.rand(batch, tries, 2, generator=generator, device=drawn_on).to(device)  # (B, T, 2)
        target_area = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * rand[..., 0])
        log_r = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        aspect = torch.exp(log_r[0] + (log_r[1] - log_r[0]) * rand[..., 1])
        w = torch.sqrt(target_area * aspect).round()  # (B, T)
        h = torch.sqrt(target_area / aspect).round()
        fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        first = fits.int().argmax(dim=1, keepdim=True)  # index of the first try that fits
        w = w.gather(1, first).squeeze(1)  # (B,)
        h = h.gather(1, first).squeeze(1)
        # fallback (no try fits): whole image, clamped to the ratio range
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            fw, fh = width, round(width / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            fw, fh = round(height * self.ratio[1]), height
        else:
            fw, fh = width, height
        any_fit = fits.any(dim=1)
        w = torch.where(any_fit, w, torch.full_like(w, fw))
        h = torch.where(any_fit, h, torch.full_like(h, fh))
        pos = torch.rand(batch, 2, generator=generator, device=drawn_on).to(device)  # (B, 2)
        x1 = torch.where(any_fit, torch.floor(pos[:, 0] * (width - w + 1)), torch.floor((width - w) / 2))
        y1 = torch.where(any_fit, torch.floor(pos[:, 1] * (height - h + 1)), torch.floor((height - h) / 2))
        return torch.stack([x1, y1, x1 + w, y1 + h], dim=1)  # (B, 4)

    def forward(self, images_uint8: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """uint8 (B, 3, S, S) -> augmented, normalised float32 (B, 3, image_size, image_size)."""
        _check_uint8_batch(images_uint8)
        B, _, H, W = images_uint8.shape
        device = images_uint8.device
        size = self.image_size
        boxes = self.crop_boxes(B, H, W, generator, device)  # (B, 4)
        drawn_on = generator.device if generator is not None else device
        flip = torch.rand(B, generator=generator, device=drawn_on).to(device) < self.hflip  # (B,)
        rois = torch.cat([torch.arange(B, device=device, dtype=boxes.dtype).unsqueeze(1), boxes], dim=1)  # (B, 5)
        # bilinear crop-and-resize; sampling_ratio=0 averages ceil(box/out) samples per output pixel (antialias)
        x = roi_align(images_uint8.float(), rois, output_size=(size, size), spatial_scale=1.0,
                      sampling_ratio=0, aligned=True)  # (B, 3, size, size), values in [0, 255]
        x = torch.where(flip.view(B, 1, 1, 1), x.flip(-1), x)
        if self.policy is None and self.eraser is None:
            return _normalize(x, self.mean, self.std)
        # per-sample torchvision transforms draw from the global RNG: fork it, seeded from `generator`
        seed = None if generator is None else int(torch.randint(2**62, (1,), generator=generator,
                                                                device=generator.device))
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            if self.policy is not None:
                x8 = x.round_().clamp_(0, 255).to(torch.uint8)  # policies work on uint8
                x = torch.stack([self.policy(img) for img in x8]).float()  # (B, 3, size, size)
            x = _normalize(x, self.mean, self.std)
            if self.eraser is not None:
                x = torch.stack([self.eraser(img) for img in x])
        return x
