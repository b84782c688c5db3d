"""What the benchmarks share: the checkout on ``sys.path`` (they run from a clone without installing), the
contenders of one comparison timed in alternating rounds, the report of rows and notes (markdown and JSON), the
machine's description, and the photos of a split list. Each script imports it first (its folder is on
``sys.path`` when it runs as ``python benchmarks/NAME.py``):

    from harness import Contender, Report, alternate, ratio
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from torch import nn

ROOT = Path(__file__).resolve().parents[1]  # the checkout
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vit_flowers.data.augment import eval_transform
from vit_flowers.data.datasets import TensorImageDataset, cache_images
from vit_flowers.data.splits import scan_class_folders, stratified_split

__all__ = ["ROOT", "DEFAULT_DATA", "Contender", "alternate", "ratio", "Report", "forward_fn", "machine",
           "make_split", "split_photos", "SKIMAGE", "views", "fifth_species_parser", "peer_accuracy"]

logger = logging.getLogger("benchmarks")

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "flowers5"


@dataclass
class Contender:
    """``fn()`` does one unit of work on ``items`` items (a training step on a batch, a forward...)."""

    fn: Callable[[], Any]
    items: int
    calls: int = 1  # units per round
    rates: list[float] = field(default_factory=list)  # items/s, one per round

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        return (max(self.rates) - min(self.rates)) / self.median


def alternate(contenders: dict[str, Contender], rounds: int, warmup: int = 1) -> dict[str, Contender]:
    """Run every contender ``rounds`` times, round by round, rotating the order each round."""
    names = list(contenders)
    for name in names:
        for _ in range(warmup):
            contenders[name].fn()
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            c = contenders[name]
            start = time.perf_counter()
            for _ in range(c.calls):
                c.fn()
            c.rates.append(c.calls * c.items / (time.perf_counter() - start))
    return contenders


def ratio(a: Contender, b: Contender) -> float:
    """Median of the per-round throughput ratios a / b."""
    return statistics.median(x / y for x, y in zip(a.rates, b.rates))


@dataclass
class Report:
    """Everything measured, as printed markdown tables and as JSON."""

    meta: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, name: str, c: Contender | None = None, unit: str = "img/s", **extra: Any) -> None:
        row: dict[str, Any] = dict(section=section, name=name, unit=unit, **extra)
        if c is not None:
            row.update(median=c.median, spread=c.spread, rounds=len(c.rates))
        self.rows.append(row)
        logger.info("%s | %s | %s", section, name, _fmt_row(row))

    def note(self, text: str) -> None:
        self.notes.append(text)
        logger.info("note: %s", text)

    def markdown(self) -> str:
        lines = [f"Machine: {self.meta['machine']}", f"Command: `{self.meta['command']}`",
                 f"Load average at start / end: {self.meta['load_start']} / {self.meta.get('load_end')}; "
                 f"total time {self.meta.get('seconds', 0):.0f} s", "",
                 "| section | contender | median | spread | vs | ratio | target |",
                 "|---|---|---|---|---|---|---|"]
        for row in self.rows:
            med = f"{row['median']:.1f} {row['unit']}" if "median" in row else row.get("value", "")
            spread = f"±{row['spread'] / 2:.0%}" if "spread" in row else ""
            ratio_txt = f"{row['ratio']:.3f}" if "ratio" in row else ""
            lines.append(f"| {row['section']} | {row['name']} | {med} | {spread} | {row.get('vs', '')} | "
                         f"{ratio_txt} | {row.get('target', '')} |")
        if self.notes:
            lines += ["", "Notes:"] + [f"- {n}" for n in self.notes]
        return "\n".join(lines)

    def finish(self, start: float, json_path: Path | None = None) -> None:
        """Record the load average at the end and the time since ``start``, print the markdown, and write
        everything as JSON to ``json_path`` when given."""
        self.meta["load_end"] = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        self.meta["seconds"] = time.perf_counter() - start
        print(self.markdown())
        if json_path:
            json_path.write_text(json.dumps(dict(meta=self.meta, rows=self.rows, notes=self.notes), indent=1))


def _fmt_row(row: dict[str, Any]) -> str:
    parts = []
    if "median" in row:
        parts.append(f"{row['median']:.1f} {row['unit']} (spread {row['spread']:.0%})")
    if "value" in row:
        parts.append(str(row["value"]))
    if "ratio" in row:
        parts.append(f"{row['ratio']:.3f}x {row.get('vs', '')}")
    if "target" in row:
        parts.append(f"target {row['target']}")
    return ", ".join(parts)


def forward_fn(model: nn.Module, images: torch.Tensor, *, grad_mode: str = "inference_mode", bf16: bool = False,
               compile_model: bool = False) -> Callable[[], torch.Tensor]:
    """A forward pass of ``model`` (eval mode, optionally compiled) on ``images`` under ``grad_mode``
    ("inference_mode" or "no_grad"), in bf16 autocast with ``bf16``."""
    model.eval()
    net = torch.compile(model) if compile_model else model
    ctx = torch.inference_mode if grad_mode == "inference_mode" else torch.no_grad

    def forward() -> torch.Tensor:
        with ctx(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return net(images)

    return forward


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads, "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(default)')}), python {platform.python_version()}, "
            f"{platform.system()}")


def split_photos(split: dict[str, Any], name: str, data: Path, size: int) -> TensorImageDataset:
    """The photos of the split's ``name`` list (paths relative to ``data``, as benchmarks/accuracy.py writes a
    split), decoded at ``size``."""
    classes = split["classes"]
    paths = [data / r for r in split[name]]
    labels = [classes.index(r.split("/")[0]) for r in split[name]]
    return cache_images(paths, labels, classes, size, desc=name, progress=False)


def make_split(data: Path, test_fraction: float, val_fraction: float, seed: int) -> dict[str, Any]:
    """Stratified train / val / test lists of paths relative to ``data`` (val and test as shares of the whole)."""
    classes, samples = scan_class_folders(data)
    labels = [y for _, y in samples]
    rest, test = stratified_split(labels, test_fraction, seed)
    train_i, val_i = stratified_split([labels[i] for i in rest], val_fraction / (1 - test_fraction), seed + 1)
    rel = [p.relative_to(data).as_posix() for p, _ in samples]
    return {"root": str(data.resolve()), "classes": classes, "seed": seed, "test_fraction": test_fraction,
            "val_fraction": val_fraction, "train": [rel[rest[i]] for i in train_i],
            "val": [rel[rest[i]] for i in val_i], "test": [rel[i] for i in test]}


def frozen_lite(variant: str = "lite0") -> nn.Module:
    """timm's ``tf_efficientnet_<variant>`` with the shipped ImageNet weights, in eval mode: the frozen-features
    peer's network (frozen_peer.py, split_grouping.py)."""
    import timm

    from vit_flowers.models.efficientnet import imagenet_state

    net = timm.create_model(f"tf_efficientnet_{variant}", pretrained=False)
    net.load_state_dict(imagenet_state(variant))
    return net.eval()


