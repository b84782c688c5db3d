"""Robust image reading, shared by training, evaluation and predict.

The torch-free part, :mod:`.image_files`, is imported from there: `load_image` turns any image file PIL can
read into an RGB image (EXIF orientation applied, transparency composited on white, 16-bit and float
grayscale rescaled instead of clipped) or raises `ImageLoadError` naming the file and the reason;
`list_images` expands files and folders into image files. Here: `resize_crop` is THE resize used everywhere
(dataset cache, evaluation, predict; `preprocess` for one PIL image), so that they all see the same pixels.
`decode_pixels` (predict's decoder) hands plain photo-sized JPEGs to torchvision's libjpeg-turbo decoder
(the same pixels in about two thirds of PIL's time) and everything else to `load_image`. `decode_rows` runs a
decoder over many files on a few threads, a bounded number in flight: what the photo cache builds a set from.
"""

from __future__ import annotations

import os
import struct
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.transforms.v2 import functional as TF

from . import image_files
from .image_files import (
    DECODE_THREADS,
    IMAGE_EXTENSIONS,
    ImageLoadError,
    crop_strip,
    list_images,
    load_image,
    printable_name,
)

if TYPE_CHECKING:
    from .photo_cache import Produce

try:  # deprecated since torchvision 0.29 in favour of TorchCodec; PIL decodes every file once it is gone
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as _tv_decode_jpeg  # (importing it loads torchvision's image ops)

    # The op behind it, called directly: the Python wrapper's per-call usage log and deprecation warning cost
    # ~10% of a 128 px photo's decode. Same op, same pixels; if it is renamed, the wrapper is used instead.
    _jpeg_op = getattr(torch.ops.image, "decode_jpeg", None)
except (ImportError, AttributeError, RuntimeError):  # pragma: no cover - depends on the installed torchvision
    _tv_decode_jpeg = _jpeg_op = None
# That deprecation warning would fire once per photo; only it is silenced.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)

__all__ = ["DECODE_THREADS", "IMAGE_EXTENSIONS", "ImageLoadError", "load_image", "list_images", "printable_name",
           "to_pixels", "resize_crop", "preprocess", "jpeg_frame", "decode_pixels", "decode_file",
           "decode_rows"]


def to_pixels(img: Image.Image) -> torch.Tensor:
    """RGB PIL image -> uint8 (3, H, W), a channels-last view of its pixels; a strip longer than
    `image_files.MAX_ASPECT_RATIO` times its width is cut to its centre square first (:func:`crop_strip`)."""
    img = crop_strip(img)
    return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)  # (H, W, 3) -> (3, H, W) view


def resize_crop(pixels: Sequence[torch.Tensor], size: int) -> torch.Tensor:
    """uint8 images (3, H_i, W_i) -> uint8 (B, 3, size, size): shorter side to `size` (bicubic, antialiased),
    centre crop, in input order.

    THE resize used everywhere (dataset cache, evaluation, predict), so that they all see the same pixels. It
    runs on the uint8 pixels in torch (PIL's antialiased bicubic filter, vectorised: within 2-3 grey levels of
    PIL's own resize), one call per group of equal-sized images: ~5x cheaper than PIL a 128 px photo, which
    keeps decoding off predict's critical path.
    """
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    out = torch.empty(len(pixels), 3, size, size, dtype=torch.uint8)  # (B, 3, S, S)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(pixels):
        groups.setdefault(tuple(image.shape), []).append(i)
    for (_, h, w), members in groups.items():
        x = torch.stack([pixels[i].permute(1, 2, 0) for i in members]).permute(0, 3, 1, 2)  # (G, 3, H, W) NHWC
        out_hw = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)  # as torchvision's resize
        if out_hw != (h, w):
            x = F.interpolate(x, size=out_hw, mode="bicubic", antialias=True)  # uint8 in, uint8 out
        crop = TF.center_crop(x, [size, size])
        if len(members) == len(pixels):  # one size for all (a folder of photos): a plain copy, no scatter
            out.copy_(crop)
        else:
            out[members] = crop
    return out


def preprocess(img: Image.Image, size: int) -> torch.Tensor:
    """RGB PIL image -> uint8 (3, size, size) by :func:`resize_crop` (shorter side to `size`, centre crop)."""
    return resize_crop([to_pixels(img)], size)[0]


_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame (not DHT, JPG, DAC)
_JPEG_SUFFIXES = frozenset({".jpg", ".jpeg"})  # the JPEG names of IMAGE_EXTENSIONS


