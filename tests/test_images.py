"""Tests for vit_flowers.data.images: robust loading, the shared resize, and file listing."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter, features
from torchvision.transforms.v2 import functional as TF

from vit_flowers.data import image_files, images
from vit_flowers.data.images import (
    IMAGE_EXTENSIONS,
    ImageLoadError,
    decode_file,
    decode_pixels,
    list_images,
    load_image,
    preprocess,
    resize_crop,
    to_pixels,
)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png_bytes(width: int, height: int, bit_depth: int, colour_type: int, raw: bytes) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(raw))
        + _png_chunk(b"IEND", b"")
    )


def _px(img: Image.Image, x: int, y: int) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(img)[y, x])


def _assert_rgb(img: Image.Image, size: tuple[int, int]) -> None:
    assert isinstance(img, Image.Image)
    assert img.mode == "RGB"
    assert img.size == size


def test_jpeg_rgb(tmp_path: Path) -> None:
    p = tmp_path / "a.jpg"
    Image.new("RGB", (30, 20), (200, 30, 40)).save(p, quality=95)
    img = load_image(p)
    _assert_rgb(img, (30, 20))
    assert np.abs(np.asarray(img).astype(int) - [200, 30, 40]).max() <= 3


def test_png_rgba_composited_on_white(tmp_path: Path) -> None:
    p = tmp_path / "a.png"
    im = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red
    im.putpixel((1, 1), (0, 0, 255, 255))  # opaque blue
    im.putpixel((2, 2), (0, 0, 0, 128))  # half-transparent black
    im.save(p)
    img = load_image(p)
    _assert_rgb(img, (4, 4))
    assert _px(img, 0, 0) == (255, 255, 255)
    assert _px(img, 1, 1) == (0, 0, 255)
    assert all(120 <= v <= 135 for v in _px(img, 2, 2))  # black at 50% over white -> mid grey


def test_la_png_composited_on_white(tmp_path: Path) -> None:
    p = tmp_path / "la.png"
    im = Image.new("LA", (3, 3), (0, 0))  # transparent black
    im.putpixel((0, 0), (50, 255))
    im.save(p)
    img = load_image(p)
    assert _px(img, 1, 1) == (255, 255, 255)
    assert _px(img, 0, 0) == (50, 50, 50)


def test_palette_png_with_transparency(tmp_path: Path) -> None:
    p = tmp_path / "p.png"
    im = Image.new("P", (4, 4), 1)
    im.putpalette([0, 0, 0] + [0, 200, 0] + [0, 0, 0] * 254)  # index 0 black (transparent), 1 green
    im.putpixel((0, 0), 0)
    im.save(p, transparency=0)
    img = load_image(p)
    _assert_rgb(img, (4, 4))
    assert _px(img, 0, 0) == (255, 255, 255)  # transparent black -> white, not black
    assert _px(img, 3, 3) == (0, 200, 0)


def test_palette_png_without_transparency(tmp_path: Path) -> None:
    p = tmp_path / "p.png"
    im = Image.new("P", (2, 2), 1)
    im.putpalette([0, 0, 0] + [10, 20, 30] + [0, 0, 0] * 254)
    im.save(p)
    assert _px(load_image(p), 1, 1) == (10, 20, 30)


def test_grayscale_jpeg(tmp_path: Path) -> None:
    p = tmp_path / "g.jpg"
    Image.new("L", (10, 8), 90).save(p, quality=95)
    img = load_image(p)
    _assert_rgb(img, (10, 8))
    r, g, b = _px(img, 5, 4)
    assert r == g == b and abs(r - 90) <= 2


def test_16bit_grayscale_png_rescaled_not_clipped(tmp_path: Path) -> None:
    p = tmp_path / "g16.png"
    values = np.array([[0, 100 * 257, 65535]], dtype=np.uint16)
    Image.fromarray(values).save(p)
    with Image.open(p) as raw:
        assert raw.mode.startswith("I")  # really a 16-bit file
    img = load_image(p)
    _assert_rgb(img, (3, 1))
    assert [_px(img, x, 0) for x in range(3)] == [(0, 0, 0), (100, 100, 100), (255, 255, 255)]


def test_16bit_rgb_png(tmp_path: Path) -> None:
    p = tmp_path / "rgb16.png"
    raw = b"\x00" + np.array([[65535, 0, 0], [0, 32896, 65535]], dtype=">u2").tobytes()  # filter byte + row
    p.write_bytes(_png_bytes(2, 1, 16, 2, raw))
    img = load_image(p)
    _assert_rgb(img, (2, 1))
    assert _px(img, 0, 0) == (255, 0, 0)
    assert _px(img, 1, 0) == (0, 128, 255)


def test_float_tiff_in_unit_range(tmp_path: Path) -> None:
    p = tmp_path / "f.tiff"
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32), mode="F").save(p)
    img = load_image(p)
    assert [_px(img, x, 0)[0] for x in range(3)] == [0, 128, 255]


def test_cmyk_jpeg(tmp_path: Path) -> None:
    p = tmp_path / "c.jpg"
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(p, quality=95)  # pure red in CMYK
    with Image.open(p) as raw:
        assert raw.mode == "CMYK"
    img = load_image(p)
    _assert_rgb(img, (8, 8))
    r, g, b = _px(img, 4, 4)
    assert r > 240 and g < 15 and b < 15


@pytest.mark.skipif(not features.check("webp"), reason="Pillow built without WebP")
def test_webp(tmp_path: Path) -> None:
    p = tmp_path / "a.webp"
    Image.new("RGB", (12, 10), (10, 120, 250)).save(p, lossless=True)
    img = load_image(p)
    _assert_rgb(img, (12, 10))
    assert _px(img, 3, 3) == (10, 120, 250)


def test_bmp_and_gif(tmp_path: Path) -> None:
    Image.new("RGB", (5, 6), (1, 2, 3)).save(tmp_path / "a.bmp")
    assert _px(load_image(tmp_path / "a.bmp"), 2, 2) == (1, 2, 3)
    frames = [Image.new("RGB", (5, 5), c) for c in [(255, 0, 0), (0, 0, 255)]]
    frames[0].save(tmp_path / "a.gif", save_all=True, append_images=frames[1:])
    img = load_image(tmp_path / "a.gif")  # animated: first frame
    _assert_rgb(img, (5, 5))
    assert _px(img, 2, 2) == (255, 0, 0)


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    p = tmp_path / "rot.jpg"
    im = Image.new("RGB", (40, 20), (255, 0, 0))
    im.paste((0, 0, 255), (20, 0, 40, 20))  # left half red, right half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    im.save(p, exif=exif.tobytes(), quality=95)
    img = load_image(p)
    _assert_rgb(img, (20, 40))  # transposed
    assert _px(img, 10, 3)[0] > 200 and _px(img, 10, 3)[2] < 50  # former left half now on top
    assert _px(img, 10, 36)[2] > 200 and _px(img, 10, 36)[0] < 50


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("empty.jpg", b"", "empty file"),
        ("notes.jpg", b"this is just some text, not a JPEG\n" * 10, "not an image"),
        ("garbage.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 50, "not an image"),  # PNG magic, then junk
    ],
    ids=["zero-byte", "text-as-jpg", "junk-after-png-magic"],
)
def test_bad_files_raise_image_load_error(tmp_path: Path, name: str, content: bytes, reason: str) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(ImageLoadError, match=reason) as exc:
        load_image(p)
    assert str(p) in str(exc.value)
    assert exc.value.path == str(p)


def test_truncated_jpeg(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    full = tmp_path / "full.jpg"
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(full)
    p = tmp_path / "truncated.jpg"
    p.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(ImageLoadError, match="truncated") as exc:
        load_image(p)
    assert "truncated.jpg" in str(exc.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ImageLoadError, match="not found"):
        load_image(tmp_path / "nope.jpg")
    with pytest.raises(ImageLoadError, match="directory"):
        load_image(tmp_path)


def test_decompression_bomb_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "big.png"
    Image.new("RGB", (20, 20)).save(p)
    assert load_image(p).size == (20, 20)
    monkeypatch.setattr(image_files, "MAX_IMAGE_PIXELS", 399)
    with pytest.raises(ImageLoadError, match="decompression bomb") as exc:
        load_image(p)
    assert "big.png" in str(exc.value)


def test_crafted_png_header_claiming_huge_size(tmp_path: Path) -> None:
    p = tmp_path / "bomb.png"
    p.write_bytes(_png_bytes(100_000, 100_000, 8, 2, b"\x00" * 10))  # 10^10 pixels in a tiny file
    assert p.stat().st_size < 200
    with pytest.raises(ImageLoadError, match="decompression bomb") as exc:
        load_image(p)
    assert "bomb.png" in str(exc.value)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count open files")
def test_file_handles_are_closed(tmp_path: Path) -> None:
    p = tmp_path / "a.png"
    Image.new("RGB", (8, 8)).save(p)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"nope" * 10)
    load_image(p)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        load_image(p).getpixel((0, 0))  # still usable after the file is closed
        with pytest.raises(ImageLoadError):
            load_image(bad)
    assert len(os.listdir("/proc/self/fd")) == before


def test_preprocess_resizes_shorter_side_then_centre_crops() -> None:
    im = Image.new("RGB", (150, 50), (255, 0, 0))
    im.paste((0, 255, 0), (50, 0, 100, 50))  # thirds: red | green | blue
    im.paste((0, 0, 255), (100, 0, 150, 50))
    out = preprocess(im, 32)
    assert out.dtype == torch.uint8 and out.shape == (3, 32, 32)
    # the centre crop is exactly the green middle third (up to bicubic bleeding at the borders)
    inner = out[:, :, 2:-2].float()
    assert inner[1].min() > 200 and inner[0].max() < 40 and inner[2].max() < 40


def test_preprocess_portrait_and_upscale() -> None:
    im = Image.new("RGB", (10, 30), (0, 0, 0))
    im.paste((255, 255, 255), (0, 10, 10, 20))  # white middle band
    out = preprocess(im, 20)  # upscale 10 -> 20, crop the middle 20 of 60 rows
    assert out.shape == (3, 20, 20)
    assert out[:, 2:-2].float().min() > 200


def test_preprocess_matches_identity_at_same_size() -> None:
    arr = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    out = preprocess(Image.fromarray(arr), 16)
    assert torch.equal(out, torch.from_numpy(arr).permute(2, 0, 1))


def _touch_image(p: Path) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (2, 2)).save(p) if p.suffix.lower() in IMAGE_EXTENSIONS else p.write_text("x")


def test_list_images_nested_hidden_and_symlink_loop(tmp_path: Path) -> None:
    root = tmp_path / "photos"
    for rel in ["b.png", "a.JPG", "sub/c.jpeg", "sub/deeper/d.webp", "sub/notes.txt", "LICENSE",
                ".hidden.jpg", ".cache/e.jpg", "sub/.f.png"]:
        _touch_image(root / rel)
    (root / "sub" / "deeper" / "loop").symlink_to(root, target_is_directory=True)  # loop back to the top
    found, skipped = list_images(root)
    assert found == sorted([root / "a.JPG", root / "b.png", root / "sub/c.jpeg", root / "sub/deeper/d.webp"])
    assert skipped == sorted([root / "LICENSE", root / "sub/notes.txt"])

    flat, flat_skipped = list_images(root, recursive=False)
    assert flat == [root / "a.JPG", root / "b.png"]
    assert flat_skipped == [root / "LICENSE"]


def test_list_images_files_and_folders_mixed(tmp_path: Path) -> None:
    _touch_image(tmp_path / "dir/x.png")
    _touch_image(tmp_path / "y.bmp")
    _touch_image(tmp_path / "z.txt")
    found, skipped = list_images([str(tmp_path / "y.bmp"), tmp_path / "dir", tmp_path / "z.txt", tmp_path / "y.bmp"])
    assert found == [tmp_path / "dir/x.png", tmp_path / "y.bmp"]  # sorted, no duplicates
    assert skipped == [tmp_path / "z.txt"]
    assert list_images(tmp_path / "y.bmp") == ([tmp_path / "y.bmp"], [])  # a single path works too
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        list_images([tmp_path / "missing.jpg"])


def test_large_jpeg_is_decoded_at_reduced_scale_with_the_same_pixels(tmp_path):
    yy, xx = np.mgrid[0:1200, 0:1600]  # a smooth 1600 x 1200 photo-like gradient with some texture
    rgb = np.stack([xx / 1600 * 255, yy / 1200 * 255, 128 + 60 * np.sin(xx / 40.0) * np.cos(yy / 30.0)], axis=-1)
    path = tmp_path / "big.jpg"
    Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).save(path, quality=92)
    reduced = load_image(path, min_size=96)
    assert reduced.size == (400, 300)  # 1/4 scale: the largest that keeps both sides >= 2 * 96
    assert load_image(path).size == (1600, 1200)  # without a size hint: full decode
    full, fast = preprocess(load_image(path), 96).int(), preprocess(reduced, 96).int()
    assert (full - fast).abs().float().mean() < 1.0 and (full - fast).abs().max() <= 8
    png = tmp_path / "big.png"
    Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).save(png)
    assert load_image(png, min_size=96).size == (1600, 1200)  # only JPEG has DCT scaling


def test_resize_crop_batches_mixed_sizes_in_order_like_preprocess_and_close_to_pil() -> None:
    rng = np.random.default_rng(1)
    shapes = [(40, 60), (30, 30), (40, 60), (90, 20), (16, 16), (30, 30)]  # (H, W): groups interleaved
    ims = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).filter(ImageFilter.SMOOTH)
           for h, w in shapes]
    batch = resize_crop([to_pixels(im) for im in ims], 16)
    assert batch.shape == (6, 3, 16, 16) and batch.dtype == torch.uint8
    for i, im in enumerate(ims):  # the same pixels one by one (training cache) as in a batch (predict)
        assert torch.equal(batch[i], preprocess(im, 16))
        w, h = im.size  # PIL's own bicubic resize of the shorter side + centre crop, within rounding
        pil = im.resize((16, 16 * h // w) if w <= h else (16 * w // h, 16), Image.BICUBIC)
        pil = torch.from_numpy(np.array(TF.center_crop(pil, [16, 16]))).permute(2, 0, 1)
        assert (batch[i].int() - pil.int()).abs().max() <= 3
    same = [im for im, shape in zip(ims, shapes) if shape == (40, 60)]  # one size for all: the copy path
    expected = torch.stack([preprocess(im, 16) for im in same])
    assert torch.equal(resize_crop([to_pixels(im) for im in same], 16), expected)
    assert resize_crop([], 16).shape == (0, 3, 16, 16)


def test_decode_pixels_keeps_small_images_whole_and_shrinks_big_ones(tmp_path: Path) -> None:
    small, big = tmp_path / "small.png", tmp_path / "big.png"
    Image.new("RGB", (50, 40), (0, 128, 255)).save(small)
    Image.new("RGB", (500, 400), (0, 128, 255)).save(big)
    assert decode_pixels(small, 32).shape == (3, 40, 50)  # resized later, with its batch
    assert decode_pixels(big, 32).shape == (3, 32, 32)  # resized now: a batch never holds full-size photos
    assert torch.equal(resize_crop([decode_pixels(big, 32)], 32)[0], decode_file(big, 32))
    assert decode_pixels(tmp_path / "missing.png", 32) == "file not found"


def _jpeg(path: Path, mode: str, size: tuple[int, int], exif_orientation: int | None = None) -> Path:
    rng = np.random.default_rng(1)
    channels = {"L": 1, "RGB": 3, "CMYK": 4}[mode]
    arr = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    img = Image.fromarray(arr[..., 0] if channels == 1 else arr, mode=mode).filter(ImageFilter.SMOOTH)
    kw = {}
    if exif_orientation:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        kw["exif"] = exif.tobytes()
    img.save(path, quality=90, **kw)
    return path


@pytest.mark.parametrize("mode, size, orientation, fast", [
    ("RGB", (48, 40), None, True), ("L", (40, 48), None, True), ("RGB", (60, 30), 6, True),
    ("RGB", (30, 60), 3, True), ("CMYK", (40, 40), None, False),  # CMYK: PIL, whose conversion training uses
    ("RGB", (400, 300), None, False),  # far larger than the model's input: PIL's reduced-scale decode
], ids=["rgb", "gray", "exif-rotate-90", "exif-rotate-180", "cmyk", "large"])
@pytest.mark.parametrize("direct_op", [True, False], ids=["op", "wrapper"])
def test_decode_pixels_jpeg_fast_path_gives_load_images_pixels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               mode, size, orientation, fast, direct_op):
    """predict's JPEG decoder (torchvision's) returns exactly the pixels that training's PIL decode caches,
    through torchvision's op called directly and through its Python wrapper (used if the op is renamed)."""
    if not direct_op:
        monkeypatch.setattr(images, "_jpeg_op", None)
    p = _jpeg(tmp_path / "a.jpg", mode, size, orientation)
    assert (images._decode_jpeg_fast(p, 32) is not None) == (fast and images._tv_decode_jpeg is not None)
    pil = load_image(p, min_size=32)
    expected = images.preprocess(pil, 32) if min(pil.size) > 64 else images.to_pixels(pil)
    assert torch.equal(decode_pixels(p, 32), expected)