@torch.inference_mode()
def pooled_features(net: torch.nn.Module, images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (N, 3, S, S) -> (N, 1280): the network's pooled features, inputs scaled as it was trained, (x-0.5)/0.5."""
    out = []
    for chunk in images.split(64):
        x = eval_transform(chunk, size, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
        out.append(net.forward_head(net.forward_features(x.contiguous(memory_format=torch.channels_last)),
                                    pre_logits=True))
    return torch.cat(out)


# scikit-image's sample photos: the non-flowers the unknown rule is measured on (unknown_teach.py, unknown_sample.py)
SKIMAGE = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina",
           "colorwheel", "camera", "moon", "coins", "clock", "grass", "gravel", "brick", "page", "text"]


def views(rgb: Any, size: int) -> torch.Tensor:
    """An image (H, W[, 3], a numpy array) whole and its four quadrants, uint8 (5, 3, size, size)."""
    import numpy as np

    from vit_flowers.data.images import resize_crop

    rgb = np.stack([rgb] * 3, axis=-1) if rgb.ndim == 2 else rgb[..., :3]
    h, w = rgb.shape[:2]
    crops = [rgb] + [rgb[y:y + h // 2, x:x + w // 2] for y in (0, h // 2) for x in (0, w // 2)]
    return resize_crop([torch.from_numpy(np.ascontiguousarray(c)).permute(2, 0, 1) for c in crops], size)


def fifth_species_parser(description: str | None, cache_help: str) -> Any:
    """The command line of unknown_teach.py and unknown_sample.py: a run, the folder of a species it never saw, the
    .npz its outputs are cached in (an argparse parser; each script adds its own options)."""
    import argparse

    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, type=Path)
    p.add_argument("--fifth", required=True, type=Path, help="the folder of the class the run never saw")
    p.add_argument("--cache", required=True, type=Path, help=cache_help)
    return p


# ---- teach on flowers5's rotations (teach_rotations.py, teach_levers.py) -------------------------------------------
TEACH_SEED = 46  # the held-out photos and the draws of the photos taught


def photo_files(folder: Path) -> list[Path]:
    """The photos (.jpg, .jpeg, .png) directly in ``folder``, by name."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def teach_draw(pool: Path, species: str, shots: int, draw: int) -> list[Path]:
    """The ``shots`` photos of ``pool`` (a species' folder) that ``draw`` teaches ``species`` from."""
    import random

    return sorted(random.Random(f"{TEACH_SEED}-{species}-{shots}-{draw}").sample(photo_files(pool), shots))


def peer_accuracy(train: list[tuple[Path, int]], test_feats: tuple[np.ndarray, np.ndarray], classes: list[str],
                  net: torch.nn.Module, c: float) -> tuple[float, float]:
    """(test accuracy, seconds of the fit's features and fit) of the frozen-feature peer on ``train``."""
    start = time.perf_counter()
    ds = cache_images([p for p, _ in train], [y for _, y in train], classes, 224, desc="peer", progress=False)
    x = pooled_features(net, ds.images, 224).numpy()
    clf = LogisticRegression(C=c, max_iter=3000).fit(x, ds.labels.numpy())
    return float(clf.score(*test_feats)), time.perf_counter() - start
