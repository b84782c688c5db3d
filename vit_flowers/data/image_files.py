"""Reading image files safely, without torch: the part of :mod:`.images` that a deployment needs.

`load_image` turns any image file PIL can read (HEIC / HEIF through pi-heif, AVIF) into an RGB image (EXIF
orientation applied, transparency composited on white, 16-bit and float grayscale rescaled instead of clipped)
or raises `ImageLoadError`
naming the file and the reason; `crop_strip` cuts absurdly long strips to their centre. `list_images`
expands files and folders into image files; `decode_in_chunks` decodes a list of files a chunk at a time on
a few threads, one unreadable file costing only its own entry. :mod:`.images` (torch) builds on these, and
so does the torch-free ONNX Runtime path (:mod:`vit_flowers.inference.onnx_runtime`):

    img = load_image("photo.jpg", min_size=96)           # RGB PIL image, or ImageLoadError
    images, skipped = list_images("photos/")             # sorted image files, non-image files
"""

from __future__ import annotations

import io
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np
from PIL import Image, ImageOps, features

__all__ = ["IMAGE_EXTENSIONS", "HEIF_EXTENSIONS", "AVIF_EXTENSIONS", "HEIF_PLUGIN", "MAX_IMAGE_PIXELS",
           "MAX_ASPECT_RATIO", "READ_WHOLE_BYTES", "DECODE_THREADS", "heif_plugin", "ImageLoadError", "load_image",
           "crop_strip", "inside_folder", "list_images", "printable_name", "FileError", "decode_in_chunks"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

# HEIC / HEIF: every iPhone's default since 2017, read through the pi-heif plugin (a dependency, registered
# with PIL on the first such file: importing it costs ~0.1 s that a one-photo predict of a JPEG need not pay).
# AVIF: read by Pillow itself (11.3 and later).
HEIF_EXTENSIONS: frozenset[str] = frozenset({".heic", ".heif"})
AVIF_EXTENSIONS: frozenset[str] = frozenset({".avif"})
IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"} | HEIF_EXTENSIONS | AVIF_EXTENSIONS
)
HEIF_PLUGIN = "pi-heif"  # the PyPI package that reads HEIC / HEIF (pillow-heif's decoder-only build)

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


_plugin_lock = threading.Lock()
_heif_registered: bool | None = None  # None: not tried yet


def heif_plugin() -> bool:
    """Whether HEIC / HEIF files can be read: registers pi-heif's opener with PIL the first time (decode threads
    may ask at once); False when the plugin is not installed."""
    global _heif_registered
    with _plugin_lock:
        if _heif_registered is None:
            try:
                from pi_heif import register_heif_opener
            except ImportError:
                _heif_registered = False
            else:
                register_heif_opener()
                _heif_registered = True
        return _heif_registered


def _missing_reader(path: Path) -> str | None:
    """Why a HEIC / HEIF / AVIF file cannot be read here (the plugin or Pillow version it needs, and the pip
    command), or None when it can be."""
    suffix = path.suffix.lower()
    if suffix in HEIF_EXTENSIONS and not heif_plugin():
        return f"a HEIC/HEIF photo: reading it needs the {HEIF_PLUGIN} plugin (pip install {HEIF_PLUGIN})"
    if suffix in AVIF_EXTENSIONS and not features.check("avif"):
        return "an AVIF photo: this Pillow cannot read AVIF (Pillow 11.3 or later can: pip install -U pillow)"
    return None


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
    missing = _missing_reader(path)
    if missing:
        raise ImageLoadError(path, missing)
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
    except Exception as e:  # noqa: BLE001 - OSError (truncated), SyntaxError, ValueError, struct.error, ... from PIL plugins
        raise ImageLoadError(path, f"corrupt or truncated image ({type(e).__name__}: {e})") from None
    try:
        ImageOps.exif_transpose(img, in_place=True)  # no copy when there is nothing to rotate
    except Exception as e:  # noqa: BLE001 - malformed EXIF (any error of PIL's): keep the pixels, lose the rotation
        logger.debug("ignoring unreadable EXIF orientation in %s: %s", path, e)
    try:
        return _to_rgb(img)
    except Exception as e:  # noqa: BLE001 - PIL's mode conversions raise several types; the file gets its error
        raise ImageLoadError(path, f"cannot convert mode {img.mode!r} to RGB ({type(e).__name__}: {e})") from None



def crop_strip(img: Image.Image) -> Image.Image:
    """A strip longer than `MAX_ASPECT_RATIO` times its width (e.g. 1 x 1,000,000) cut to its centre square
    (torchvision's centre-crop rounding), all that a shorter-side resize and centre crop keep of it anyway
    (resizing it whole would need gigabytes); any other image unchanged."""
    w, h = img.size
    if max(w, h) <= MAX_ASPECT_RATIO * min(w, h):
        return img
    side = min(w, h)
    left, top = int(round((w - side) / 2.0)), int(round((h - side) / 2.0))
    return img.crop((left, top, left + side, top + side))

