""""None of these" and "teach" (#37), measured on a run trained on four of flowers5's classes.

    python -m vit_flowers.train --data /tmp/flowers4 --time-budget 4 --precision fp32 --out-dir /tmp/runs37 \
        --run-name four
    python benchmarks/unknown_teach.py --run /tmp/runs37/four --fifth /work/shared/data/flowers5/tulip

(A run trained before the rule existed gets it here, by the function training's end calls.)

Unknown: every rule of :mod:`vit_flowers.inference.unknown` with its threshold chosen as training chooses it (accepting
95% of the run's validation photos); the acceptance of held-out known-class photos is measured by two-fold
cross-validation on those photos (the threshold chosen on one half, measured on the other), so it is not 95% by
construction. Non-flowers: scikit-image's 17 sample images that ship in its wheel, whole and as four quadrant
crops (85 images); a flower it never saw: the fifth class's photos and scikit-learn's flower.jpg. Also kNN: the
cosine to the nearest training photo's features (measured, not offered). AUROC: known val photos vs non-flowers.

Teach: the fifth class from 5, 10 and 20 of its photos (5 random draws each), its other photos held out; the
accuracy of the four classes on the run's validation photos before (the trained head) and after, for two heads:
``ncm`` (every class its training mean's nearest-class-mean row: what ``teach`` writes) and ``append`` (the
trained rows kept, the new row imprinted: the new mean's direction about the class centre, scaled to the trained
rows' mean norm, their mean bias).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import harness  # noqa: F401  (puts the checkout on sys.path)
import numpy as np
import torch

from vit_flowers.data.datasets import TensorImageDataset
from vit_flowers.data.image_files import list_images
from vit_flowers.data.images import resize_crop
from vit_flowers.inference.batches import iter_image_batches
from vit_flowers.inference.prototypes import batch_outputs, calibrate_checkpoint, class_means, ncm_head
from vit_flowers.inference.unknown import RULES, calibrate, known_scores, shared_precision
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import load_model, save_checkpoint
from vit_flowers.training.run_data import run_config, run_folder

log = logging.getLogger("unknown_teach")
SKIMAGE = ("astronaut coffee chelsea rocket hubble_deep_field immunohistochemistry retina colorwheel camera moon "
           "coins clock grass gravel brick page text").split()


def views(rgb: np.ndarray, size: int) -> torch.Tensor:
    """An image (H, W[, 3]) whole and its four quadrants, uint8 (5, 3, size, size)."""
    rgb = np.stack([rgb] * 3, axis=-1) if rgb.ndim == 2 else rgb[..., :3]
    h, w = rgb.shape[:2]
    crops = [rgb] + [rgb[y:y + h // 2, x:x + w // 2] for y in (0, h // 2) for x in (0, w // 2)]
    return resize_crop([torch.from_numpy(np.ascontiguousarray(c)).permute(2, 0, 1) for c in crops], size)


def files_images(paths: list[Path], size: int) -> torch.Tensor:
    return torch.cat([b.images for b in iter_image_batches(paths, size, batch_size=64)])


def auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.r_[np.ones(len(pos)), np.zeros(len(neg))], np.r_[pos, neg]))


def unknown_table(val, train_feats, others, means, precision) -> list[dict]:
    """One row per rule: AUROC, val acceptance (2-fold), rejection of each set in ``others``."""
    rows = []
    half = np.arange(len(val["labels"])) % 2 == 0
    for rule in (*RULES, "knn"):
        def score(d, rule=rule):
            if rule == "knn":
                f = d["feats"] / np.linalg.norm(d["feats"], axis=1, keepdims=True)
                t = train_feats / np.linalg.norm(train_feats, axis=1, keepdims=True)
                return (f @ t.T).max(axis=1)
            return known_scores(rule, d["logits"], d["feats"], means, precision)
        s_val = score(val)
        thr = calibrate(rule, s_val).threshold
        cv = np.mean([(s_val[~m] >= calibrate(rule, s_val[m]).threshold).mean() for m in (half, ~half)])
        row = {"rule": rule, "threshold": thr, "val_accepted_cv": float(cv)}
        for name, d in others.items():
            s = score(d)
            row[f"{name}_rejected"] = float((s < thr).mean())
            row[f"{name}_auroc"] = auroc(s_val, s)
        rows.append(row)
    return rows


def imprint(weight: np.ndarray, bias: np.ndarray, means: np.ndarray, new_mean: np.ndarray):
    center = means.mean(axis=0)
    direction = (new_mean - center) / np.linalg.norm(new_mean - center)
    row = direction * np.linalg.norm(weight, axis=1).mean()
    return np.vstack([weight, row]), np.r_[bias, bias.mean()]


def teach_table(model, val, fifth, means_state, sizes=(5, 10, 20), draws=5) -> list[dict]:
    w_old = model.mlp_head.weight.detach().numpy()
    b_old = model.mlp_head.bias.detach().numpy()
    before = float(((val["head"] @ w_old.T + b_old).argmax(1) == val["labels"]).mean())
    means = means_state["means"].numpy()
    n_old = len(means)
    rows = []
    for n in sizes:
        for head in ("ncm", "append"):
            old_acc, new_acc = [], []
            for seed in range(draws):
                pick = np.random.default_rng(seed).permutation(len(fifth))
                taught, held = fifth[pick[:n]], fifth[pick[n:]]
                new_mean = taught.mean(axis=0)
                if head == "ncm":
                    w, b = (t.numpy() for t in ncm_head(torch.from_numpy(np.vstack([means, new_mean])),
                                                        means_state["within"]))
                else:
                    w, b = imprint(w_old, b_old, means, new_mean)
                old_acc.append(((val["head"] @ w.T + b).argmax(1) == val["labels"]).mean())
                new_acc.append(((held @ w.T + b).argmax(1) == n_old).mean())
            rows.append({"photos": n, "head": head, "old_before": before, "old_after": float(np.mean(old_acc)),
                         "old_after_min": float(np.min(old_acc)), "fifth": float(np.mean(new_acc)),
                         "fifth_min": float(np.min(new_acc))})
    return rows


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser()
    p.add_argument("--run", required=True)
    p.add_argument("--fifth", required=True, help="the folder of the class the run never saw")
    p.add_argument("--out", default="unknown_teach.json")
    args = p.parse_args()
    run = Path(args.run)
    model, ckpt = load_model(run / runs.BEST)
    size = ckpt["image_size"]
    files = run_folder(run_config(run, ckpt), run).files

    def outputs(images):
        out = batch_outputs(model, images, ckpt["mean"], ckpt["std"])
        return {"logits": out.logits, "feats": out.features, "head": out.head}

    val_images, train_images = (files_images([f for f, _ in s], size) for s in (files.val, files.train))
    val = outputs(val_images)
    val["labels"] = np.array([y for _, y in files.val])
    train = outputs(train_images)
    train_labels = np.array([y for _, y in files.train])
    if "unknown" not in ckpt:  # a run trained before the rule: what its training's end now does
        sets = [TensorImageDataset(i, torch.tensor(y), ckpt["classes"]) for i, y in ((train_images, train_labels),
                                                                                   (val_images, val["labels"]))]
        save_checkpoint(calibrate_checkpoint(model, ckpt, *sets), run / runs.BEST)
    means_state = class_means(train["head"], train_labels, len(ckpt["classes"]))  # the head's: teach
    means = class_means(train["feats"], train_labels, len(ckpt["classes"]))["means"].numpy()  # unknown's
    precision = shared_precision(train["feats"], train_labels, means)
    import skimage.data
    from sklearn.datasets import load_sample_images

    sk = [views(getattr(skimage.data, n)(), size) for n in SKIMAGE]
    fifth_paths, _ = list_images(args.fifth)
    flower = load_sample_images().images[1]
    others = {"skimage17": outputs(torch.stack([v[0] for v in sk])), "skimage85": outputs(torch.cat(sk)),
              "fifth_class": outputs(files_images(fifth_paths, size)), "sklearn_flower5": outputs(views(flower, size))}
    result = {"unknown": unknown_table(val, train["feats"], others, means, precision),
              "teach": teach_table(model, val, others["fifth_class"]["head"], means_state),
              "per_image_mahalanobis": {n: float(s) for n, s in zip(SKIMAGE, known_scores(
                  "mahalanobis", others["skimage17"]["logits"], others["skimage17"]["feats"], means, precision))},
              "top_class_skimage17": [ckpt["classes"][i] for i in others["skimage17"]["logits"].argmax(1)]}
    Path(args.out).write_text(json.dumps(result, indent=1))
    log.info("%s", json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
