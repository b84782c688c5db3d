"""The split's duplicate grouping at scale (#53): hashing every photo and finding the near-duplicate pairs, the two
steps of ``train --data``'s split (:mod:`vit_flowers.data.duplicates`), timed on made-up photos, with their peak
resident memory.

    python benchmarks/split_scale.py make --out WORK/made20k --photos 20000      # small JPEGs, 50 classes
    python benchmarks/split_scale.py measure --data WORK/made20k                 # one size a process (peak RSS)

``make`` draws small JPEGs (96 x 96) of varied content: random colour fields, each from its own random
24 x 24 grid, with a little noise. One photo in a hundred is copied byte for byte and one in a hundred is saved again at
another JPEG quality and size, so the split has groups to find (the script knows which: ``made.json``).
``measure`` runs the split's steps on the folder and prints one JSON line: the seconds of the scan, of
``hash_files`` and of ``duplicate_groups`` (``near_pairs``, then union-find), the groups found against the copies
made, and the process's peak RSS (``ru_maxrss``, the libraries included) after each step.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time
from pathlib import Path

import harness  # noqa: F401  (puts the checkout on sys.path)
import numpy as np
from PIL import Image

log = logging.getLogger("split_scale")
SIDE = 96


def _photo(rng: np.random.Generator) -> Image.Image:
    """A random colour field: a random 24 x 24 grid of colours, resized bilinearly (detail at the perceptual hash's
    frequencies, as a photo has: a coarser grid leaves them to the noise, and its re-encoded copies apart), with a
    little noise."""
    grid = Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).resize((SIDE, SIDE),
                                                                                    Image.Resampling.BILINEAR)
    noisy = np.asarray(grid, dtype=np.int16) + rng.integers(-4, 5, (SIDE, SIDE, 3), dtype=np.int16)
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8))


def make(out: Path, photos: int, classes: int, seed: int) -> None:
    """``photos`` JPEGs in ``classes`` class folders under ``out``, 1% byte copies and 1% re-encoded copies."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (out / f"class{c:03d}").mkdir(parents=True, exist_ok=True)
    copies: list[list[str]] = []
    made: list[Path] = []
    for i in range(photos):
        path = out / f"class{i % classes:03d}" / f"p{i:06d}.jpg"
        kind = rng.random()
        if made and kind < 0.01:  # a byte copy of an earlier photo of this class
            source = made[-classes] if len(made) >= classes else made[0]
            path.write_bytes(source.read_bytes())
        elif made and kind < 0.02:  # the same photo saved again, smaller and at another quality
            source = made[-classes] if len(made) >= classes else made[0]
            with Image.open(source) as img:
                img.resize((SIDE * 3 // 4, SIDE * 3 // 4), Image.Resampling.BILINEAR).save(path, quality=60)
        else:
            _photo(rng).save(path, quality=90)
            made.append(path)
            continue
        copies.append([str(source.relative_to(out)), str(path.relative_to(out))])
    (out / "made.json").write_text(json.dumps({"photos": photos, "classes": classes, "seed": seed,
                                               "copies": copies}))
    log.info("%d photos in %s (%d copies)", photos, out, len(copies))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(data: Path) -> dict:
    from vit_flowers.data.duplicates import duplicate_groups, hash_files
    from vit_flowers.data.splits import scan_class_folders

    row: dict = {"data": data.name, "peak_mb_start": _peak_mb()}
    start = time.perf_counter()
    _, samples = scan_class_folders(data)
    paths = [p for p, _ in samples]
    row |= {"photos": len(paths), "scan_s": time.perf_counter() - start}
    start = time.perf_counter()
    hashes = hash_files(paths)
    row |= {"hash_s": time.perf_counter() - start, "peak_mb_hashed": _peak_mb()}
    start = time.perf_counter()
    groups = duplicate_groups(hashes)  # the near-duplicate pairs (near_pairs), joined with the byte copies
    row |= {"groups_s": time.perf_counter() - start, "groups": len(groups), "grouped_photos": sum(map(len, groups)),
            "peak_mb_grouped": _peak_mb()}
    made = json.loads((data / "made.json").read_text()) if (data / "made.json").is_file() else None
    if made is not None:
        index = {str(p.relative_to(data)): i for i, p in enumerate(paths)}
        grouped = {i: g[0] for g in groups for i in g}
        row["copies_found"] = sum(grouped.get(index[a], -1) == grouped.get(index[b], -2) for a, b in made["copies"])
        row["copies_made"] = len(made["copies"])
    row["peak_mb"] = _peak_mb()
    return row


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--photos", type=int, required=True)
    m.add_argument("--classes", type=int, default=50)
    m.add_argument("--seed", type=int, default=53)
    r = sub.add_parser("measure")
    r.add_argument("--data", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "make":
        make(args.out, args.photos, args.classes, args.seed)
    else:
        print(json.dumps(measure(args.data)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