def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def inside_folder(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies below it, compared as written (give both as real paths to compare
    where they lead)."""
    try:
        return os.path.commonpath([os.fspath(path), os.fspath(folder)]) == os.fspath(folder)
    except ValueError:  # one relative, one absolute (or, on Windows, other drives)
        return False


def list_images(
    paths: str | os.PathLike | Iterable[str | os.PathLike], recursive: bool = True, *,
    links_out: list[Path] | None = None,
) -> tuple[list[Path], list[Path]]:
    """Expand files and folders into (sorted image files, skipped non-image files).

    Image files are recognised by extension (`IMAGE_EXTENSIONS`, case-insensitive). Folders are walked
    (recursively unless `recursive=False`), following symbolic links but never entering the same real
    folder twice, nor a folder that contains the one being walked (a link back up, e.g. `daisy/up -> ..`,
    would add the other classes' images), so link loops terminate; a link that cannot be followed (a loop, or
    dangling) is listed with the images whatever its name, so that reading it says why. Hidden files and folders
    (names starting with '.') found while walking are ignored. A path that does not exist raises `FileNotFoundError`.

    ``links_out`` (a class folder's walk, :func:`vit_flowers.data.splits.scan_class_folders`): a link found while
    walking a folder (to a file or a folder) that leads out of that folder's real path is not followed but
    appended to this list (sorted), so that no photo is counted under two classes nor read from outside the data.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    images: set[Path] = set()
    skipped: set[Path] = set()
    out: set[Path] = set()

    def add_file(p: Path, top: str) -> None:
        # a link that leads nowhere (dangling, or a loop: os.walk lists those as files) is kept whatever its name,
        # so that reading it reports it ("Too many levels of symbolic links") instead of skipping it unseen
        unreachable = p.is_symlink() and not p.exists()
        leads_out = p.is_symlink() and not unreachable and not inside_folder(os.path.realpath(p), top)
        if links_out is not None and leads_out:
            out.add(p)
            return
        (images if unreachable or p.suffix.lower() in IMAGE_EXTENSIONS else skipped).add(p)

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
                if links_out is not None:  # folder links out of the folder walked: named, not entered
                    leaving = {d for d in dirnames
                               if not inside_folder(os.path.realpath(os.path.join(dirpath, d)), top)}
                    out.update(Path(dirpath) / d for d in leaving)
                    dirnames[:] = [d for d in dirnames if d not in leaving]
                for name in filenames:
                    if not _is_hidden(name):
                        add_file(Path(dirpath) / name, top)
        elif p.exists():
            add_file(p, os.path.realpath(p.parent))
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
    if links_out is not None:
        links_out.extend(sorted(out))
    return sorted(images), sorted(skipped)


def printable_name(path: str | os.PathLike) -> str:
    """``path`` as text that can always be printed, plotted or written as UTF-8: the bytes of a file name that
    are not valid UTF-8 (kept by Python as surrogate escapes, which encoders and matplotlib reject) become
    ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


class FileError(NamedTuple):
    """A file that could not be read: its position in the input, its path and the reason."""

    index: int  # type: ignore[assignment]  # a field named like tuple.index, which it shadows: Python allows it
    path: Path
    reason: str


def _decode_all(decode: Callable[[Path], T | str], paths: Sequence[Path]) -> list[T | str]:
    """``decode`` of each path, in order; a decoder bug on one odd file costs only that file."""
    out: list[T | str] = []
    for path in paths:
        try:
            out.append(decode(path))
        except Exception as exc:  # noqa: BLE001 - a decoder bug on one odd file costs only that file
            out.append(f"{type(exc).__name__}: {exc}")
    return out


def decode_in_chunks(
    paths: Sequence[Path],
    decode: Callable[[Path], T | str],
    chunk_size: int,
    num_threads: int | None = None,
    read_ahead: bool = True,
) -> Iterator[tuple[list[int], list[T], list[FileError]]]:
    """Decode ``paths`` in chunks of ``chunk_size``: yields (input positions, decoded values, errors) per chunk.

    ``decode(path)`` returns a value, or a string saying why the file cannot be read. Each chunk is split into
    ``num_threads`` parts (default :data:`DECODE_THREADS`) decoded side by side. ``read_ahead``: decode the
    next chunk while the consumer works on this one (the right thing when the consumer leaves the CPU free: a
    model on a GPU); otherwise decode each chunk when it is asked for, the calling thread taking one part (for
    a model on the CPU, whose threads would otherwise wait for the cores the decoders took).

    Every input path ends up in exactly one chunk, decoded or in the errors; chunks follow the input order.
    At most two chunks are decoded or held at a time.
    """
    if chunk_size <= 0:
        raise ValueError(f"batch_size must be positive, got {chunk_size}")
    if not paths:
        return
    threads = max(1, num_threads or DECODE_THREADS)

    def parts(start: int) -> list[Sequence[Path]]:
        chunk = paths[start:start + chunk_size]
        step = -(-len(chunk) // threads)
        return [chunk[i:i + step] for i in range(0, len(chunk), step)]

    with ThreadPoolExecutor(max_workers=threads if read_ahead else max(1, threads - 1)) as pool:

        def submit(chunk_parts: list[Sequence[Path]]) -> list[Future]:
            return [pool.submit(_decode_all, decode, part) for part in chunk_parts]

        pending = submit(parts(0)) if read_ahead else []
        for start in range(0, len(paths), chunk_size):
            if read_ahead:
                futures = pending
                if start + chunk_size < len(paths):
                    pending = submit(parts(start + chunk_size))  # decode the next chunk while this one is used
                results: list[T | str] = []
            else:
                first, *rest = parts(start)
                futures = submit(rest)
                results = _decode_all(decode, first)  # this thread decodes a part too
            results += [r for future in futures for r in future.result()]
            indices: list[int] = []
            decoded: list[T] = []
            errors: list[FileError] = []
            for i, result in enumerate(results, start):
                if isinstance(result, str):
                    errors.append(FileError(i, paths[i], result))
                else:
                    indices.append(i)
                    decoded.append(result)
            yield indices, decoded, errors
