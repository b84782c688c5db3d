"""Built-in synthetic flower dataset: five procedurally drawn classes, no download.

Every image is drawn with PIL ``ImageDraw`` (polygons, ellipses, lines) on a canvas twice the
target size, downscaled with antialiasing and then jittered in numpy (lighting, contrast,
colour, noise). Backgrounds, scale, position, rotation, tilt, number of flowers and colours
vary so that a small ViT has something to learn. Image ``i`` of a set depends only on
``(seed, i)`` through ``numpy.random.default_rng([seed, i])``: any image can be regenerated on
its own, in any order, in any process.

    images, labels = make_synthetic_flowers(400, 64, seed=0)   # (2000, 3, 64, 64) uint8
"""

from __future__ import annotations

import colorsys
import functools
import logging
import math
import operator
from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

CLASSES: tuple[str, ...] = ("daisy", "dandelion", "rose", "sunflower", "tulip")

RGB = tuple[int, int, int]
MIN_SIZE = 8  # smallest image side we agree to draw

# ---------------------------------------------------------------------------- geometry


def _rot(angle: float) -> np.ndarray:
    """2x2 rotation matrix."""
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s], [s, c]])


def _pose(rng: np.random.Generator, tilt: float = 0.6) -> np.ndarray:
    """Random in-plane rotation times a squash along one axis (a flower seen at an angle)."""
    squash = rng.uniform(tilt, 1.0) if rng.random() < 0.6 else 1.0
    return _rot(rng.uniform(0, 2 * np.pi)) @ np.diag([1.0, squash])


@functools.cache
def _unit_circle(k: int = 28) -> np.ndarray:
    """(k, 2) points on the unit circle."""
    t = np.linspace(0, 2 * np.pi, k, endpoint=False)
    return np.stack([np.cos(t), np.sin(t)], axis=1)


def _petal_outline(p: float, q: float, k: int = 10) -> np.ndarray:
    """Closed outline of a petal lying along +x from (0, 0) to (1, 0), unit width: (2k-2, 2).

    Half-width profile ``0.5 * sin(pi * s**p) ** q``: ``p > 1`` moves the widest point towards
    the tip, ``q < 1`` rounds the ends, ``q >= 1`` makes them pointed.
    """
    s = np.linspace(0.0, 1.0, k)
    h = 0.5 * np.sin(np.pi * s**p) ** q
    top = np.stack([s, h], axis=1)
    bottom = np.stack([s[-2:0:-1], -h[-2:0:-1]], axis=1)
    return np.concatenate([top, bottom])


def _ring(centre: np.ndarray, pose: np.ndarray, angles: np.ndarray, r0: float,
          lengths: np.ndarray, widths: np.ndarray, p: float, q: float) -> np.ndarray:
    """Petals radiating from ``centre``, one per angle, in canvas pixels: (n, K, 2)."""
    unit = _petal_outline(p, q)                                        # (K, 2)
    local = unit[None] * np.stack([lengths, widths], -1)[:, None]      # (n, K, 2)
    local[..., 0] += r0
    c, s = np.cos(angles), np.sin(angles)
    spin = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)  # (n, 2, 2)
    pts = np.einsum("nij,nkj->nki", spin, local)                       # (n, K, 2)
    return pts @ pose.T + centre


def _ellipse(centre: np.ndarray, pose: np.ndarray, rx: float, ry: float | None = None) -> list[float]:
    """Flat polygon of an ellipse with radii (rx, ry) in the pose's frame."""
    ry = rx if ry is None else ry
    pts = _unit_circle() * [rx, ry] @ pose.T + centre                  # (k, 2)
    return pts.ravel().tolist()


# ---------------------------------------------------------------------------- colour


def _shade(colour: tuple[int, ...] | np.ndarray, factor: float, alpha: int | None = None) -> tuple[int, ...]:
    """Colour scaled by ``factor`` (clipped), optionally with an alpha channel."""
    c = np.clip(np.asarray(colour[:3], dtype=np.float64) * factor, 0, 255).astype(int)
    return tuple(c.tolist()) + (() if alpha is None else (int(alpha),))


def _mix(a: RGB, b: RGB, t: float) -> RGB:
    """Linear blend ``(1 - t) * a + t * b``."""
    return tuple(int(round((1 - t) * x + t * y)) for x, y in zip(a, b))  # type: ignore[return-value]  # 3 in, 3 out


