"""The Label loop (#63) played from the true labels: flowers5 treated as an unlabelled folder, starting from 10
labelled photos a class, the simulated user reviewing the page's grids until every photo is labelled.

The model of each round is the frozen-feature recipe, not the page's training: EfficientNet-Lite0's 1,280 pooled
ImageNet features (computed once, cached in ``--features``) and a logistic regression (C 0.5, as
benchmarks/frozen_peer.py), refitted on the labelled photos after each round. The page retrains the run's own recipe
instead (a minute or two a round); this measures the loop's clicks and the order's effect, not the page's time.

1. **Clicks** (``fast``: most confident first). Each round the model predicts every unlabelled photo; for each class
   the page shows its suggestions most confident first, ``--grid`` at a time, each pre-ticked. The user reviews
   ``--pages`` grids a class a round: each wrong suggestion is moved to its true class (one click: the page's
   per-photo class buttons), then Accept (one click) labels the whole grid. Nothing is labelled wrong: every wrong
   suggestion shown is moved. Counted against one click per photo. The accuracy of each round's model on the
   photos not yet labelled (never trained on) is reported per round.
2. **Active against random** for the first 200 labels: a stratified 20% of flowers5 held out (never labelled), 10 a
   class drawn from the rest, then 150 more in batches of ``--batch``, refitting after each: the least certain
   first (the smallest margin between the two best classes) or a random draw; held-out accuracy at 200 labels, over
   ``--seeds`` draws.

    flock /work/heavy.lock python benchmarks/label_loop.py --features /tmp/label_loop_lite0.npz
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from harness import DEFAULT_DATA, frozen_lite, machine, pooled_features
from sklearn.linear_model import LogisticRegression

from vit_flowers.data.datasets import cache_images
from vit_flowers.data.splits import scan_class_folders, stratified_split
from vit_flowers.inference.runtime import keep_freed_memory
from vit_flowers.labelling.state import GRID

log = logging.getLogger("benchmarks.label_loop")

START_PER_CLASS = 10


def features(data: Path, cache: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(N, 1280) Lite0 features, (N,) labels and the classes of every photo of ``data``, cached in ``cache``."""
    if cache.is_file():
        z = np.load(cache, allow_pickle=False)
        return z["x"], z["y"], [str(c) for c in z["classes"]]
    classes, samples = scan_class_folders(data)
    net = frozen_lite("lite0")
    xs, ys = [], []
    for i in range(0, len(samples), 256):
        chunk = samples[i:i + 256]
        ds = cache_images([p for p, _ in chunk], [y for _, y in chunk], classes, 224, progress=False)
        if len(ds) != len(chunk):
            raise SystemExit(f"{len(chunk) - len(ds)} photo(s) of {data} could not be read")
        xs.append(pooled_features(net, ds.images, 224).numpy())
        ys.append(ds.labels.numpy())
        log.info("features: %d / %d", i + len(chunk), len(samples))
    x, y = np.concatenate(xs), np.concatenate(ys)
    np.savez(cache, x=x, y=y, classes=np.array(classes))
    return x, y, classes


def fit(x: np.ndarray, y: np.ndarray, c: float) -> LogisticRegression:
    return LogisticRegression(C=c, max_iter=3000).fit(x, y)


