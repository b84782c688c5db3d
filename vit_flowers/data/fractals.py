"""Images drawn from formulas, for pretraining without a single natural image (FractalDB-style).

A category is an iterated function system (IFS): 2 to 4 random contractive affine maps of the plane, each
picked with a probability proportional to its area factor (Kataoka et al. 2020, "Pre-training without
Natural Images"; maps parametrised by their singular values as in Anderson & Farrell 2022). The chaos game
draws its attractor, a fractal; systems whose attractor covers too little or too much of the image are drawn
again, as FractalDB filters by filling rate. An instance of a category perturbs the maps slightly and is
coloured (a hue per map on a dark, light or textured background), rotated, mirrored and framed with a
random margin, so a model must learn the shape, not one picture of it.

Everything is deterministic: category ``c`` of seed ``s`` comes from ``default_rng([s, c])`` and its instance
``i`` from ``default_rng([s, c, i])``, so any image can be drawn again on its own, in any order.

Two renderers draw the same categories. ``render_fractal`` (numpy, one image at a time) fills a set that is
drawn once and cached; ``render_batch`` (torch, a whole batch at once, on any device) draws fresh instances
for every batch, so a pretraining never sees an instance twice (``FractalStream``; FractalDB draws 1,000
instances a category, a cache holds tens). Their pixels differ (other random draws), their distributions
do not.

    images, labels = make_fractal_dataset(num_classes=100, per_class=10, size=64, seed=0)  # (1000, 3, 64, 64)
    stream = FractalStream(num_classes=100, per_class=10, size=64, seed=0)  # 1000 fresh images an epoch
    images = stream.batch(torch.arange(128), torch.Generator().manual_seed(1))  # (128, 3, 64, 64) uint8
"""

from __future__ import annotations

import colorsys
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from .images import DECODE_THREADS

__all__ = ["IFS", "DRAWING_VERSION", "sample_ifs", "chaos_game", "render_fractal", "make_fractal_dataset",
           "stack_systems", "render_batch", "FractalStream"]

logger = logging.getLogger(__name__)

FILL_RANGE = (0.08, 0.6)  # share of a 32 x 32 grid that a category's attractor must cover
POINTS = 24_000  # chaos-game points drawn per image
DRAWING_VERSION = 1  # part of a cached set's file name: bump it whenever a change draws other pixels
_CHAINS = 400  # chaos-game chains run side by side (numpy vectorises over them)
_BURN_IN = 12  # steps before a chain's points are kept (they converge onto the attractor)


@dataclass(frozen=True)
class IFS:
    """An iterated function system: point -> ``maps[k] @ (x, y, 1)`` with probability ``probs[k]``."""

    maps: np.ndarray  # (K, 2, 3) float64: [[a, b, e], [c, d, f]] per map
    probs: np.ndarray  # (K,) float64, sums to 1


def _rotation(angle: float) -> np.ndarray:
    return np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])


def _singular_values(rng: np.random.Generator, k: int) -> np.ndarray:
    """(k, 2) singular values in (0, 1), largest first, whose sigma-factor sum(s1 + 2 s2) lies in
    [(5 + k) / 2, (6 + k) / 2]: the range where random IFS draw fractals rather than dust or blobs."""
    target = rng.uniform((5 + k) / 2, (6 + k) / 2)
    for _ in range(1000):
        s = np.sort(rng.uniform(0.0, 1.0, size=(k, 2)), axis=1)[:, ::-1]
        s = s * target / (s[:, 0] + 2 * s[:, 1]).sum()
        if s.max() < 1.0:
            return s
    return np.full((k, 2), min(0.99, target / (3 * k)))


def _random_maps(rng: np.random.Generator) -> IFS:
    """2 to 4 contractive affine maps, each R(theta) diag(s1, s2) D R(phi) plus a shift (Anderson & Farrell
    2022, "Improving Fractal Pre-training": SVD parametrisation with a bounded sigma-factor)."""
    k = int(rng.integers(2, 5))
    maps = np.empty((k, 2, 3))
    for i, (s1, s2) in enumerate(_singular_values(rng, k)):
        signs = np.diag(rng.choice([-1.0, 1.0], size=2))
        maps[i, :, :2] = _rotation(rng.uniform(0, 2 * np.pi)) @ np.diag([s1, s2]) @ signs @ _rotation(
            rng.uniform(0, 2 * np.pi))
        maps[i, :, 2] = rng.uniform(-1.0, 1.0, size=2)
    det = np.abs(np.linalg.det(maps[:, :, :2]))
    return IFS(maps, (det + 1e-3) / (det + 1e-3).sum())