def _jitter(rng: np.random.Generator, colour: RGB, amount: float = 18.0) -> RGB:
    """Colour with independent per-channel noise, clipped to [0, 255]."""
    c = np.clip(np.asarray(colour, dtype=np.float64) + rng.normal(0, amount, 3), 0, 255)
    return tuple(c.astype(int).tolist())  # 3 channels (tolist() is untyped: Any)


def _pick(rng: np.random.Generator, palette: tuple[tuple[RGB, float], ...]) -> RGB:
    """Choose a colour from ``((rgb, weight), ...)``."""
    weights = np.array([w for _, w in palette])
    return palette[rng.choice(len(palette), p=weights / weights.sum())][0]


def _green(rng: np.random.Generator) -> RGB:
    """A leaf or grass green."""
    rgb = colorsys.hsv_to_rgb(rng.uniform(0.2, 0.42), rng.uniform(0.4, 0.85), rng.uniform(0.3, 0.72))
    return tuple(int(255 * v) for v in rgb)  # type: ignore[return-value]  # hsv_to_rgb gives 3


def _polygons(draw: ImageDraw.ImageDraw, polys: np.ndarray, fills: list[tuple[int, ...]],
              outline_factor: float | None, width: int) -> None:
    """Fill each polygon of (n, K, 2), outlined in a darker shade of its fill."""
    for pts, fill in zip(polys, fills):
        outline = None if outline_factor is None else _shade(fill, outline_factor)
        draw.polygon(pts.ravel().tolist(), fill=fill, outline=outline, width=width)


# ---------------------------------------------------------------------------- backgrounds


def _upsample(low: np.ndarray, n: int) -> Image.Image:
    """Low-resolution colour field (g, g, 3) -> smooth (n, n) RGB image."""
    return Image.fromarray(np.clip(low, 0, 255).astype(np.uint8)).resize((n, n), Image.Resampling.BICUBIC)


def _foliage(rng: np.random.Generator, n: int, g: int) -> Image.Image:
    """Greens with shadows and leaves, out of focus."""
    base = np.array(_green(rng), dtype=np.float64)
    low = base * rng.uniform(0.35, 1.3, (g, g, 1)) + rng.normal(0, 12, (g, g, 3))
    img = _upsample(low, n)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 14))):
        _leaf(draw, rng.uniform(0, n, 2), rng.uniform(0, 2 * np.pi),
              n * rng.uniform(0.15, 0.5), rng.uniform(0.15, 0.4), _shade(_green(rng), rng.uniform(0.5, 1.2)))
    return img.filter(ImageFilter.GaussianBlur(n * rng.uniform(0.01, 0.04)))


def _sky(rng: np.random.Generator, n: int) -> Image.Image:
    """Sky, sometimes above a strip of field or trees."""
    top = np.array([rng.uniform(60, 150), rng.uniform(130, 200), rng.uniform(190, 255)])
    bottom = np.array([rng.uniform(180, 240)] * 3) + rng.normal(0, 8, 3)
    t = np.linspace(0, 1, n)[:, None, None]                        # (n, 1, 1)
    arr = np.broadcast_to((1 - t) * top + t * bottom, (n, n, 3))
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img, "RGBA")
    for _ in range(int(rng.integers(0, 5))):  # clouds
        c = rng.uniform(0, n, 2)
        draw.ellipse([*(c - n * rng.uniform(0.08, 0.25, 2)), *(c + n * rng.uniform(0.08, 0.25, 2))],
                     fill=(255, 255, 255, int(rng.integers(60, 180))))
    if rng.random() < 0.5:
        h = n * rng.uniform(0.6, 0.9)
        draw.rectangle([0, h, n, n], fill=_green(rng))
    return img.filter(ImageFilter.GaussianBlur(n * rng.uniform(0.01, 0.03)))