def start_draw(y: np.ndarray, pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``START_PER_CLASS`` indices of each class drawn from ``pool``."""
    return np.concatenate([rng.choice(pool[y[pool] == k], START_PER_CLASS, replace=False) for k in np.unique(y)])


def play_fast(x: np.ndarray, y: np.ndarray, seed: int, grid: int, pages: int, c: float) -> dict:
    """The clicks until every photo is labelled (see the module's 1.)."""
    rng = np.random.default_rng(seed)
    n, classes = len(y), np.unique(y)
    labelled = np.zeros(n, bool)
    labelled[start_draw(y, np.arange(n), rng)] = True
    clicks = moves = accepts = 0
    rounds = []
    while not labelled.all():
        left = np.flatnonzero(~labelled)
        clf = fit(x[labelled], y[labelled], c)
        probs = clf.predict_proba(x[left])
        guess = clf.classes_[probs.argmax(1)]
        conf = probs.max(1)
        round_acc = float((guess == y[left]).mean())
        shown = 0
        for k in classes:
            mine = left[guess == k]
            order = mine[np.argsort(-conf[guess == k], kind="stable")]
            for page in range(pages):
                photos = order[page * grid:(page + 1) * grid]
                if not len(photos):
                    break
                wrong = int((y[photos] != k).sum())
                moves += wrong
                accepts += 1
                clicks += wrong + 1
                labelled[photos] = True  # accepted (right) or moved to the true class (wrong)
                shown += len(photos)
        rounds.append({"round": len(rounds) + 1, "labelled_before": int(n - len(left)), "reviewed": shown,
                       "accuracy_on_unlabelled": round(round_acc, 4), "clicks_so_far": clicks})
        log.info("round %d: %d labelled, model %.1f%% on the %d unlabelled, %d reviewed, %d clicks so far",
                 len(rounds), n - len(left), 100 * round_acc, len(left), shown, clicks)
    return {"seed": seed, "grid": grid, "pages": pages, "clicks": clicks, "moves": moves, "accepts": accepts,
            "rounds": len(rounds), "per_round": rounds, "photos": n, "labelled_wrong": 0}


def first_200(x: np.ndarray, y: np.ndarray, seed: int, order: str, batch: int, c: float, total: int = 200) -> float:
    """Held-out accuracy after ``total`` labels chosen ``order`` ("active" or "random"; see the module's 2.)."""
    rng = np.random.default_rng(seed)
    pool_i, test_i = stratified_split(y.tolist(), 0.2, seed)
    pool, test = np.asarray(pool_i), np.asarray(test_i)
    labelled = set(start_draw(y, pool, rng).tolist())
    while len(labelled) < total:
        left = np.asarray([i for i in pool if i not in labelled])
        take = min(batch, total - len(labelled))
        if order == "random":
            chosen = rng.choice(left, take, replace=False)
        else:
            idx = np.asarray(sorted(labelled))
            probs = fit(x[idx], y[idx], c).predict_proba(x[left])
            top2 = np.sort(probs, axis=1)[:, -2:]
            chosen = left[np.argsort(top2[:, 1] - top2[:, 0], kind="stable")[:take]]
        labelled.update(chosen.tolist())
    idx = np.asarray(sorted(labelled))
    return float(fit(x[idx], y[idx], c).score(x[test], y[test]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--features", type=Path, required=True, help="the .npz the Lite0 features are cached in")
    p.add_argument("--grid", type=int, default=GRID, help="photos a grid (the page's; default: %(default)s)")
    p.add_argument("--pages", type=int, nargs="+", default=[1, 2, 4],
                   help="grids a class the user reviews each round, one simulation each (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--batch", type=int, default=25, help="labels between refits in the first 200")
    p.add_argument("--c", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    if not args.data.is_dir() and not args.features.is_file():
        print(f"skipped: no photos at {args.data}", file=sys.stderr)
        return 0
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    x, y, classes = features(args.data, args.features)
    feature_s = time.perf_counter() - start
    result: dict = {"machine": machine(), "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                    "load_start": os.getloadavg(), "photos": len(y), "classes": classes, "feature_seconds": feature_s}
    result["fast"] = [play_fast(x, y, seed, args.grid, pages, args.c) for pages in args.pages
                      for seed in range(args.seeds)]
    result["first_200"] = {order: [first_200(x, y, seed, order, args.batch, args.c) for seed in range(args.seeds)]
                           for order in ("active", "random")}
    result["seconds"] = time.perf_counter() - start
    for pages in args.pages:
        runs = [r for r in result["fast"] if r["pages"] == pages]
        clicks = [r["clicks"] for r in runs]
        print(f"fast, {pages} grid(s) of {args.grid} a class a round: clicks {np.mean(clicks):.0f} "
              f"(min {min(clicks)}, max {max(clicks)}) for {len(y)} photos ({np.mean(clicks) / len(y):.1%} of one "
              f"a photo), rounds {np.mean([r['rounds'] for r in runs]):.1f}, moves "
              f"{np.mean([r['moves'] for r in runs]):.0f}, accepts {np.mean([r['accepts'] for r in runs]):.0f}")
    act, rnd = (np.asarray(result["first_200"][o]) for o in ("active", "random"))
    print(f"first 200 labels, held-out accuracy over {args.seeds} seeds: active {100 * act.mean():.1f}% "
          f"(sd {100 * act.std():.1f}), random {100 * rnd.mean():.1f}% (sd {100 * rnd.std():.1f}); "
          f"difference {100 * (act - rnd).mean():+.1f} points (paired; min {100 * (act - rnd).min():+.1f})")
    print(f"features {feature_s:.0f} s, whole run {result['seconds']:.0f} s; {result['machine']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
