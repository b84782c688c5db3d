"""Teach measured (#46): on flowers5, each species taught in turn to a run trained on the other four.

    python benchmarks/teach_rotations.py prepare --photos ../shared/data/flowers5 --work WORK
    python -m vit_flowers.train --data WORK/data/without-tulip --time-budget 2 --out-dir WORK/runs \
        --run-name without-tulip                                   # one base run per species (the 2-minute recipe)
    python benchmarks/teach_rotations.py measure --work WORK --out OUT --shots 10 --draws 5

``prepare`` holds out :data:`TEST_PER_CLASS` photos of every species (seed :data:`SEED`) that neither a base run nor
teach sees (``WORK/test/<species>``), and builds ``WORK/data/without-<S>`` (the other four species' remaining
photos: what the base run trains on) and ``WORK/pool/<S>`` (the remaining photos of S: what teach draws its photos
from), of hard links (copies across file systems). ``measure`` teaches each base run its missing species from
``--shots`` photos (``--draws`` draws), with today's teach (a hybrid: the gate on the trunk,
:mod:`vit_flowers.teaching.gate`) and with the head refitted on the encoder's features (what teach did before,
``--methods``), and scores the held-out photos of all five species: the taught species' recall, the old species'
accuracy before and after, the share of each that the run's "none of these" rule accepts, and teach's wall time. A
base run trained before best.pt kept the trunk outputs gets them once (``OUT/bases``: what teach would read from its
training photos on every call).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path
from unittest import mock

import harness
import numpy as np
import torch

from vit_flowers.data.augment import eval_transform
from vit_flowers.inference.calibration import TEACH_PER_CLASS, balanced_sample, teach_sample
from vit_flowers.inference.features import batch_outputs
from vit_flowers.inference.unknown import rule_from_checkpoint
from vit_flowers.models.patch_embed import hybrid_embed
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import load_model, save_checkpoint
from vit_flowers.teaching import gate as teach_gate
from vit_flowers.teaching.estimate import recall, recall_range
from vit_flowers.teaching.teach import read_photos, teach

log = logging.getLogger("teach_rotations")

SEED = harness.TEACH_SEED
TEST_PER_CLASS = 100  # held-out photos a species: scored, never trained on nor taught from
METHODS = ("gate", "encoder")  # today's teach of a hybrid; the head refitted on the encoder's features (before)


_images = harness.photo_files


def _link(files: list[Path], folder: Path) -> None:
    """Hard links to ``files`` in ``folder`` (training follows no link that leads out of a class folder); copies
    where ``folder`` is on another file system."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        try:
            os.link(f.resolve(), folder / f.name)
        except OSError:
            shutil.copyfile(f, folder / f.name)


def prepare(photos: Path, work: Path) -> None:
    """The held-out test photos, the four-species training folders and the pools to teach from (hard links)."""
    species = sorted(p.name for p in photos.iterdir() if p.is_dir())
    rng = random.Random(SEED)
    test, rest = {}, {}
    for s in species:
        files = _images(photos / s)
        held = set(rng.sample(range(len(files)), TEST_PER_CLASS))
        test[s] = [f for i, f in enumerate(files) if i in held]
        rest[s] = [f for i, f in enumerate(files) if i not in held]
    if (work / "test").exists():
        raise SystemExit(f"{work / 'test'} exists: prepare writes a fresh WORK")
    for s in species:
        _link(test[s], work / "test" / s)
        _link(rest[s], work / "pool" / s)
        for other in species:
            if other != s:
                _link(rest[other], work / "data" / f"without-{s}" / other)
    log.info("%s: %d species, %d test photos each", work, len(species), TEST_PER_CLASS)


def _with_trunk(run: Path, out: Path) -> Path:
    """``run`` itself when its best.pt keeps the trunk outputs teach fits a gate on, else a copy (``out``) that
    does: of up to ``TEACH_PER_CLASS`` of its training photos a class (split.json's), as the end of training keeps
    them."""
    model, ckpt = load_model(run / runs.BEST)
    if ckpt["teach_sample"] and "trunk" in ckpt["teach_sample"]:
        return run
    if not (out / runs.BEST).is_file():
        start = time.perf_counter()
        split = json.loads((run / runs.SPLIT).read_text())
        labels = np.array([ckpt["classes"].index(rel.split("/")[0]) for rel in split["train"]])
        picked = balanced_sample(labels, TEACH_PER_CLASS)
        images = read_photos([Path(split["root"]) / split["train"][i] for i in picked], ckpt["image_size"], str(run))
        ckpt["teach_sample"] = teach_sample(model, images, labels[picked], ckpt["mean"], ckpt["std"])
        out.mkdir(parents=True, exist_ok=True)
        for name in (runs.CONFIG, runs.SPLIT):
            shutil.copyfile(run / name, out / name)
        save_checkpoint(ckpt, out / runs.BEST)
        log.info("%s: trunk outputs of its training photos kept in %s (%.0f s)", run, out, time.perf_counter() - start)
    return out