def _background(rng: np.random.Generator, n: int) -> Image.Image:
    """A photo-like, out-of-focus background, independent of the class."""
    kind = rng.choice(7, p=[0.3, 0.13, 0.1, 0.15, 0.1, 0.08, 0.14])
    g = int(rng.integers(3, 9))
    if kind == 0:
        return _foliage(rng, n, g)
    if kind == 1:
        return _sky(rng, n)
    if kind == 2:  # soil / bark / dry grass
        base = np.array([rng.uniform(70, 150), rng.uniform(50, 110), rng.uniform(25, 70)])
        low = base * rng.uniform(0.6, 1.3, (g * 2, g * 2, 1))
        arr = np.asarray(_upsample(low, n), dtype=np.float64)
        arr = arr + rng.normal(0, rng.uniform(5, 20), (n, n, 1))
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    if kind == 3:  # bokeh: blurred blobs of assorted colours over a dark or green base
        base = np.array(_green(rng) if rng.random() < 0.6 else _jitter(rng, (40, 40, 40), 20), dtype=np.float64)
        small = max(8, n // 4)
        low = np.broadcast_to(base, (small, small, 3)).astype(np.uint8)
        img = Image.fromarray(np.ascontiguousarray(low))
        draw = ImageDraw.Draw(img, "RGBA")
        for _ in range(int(rng.integers(4, 16))):
            col = _green(rng) if rng.random() < 0.5 else tuple(int(v) for v in rng.integers(0, 256, 3))
            c = rng.uniform(0, small, 2)
            rad = small * rng.uniform(0.05, 0.25)
            draw.ellipse([*(c - rad), *(c + rad)], fill=(*col, int(rng.integers(80, 220))))
        img = img.filter(ImageFilter.GaussianBlur(small * rng.uniform(0.04, 0.1)))
        return img.resize((n, n), Image.Resampling.BICUBIC)
    if kind == 4:  # two-colour gradient in any direction
        a, b = (rng.uniform(20, 230, 3) for _ in range(2))
        ang = rng.uniform(0, 2 * np.pi)
        xy = np.linspace(-1, 1, n)
        t = (np.cos(ang) * xy[None, :] + np.sin(ang) * xy[:, None]) * 0.5 + 0.5  # (n, n)
        arr = (1 - t[..., None]) * a + t[..., None] * b
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    if kind == 5:  # coloured multi-scale noise
        base = rng.uniform(30, 200, 3)
        low = base + rng.normal(0, 35, (g * 3, g * 3, 1)) + rng.normal(0, 12, (g * 3, g * 3, 3))
        arr = np.asarray(_upsample(low, n), dtype=np.float64) + rng.normal(0, 12, (n, n, 3))
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    # dark studio / shadowy background with a faint tint
    base = rng.uniform(0, 45, 3)
    low = base * rng.uniform(0.5, 1.6, (g, g, 1))
    return _upsample(low, n)


# ---------------------------------------------------------------------------- parts


def _leaf(draw: ImageDraw.ImageDraw, base: np.ndarray, angle: float,
          length: float, aspect: float, colour: tuple[int, ...]) -> None:
    """A pointed lens-shaped leaf from ``base`` along ``angle``, with a darker midrib."""
    pts = _petal_outline(1.0, 0.9) * [length, length * aspect] @ _rot(angle).T + base
    draw.polygon(pts.ravel().tolist(), fill=colour)
    tip = base + length * np.array([math.cos(angle), math.sin(angle)])
    draw.line([*base, *tip], fill=_shade(colour, 0.75), width=max(1, int(length * 0.03)))


def _stem(draw: ImageDraw.ImageDraw, rng: np.random.Generator, top: np.ndarray, r: float,
          n: int, with_leaf: bool) -> None:
    """A slightly bent green stem from ``top`` down past the bottom of the canvas."""
    colour = _green(rng)
    width = max(2, int(r * rng.uniform(0.07, 0.13)))
    bend = rng.uniform(-0.4, 0.4) * r
    mid = top + [bend, (n - top[1]) * 0.5 + r * 0.3]
    end = top + [bend * 2.5, n - top[1] + r]
    draw.line([*top, *mid, *end], fill=colour, width=width, joint="curve")
    if with_leaf:
        side = rng.choice([-1.0, 1.0])
        angle = -np.pi / 2 + side * rng.uniform(0.3, 1.0)
        _leaf(draw, mid, angle, r * rng.uniform(1.0, 1.8), rng.uniform(0.18, 0.32), _shade(colour, 0.9))


# ---------------------------------------------------------------------------- flowers
# Each drawer paints one flower of radius ~r centred at c on an n x n canvas (pixels).


def _draw_daisy(draw: ImageDraw.ImageDraw, rng: np.random.Generator, c: np.ndarray, r: float,
                n: int) -> None:
    """Many thin white elongated petals around a yellow centre."""
    pose = _pose(rng)
    white = _pick(rng, (((250, 250, 248), 6), ((245, 238, 225), 2), ((248, 228, 238), 1), ((232, 230, 250), 1)))
    m = int(rng.integers(14, 30))
    length, r0 = r * rng.uniform(0.65, 0.82), r * rng.uniform(0.1, 0.18)
    aspect = rng.uniform(0.13, 0.24)
    layers = 2 if rng.random() < 0.5 else 1
    for layer in range(layers):
        back = layer < layers - 1
        ang = rng.uniform(0, 2 * np.pi) + 2 * np.pi * np.arange(m) / m + rng.normal(0, 0.06, m)
        lens = length * rng.uniform(0.85, 1.1, m) * (0.95 if back else 1.0)
        fills = [_shade(white, f) for f in rng.uniform(0.78, 1.0, m) * (0.85 if back else 1.0)]
        _polygons(draw, _ring(c, pose, ang, r0, lens, lens * aspect, 1.0, 0.6), fills, 0.78, max(1, int(r / 45)))
    rc = r * rng.uniform(0.17, 0.27)
    yellow = _jitter(rng, (235, 185, 25), 15)
    draw.polygon(_ellipse(c, pose, rc), fill=_shade(yellow, 0.8))
    draw.polygon(_ellipse(c + rc * rng.uniform(-0.15, 0.15, 2), pose, rc * 0.78), fill=yellow)
    for _ in range(int(rng.integers(4, 12))):  # florets
        p = c + (rng.uniform(-0.6, 0.6, 2) * rc) @ pose.T
        d = max(1.0, rc * 0.1)
        draw.ellipse([*(p - d), *(p + d)], fill=_shade(yellow, rng.uniform(0.75, 1.1)))


def _draw_dandelion(draw: ImageDraw.ImageDraw, rng: np.random.Generator, c: np.ndarray, r: float,
                    n: int) -> None:
    """A dense yellow head of fine strands (sometimes a white seed puffball); no visible centre."""
    if rng.random() < 0.2:
        _draw_puffball(draw, rng, c, r, n)
        return
    pose = _pose(rng, tilt=0.65)
    yellow = _jitter(rng, (250, int(rng.uniform(175, 225)), 20), 10)
    draw.polygon(_ellipse(c, pose, r * 0.85), fill=_shade(yellow, 0.7))
    width = max(1, int(r * rng.uniform(0.025, 0.045)))
    # rings of short fine strands, outer and darker first; inner ones brighter (a lit dome),
    # the very centre a little more orange
    for count, (lo, hi), bright, warm in ((rng.integers(60, 90), (0.8, 1.0), 0.85, 0.0),
                                          (rng.integers(50, 80), (0.55, 0.8), 0.95, 0.0),
                                          (rng.integers(40, 60), (0.3, 0.55), 1.05, 0.2),
                                          (rng.integers(15, 30), (0.08, 0.3), 1.0, 0.6)):
        ang = rng.uniform(0, 2 * np.pi, count)
        lens = r * rng.uniform(lo, hi, count)
        unit = np.stack([np.cos(ang), np.sin(ang)], 1)                       # (count, 2)
        tips = unit * lens[:, None] @ pose.T + c
        roots = unit * (lens * rng.uniform(0.0, 0.6, count))[:, None] @ pose.T + c
        col = _mix(yellow, (240, 140, 10), warm * rng.uniform(0.3, 0.8))
        for b, t, f in zip(roots, tips, bright * rng.uniform(0.85, 1.1, count)):
            draw.line([*b, *t], fill=_shade(col, f), width=width)


def _draw_puffball(draw: ImageDraw.ImageDraw, rng: np.random.Generator, c: np.ndarray, r: float,
                   n: int) -> None:
    """A white dandelion seed head: a faint sphere of fine radiating filaments on a stem."""
    if rng.random() < 0.7:
        _stem(draw, rng, c, r * 0.5, n, with_leaf=False)
    white = _jitter(rng, (240, 240, 235), 8)
    r = r * rng.uniform(0.7, 0.95)
    draw.ellipse([*(c - r * 0.95), *(c + r * 0.95)], fill=(*white, int(rng.integers(40, 90))))
    count = int(rng.integers(110, 190))
    ang = rng.uniform(0, 2 * np.pi, count)
    lens = r * rng.uniform(0.75, 1.0, count)
    tips = np.stack([np.cos(ang), np.sin(ang)], 1) * lens[:, None] + c          # (count, 2)
    dot = max(1.0, r * 0.03)
    for t, a in zip(tips, rng.integers(120, 230, count)):
        draw.line([*c, *t], fill=(*white, int(a)), width=1)
        draw.ellipse([*(t - dot), *(t + dot)], fill=(*white, int(a)))
    rc = r * rng.uniform(0.08, 0.14)
    draw.ellipse([*(c - rc), *(c + rc)], fill=_jitter(rng, (150, 130, 100), 15))


def _draw_rose(draw: ImageDraw.ImageDraw, rng: np.random.Generator, c: np.ndarray, r: float,
               n: int) -> None:
    """Layered, spiralling rounded petals, lighter outside and shadowed towards the centre."""
    pose = _pose(rng, tilt=0.55)
    colour = _jitter(rng, _pick(rng, (((200, 20, 35), 3.5), ((145, 10, 35), 1), ((240, 115, 160), 2),
                                      ((248, 238, 225), 1.2), ((245, 205, 60), 1.2), ((245, 150, 95), 1.1))), 12)
    layers = int(rng.integers(3, 6))
    # inner layers sit a little higher: a cup seen slightly from the side
    lift = np.array([0.0, -rng.uniform(0.0, 0.12) * r]) @ pose.T
    width = max(1, int(r / 35))
    for k in range(layers):
        t = 1.0 - k / (layers + 0.6)
        m = int(rng.integers(5, 8) if k == 0 else rng.integers(3, 6))
        ang = rng.uniform(0, 2 * np.pi) + 2 * np.pi * np.arange(m) / m + rng.normal(0, 0.15, m)
        lens = r * t * rng.uniform(0.7, 0.9, m)
        wids = lens * rng.uniform(1.0, 1.45, m)
        centre = c + lift * k / layers
        fills = [_shade(colour, f) for f in (1.05 - 0.4 * k / layers) * rng.uniform(0.88, 1.05, m)]
        _polygons(draw, _ring(centre, pose, ang, r * t * 0.08, lens, wids, 1.0, 0.45), fills, 0.62, width)
    # tight spiral of the innermost petals
    theta = np.linspace(0, rng.uniform(2.5, 4.5) * np.pi, 40)
    rad = r * (0.03 + rng.uniform(0.15, 0.25) * theta / theta[-1])
    spiral = np.stack([np.cos(theta + rng.uniform(0, 6.3)), np.sin(theta)], 1) * rad[:, None]
    pts = spiral @ pose.T + c + lift
    draw.line(pts.ravel().tolist(), fill=_shade(colour, 0.5), width=max(1, int(r / 22)), joint="curve")


def _draw_sunflower(draw: ImageDraw.ImageDraw, rng: np.random.Generator, c: np.ndarray, r: float,
                    n: int) -> None:
    """Long pointed yellow/orange petals around a big dark brown seed disc."""
    pose = _pose(rng, tilt=0.5)
    petal = _jitter(rng, _mix((250, 205, 20), (240, 140, 10), rng.uniform(0, 1) ** 2), 10)
    m = int(rng.integers(18, 34))
    rc = r * rng.uniform(0.3, 0.46)
    length = r * rng.uniform(0.5, 0.68)
    aspect = rng.uniform(0.2, 0.32)
    for back in (True, False):
        ang = rng.uniform(0, 2 * np.pi) + 2 * np.pi * np.arange(m) / m + rng.normal(0, 0.07, m)
        lens = length * rng.uniform(0.8, 1.12, m) * (0.92 if back else 1.0)
        fills = [_shade(petal, f) for f in rng.uniform(0.85, 1.05, m) * (0.8 if back else 1.0)]
        _polygons(draw, _ring(c, pose, ang, rc * 0.8, lens, lens * aspect, 0.85, 0.9), fills, 0.8, 1)
    brown = _jitter(rng, (95, 60, 20), 12)
    draw.polygon(_ellipse(c, pose, rc), fill=brown)
    draw.polygon(_ellipse(c, pose, rc * rng.uniform(0.7, 0.85)), fill=_shade(brown, rng.uniform(0.4, 0.65)))
    # seeds on a golden-angle (Fermat) spiral
    k = np.arange(int(rng.integers(50, 110)))
    rad = rc * 0.92 * np.sqrt((k + 0.5) / len(k))
    turns = k * 2.39996
    seeds = np.stack([np.cos(turns), np.sin(turns)], 1) * rad[:, None] @ pose.T + c
    dot = max(1.0, rc * 0.05)
    for s, f in zip(seeds, rng.uniform(0.4, 1.3, len(k))):
        draw.ellipse([*(s - dot), *(s + dot)], fill=_shade(brown, f))


def _draw_tulip(draw: ImageDraw.ImageDraw, rng: np.random.Generator, c: np.ndarray, r: float,
                n: int) -> None:
    """A goblet of 3-6 broad upright petals seen from the side, on a stem with a leaf."""
    colour = _jitter(rng, _pick(rng, (((215, 25, 40), 3), ((240, 110, 160), 2), ((248, 210, 40), 2),
                                      ((120, 40, 140), 1.2), ((248, 245, 235), 1.2), ((245, 120, 30), 1))), 12)
    pose = _rot(rng.normal(0, 0.2))
    height = r * rng.uniform(1.2, 1.6)
    base = c + np.array([0.0, 0.5 * height]) @ pose.T
    if rng.random() < 0.85:
        _stem(draw, rng, base, r, n, with_leaf=rng.random() < 0.8)
    m = int(rng.integers(3, 7))
    half = r * rng.uniform(0.4, 0.55)          # half-width of the cup
    opening = rng.uniform(0.0, 0.3)            # how far the petals lean outwards
    width = max(1, int(r / 40))
    back_colour, front_colour = _shade(colour, rng.uniform(0.65, 0.8)), _shade(colour, rng.uniform(0.92, 1.05))
    # rounded bottom of the goblet
    draw.polygon(_ellipse(base + np.array([0.0, -0.3 * height]) @ pose.T, pose, half * 0.95, 0.32 * height),
                 fill=back_colour)
    if opening > 0.22:  # open bloom: the dark inside of the cup shows
        inside = base + np.array([0.0, -0.85 * height]) @ pose.T
        draw.polygon(_ellipse(inside, pose, half * 1.1, half * 0.35), fill=_shade(colour, 0.4))
    # back petals (darker, taller, leaning out) then front ones (lighter, overlapping in the middle)
    n_back = m // 2
    for front, count in ((False, n_back), (True, m - n_back)):
        spread = np.linspace(-1, 1, count) if count > 1 else np.zeros(1)
        ang = -np.pi / 2 + spread * opening * (1.5 if not front else 1.0) + rng.normal(0, 0.04, count)
        lens = height * rng.uniform(0.9, 1.0, count) * (1.05 if not front else 0.97)
        wids = half * (2.1 / max(count, 1.5)) * rng.uniform(0.95, 1.15, count)
        roots = np.stack([spread * half * 0.45, np.full(count, -0.05 * height)], 1) @ pose.T + base
        for k in range(count):
            pts = _ring(roots[k], pose, ang[k:k + 1], 0.0, lens[k:k + 1], wids[k:k + 1], 1.3, 0.45)
            fill = _shade(front_colour if front else back_colour, rng.uniform(0.93, 1.05))
            _polygons(draw, pts, [fill], 0.7, width)
            if front and rng.random() < 0.6:  # soft highlight along the petal
                hi = _ring(roots[k], pose, ang[k:k + 1], lens[k] * 0.25, lens[k:k + 1] * 0.65,
                           wids[k:k + 1] * 0.25, 1.2, 0.8)
                draw.polygon(hi[0].ravel().tolist(), fill=(255, 255, 255, int(rng.integers(30, 80))))


_DRAWERS: tuple[Callable[[ImageDraw.ImageDraw, np.random.Generator, np.ndarray, float, int], None], ...] = (
    _draw_daisy, _draw_dandelion, _draw_rose, _draw_sunflower, _draw_tulip,
)


# ---------------------------------------------------------------------------- rendering


def _finish(img: Image.Image, rng: np.random.Generator, size: int) -> Image.Image:
    """Mild blur, 2x antialiased downscale, then lighting / contrast / colour jitter and noise."""
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.6) * size / 64))
    img = img.reduce(2)                                                 # (size, size) box filter
    a = np.asarray(img, dtype=np.float32)                               # (S, S, 3)
    xy = np.linspace(-1, 1, size, dtype=np.float32)
    ang = rng.uniform(0, 2 * np.pi)
    light = 1 + rng.uniform(0, 0.3) * (np.cos(ang) * xy[None, :] + np.sin(ang) * xy[:, None])  # (S, S)
    a = a * (rng.uniform(0.7, 1.25) * light)[..., None]
    mean = a.mean()
    a = (a - mean) * rng.uniform(0.7, 1.25) + mean
    grey = a.mean(axis=-1, keepdims=True)
    a = grey + (a - grey) * rng.uniform(0.7, 1.3)
    a = a * rng.uniform(0.9, 1.1, 3).astype(np.float32)
    sigma = rng.uniform(0, 8)
    if sigma > 1:
        a = a + rng.normal(0, sigma, a.shape).astype(np.float32)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def render_flower(label: int, size: int, rng: np.random.Generator) -> Image.Image:
    """One RGB image of class `label`, size x size."""
    label = operator.index(label)
    size = operator.index(size)
    if not 0 <= label < len(CLASSES):
        raise ValueError(f"label must be in [0, {len(CLASSES)}) for classes {CLASSES}, got {label}")
    if size < MIN_SIZE:
        raise ValueError(f"size must be at least {MIN_SIZE} pixels, got {size}")
    n = 2 * size  # draw at 2x, downscale at the end
    img = _background(rng, n)
    draw = ImageDraw.Draw(img, "RGBA")
    count = int(rng.choice([1, 2, 3], p=[0.65, 0.22, 0.13]))
    r_main = n * rng.uniform(0.2, 0.42) * (1.0 if count == 1 else 0.85)
    spot = 0.22 if rng.random() < 0.85 else 0.35
    flowers = [(rng.uniform(0.05, 0.95, 2) * n, r_main * rng.uniform(0.45, 0.85)) for _ in range(count - 1)]
    flowers.append(((0.5 + rng.uniform(-spot, spot, 2)) * n, r_main))  # the main flower, in front
    for centre, r in flowers:
        if rng.random() < 0.3:  # a leaf or two behind the bloom, for any class
            for _ in range(int(rng.integers(1, 3))):
                ang = rng.uniform(0, 2 * np.pi)
                _leaf(draw, centre, ang, r * rng.uniform(0.9, 1.6), rng.uniform(0.25, 0.45), _green(rng))
        if label in (0, 3) and rng.random() < 0.3:
            _stem(draw, rng, centre, r, n, with_leaf=rng.random() < 0.5)
        _DRAWERS[label](draw, rng, centre, r, n)
    if rng.random() < 0.15:  # out-of-focus grass blades in front
        for _ in range(int(rng.integers(1, 4))):
            x = rng.uniform(0, n)
            _leaf(draw, np.array([x, n * 1.05]), -np.pi / 2 + rng.normal(0, 0.3), n * rng.uniform(0.3, 0.7),
                  rng.uniform(0.05, 0.12), _green(rng))
    return _finish(img, rng, size)


