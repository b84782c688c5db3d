""""None of these" and "teach" (#37), measured on a run trained on four of flowers5's classes.

    python -m vit_flowers.train --data flowers4 --run-name four14          # four of flowers5's classes
    python benchmarks/unknown_teach.py --run checkpoints/four14 --fifth ../shared/data/flowers5/tulip \
        --cache four14_features.npz

Step one computes every photo's features once into ``--cache`` (reused when it exists; minutes): the run's
validation photos, up to 200 training photos a class (evenly spaced, as ``teach_sample`` keeps) and their mirror
images, the fifth class's photos and their mirror images, scikit-image's 17 sample photos whole and as four quadrant
crops (85 images) and scikit-learn's flower.jpg (whole + 4 quarters). Features: the logits, the CLS token the
trained head reads (``cls``), the mean of the final patch tokens (``patches``: the unknown rule's), the mean of
the hybrid's CNN trunk output (``trunk``, 320 channels for Lite0 at stride 32), ImageNet's own last 1x1
convolution (320 -> 1,280, BatchNorm, ReLU6; not in the hybrid) on that trunk, pooled (``trunk1280``), and the whole
frozen ImageNet EfficientNet-Lite0's pooled features (``imagenet``: the frozen-features peer's; a second network,
for reference).

Unknown: the run's own rule (its class means, precision and threshold as training chose them) and every other rule
of :mod:`vit_flowers.inference.unknown` (class means and precision from the kept training photos, 200 a class) with its
threshold chosen as training chooses it (accepting 95% of the validation photos); the acceptance of held-out
known-class photos is two-fold cross-validated (the threshold chosen on one half,
measured on the other). Also kNN: the cosine to the nearest kept training photo's features (measured, not offered).

Teach: the fifth class from 5, 10 and 20 of its photos (5 random draws each, the same draws for every head), its
other photos held out; "old" = the four classes' validation photos predicted among all five, before (the trained
head) and after. Heads: ``ncm`` (the nearest class mean, each source L2-normalised; what ``teach`` wrote before),
``lr`` (a logistic regression on the kept training photos' features and the taught photos', mirror images of both,
each class weighted alike: what ``teach`` writes now, on ``calibration.TEACH_INPUT``), ``keep`` (the trained head
for the old classes, a one-against-the-rest logistic regression for the new class: tulip when its probability is
over 0.5).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch
from harness import SKIMAGE, fifth_species_parser, views  # (before vit_flowers: it puts the checkout on sys.path)

from vit_flowers.data.augment import eval_transform
from vit_flowers.data.image_files import list_images
from vit_flowers.inference.batches import iter_image_batches
from vit_flowers.inference.calibration import TEACH_C, TEACH_PER_CLASS, balanced_sample
from vit_flowers.inference.run_data import rebuilt_photos
from vit_flowers.inference.unknown import RULES, calibrate, known_scores, rule_from_checkpoint, shared_precision
from vit_flowers.models.vit import pool_patches
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import load_model

log = logging.getLogger("unknown_teach")
FEATURES = ("cls", "patches", "trunk", "trunk1280", "imagenet")
# (features, head) pairs of the teach table
OPTIONS = [(("cls",), "ncm"), (("patches",), "ncm"), (("cls", "patches"), "ncm"), (("cls",), "lr"),
           (("patches",), "lr"), (("cls", "patches"), "lr"), (("trunk",), "lr"), (("cls", "patches", "trunk"), "lr"),
           (("trunk1280",), "lr"), (("cls", "patches", "trunk1280"), "lr"), (("imagenet",), "ncm"),
           (("imagenet",), "lr"), (("cls", "patches", "imagenet"), "lr"), (("patches",), "keep"),
           (("imagenet",), "keep")]


class Extractor:
    """Every feature of :data:`FEATURES` (and the logits) of uint8 photos, for a hybrid run."""

    def __init__(self, run: Path) -> None:
        import timm

        from vit_flowers.models.efficientnet import imagenet_state

        self.model, self.ckpt = load_model(run / runs.BEST)
        self.net = timm.create_model("tf_efficientnet_lite0", pretrained=False)
        self.net.load_state_dict(imagenet_state("lite0"))
        self.net.eval()

    @torch.inference_mode()
    def __call__(self, images: torch.Tensor, mirror: bool = False) -> dict[str, np.ndarray]:
        m, ckpt, out = self.model, self.ckpt, {}
        for chunk in images.split(32):
            chunk = chunk.flip(-1) if mirror else chunk
            x = eval_transform(chunk, ckpt["image_size"], ckpt["mean"], ckpt["std"])
            trunk = m.to_patch_embedding.trunk_features(x)  # (B, 320, 7, 7)
            tokens = m.forward_features(m.to_patch_embedding.tokens(trunk), embedded=True)
            xi = eval_transform(chunk, ckpt["image_size"], (0.5,) * 3, (0.5,) * 3)  # as Lite0 was trained
            found = {"logits": m.forward_head(tokens), "cls": tokens[:, 0], "patches": pool_patches(tokens),
                     "trunk": trunk.mean((2, 3)),
                     "trunk1280": self.net.bn2(self.net.conv_head(trunk.contiguous())).mean((2, 3)),
                     "imagenet": self.net.forward_head(self.net.forward_features(xi), pre_logits=True)}
            for k, v in found.items():
                out.setdefault(k, []).append(v.float().numpy())
        return {k: np.concatenate(v) for k, v in out.items()}


def cache_features(run: Path, fifth: Path, path: Path) -> dict[str, np.ndarray]:
    """The features of every photo set (module docstring), from ``path`` when it holds them, else computed there."""
    found = dict(np.load(path)) if path.is_file() else {}
    ex = None
    model_ckpt = load_model(run / runs.BEST)[1]
    size = model_ckpt["image_size"]
    train_photos, val_photos = (rebuilt_photos(model_ckpt, run, which) for which in ("train", "val"))
    assert train_photos.files is not None and val_photos.files is not None, f"{run}: a run on a folder of photos"
    classes = train_photos.classes
    train_files = list(zip(train_photos.files, train_photos.labels))
    val_files = list(zip(val_photos.files, val_photos.labels))

    def read(paths: list[Path]) -> torch.Tensor:
        return torch.cat([b.images for b in iter_image_batches(paths, size, batch_size=64)])

    def photo_sets():
        train_labels = np.array([y for _, y in train_files])
        train = [train_files[i] for i in balanced_sample(train_labels, TEACH_PER_CLASS)]
        yield "train", lambda: read([p for p, _ in train]), [y for _, y in train], True
        yield "val", lambda: read([p for p, _ in val_files]), [y for _, y in val_files], False
        tulips = list_images(fifth)[0]
        yield "tulip", lambda: read(tulips), [len(classes)] * len(tulips), True
        import skimage.data
        from sklearn.datasets import load_sample_images

        def sk():
            return [views(getattr(skimage.data, n)(), size) for n in SKIMAGE]
        yield "sk17", lambda: torch.stack([v[0] for v in sk()]), [-1] * 17, False
        yield "sk85", lambda: torch.cat(sk()), [-1] * 85, False
        yield "flower", lambda: views(load_sample_images().images[1], size), [-1] * 5, False

    for name, images, labels, mirror in photo_sets():
        if f"{name}_labels" in found:
            continue
        ex = ex or Extractor(run)
        start = time.perf_counter()
        loaded = images()
        for flip in (False, True) if mirror else (False,):
            for k, v in ex(loaded, flip).items():
                found[f"{name}_{k}" + ("_flip" if flip else "")] = v
        found[f"{name}_labels"] = np.array(labels)
        log.info("%s: %d photos in %.0f s", name, len(labels), time.perf_counter() - start)
        np.savez(path, **found)
    return found


def auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.r_[np.ones(len(pos)), np.zeros(len(neg))], np.r_[pos, neg]))


def unknown_table(d: dict[str, np.ndarray], ckpt: dict) -> list[dict]:
    """One row per rule: AUROC, val acceptance (2-fold), rejection of each other set; the run's own rule first."""
    own = rule_from_checkpoint(ckpt)
    labels = d["train_labels"]
    means = np.stack([d["train_patches"][labels == c].mean(0) for c in range(len(ckpt["classes"]))])
    precision = shared_precision(d["train_patches"], labels, means)
    val = {"logits": d["val_logits"], "feats": d["val_patches"]}
    others = {s: {"logits": d[f"{s}_logits"], "feats": d[f"{s}_patches"]} for s in ("sk17", "sk85", "tulip", "flower")}
    half = np.arange(len(d["val_labels"])) % 2 == 0
    rows = []
    for rule in ("own", *RULES, "knn") if own is not None else (*RULES, "knn"):
        def score(x, rule=rule):
            if rule == "own":
                return own.scores(x["logits"], x["feats"])
            if rule == "knn":
                f = x["feats"] / np.linalg.norm(x["feats"], axis=1, keepdims=True)
                t = d["train_patches"] / np.linalg.norm(d["train_patches"], axis=1, keepdims=True)
                return (f @ t.T).max(axis=1)
            return known_scores(rule, x["logits"], x["feats"], means, precision)
        s_val = score(val)
        thr = own.threshold if rule == "own" else calibrate(rule, s_val).threshold
        cv = np.mean([(s_val[~m] >= calibrate(rule, s_val[m]).threshold).mean() for m in (half, ~half)])
        row = {"rule": f"{own.rule} (the run's own)" if rule == "own" else rule, "threshold": thr,
               "val_accepted": float((s_val >= thr).mean()), "val_accepted_cv": float(cv)}
        for name, x in others.items():
            s = score(x)
            row[f"{name}_rejected"] = float((s < thr).mean())
            row[f"{name}_auroc"] = auroc(s_val, s)
        rows.append(row)
    return rows