def jpeg_frame(data: bytes) -> tuple[int, int, int] | None:
    """(height, width, components) from a JPEG's start-of-frame header, or None if ``data`` is not a JPEG whose
    header reads cleanly (PIL then judges it). Reads only the markers before the frame header."""
    if data[:3] != b"\xff\xd8\xff":
        return None
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF_MARKERS:
            height, width, components = struct.unpack(">HHB", data[i + 5:i + 10])
            return height, width, components
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    return None


def _plain_aspect(height: int, width: int) -> bool:
    return max(height, width) <= image_files.MAX_ASPECT_RATIO * min(height, width)


def _decode_jpeg_fast(path: str | os.PathLike, size: int) -> torch.Tensor | None:
    """A photo-sized JPEG (1 or 3 components, under ``MAX_IMAGE_PIXELS``, not so large that PIL's reduced-scale
    decode pays off) -> uint8 (3, H, W) by torchvision's decoder with EXIF orientation applied, the same pixels
    as :func:`load_image`. None for any other file, or any failure: :func:`load_image` then decodes it or names
    what is wrong."""
    if Path(path).suffix.lower() not in _JPEG_SUFFIXES:  # other files are read once, by load_image alone
        return None
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > image_files.READ_WHOLE_BYTES:
                return None
            data = f.read()
        frame = jpeg_frame(data)
        if frame is None:
            return None
        height, width, components = frame
        if components not in (1, 3) or not 0 < height * width <= image_files.MAX_IMAGE_PIXELS:
            return None
        if min(height, width) >= 4 * size or not _plain_aspect(height, width):
            return None  # PIL decodes it at 1/2-1/8 scale (load_image's draft), or crops the strip first
        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if _jpeg_op is not None:
            return _jpeg_op(encoded, ImageReadMode.RGB.value, True)  # True: apply the EXIF orientation
        return _tv_decode_jpeg(encoded, mode=ImageReadMode.RGB, apply_exif_orientation=True)
    except Exception:  # noqa: BLE001 - unreadable, truncated, odd: PIL gives the file its error message
        return None


def decode_pixels(path: str | os.PathLike, size: int) -> torch.Tensor | str:
    """One file -> its uint8 pixels (3, H, W) (:func:`load_image` + :func:`to_pixels`), not yet resized (JPEGs
    decode at a reduced scale when far larger than ``size``), or the reason it failed. An image whose shorter
    side is over twice ``size`` (a big PNG, a phone photo) comes back already resized to (3, size, size), so a
    batch of them never holds full-size pixels; :func:`resize_crop` leaves those as they are.

    Photo-sized JPEGs go through torchvision's decoder (:func:`_decode_jpeg_fast`): the same pixels in about two
    thirds of PIL's open + decode time (predict then spends ~80-85% of its time in the model, not in decoding)."""
    pixels = _decode_jpeg_fast(path, size) if _tv_decode_jpeg is not None else None
    if pixels is not None:
        return resize_crop([pixels], size)[0] if min(pixels.shape[1:]) > 2 * size else pixels
    try:
        img = load_image(path, min_size=size)
    except ImageLoadError as e:
        return e.reason
    return preprocess(img, size) if min(img.size) > 2 * size else to_pixels(img)


def decode_file(path: str | os.PathLike, size: int) -> torch.Tensor | str:
    """One file -> uint8 (3, size, size) (:func:`decode_pixels` + :func:`resize_crop`), or the reason it failed."""
    pixels = decode_pixels(path, size)
    return pixels if isinstance(pixels, str) else resize_crop([pixels], size)[0]


def decode_rows(paths: list[Path], size: int, decode: Callable[[Path, int], torch.Tensor | str],
                threads: int) -> Produce:
    """What :meth:`~vit_flowers.data.photo_cache.PhotoCache.rows` produces for photos: ``decode`` of the files asked
    for, on ``threads`` threads, a bounded number of them in flight (memory does not grow with the photos)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    def produce(indices: list[int]) -> Iterator[tuple[int, np.ndarray | str]]:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            window: list[tuple[int, Future[torch.Tensor | str]]] = []
            pending = iter(indices)
            for i in _take(pending, 4 * threads):
                window.append((i, pool.submit(decode, paths[i], size)))
            while window:
                i, future = window.pop(0)
                result = future.result()
                for j in _take(pending, 1):
                    window.append((j, pool.submit(decode, paths[j], size)))
                yield i, result if isinstance(result, str) else result.numpy()

    return produce


def _take(items: Iterator[int], n: int) -> Iterable[int]:
    for _ in range(n):
        try:
            yield next(items)
        except StopIteration:
            return
