"""Rounds of the Label loop (#63) with the page's own recipe, on real photos, through the command line: 10 photos a
class of flowers5 as the training photos, 1,000 others flattened into a folder to label (with a text file), then
round by round: `train --data PHOTOS --time-budget 2`, `label FOLDER --run RUN` (timed), the simulated user taking
the first 2 grids of each class of the suggestions (most confident first; a wrong suggestion changed to the truth:
a move), `label --accept`. A fresh photo cache (in --work) so that no run reads another's decoded photos.

    flock /work/heavy.lock python benchmarks/label_round.py --work /tmp/label_round --rounds 2
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from harness import DEFAULT_DATA, ROOT, machine

GRID = 48
SEED = 63


def make_folders(data: Path, work: Path, per_class: int, folder_size: int) -> dict[str, str]:
    """``work/photos`` (per_class a class) and ``work/summer`` (folder_size others, renamed); returns path -> class."""
    rng = random.Random(SEED)
    pool = []
    for cls in sorted(p.name for p in data.iterdir() if p.is_dir()):
        files = sorted((data / cls).glob("*.jpg"))
        rng.shuffle(files)
        (work / "photos" / cls).mkdir(parents=True)
        for f in files[:per_class]:
            shutil.copyfile(f, work / "photos" / cls / f.name)
        pool += [(f, cls) for f in files[per_class:]]
    rng.shuffle(pool)
    (work / "summer").mkdir()
    truth = {}
    for i, (f, cls) in enumerate(pool[:folder_size]):
        dest = work / "summer" / f"IMG_{i:04d}.jpg"
        shutil.copyfile(f, dest)
        truth[str(dest.resolve())] = cls
    (work / "summer" / "notes.txt").write_text("where I took them\n")
    return truth


def run(args: list[str], work: Path, log: str) -> float:
    """``vit-flowers ARGS`` in ``work``, its output in ``log``; seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    with open(work / log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "vit_flowers.cli", *args], cwd=work, stdout=out,
                               stderr=subprocess.STDOUT, env=env)
    if code:
        raise SystemExit(f"vit-flowers {' '.join(args)} failed: see {work / log}")
    return time.perf_counter() - start


def play(suggestions: Path, truth: dict[str, str], out: Path, grids: int) -> dict:
    """The simulated user on a suggestions CSV: the first ``grids`` grids of each class, wrong ones moved."""
    with open(suggestions, newline="") as f:
        rows = list(csv.DictReader(f))
    by_class = defaultdict(list)
    for r in rows:
        by_class[r["label"]].append(r)
    taken, moves, accepts = [], 0, 0
    for group in by_class.values():
        top = group[:grids * GRID]
        accepts += -(-len(top) // GRID)
        for r in top:
            if truth[r["path"]] != r["label"]:
                moves += 1
                r = {**r, "label": truth[r["path"]]}
            taken.append(r)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(taken)
    right = sum(truth[r["path"]] == r["label"] for r in rows)
    return {"suggested": len(rows), "right": right / max(1, len(rows)), "accepted": len(taken), "moves": moves,
            "accepts": accepts}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--work", type=Path, required=True, help="a new folder for the photos, runs and logs")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--per-class", type=int, default=10)
    p.add_argument("--folder-size", type=int, default=1000)
    p.add_argument("--grids", type=int, default=2, help="grids a class the user takes each round")
    p.add_argument("--minutes", type=float, default=2.0)
    args = p.parse_args(argv)
    if not args.data.is_dir():
        print(f"skipped: no photos at {args.data}", file=sys.stderr)
        return 0
    work = args.work.resolve()
    work.mkdir(parents=True)
    truth = make_folders(args.data, work, args.per_class, args.folder_size)
    result: dict = {"machine": machine(), "load_start": os.getloadavg(), "rounds": []}
    for r in range(1, args.rounds + 1):
        train_s = run(["train", "--data", "photos", "--time-budget", f"{args.minutes:g}", "--out-dir", "runs",
                       "--run-name", f"r{r}", "--cache-dir", str(work / "cache")], work, f"train{r}.log")
        suggest_s = run(["label", "summer", "--run", f"runs/r{r}", "--output", f"suggestions{r}.csv"], work,
                        f"label{r}.log")
        user = play(work / f"suggestions{r}.csv", truth, work / f"accepted{r}.csv", args.grids)
        run(["label", "summer", "--run", f"runs/r{r}", "--accept", f"accepted{r}.csv"], work, f"accept{r}.log")
        row = {"round": r, "train_s": round(train_s, 1), "suggest_s": round(suggest_s, 1), **user}
        result["rounds"].append(row)
        print(json.dumps(row), flush=True)
    result["load_end"] = os.getloadavg()
    (work / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