@torch.inference_mode()
def _trunk_grids(best: Path, paths: list[Path]) -> torch.Tensor:
    """The base run's trunk outputs (N, C, h, w) of ``paths``: every taught run of it shares its trunk."""
    model, ckpt = load_model(best)
    images = read_photos(paths, ckpt["image_size"], "test photos")
    embed = hybrid_embed(model.to_patch_embedding)
    return torch.cat([embed.trunk_features(eval_transform(chunk, ckpt["image_size"], ckpt["mean"], ckpt["std"]))
                      for chunk in images.split(64)])


def _score(best: Path, grids: torch.Tensor, names: list[str]) -> dict[str, float]:
    """A run's accuracy on the photos of ``grids`` (their species ``names``), the share its unknown rule accepts and
    the share it names right and accepts (recognised with the rule on), for each species."""
    model, ckpt = load_model(best)
    out = batch_outputs(model, grids, ckpt["mean"], ckpt["std"], cached=True)
    rule = rule_from_checkpoint(ckpt)
    accepted = rule.scores(out.logits, out.features) >= rule.threshold if rule else np.ones(len(names), bool)
    said = np.array(ckpt["classes"])[out.logits.argmax(1)]
    right = said == np.array(names)
    found = {}
    for name in sorted(set(names)):
        mine = np.array(names) == name
        found[f"acc/{name}"], found[f"accepted/{name}"] = float(right[mine].mean()), float(accepted[mine].mean())
        found[f"known/{name}"] = float((right & accepted)[mine].mean())
    return found


def _teach(base: Path, species: str, photos: list[Path], out: Path, method: str, bias: float | None,
           ) -> tuple[Path, float, dict[str, float] | None]:
    """Teach ``species`` from ``photos`` to ``base`` by ``method`` (the gate: with ``bias``, GATE_BIAS's stand-in):
    (the new best.pt, wall seconds, teach's estimate: its point, low and high)."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    if method == "gate":
        with mock.patch.object(teach_gate, "GATE_BIAS", bias):
            result = teach(base, [(species, photos)], out)
    else:  # the head refitted on the encoder's features, as teach fits a model that is not a hybrid
        with mock.patch.object(teach_gate, "reads_trunk", return_value=False):
            result = teach(base, [(species, photos)], out)
    seconds = time.perf_counter() - start
    said = [(recall(e), *recall_range(e)) for e in result.estimates]
    return result.best, seconds, (dict(zip(("point", "low", "high"), said[0])) if said else None)


def measure(work: Path, out: Path, shots: int, draws: int, methods: list[str], biases: list[float],
            species: list[str]) -> list[dict]:
    """Teach every base run its missing species ``draws`` times from ``shots`` photos by each method (the gate with
    each of ``biases``); the rows."""
    rows_file = out / "rows.json"
    rows = json.loads(rows_file.read_text()) if rows_file.is_file() else []
    done = {(r["species"], r["draw"], r["method"], r["bias"]) for r in rows}
    variants = [(m, b) for m in methods for b in (biases if m == "gate" else [None])]
    test = [(name, p) for name in sorted(d.name for d in (work / "test").iterdir())
            for p in _images(work / "test" / name)]
    names = [n for n, _ in test]
    for s in species:
        base = _with_trunk(work / "runs" / f"without-{s}", out / "bases" / f"without-{s}")
        grids = _trunk_grids(base / runs.BEST, [p for _, p in test])  # (500, C, h, w)
        before = _score(base / runs.BEST, grids, names)
        for draw, (method, bias) in ((d, v) for d in range(draws) for v in variants):
            if (s, draw, method, bias) in done:
                continue
            photos = harness.teach_draw(work / "pool" / s, s, shots, draw)
            best, seconds, estimate = _teach(base, s, photos, out / "taught" / f"{s}-{draw}-{method}", method, bias)
            after = _score(best, grids, names)
            shutil.rmtree(best.parent)
            rows.append({"species": s, "shots": shots, "draw": draw, "method": method, "bias": bias,
                         "seconds": seconds, "before": before, "after": after, "estimate": estimate})
            log.info("%s draw %d %s %s: %.1f s, recall %.1f%%, old %.1f%% -> %.1f%%", s, draw, method, bias, seconds,
                     100 * after[f"acc/{s}"], 100 * _old(before, s), 100 * _old(after, s))
            rows_file.write_text(json.dumps(rows, indent=1))
    return rows


def _old(scores: dict[str, float], taught: str, key: str = "acc") -> float:
    """The mean over the species other than ``taught`` of ``key``."""
    return float(np.mean([v for k, v in scores.items() if k.startswith(key + "/") and k.split("/")[1] != taught]))


def _recall(row: dict, key: str = "acc") -> float:
    """A row's ``key`` (acc, accepted) of the taught species after teaching."""
    return float(row["after"][f"{key}/{row['species']}"])