def _l2(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True).clip(1e-12)


def teach_table(d: dict[str, np.ndarray], sizes=(5, 10, 20), draws: int = 5, options=OPTIONS) -> list[dict]:
    """One row per (features, head, photos taught): the fifth class recognised and the old classes after (mean and
    worst of ``draws`` draws), and the seconds one head takes to fit."""
    from sklearn.linear_model import LogisticRegression

    from vit_flowers.inference.calibration import fit_head

    y_old, y_val = d["train_labels"], d["val_labels"]
    n_old = int(y_old.max()) + 1
    before = float((d["val_logits"].argmax(1) == y_val).mean())
    rows = []
    for names, head in options:
        def feats(s, flip="", names=names):  # a cache without mirror images of a feature: the photos again
            return np.hstack([_l2(d.get(f"{s}_{n}{flip}", d[f"{s}_{n}"])) for n in names])
        old = np.vstack([feats("train"), feats("train", "_flip")])
        old_labels = np.r_[y_old, y_old]
        val, fifth, fifth_flip = feats("val"), feats("tulip"), feats("tulip", "_flip")
        for n in sizes:
            old_acc, new_acc, seconds = [], [], []
            for seed in range(draws):
                pick = np.random.default_rng(seed).permutation(len(fifth))
                taught, held = pick[:n], pick[n:]
                new = np.vstack([fifth[taught], fifth_flip[taught]])
                start = time.perf_counter()
                if head == "ncm":
                    means = np.vstack([old[old_labels == c].mean(0) for c in range(n_old)] + [new.mean(0)])
                    def predict(x, means=means):
                        return (x @ means.T - 0.5 * (means ** 2).sum(1)).argmax(1)
                elif head == "lr":
                    labels = np.r_[old_labels, np.full(len(new), n_old)]
                    w, b = (t.numpy() for t in fit_head(np.vstack([old, new]), labels, n_old + 1, TEACH_C))
                    def predict(x, w=w, b=b):
                        return (x @ w.T + b).argmax(1)
                else:  # keep: the trained head, and a one-against-the-rest model of the new class
                    clf = LogisticRegression(C=TEACH_C, max_iter=5000, class_weight="balanced").fit(
                        np.vstack([old, new]), np.r_[np.zeros(len(old)), np.ones(len(new))])
                    predict = None
                seconds.append(time.perf_counter() - start)
                if head == "keep":
                    pv = np.where(clf.predict_proba(val)[:, 1] > 0.5, n_old, d["val_logits"].argmax(1))
                    ph = np.where(clf.predict_proba(fifth[held])[:, 1] > 0.5, n_old,
                                  d["tulip_logits"][held].argmax(1))
                else:
                    pv, ph = predict(val), predict(fifth[held])
                old_acc.append(float((pv == y_val).mean()))
                new_acc.append(float((ph == n_old).mean()))
            rows.append({"features": "+".join(names), "head": head, "photos": n, "old_before": before,
                         "fifth": float(np.mean(new_acc)), "fifth_min": float(np.min(new_acc)),
                         "old_after": float(np.mean(old_acc)), "old_after_min": float(np.min(old_acc)),
                         "fit_s": float(np.median(seconds))})
            r = rows[-1]
            log.info("%-28s %-4s %2d: fifth %5.1f%% / %5.1f%%, old %5.1f%% / %5.1f%% (before %.1f%%), fit %.2f s",
                     r["features"], head, n, 100 * r["fifth"], 100 * r["fifth_min"], 100 * r["old_after"],
                     100 * r["old_after_min"], 100 * before, r["fit_s"])
    return rows


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = fifth_species_parser(__doc__, "the features' .npz (computed when absent)")
    p.add_argument("--out", default="unknown_teach.json")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    d = cache_features(args.run, args.fifth, args.cache)
    ckpt = load_model(args.run / runs.BEST)[1]
    result = {"unknown": unknown_table(d, ckpt), "teach": teach_table(d),
              "top_class_skimage17": [ckpt["classes"][i] for i in d["sk17_logits"].argmax(1)]}
    Path(args.out).write_text(json.dumps(result, indent=1))
    log.info("%s", json.dumps(result["unknown"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