def test_torchvisions_jpeg_op_is_found_where_its_decoder_is() -> None:
    """A torchvision that renames the op still decodes (through the wrapper), but slower: this says so."""
    assert (images._jpeg_op is not None) == (images._tv_decode_jpeg is not None)


def test_jpeg_frame_reads_the_header_and_declines_anything_else(tmp_path: Path) -> None:
    data = _jpeg(tmp_path / "a.jpg", "RGB", (48, 40), exif_orientation=6).read_bytes()  # EXIF before the frame
    assert images.jpeg_frame(data) == (40, 48, 3)
    Image.new("RGB", (4, 4)).save(tmp_path / "a.png")
    for other in (b"", b"\xff\xd8\xff", data[:20], b"\xff\xd8\xff\xe0\x00\x10JFIF", (tmp_path / "a.png").read_bytes(),
                  data[:2] + b"\x00" * 40):
        assert images.jpeg_frame(other) is None


def test_decode_pixels_bad_jpegs_keep_their_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Truncated, bomb-sized or fake JPEGs fall back to PIL's checks and messages."""
    full = _jpeg(tmp_path / "full.jpg", "RGB", (64, 64))
    (tmp_path / "truncated.jpg").write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    assert "truncated" in decode_pixels(tmp_path / "truncated.jpg", 32)
    (tmp_path / "text.jpg").write_bytes(b"\xff\xd8\xff not really a JPEG" * 4)
    assert "not an image" in decode_pixels(tmp_path / "text.jpg", 32)
    monkeypatch.setattr(image_files, "MAX_IMAGE_PIXELS", 64 * 63)
    assert "decompression bomb" in decode_pixels(full, 32)


