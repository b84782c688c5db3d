"""What keeping duplicates on one side of the train/val split changes on flowers5 (issue #36).

``train --data PHOTOS`` splits a folder 80/20, stratified, then moves every group of duplicate photos (the cheap
hashes of :mod:`vit_flowers.data.duplicates`) to the side that holds most of it. This measures, over several split
seeds, how many validation photos had a copy on the training side before that move, and what the move does to
validation accuracy. The classifier is the frozen-features peer of ``frozen_peer.py`` (timm's
``tf_efficientnet_lite0`` with the shipped ImageNet weights, pooled features, logistic regression): it is fit in
seconds per split, and a photo with its twin in the training photos is as easy for it as for the hybrid.

    python benchmarks/split_grouping.py                    # 10 split seeds, 224 px (~2 min on 2 cores)
    python benchmarks/split_grouping.py --seeds 20 --size 160
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from harness import DEFAULT_DATA, frozen_lite, pooled_features
from sklearn.linear_model import LogisticRegression

from vit_flowers.data.datasets import cache_images
from vit_flowers.data.duplicates import duplicate_groups, hash_files
from vit_flowers.data.splits import keep_groups_together, scan_class_folders, stratified_split
from vit_flowers.inference.runtime import keep_freed_memory

log = logging.getLogger("benchmarks.split_grouping")


def val_with_twin(train: list[int], val: list[int], groups: list[list[int]]) -> int:
    """How many of ``val`` have a duplicate in ``train``."""
    in_train, count = set(train), 0
    for group in groups:
        if any(i in in_train for i in group):
            count += sum(i in set(val) for i in group)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--seeds", type=int, default=10, help="split seeds 0 .. N-1")
    parser.add_argument("--val-fraction", type=float, default=0.2, help="train's default split")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--c", type=float, default=0.5, help="the logistic regression's inverse regularisation")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    classes, samples = scan_class_folders(args.data)
    paths, labels = [p for p, _ in samples], [y for _, y in samples]
    groups = duplicate_groups(hash_files(paths))
    log.info("%d photos, %d groups of duplicates (%d photos)", len(paths), len(groups), sum(map(len, groups)))
    net = frozen_lite("lite0")
    images = cache_images(paths, labels, classes, args.size, desc="decode", progress=False).images
    x, y = pooled_features(net, images, args.size).numpy(), np.asarray(labels)
    log.info("features of %d photos in %.0f s", len(x), time.perf_counter() - start)
    rows = []
    for seed in range(args.seeds):
        train, val = stratified_split(labels, args.val_fraction, seed)
        g_train, g_val, moved = keep_groups_together(train, val, groups)
        row = {"seed": seed, "val_photos_with_twin_in_train": val_with_twin(train, val, groups),
               "after_grouping": val_with_twin(g_train, g_val, groups), "moved_groups": len(moved)}
        for name, (tr, va) in (("random", (train, val)), ("grouped", (g_train, g_val))):
            clf = LogisticRegression(C=args.c, max_iter=3000).fit(x[tr], y[tr])
            row[f"val_acc_{name}"] = clf.score(x[va], y[va])
        rows.append(row)
        log.info("%s", row)
    diff = [r["val_acc_random"] - r["val_acc_grouped"] for r in rows]
    summary = {"size": args.size, "seeds": args.seeds, "groups": len(groups),
               "mean_val_acc_random": statistics.mean(r["val_acc_random"] for r in rows),
               "mean_val_acc_grouped": statistics.mean(r["val_acc_grouped"] for r in rows),
               "mean_difference_points": 100 * statistics.mean(diff),
               "stdev_difference_points": 100 * statistics.stdev(diff) if len(diff) > 1 else 0.0,
               "mean_val_photos_with_twin": statistics.mean(r["val_photos_with_twin_in_train"] for r in rows),
               "seconds": time.perf_counter() - start, "rows": rows}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