def chaos_game(ifs: IFS, n_points: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(points (P, 2), index of the map that placed each point (P,)), P <= ``n_points``; points of a diverging
    system (non-finite) are dropped."""
    steps = max(1, -(-n_points // _CHAINS))
    xy = rng.uniform(-1.0, 1.0, size=(_CHAINS, 2))
    choice = rng.choice(len(ifs.probs), size=(_BURN_IN + steps, _CHAINS), p=ifs.probs)
    linear, shift = ifs.maps[:, :, :2], ifs.maps[:, :, 2]  # (K, 2, 2), (K, 2)
    points = np.empty((steps, _CHAINS, 2))
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(_BURN_IN + steps):
            k = choice[t]
            xy = np.einsum("cij,cj->ci", linear[k], xy) + shift[k]  # (chains, 2)
            if t >= _BURN_IN:
                points[t - _BURN_IN] = xy
    points, maps_used = points.reshape(-1, 2), choice[_BURN_IN:].reshape(-1)
    finite = np.isfinite(points).all(axis=1) & (np.abs(points) < 1e6).all(axis=1)
    return points[finite], maps_used[finite]


def _to_grid(points: np.ndarray, size: int, margin: float = 0.06) -> tuple[np.ndarray, np.ndarray]:
    """Points scaled into a ``size`` x ``size`` grid (aspect kept, centred): (flat pixel indices of the points that
    land inside, which points those are (P,) bool)."""
    lo, hi = np.percentile(points, 0.5, axis=0), np.percentile(points, 99.5, axis=0)
    scale = (1 - 2 * margin) * size / max(float((hi - lo).max()), 1e-9)
    centre = (lo + hi) / 2
    xy = np.floor((points - centre) * scale + size / 2).astype(np.int64)
    inside = ((xy >= 0) & (xy < size)).all(axis=1)
    return xy[inside, 1] * size + xy[inside, 0], inside


def fill_rate(ifs: IFS, rng: np.random.Generator, grid: int = 32) -> float:
    points, _ = chaos_game(ifs, 4_000, rng)
    if len(points) < 1_000:
        return 0.0
    flat, _ = _to_grid(points, grid)
    return len(np.unique(flat)) / grid**2


def sample_ifs(rng: np.random.Generator, max_tries: int = 200) -> IFS:
    """A random IFS whose attractor covers between FILL_RANGE of the image (FractalDB's filling-rate filter)."""
    for _ in range(max_tries):
        ifs = _random_maps(rng)
        if FILL_RANGE[0] <= fill_rate(ifs, rng) <= FILL_RANGE[1]:
            return ifs
    raise RuntimeError(f"no IFS with a filling rate in {FILL_RANGE} after {max_tries} tries")


def _perturb(ifs: IFS, rng: np.random.Generator, amount: float = 0.04) -> IFS:
    """An instance's maps: each parameter moved by up to ``amount`` (the category's shape stays)."""
    maps = ifs.maps + rng.uniform(-amount, amount, size=ifs.maps.shape)
    return IFS(maps, ifs.probs)


def _palette(rng: np.random.Generator, k: int) -> np.ndarray:
    """(k, 3) float colours in [0, 1]: hues around a random base hue, vivid."""
    base = rng.uniform()
    hues = (base + rng.uniform(-0.25, 0.25, size=k)) % 1.0
    return np.array([colorsys.hsv_to_rgb(h, rng.uniform(0.5, 1.0), rng.uniform(0.6, 1.0)) for h in hues])


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """(S, S, 3) float: dark, light, or a smooth random texture."""
    kind = rng.integers(3)
    if kind < 2:
        level = rng.uniform(0.0, 0.15) if kind == 0 else rng.uniform(0.7, 1.0)
        return np.broadcast_to(level * _palette(rng, 1)[0] + (1 - level) * level, (size, size, 3)).copy()
    low = rng.uniform(0.0, 1.0, size=(4, 4, 3))
    t = torch.from_numpy(low).permute(2, 0, 1)[None].float()  # (1, 3, 4, 4)
    up = torch.nn.functional.interpolate(t, size=(size, size), mode="bicubic", align_corners=False)
    return up[0].permute(1, 2, 0).clamp(0, 1).numpy().astype(np.float64) * 0.6


def render_fractal(ifs: IFS, size: int, rng: np.random.Generator) -> np.ndarray:
    """One coloured instance of ``ifs``: uint8 (3, size, size)."""
    inst = _perturb(ifs, rng)
    points, used = chaos_game(inst, POINTS, rng)
    if len(points) < 100:  # the perturbation made it diverge: draw the category's own maps
        points, used = chaos_game(ifs, POINTS, rng)
    points = points @ _rotation(rng.uniform(0, 2 * np.pi)).T * np.array([rng.choice([-1.0, 1.0]), 1.0])
    rng.uniform(-0.08, 0.08, size=2)  # a shift that _to_grid's centring undoes: still drawn, so version 1 stays
    flat, inside = _to_grid(points, size, margin=rng.uniform(0.0, 0.15))
    colours = _palette(rng, len(ifs.probs))[used[inside]]  # (P, 3)
    count = np.bincount(flat, minlength=size * size).astype(np.float64)
    rgb = np.stack([np.bincount(flat, weights=colours[:, c], minlength=size * size) for c in range(3)], axis=1)
    rgb = rgb / np.maximum(count, 1)[:, None]
    alpha = np.clip(count * rng.uniform(0.3, 1.0), 0, 1)[:, None]
    image = _background(rng, size).reshape(-1, 3) * (1 - alpha) + rgb * alpha
    return np.round(image.reshape(size, size, 3).transpose(2, 0, 1) * 255).astype(np.uint8)


def _render_class(seed: int, label: int, per_class: int, size: int, first: int) -> np.ndarray:
    """Instances ``first .. first + per_class - 1`` of category ``label``: uint8 (per_class, 3, S, S)."""
    ifs = sample_ifs(np.random.default_rng([seed, label]))
    return np.stack([render_fractal(ifs, size, np.random.default_rng([seed, label, first + i]))
                     for i in range(per_class)])


def make_fractal_dataset(num_classes: int, per_class: int, size: int, seed: int = 0, first: int = 0,
                         progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 (C * per_class, 3, S, S), labels int64), class by class; instances ``first`` onwards (a
    validation set uses other instance numbers than training, of the same categories)."""
    if num_classes < 1 or per_class < 0 or size < 8:
        raise ValueError(f"need num_classes >= 1, per_class >= 0 and size >= 8; got {num_classes}, {per_class}, "
                         f"{size}")
    images = torch.empty(num_classes * per_class, 3, size, size, dtype=torch.uint8)
    with ThreadPoolExecutor(DECODE_THREADS) as pool, tqdm(total=num_classes, desc="fractals", unit="class",
                                                          disable=None if progress else True, leave=False) as bar:
        jobs = pool.map(_render_class, [seed] * num_classes, range(num_classes), [per_class] * num_classes,
                        [size] * num_classes, [first] * num_classes)
        for c, block in enumerate(jobs):
            images[c * per_class:(c + 1) * per_class] = torch.from_numpy(block)
            bar.update()
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    logger.debug("drew %d fractals of %d categories at %d px (seed %d)", len(images), num_classes, size, seed)
    return images, labels


# ----------------------------------------------------------------------------------------------------------
# The same formulas drawn in torch, a batch at a time, on any device

MAX_MAPS = 4  # maps per system (_random_maps draws 2 to 4); fewer are padded with probability 0


def stack_systems(systems: list[IFS]) -> tuple[torch.Tensor, torch.Tensor]:
    """(maps (C, MAX_MAPS, 2, 3), probs (C, MAX_MAPS)) float32, padded maps never picked."""
    maps = torch.zeros(len(systems), MAX_MAPS, 2, 3)
    probs = torch.zeros(len(systems), MAX_MAPS)
    for c, ifs in enumerate(systems):
        maps[c, :len(ifs.probs)] = torch.from_numpy(ifs.maps)
        probs[c, :len(ifs.probs)] = torch.from_numpy(ifs.probs)
    return maps, probs


def _chaos_game_batch(maps: torch.Tensor, probs: torch.Tensor, points: int,
                      g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """maps (B, K, 2, 3), probs (B, K) -> (points (B, P, 2) with NaN where a chain diverged, map used (B, P))."""
    B, K = probs.shape
    steps = max(1, -(-points // _CHAINS))
    u = torch.rand(B, (_BURN_IN + steps) * _CHAINS, generator=g, device=maps.device)
    cumulative = probs.cumsum(-1)
    choice = torch.searchsorted(cumulative / cumulative[:, -1:], u).clamp_max(K - 1)  # faster than multinomial
    choice = choice.view(B, _BURN_IN + steps, _CHAINS)
    linear, shift = maps[..., :2], maps[..., 2]  # (B, K, 2, 2), (B, K, 2)
    xy = torch.rand(B, _CHAINS, 2, generator=g, device=maps.device) * 2 - 1  # (B, chains, 2)
    kept = []
    for t in range(_BURN_IN + steps):
        every_map = torch.einsum("bkij,bcj->bkci", linear, xy) + shift[:, :, None]  # (B, K, chains, 2)
        xy = every_map.gather(1, choice[:, t, None, :, None].expand(B, 1, _CHAINS, 2)).squeeze(1)
        if t >= _BURN_IN:
            kept.append(xy)
    xy = torch.stack(kept, 1).reshape(B, -1, 2)  # (B, P, 2)
    diverged = ~(xy.abs() < 1e6).all(-1, keepdim=True)  # inf and NaN compare False
    return xy.masked_fill_(diverged, torch.nan), choice[:, _BURN_IN:].reshape(B, -1)


def _hsv_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Hue, saturation, value (...) in [0, 1] -> RGB (..., 3), as colorsys.hsv_to_rgb."""
    i = torch.floor(h * 6)
    f = h * 6 - i
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    sectors = torch.stack([torch.stack(rgb, -1) for rgb in
                           ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))], -2)  # (..., 6, 3)
    sector = (i.long() % 6)[..., None, None].expand(*h.shape, 1, 3)
    return sectors.gather(-2, sector).squeeze(-2)