def _two_colour_photo(path: Path, orientation: int | None = None, **save) -> None:
    """A 40 x 20 photo, left half red, right half blue, saved in the format of ``path``'s extension."""
    im = Image.new("RGB", (40, 20), (255, 0, 0))
    im.paste((0, 0, 255), (20, 0, 40, 20))
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    im.save(path, exif=exif.tobytes(), **save)


def test_heic_photos_read_like_any_photo_with_their_rotation(tmp_path: Path) -> None:
    """An iPhone's HEIC (made here with pillow-heif, which stores the EXIF rotation in the file's own rotation box
    as phones do) reads as the same JPEG with that EXIF rotation does, and is listed as an image."""
    pytest.importorskip("pillow_heif").register_heif_opener()  # to write one
    _two_colour_photo(tmp_path / "IMG_0001.HEIC", orientation=6, quality=90)
    _two_colour_photo(tmp_path / "rot.jpg", orientation=6, quality=95)
    heic, jpeg = load_image(tmp_path / "IMG_0001.HEIC"), load_image(tmp_path / "rot.jpg")
    _assert_rgb(heic, (20, 40))  # transposed, as the JPEG
    assert np.abs(np.asarray(heic, dtype=int) - np.asarray(jpeg, dtype=int)).mean() < 12
    assert _px(heic, 10, 3)[0] > 200 and _px(heic, 10, 36)[2] > 200  # the red half on top
    assert list_images(tmp_path) == ([tmp_path / "IMG_0001.HEIC", tmp_path / "rot.jpg"], [])


def test_avif_photos_read_where_pillow_reads_avif(tmp_path: Path) -> None:
    if not features.check("avif"):
        pytest.skip("this Pillow has no AVIF support")
    _two_colour_photo(tmp_path / "a.avif", quality=90)
    img = load_image(tmp_path / "a.avif")
    _assert_rgb(img, (40, 20))
    assert _px(img, 5, 10)[0] > 200 and _px(img, 35, 10)[2] > 200
    assert list_images(tmp_path)[0] == [tmp_path / "a.avif"]


def test_without_the_heif_plugin_a_heic_file_names_the_plugin_and_the_pip_command(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    pytest.importorskip("pillow_heif").register_heif_opener()  # to write one
    _two_colour_photo(tmp_path / "IMG_0002.heic", quality=90)
    monkeypatch.setattr(image_files, "_heif_registered", False)  # as where pi-heif is not installed
    with pytest.raises(ImageLoadError, match=r"IMG_0002.heic: a HEIC/HEIF photo: reading it needs the pi-heif "
                                             r"plugin \(pip install pi-heif\)"):
        load_image(tmp_path / "IMG_0002.heic")
