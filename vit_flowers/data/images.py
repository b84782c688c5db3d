"""Robust image reading, shared by training, evaluation and predict.

`load_image` turns any image file PIL can read into an RGB image (EXIF orientation applied, transparency
composited on white, 16-bit and float grayscale rescaled instead of clipped) or raises `ImageLoadError`
naming the file and the reason. `resize_crop` is THE resize used everywhere (dataset cache, evaluation,
predict; `preprocess` for one PIL image), so that they all see the same pixels. `list_images` expands files
and folders into image files. `decode_pixels` (predict's decoder) hands plain photo-sized JPEGs to
torchvision's libjpeg-turbo decoder (the same pixels in about two thirds of PIL's time) and everything else
to `load_image`.
"""

from __future__ import annotations

import io
import logging
import os
import struct
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from torchvision.transforms.v2 import functional as TF

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

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"}
)

# Decompression-bomb limit: a file whose header claims more pixels than this is refused before decoding.
# Read at call time, so it can be changed (or monkeypatched in tests).
MAX_IMAGE_PIXELS: int = 100_000_000
# A tiny file can also decode to a legal but absurd strip (1 x 1,000,000 pixels from 4 KB of PNG) that the
# shorter-side resize would blow up to billions of pixels: `to_pixels` crops such strips to their centre first.
MAX_ASPECT_RATIO: int = 8
# Files up to this size are read into memory in one call before decoding (faster); larger ones are streamed.
READ_WHOLE_BYTES: int = 64 * 2**20
# Threads that decode files side by side (libjpeg-turbo and PIL release the GIL while decoding): when
# photos are cached for training and when a batch is decoded for evaluate / predict.
DECODE_THREADS: int = min(4, os.cpu_count() or 1)

_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_HIGH_DEPTH_MODES = frozenset({"I", "F", "I;16", "I;16L", "I;16B", "I;16N"})


class ImageLoadError(Exception):
    """An image file could not be read; the message names the file and the reason."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot load image {self.path}: {reason}")


def _high_depth_to_l(img: Image.Image) -> Image.Image:
    """16-bit / 32-bit integer or float grayscale -> 8-bit 'L', rescaled (PIL's convert would clip at 255)."""
    a = np.asarray(img, dtype=np.float64)  # (H, W)
    if not np.isfinite(a).all():
        a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if img.mode.startswith("I;16"):
        a = a / 257.0  # 0..65535 -> 0..255
    elif img.mode == "F" and lo >= 0.0 and hi <= 1.0:
        a = a * 255.0  # float image in [0, 1]
    elif lo >= 0.0 and hi <= 255.0:
        pass  # already 8-bit range
    elif lo >= 0.0 and hi <= 65535.0:
        a = a / 257.0  # 16-bit data stored as 'I' (e.g. 16-bit PNG in older Pillow)
    else:
        a = (a - lo) / (hi - lo) * 255.0  # arbitrary range: min-max stretch
    return Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8), mode="L")


def _to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB; transparent pixels become white."""
    if img.mode in _HIGH_DEPTH_MODES:
        img = _high_depth_to_l(img)
    if img.mode in _ALPHA_MODES or "transparency" in img.info:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if img.mode != "RGB":
        return img.convert("RGB")  # L, 1, P, CMYK, YCbCr, ...
    return img


def load_image(path: str | os.PathLike, min_size: int | None = None) -> Image.Image:
    """Read an image file into a fully decoded RGB PIL image, or raise `ImageLoadError`.

    EXIF orientation is honoured; RGBA / LA / palette-with-transparency are composited on white; palette,
    grayscale (L, I;16, I, F), CMYK and 16-bit images are converted to 8-bit RGB. Missing, empty, truncated,
    corrupt or non-image files and decompression bombs (more than `MAX_IMAGE_PIXELS` pixels) raise
    `ImageLoadError`. The file handle is closed before returning.

    ``min_size``: the caller will shrink the image to this shorter side, so a JPEG at least four times as
    large is decoded at 1/2, 1/4 or 1/8 scale by libjpeg (``Image.draft``), keeping at least twice
    ``min_size`` before the antialiased resize. A 12-megapixel phone photo for a 96 px model decodes
    about 10x faster and ends within a few grey levels of the full decode.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ImageLoadError(path, "file not found") from None
    except OSError as e:
        raise ImageLoadError(path, f"cannot access file ({e.strerror or e})") from None
    if path.is_dir():
        raise ImageLoadError(path, "is a directory, not an image file")
    if size == 0:
        raise ImageLoadError(path, "empty file (0 bytes)")
    try:
        # We own the file object, so it is closed on exit whatever PIL does. A photo-sized file is read whole
        # first: PIL parses JPEG markers in tiny reads, ~3x cheaper from memory (0.05 ms of a 128 px photo's 0.3).
        with open(path, "rb") as f:
            img = Image.open(io.BytesIO(f.read()) if size <= READ_WHOLE_BYTES else f)
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageLoadError(
                    path,
                    f"image is {width}x{height} = {width * height:,} pixels, over the limit of "
                    f"{MAX_IMAGE_PIXELS:,} (possible decompression bomb)",
                )
            if min_size and img.format == "JPEG":
                img.draft("RGB", (2 * min_size, 2 * min_size))  # DCT scaling; both sides stay >= 2 * min_size
            img.load()  # decode now: truncated data fails here, inside the try
    except ImageLoadError:
        raise
    except Image.DecompressionBombError as e:
        raise ImageLoadError(path, f"possible decompression bomb ({e})") from None
    except Image.UnidentifiedImageError:
        raise ImageLoadError(path, "not an image file, or a format PIL cannot read") from None
    except MemoryError:
        raise ImageLoadError(path, "out of memory while decoding") from None
    except Exception as e:  # OSError (truncated), SyntaxError, ValueError, struct.error, ... from PIL plugins
        raise ImageLoadError(path, f"corrupt or truncated image ({type(e).__name__}: {e})") from None
    try:
        ImageOps.exif_transpose(img, in_place=True)  # no copy when there is nothing to rotate
    except Exception as e:  # malformed EXIF: keep the pixels, lose the rotation
        logger.debug("ignoring unreadable EXIF orientation in %s: %s", path, e)
    try:
        return _to_rgb(img)
    except Exception as e:
        raise ImageLoadError(path, f"cannot convert mode {img.mode!r} to RGB ({type(e).__name__}: {e})") from None