def synthetic_label(index: int) -> int:
    """The class of image ``index`` of every synthetic set: classes interleaved."""
    return index % len(CLASSES)


def _render_index(seed: int, index: int, size: int) -> tuple[Image.Image, int]:
    """Image ``index`` of the set with this seed, and its label (:func:`synthetic_label`)."""
    label = synthetic_label(index)
    return render_flower(label, size, np.random.default_rng([seed, index])), label


def make_synthetic_flowers(num_per_class: int, image_size: int, seed: int = 0, progress: bool = False,
                           indices: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (images uint8 (N, 3, S, S), labels int64 (N,)), classes interleaved, N = 5 * num_per_class.
    Image i depends only on (seed, i): same seed -> identical tensors; a different seed -> different images.
    ``indices``: only these images of the set, in that order (each below N), drawn alone."""
    if num_per_class < 0:
        raise ValueError(f"num_per_class must be >= 0, got {num_per_class}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0 (numpy SeedSequence), got {seed}")
    total = len(CLASSES) * num_per_class
    order = range(total) if indices is None else [int(i) for i in indices]
    if any(not 0 <= i < total for i in order):
        raise ValueError(f"indices must be between 0 and {total - 1} (the set's {total} images)")
    images = np.empty((len(order), image_size, image_size, 3), dtype=np.uint8)  # (N, S, S, 3)
    labels = np.empty(len(order), dtype=np.int64)
    for k, i in enumerate(tqdm(order, desc="synthetic flowers", disable=None if progress else True, leave=False)):
        img, labels[k] = _render_index(seed, i, image_size)
        images[k] = np.asarray(img)
    logger.debug("drew %d synthetic flowers at %dpx (seed %d)", len(order), image_size, seed)
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels)  # (N, 3, S, S)
