"""From ten photos a class to thousands (#52): the plain `train --data` against the frozen-feature peer (Teachable
Machine's and Create ML's recipe: a frozen ImageNet EfficientNet-Lite0's 1,280 pooled features and a logistic
regression, as frozen_peer.py) on the same photos, scored on photos of the same species that neither saw.

A quarter of each flowers5 species is held out as the test photos (stratified, ``--split-seed``); from the rest, the
first N photos of each species by file name (draw 0, as a new user's folder) or N drawn at random (draw k > 0) are
copied into a folder of their own, and the whole command `python -m vit_flowers.train --data FOLDER [ARGS]` is timed,
then its best.pt scored on the test photos with `python -m vit_flowers.evaluate`. One JSON line per run.

    python benchmarks/few_photos.py --work /tmp/few --sizes 10 30 100 --split-seed 2024 --draw 0
    python benchmarks/few_photos.py --work /tmp/few --sizes 30 --train-args --time-budget 2   # any train flags
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from harness import DEFAULT_DATA, frozen_lite, machine, peer_accuracy, pooled_features

from vit_flowers.data.datasets import cache_images
from vit_flowers.data.splits import scan_class_folders, stratified_split
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import load_checkpoint

log = logging.getLogger("benchmarks.few_photos")


def split_folder(data: Path, seed: int) -> tuple[list[str], list[tuple[Path, int]], list[tuple[Path, int]]]:
    """(classes, the pool sorted by name, the test photos): a quarter of each class held out."""
    classes, samples = scan_class_folders(data)
    pool_i, test_i = stratified_split([y for _, y in samples], 0.25, seed)
    pool = sorted((samples[i] for i in pool_i), key=lambda s: (s[1], s[0].name))
    return classes, pool, [samples[i] for i in test_i]


def draw_photos(pool: list[tuple[Path, int]], n: int, draw: int) -> list[tuple[Path, int]]:
    """N photos a class from the pool (0: all of it): the first N by name (draw 0) or N at random (seeded by
    ``draw``)."""
    rng = np.random.default_rng(draw)
    chosen = []
    for label in sorted({y for _, y in pool}):
        mine = [s for s in pool if s[1] == label]
        k = len(mine) if n == 0 else min(n, len(mine))
        chosen += mine[:k] if draw == 0 else [mine[i] for i in sorted(rng.choice(len(mine), k, replace=False))]
    return chosen


def copy_folder(photos: list[tuple[Path, int]], classes: list[str], dest: Path) -> Path:
    """The photos copied into ``dest/<class>/`` (copies, not links: train does not follow links out of a class)."""
    if not dest.is_dir():
        for path, label in photos:
            (dest / classes[label]).mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / classes[label] / path.name)
    return dest


def ours(folder: Path, test: Path, work: Path, tag: str, train_args: list[str]) -> dict:
    """The whole train command on ``folder`` (timed), then its best.pt on the test photos."""
    run = work / "runs" / tag
    cmd = [sys.executable, "-m", "vit_flowers.train", "--data", str(folder), "--out-dir", str(run.parent),
           "--run-name", tag, *train_args]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    (work / f"{tag}.log").write_text(done.stderr + done.stdout)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1:], "seconds": seconds}
    out = run / "eval-test"
    subprocess.run([sys.executable, "-m", "vit_flowers.evaluate", "--checkpoint", str(run / runs.BEST), "--data",
                    str(test), "--output", str(out), "--quiet"], check=True, capture_output=True)
    metrics = json.loads((out / "metrics.json").read_text())
    said = done.stderr.splitlines()
    recipe = next((line.split("recipe: ", 1)[1] for line in said if "recipe: " in line), None)
    start = next((line.split("start: ", 1)[1] for line in said if "start: the" in line), None)
    return {"accuracy": metrics["accuracy"], "seconds": seconds, "recipe": recipe, "start": start,
            "best_epoch": load_checkpoint(run / runs.BEST)["epoch"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--work", type=Path, required=True, help="where the folders, runs and logs go")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 100], help="photos a class; 0: all")
    parser.add_argument("--split-seed", type=int, default=2024)
    parser.add_argument("--draw", type=int, default=0)
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--peer-c", type=float, default=0.1, help="the peer's inverse regularisation (#60's: 0.1)")
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[], help="flags for the train command")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(2)
    classes, pool, test = split_folder(args.data, args.split_seed)
    test_dir = copy_folder(test, classes, args.work / f"test_s{args.split_seed}")
    net, test_feats = None, None
    if not args.skip_peer:
        net = frozen_lite("lite0")
        ds = cache_images([p for p, _ in test], [y for _, y in test], classes, 224, desc="test", progress=False)
        test_feats = (pooled_features(net, ds.images, 224).numpy(), ds.labels.numpy())
    for n in args.sizes:
        photos = draw_photos(pool, n, args.draw)
        tag = f"n{n}_s{args.split_seed}_d{args.draw}" + ("_" + "_".join(a.strip("-") for a in args.train_args)
                                                         if args.train_args else "")
        folder = copy_folder(photos, classes, args.work / f"photos_n{n}_s{args.split_seed}_d{args.draw}")
        row = {"n": n, "split_seed": args.split_seed, "draw": args.draw, "test_photos": len(test),
               "train_args": args.train_args, "ours": ours(folder, test_dir, args.work, tag, args.train_args)}
        if net is not None and test_feats is not None:
            row["peer"], row["peer_seconds"] = peer_accuracy(photos, test_feats, classes, net, args.peer_c)
        row["machine"] = machine()
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