def to_pixels(img: Image.Image) -> torch.Tensor:
    """RGB PIL image -> uint8 (3, H, W), a channels-last view of its pixels; a strip longer than
    `MAX_ASPECT_RATIO` times its width (e.g. 1 x 1,000,000) is cut to its centre square, all that
    :func:`resize_crop` keeps of it anyway (resizing it whole would need gigabytes)."""
    w, h = img.size
    if max(w, h) > MAX_ASPECT_RATIO * min(w, h):
        img = TF.center_crop(img, [min(w, h)] * 2)
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


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def list_images(
    paths: str | os.PathLike | Iterable[str | os.PathLike], recursive: bool = True
) -> tuple[list[Path], list[Path]]:
    """Expand files and folders into (sorted image files, skipped non-image files).

    Image files are recognised by extension (`IMAGE_EXTENSIONS`, case-insensitive). Folders are walked
    (recursively unless `recursive=False`), following symbolic links but never entering the same real
    folder twice, nor a folder that contains the one being walked (a link back up, e.g. `daisy/up -> ..`,
    would add the other classes' images), so link loops terminate. Hidden files and folders (names starting
    with '.') found while walking are ignored. A path that does not exist raises `FileNotFoundError`.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    images: set[Path] = set()
    skipped: set[Path] = set()

    def add_file(p: Path) -> None:
        (images if p.suffix.lower() in IMAGE_EXTENSIONS else skipped).add(p)

    seen_dirs: set[str] = set()
    for p in map(Path, paths):
        if p.is_dir():
            top = os.path.realpath(p)
            for dirpath, dirnames, filenames in os.walk(p, followlinks=True):
                real = os.path.realpath(dirpath)
                above = real != top and os.path.commonpath([real, top]) == real  # a link back up to an ancestor
                if real in seen_dirs or above:  # symlink loop or a folder reached twice
                    dirnames[:] = []
                    continue
                seen_dirs.add(real)
                dirnames[:] = sorted(d for d in dirnames if not _is_hidden(d)) if recursive else []
                for name in filenames:
                    if not _is_hidden(name):
                        add_file(Path(dirpath) / name)
        elif p.exists():
            add_file(p)
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
    return sorted(images), sorted(skipped)


def printable_name(path: str | os.PathLike) -> str:
    """``path`` as text that can always be printed, plotted or written as UTF-8: the bytes of a file name that
    are not valid UTF-8 (kept by Python as surrogate escapes, which encoders and matplotlib reject) become
    ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


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


def _decode_jpeg_fast(path: str | os.PathLike, size: int) -> torch.Tensor | None:
    """A photo-sized JPEG (1 or 3 components, under ``MAX_IMAGE_PIXELS``, not so large that PIL's reduced-scale
    decode pays off) -> uint8 (3, H, W) by torchvision's decoder with EXIF orientation applied, the same pixels
    as :func:`load_image`. None for any other file, or any failure: :func:`load_image` then decodes it or names
    what is wrong."""
    if Path(path).suffix.lower() not in _JPEG_SUFFIXES:  # other files are read once, by load_image alone
        return None
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > READ_WHOLE_BYTES:
                return None
            data = f.read()
        frame = jpeg_frame(data)
        if frame is None:
            return None
        height, width, components = frame
        if components not in (1, 3) or not 0 < height * width <= MAX_IMAGE_PIXELS:
            return None
        if min(height, width) >= 4 * size or max(height, width) > MAX_ASPECT_RATIO * min(height, width):
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
