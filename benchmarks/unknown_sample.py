"""How many training photos the "none of these" rule needs (#53): its class means and shared precision taken from
every training photo of a run, or from a balanced sample of N a class (``calibration.balanced_sample``, what the
end of a run reads), its threshold chosen on the validation photos as training chooses it.

    python -m vit_flowers.train --data flowers4 --run-name four          # four of flowers5's classes
    python benchmarks/unknown_sample.py --run checkpoints/four --fifth ../shared/data/flowers5/tulip \
        --cache four_patches.npz --out unknown_sample.json

The model's outputs (logits and the rule's features) of every training and validation photo, of the fifth
class's photos and of scikit-image's 17 sample photos whole and in quarters (85 non-flowers, as unknown_teach.py)
are computed once into ``--cache`` (reused where it holds them). One row per sample size: the validation photos
accepted (two-fold: the threshold chosen on one half, measured on the other), the fifth class's photos and the
non-flowers rejected, and the AUROC of validation against fifth-class scores; for the samples of N a class also the
worst of ``--draws`` random draws of N a class.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch
from harness import SKIMAGE, fifth_species_parser, views  # (before vit_flowers: it puts the checkout on sys.path)

from vit_flowers.data.image_files import list_images
from vit_flowers.inference.batches import iter_image_batches
from vit_flowers.inference.calibration import balanced_sample, class_means
from vit_flowers.inference.features import batch_outputs
from vit_flowers.inference.run_data import rebuilt_photos
from vit_flowers.inference.unknown import DEFAULT_RULE, calibrate, known_scores, shared_precision
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import load_model

log = logging.getLogger("unknown_sample")


def _skimage85() -> torch.Tensor:
    """scikit-image's 17 sample photos whole and as four quadrant crops (unknown_teach.py's non-flowers), 224 px."""
    import skimage.data

    return torch.cat([views(getattr(skimage.data, name)(), 224) for name in SKIMAGE])


def outputs(run: Path, fifth: Path, cache: Path) -> dict[str, np.ndarray]:
    """The logits and features of the run's train and val photos, of the fifth class's and of scikit-image's 85
    views: from ``cache`` where it holds them, else computed and kept there."""
    found: dict[str, np.ndarray] = dict(np.load(cache)) if cache.is_file() else {}
    model, ckpt = load_model(run / runs.BEST)
    sets = {which: rebuilt_photos(ckpt, run, which) for which in ("train", "val")}
    fifth_files = list_images(fifth)[0]
    for name, files, labels in [*((w, p.files, p.labels) for w, p in sets.items()),
                                ("fifth", fifth_files, [-1] * len(fifth_files)), ("sk85", None, [-1] * 85)]:
        if f"{name}_labels" in found:
            continue
        images = _skimage85() if name == "sk85" else torch.cat(
            [b.images for b in iter_image_batches(files or [], ckpt["image_size"], batch_size=64)])
        out = batch_outputs(model, images, ckpt["mean"], ckpt["std"])
        found |= {f"{name}_logits": out.logits, f"{name}_features": out.features, f"{name}_labels": np.array(labels)}
        log.info("%s: %d photos", name, len(labels))
        np.savez(cache, **found)
    return found


def _auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.r_[np.ones(len(pos)), np.zeros(len(neg))], np.r_[pos, neg]))


def measure(d: dict[str, np.ndarray], picked: np.ndarray, rule: str) -> dict[str, float]:
    """The rule with its class means and precision from the training photos ``picked``."""
    labels = d["train_labels"][picked]
    feats = d["train_features"][picked]
    means = class_means(feats, labels, int(d["train_labels"].max()) + 1)
    precision = shared_precision(feats, labels, means)

    def score(name: str) -> np.ndarray:
        return known_scores(rule, d[f"{name}_logits"], d[f"{name}_features"], means, precision)

    val, fifth, sk85 = score("val"), score("fifth"), score("sk85")
    threshold = calibrate(rule, val).threshold
    half = np.arange(len(val)) % 2 == 0
    cv = np.mean([(val[~m] >= calibrate(rule, val[m]).threshold).mean() for m in (half, ~half)])
    return {"val_accepted_cv": float(cv), "fifth_rejected": float((fifth < threshold).mean()),
            "auroc": _auroc(val, fifth), "sk85_rejected": float((sk85 < threshold).mean())}


def table(d: dict[str, np.ndarray], sizes: list[int], draws: int, rule: str) -> list[dict]:
    labels = d["train_labels"]
    rows = [{"per_class": "all", "photos": len(labels), **measure(d, np.arange(len(labels)), rule)}]
    for n in sizes:
        picked = balanced_sample(labels, n)
        row: dict = {"per_class": n, "photos": len(picked), **measure(d, picked, rule)}
        rng = np.random.default_rng(53)
        drawn = [measure(d, np.concatenate([rng.choice(np.flatnonzero(labels == c), min(n, int((labels == c).sum())),
                                                       replace=False) for c in np.unique(labels)]), rule)
                 for _ in range(draws)]
        row |= {f"{k}_worst_draw": min(x[k] for x in drawn)
                for k in ("val_accepted_cv", "fifth_rejected", "auroc", "sk85_rejected")}
        rows.append(row)
    for r in rows:
        log.info("%s", json.dumps(r))
    return rows


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = fifth_species_parser(__doc__, "the outputs' .npz (computed when absent)")
    p.add_argument("--sizes", type=int, nargs="+", default=[400, 200, 100, 50, 25])
    p.add_argument("--draws", type=int, default=5)
    p.add_argument("--rule", default=DEFAULT_RULE)
    p.add_argument("--out", default="unknown_sample.json")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = table(outputs(args.run, args.fifth, args.cache), args.sizes, args.draws, args.rule)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