def _palettes(B: int, K: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """(B, K, 3) vivid colours, hues within a quarter turn of a base hue per image (as _palette)."""
    u = torch.rand(B, 3 * K + 1, generator=g, device=device)
    hues = (u[:, :1] + u[:, 1:K + 1] * 0.5 - 0.25) % 1.0
    return _hsv_to_rgb(hues, 0.5 + 0.5 * u[:, K + 1:2 * K + 1], 0.6 + 0.4 * u[:, 2 * K + 1:])


def _backgrounds(B: int, size: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """(B, S, S, 3) float: dark, light or a smooth random texture, one in three each (as _background)."""
    kind = torch.randint(3, (B, 1, 1, 1), generator=g, device=device)
    u = torch.rand(B, 1, 1, 1, generator=g, device=device)
    level = torch.where(kind == 0, 0.15 * u, 0.7 + 0.3 * u)
    flat = level * _palettes(B, 1, g, device).view(B, 1, 1, 3) + (1 - level) * level
    low = torch.rand(B, 4, 4, 3, generator=g, device=device)
    # bicubic upsampling is separable: one (S, 4) weight matrix a side
    eye = torch.eye(4, device=device)[:, None, :, None]  # (4, 1, 4, 1)
    up = torch.nn.functional.interpolate(eye, size=(size, 1), mode="bicubic", align_corners=False)[:, 0, :, 0].T
    texture = torch.einsum("si,bijc,tj->bstc", up, low, up).clamp(0, 1) * 0.6  # (B, S, S, 3)
    return torch.where(kind == 2, texture, flat)


def render_batch(maps: torch.Tensor, probs: torch.Tensor, size: int, g: torch.Generator) -> torch.Tensor:
    """One fresh coloured instance per row of ``maps`` (B, K, 2, 3) / ``probs`` (B, K) (rows of
    ``stack_systems``): uint8 (B, 3, size, size) on their device, every random draw from ``g`` (on that device).
    The steps of ``render_fractal``: perturbed maps (the category's own where the perturbed ones diverge), a
    random rotation and mirror, a random margin, a hue per map over a drawn background."""
    B, K = probs.shape
    device = maps.device
    u = torch.rand(B, 4, generator=g, device=device)  # angle, mirror, margin, opacity
    inst = maps + (torch.rand(maps.shape, generator=g, device=device) * 0.08 - 0.04)
    xy, used = _chaos_game_batch(inst, probs, POINTS, g)
    diverged = torch.isnan(xy[..., 0]).sum(1) > xy.shape[1] - 100  # (B,) fewer than 100 points left
    if diverged.any():
        xy[diverged], used[diverged] = _chaos_game_batch(maps[diverged], probs[diverged], POINTS, g)
    angle, mirror = u[:, 0] * 2 * math.pi, torch.where(u[:, 1] < 0.5, -1.0, 1.0)
    cos, sin = angle.cos(), angle.sin()
    pose = torch.stack([torch.stack([mirror * cos, -mirror * sin], -1), torch.stack([sin, cos], -1)], -2)  # (B, 2, 2)
    xy = torch.einsum("bpj,bij->bpi", xy, pose)  # rotated, then x mirrored in half the images
    # the frame from the 0.5 / 99.5 percentiles (as _to_grid), taken on the first 2,000 points: as good, cheaper
    lo, hi = torch.nanquantile(xy[:, :2000], 0.005, dim=1), torch.nanquantile(xy[:, :2000], 0.995, dim=1)  # (B, 2)
    scale = (1 - 2 * 0.15 * u[:, 2]) * size / (hi - lo).amax(-1).clamp_min(1e-9)  # (B,)
    pixel = torch.floor((xy - (lo + hi)[:, None] / 2) * scale[:, None, None] + size / 2)  # (B, P, 2), NaN stays
    inside = ((pixel >= 0) & (pixel < size)).all(-1)  # NaN compares False
    pixel = torch.where(inside[..., None], pixel, 0).long()
    flat = pixel[..., 1] * size + pixel[..., 0] + torch.arange(B, device=device)[:, None] * size * size  # (B, P)
    colours = _palettes(B, K, g, device).gather(1, used[..., None].expand(B, used.shape[1], 3))  # (B, P, 3)
    weight = inside.float()
    count = torch.zeros(B * size * size, device=device).index_add_(0, flat.view(-1), weight.view(-1))
    rgb = torch.zeros(B * size * size, 3, device=device).index_add_(0, flat.view(-1),
                                                                     (colours * weight[..., None]).view(-1, 3))
    rgb = (rgb / count.clamp_min(1)[:, None]).view(B, size, size, 3)
    alpha = (count.view(B, size, size, 1) * (0.3 + 0.7 * u[:, 3, None, None, None])).clamp(0, 1)
    image = _backgrounds(B, size, g, device) * (1 - alpha) + rgb * alpha  # (B, S, S, 3)
    return (image.permute(0, 3, 1, 2) * 255).round().to(torch.uint8)


class FractalStream(torch.utils.data.Dataset):
    """Training images drawn afresh for every batch: ``num_classes`` categories (those of
    ``make_fractal_dataset`` for the same seed), ``per_class`` images of each an epoch, none seen twice.

    Indexable like a cached set for its labels; ``batch(idx, generator)`` draws the images of those indices
    on ``device`` (a GPU draws far faster than a CPU), every draw from ``generator``."""

    def __init__(self, num_classes: int, per_class: int, size: int, seed: int = 0,
                 device: torch.device | str = "cpu", progress: bool = False) -> None:
        if num_classes < 1 or per_class < 1 or size < 8:
            raise ValueError(f"need num_classes >= 1, per_class >= 1 and size >= 8; got {num_classes}, "
                             f"{per_class}, {size}")
        systems = [sample_ifs(np.random.default_rng([seed, c]))
                   for c in tqdm(range(num_classes), desc="formulas", disable=None if progress else True,
                                 leave=False)]
        self.device = torch.device(device)
        self.maps, self.probs = (t.to(self.device) for t in stack_systems(systems))
        self.size = size
        self.labels = torch.arange(num_classes).repeat_interleave(per_class)  # (N,)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch(torch.tensor([i]))[0], self.labels[i]

    def batch(self, idx: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """uint8 (len(idx), 3, size, size) on ``device``: fresh instances of the categories ``labels[idx]``."""
        return self.draw(self.labels[idx], generator)

    def draw(self, labels: torch.Tensor, generator: torch.Generator | None = None,
             size: int | None = None) -> torch.Tensor:
        """uint8 (len(labels), 3, S, S) on ``device``: a fresh instance of each category in ``labels``, at
        ``size`` (default: the stream's)."""
        if generator is None or generator.device != self.device:  # seeded from the caller's generator
            seed = int(torch.randint(2**62, (1,), generator=generator))
            generator = torch.Generator(self.device).manual_seed(seed)
        labels = labels.to(self.device)
        return render_batch(self.maps[labels], self.probs[labels], size or self.size, generator)