def _pct(values: list[float]) -> str:
    return f"{100 * float(np.mean(values)):.1f}%"


def _before_after(rows: list[dict], key: str) -> str:
    """'before -> after' of the old species' ``key`` (acc, accepted), means over ``rows``."""
    return " -> ".join(_pct([_old(r[when], r["species"], key) for r in rows]) for when in ("before", "after"))


def _estimated(rows: list[dict]) -> str:
    """How teach's estimates held against the recall measured with the rule on (rows measured before the estimate
    was kept: "-"): the mean |point - measured|, how many draws' ranges held the measured value, and in how many
    rotations the mean range held the mean measured recall."""
    kept = [r for r in rows if r.get("estimate") and "known/" + r["species"] in r["after"]]
    if not kept:
        return "-"
    said = [(r["estimate"], _recall(r, "known")) for r in kept]
    held = sum(e["low"] <= m <= e["high"] for e, m in said)
    by = {s: [(e, m) for (e, m), r in zip(said, kept) if r["species"] == s] for s in {r["species"] for r in kept}}
    rotations = sum(np.mean([e["low"] for e, _ in v]) <= np.mean([m for _, m in v])
                    <= np.mean([e["high"] for e, _ in v]) for v in by.values())
    return (f"{100 * float(np.mean([abs(e['point'] - m) for e, m in said])):.1f} pts; {held} of {len(said)} draws, "
            f"{rotations} of {len(by)} rotations")


def _mean_worst(rows: list[dict], key: str) -> str:
    """'mean (worst species' mean, its name)' of the taught species' ``key`` (acc; known: with the rule on; rows
    measured before it was kept: "-")."""
    rows = [r for r in rows if f"{key}/{r['species']}" in r["after"]]
    if not rows:
        return "-"
    by = {s: np.mean([_recall(r, key) for r in rows if r["species"] == s]) for s in {r["species"] for r in rows}}
    worst = min(by, key=lambda s: by[s])
    return f"{_pct([_recall(r, key) for r in rows])} ({100 * by[worst]:.1f}%, {worst})"


def table(rows: list[dict]) -> str:
    """The markdown table: by method, means over the species and draws (and the worst species' mean recall)."""
    lines = ["| teach | taught recall, mean (worst) | with the rule on, mean (worst) | old species before -> after "
             "| taught accepted | old accepted before -> after | estimate: error; range held | wall s (mean) |",
             "|" + "---|" * 8]
    for method, bias in sorted({(r["method"], r["bias"]) for r in rows}, key=lambda v: (v[0] != "gate", v[1] or 0)):
        mine = [r for r in rows if (r["method"], r["bias"]) == (method, bias)]
        name = f"gate, bias {bias:g}" if method == "gate" else "head on the encoder's features"
        lines.append(" | ".join([
            f"| {name}", _mean_worst(mine, "acc"), _mean_worst(mine, "known"),
            _before_after(mine, "acc"), _pct([_recall(r, "accepted") for r in mine]), _before_after(mine, "accepted"),
            _estimated(mine), f"{float(np.mean([r['seconds'] for r in mine])):.1f} |"]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare")
    prep.add_argument("--photos", type=Path, default=harness.DEFAULT_DATA)
    prep.add_argument("--work", type=Path, required=True)
    run = sub.add_parser("measure")
    run.add_argument("--work", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True, help="rows.json, the taught runs (removed after scoring)")
    run.add_argument("--shots", type=int, default=10)
    run.add_argument("--draws", type=int, default=5)
    run.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    run.add_argument("--biases", nargs="+", type=float, default=[teach_gate.GATE_BIAS],
                     help="the gate's bias (GATE_BIAS) to measure it at")
    run.add_argument("--species", nargs="+", default=["daisy", "dandelion", "rose", "sunflower", "tulip"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(2)
    if args.command == "prepare":
        prepare(args.photos, args.work)
        return
    rows = measure(args.work, args.out, args.shots, args.draws, args.methods, args.biases, args.species)
    print(table(rows))


if __name__ == "__main__":
    main()
