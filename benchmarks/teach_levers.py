"""Teach's levers (#55) on flowers5's five rotations, without writing a run: what teach_rotations.py measures, at a
fraction of its cost, for settings teach does not offer.

    python benchmarks/teach_rotations.py prepare ...; five base runs      # WORK, as teach_rotations.py's docstring
    python benchmarks/teach_levers.py --work WORK --features FEATS --levers today bias=1.5 feat=p1280 ...

The base runs end on their head start, so their trunk is ImageNet's Lite0 as shipped: ``FEATS`` holds, for every photo
of the photo folder (made once when absent: a few minutes), its trunk output at 224 px (320 x 7 x 7, float16), that
pooled (320) and Lite0's own head convolution pooled (1,280), and the same of its mirror image. Each base run's encoder
turns the trunk outputs into what its trained head and its "none of these" rule read (kept beside ``FEATS``). Then
each draw of teach_rotations.py (the same photos) is taught with the library's parts (the gate: ``fit_head``; the
mixture; the rule: ``taught_rule``; the estimate: a k-fold as :mod:`vit_flowers.teaching.estimate`), with a lever
changed, and scored on the same held-out photos. With the settings teach writes the rows equal teach_rotations.py's
(2026-12-07: recall, acceptance and the old species' figures alike). A lever is ``key=value`` (several joined by
``,``): ``share`` head | agree (how the trained classes share their mass: as the trained head says, or as the gate
and the head agree, teach's since #55), ``bias`` a number or ``cv`` (chosen per class from the cross-validated
mixture, the kept rows folded too), ``feat`` p320 | p1280 | p320+p1280 | p320+enc (the gate's features), ``views``
N or Ntrivial (N random crops, with TrivialAugment's colour too, of each taught photo besides its mirror image),
``rule`` perclass (the taught class's region under its own covariance, the pooled one shrunk towards its photos'
spread by ``lam``), ``C`` (the gate's inverse regularisation), ``folds`` (the estimate's).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from harness import photo_files as _images
from harness import teach_draw

from vit_flowers.data.augment import TrainAugment, eval_transform
from vit_flowers.inference.calibration import TEACH_PER_CLASS, balanced_sample, fit_head
from vit_flowers.inference.features import batch_outputs
from vit_flowers.inference.unknown import UnknownRule, rule_from_checkpoint
from vit_flowers.models.taught import mix
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import load_model
from vit_flowers.teaching.estimate import recall_range
from vit_flowers.teaching.rule import taught_rule
from vit_flowers.teaching.teach import read_photos

SIZE = 224
TODAY = {"share": "agree", "bias": 1.25, "feat": "p320", "views": 0, "C": 1.0, "folds": 10}


def _name(p: Path) -> str:
    return f"{p.parent.name}/{p.name}"


@torch.inference_mode()
def features(work: Path, out: Path) -> dict:
    """FEATS (see the module's docstring), made when absent, with ``index``: each photo's row by 'species/file'."""
    if not out.is_file():
        import harness

        net = harness.frozen_lite("lite0")
        folders = [s for d in ("test", "pool") for s in (work / d).iterdir()]
        paths = sorted({_name(p): p for s in folders for p in _images(s)}.items())
        found: dict[str, list[torch.Tensor]] = {k + f: [] for k in ("trunk", "p320", "p1280") for f in ("", "_f")}
        for start in range(0, len(paths), 64):
            images = read_photos([p for _, p in paths[start:start + 64]], SIZE, "flowers")
            x = eval_transform(images, SIZE, (0.5,) * 3, (0.5,) * 3)
            for suffix, view in (("", x), ("_f", x.flip(-1))):
                grid = net.blocks(net.bn1(net.conv_stem(view.contiguous(memory_format=torch.channels_last))))
                found["trunk" + suffix].append(grid.half())
                found["p320" + suffix].append(grid.mean((2, 3)))
                found["p1280" + suffix].append(net.forward_head(net.bn2(net.conv_head(grid)), pre_logits=True))
        torch.save({**{k: torch.cat(v) for k, v in found.items()}, "paths": [n for n, _ in paths]}, out)
    feats = torch.load(out, map_location="cpu", weights_only=False)
    feats["index"] = {p: i for i, p in enumerate(feats["paths"])}
    return feats


def shots(work: Path, species: str, draw: int, count: int = 10) -> list[Path]:
    """The photos teach_rotations.py teaches ``species`` from in ``draw``."""
    return teach_draw(work / "pool" / species, species, count, draw)


@torch.inference_mode()
def base_outputs(work: Path, feats: dict, species: str, draws: int, cache: Path) -> dict:
    """The base run without ``species``: the rows of its kept training photos (as the end of training picks them),
    of the held-out photos and of every draw's photos, and its encoder's outputs of them (and of the drawn photos'
    mirror images)."""
    if cache.is_file():
        return torch.load(cache, weights_only=False)
    run = work / "runs" / f"without-{species}"
    model, ckpt = load_model(run / runs.BEST)
    split = json.loads((run / runs.SPLIT).read_text())
    labels = np.array([ckpt["classes"].index(r.split("/")[0]) for r in split["train"]])
    picked = balanced_sample(labels, TEACH_PER_CLASS)
    test = [p for name in sorted(d.name for d in (work / "test").iterdir()) for p in _images(work / "test" / name)]
    drawn = sorted({feats["index"][_name(p)] for d in range(draws) for p in shots(work, species, d)})
    rows = {"old": [feats["index"][split["train"][i]] for i in picked],
            "test": [feats["index"][_name(p)] for p in test], "shots": drawn}
    found = {"rows": rows, "old_y": labels[picked], "test_names": [p.parent.name for p in test],
             "classes": ckpt["classes"], "counts": ckpt["class_means"]["counts"]}
    for part, (key, ids) in {**{k: ("trunk", v) for k, v in rows.items()}, "mirrored": ("trunk_f", drawn)}.items():
        found[part] = batch_outputs(model, feats[key][ids].float(), ckpt["mean"], ckpt["std"], cached=True)._asdict()
    torch.save(found, cache)
    return found


def _l2(x: np.ndarray | torch.Tensor) -> np.ndarray:
    return torch.nn.functional.normalize(torch.as_tensor(np.asarray(x), dtype=torch.float32), dim=-1).numpy()


def gate_x(feats: dict, ids: list[int], kind: str, enc: dict, mirrored: bool = False) -> np.ndarray:
    """The gate's input of the photos ``ids`` (``enc``: the base's outputs of them, for the encoder's part)."""
    suffix = "_f" if mirrored else ""
    parts = {"p320": lambda: _l2(feats["p320" + suffix][ids].float()),
             "p1280": lambda: _l2(feats["p1280" + suffix][ids].float()),
             "enc": lambda: np.concatenate([_l2(enc["cls"]), _l2(enc["features"])], 1)}
    return np.concatenate([parts[k]() for k in kind.split("+")], 1)


def mixer(share: str):
    """The mixture: ``agree`` teach's (:func:`vit_flowers.models.taught.mix`), ``head`` the trained classes' share
    as the trained head alone says (teach's before #55)."""
    if share == "agree":
        return mix

    def by_head(trained: torch.Tensor, gate: torch.Tensor, bias: float) -> torch.Tensor:
        gate = torch.log_softmax(gate, dim=-1)
        k = trained.shape[-1]
        old = torch.logsumexp(gate[:, :k], -1, keepdim=True) + torch.log_softmax(trained, -1)
        return torch.log_softmax(torch.cat([old, gate[:, k:] + bias], -1), -1)
    return by_head


class PerClassRule:
    """The taught rule with the taught class's region under a covariance of its own: the pooled one (weight ``lam``)
    and its photos' spread, its allowance from leave-one-out at the rule's acceptance, as recalibrate's."""

    def __init__(self, rule: UnknownRule, x: np.ndarray, taught: int, lam: float) -> None:
        assert rule.precision is not None and rule.means is not None
        self.rule, self.taught, self.threshold = rule, taught, rule.threshold
        x, pooled = np.asarray(x, np.float64), np.linalg.inv(np.asarray(rule.precision, np.float64))

        def precision(rows: np.ndarray) -> np.ndarray:
            z = rows - rows.mean(0)
            return np.linalg.inv(lam * pooled + (1 - lam) * z.T @ z / max(len(rows) - 1, 1))

        self.mean, self.precision = x.mean(0), precision(x)
        outside = []
        for i in range(len(x)):
            rest = np.delete(x, i, 0)
            z = x[i] - rest.mean(0)
            outside.append(z @ precision(rest) @ z + self.threshold)
        self.offset = max(0.0, float(np.quantile(outside, rule.accept)))

    def scores(self, logits: np.ndarray, f: np.ndarray) -> np.ndarray:
        r = self.rule
        assert r.means is not None
        old = UnknownRule(r.rule, r.threshold, r.means[:self.taught], r.precision,
                          offsets=None if r.offsets is None else r.offsets[:self.taught])
        z = np.asarray(f, np.float64) - self.mean
        return np.maximum(old.scores(logits, f), -((z @ self.precision) * z).sum(1) + self.offset)

    def rejects(self, scores: np.ndarray) -> np.ndarray:
        return ~(np.asarray(scores) >= self.threshold)


def taught_rule_for(lever: dict, rule: UnknownRule, counts: list[int], x: np.ndarray, taught: int):
    found = taught_rule(rule, counts, {taught: x})
    return PerClassRule(found, x, taught, lever.get("lam", 0.5)) if lever.get("rule") == "perclass" else found


class Views:
    """Random crops (and TrivialAugment's colour) of the drawn photos through the frozen Lite0, kept by draw."""

    def __init__(self) -> None:
        import harness

        self.net, self.kept = harness.frozen_lite("lite0"), dict[tuple, tuple]()

    @torch.inference_mode()
    def __call__(self, photos: list[Path], draw: int, spec: str, kind: str) -> list[np.ndarray]:
        key = (tuple(photos), spec)
        if key not in self.kept:
            images = read_photos(photos, SIZE, "views")
            augment = TrainAugment(SIZE, scale=(0.35, 1.0), auto_augment="trivial" if "trivial" in spec else "none",
                                   mean=(0.5,) * 3, std=(0.5,) * 3)
            generator, pooled = torch.Generator().manual_seed(1000 * draw + 7), []
            for _ in range(int(spec.replace("trivial", ""))):
                x = augment(images, generator=generator).contiguous(memory_format=torch.channels_last)
                grid = self.net.blocks(self.net.bn1(self.net.conv_stem(x)))
                pooled.append((grid.mean((2, 3)).numpy(),
                               self.net.forward_head(self.net.bn2(self.net.conv_head(grid)), pre_logits=True).numpy()))
            self.kept[key] = tuple(pooled)
        use = {"p320": lambda a, b: _l2(a), "p1280": lambda a, b: _l2(b),
               "p320+p1280": lambda a, b: np.concatenate([_l2(a), _l2(b)], 1)}[kind]
        return [use(a, b) for a, b in self.kept[key]]


def crossval(old_x, old_y, old_logits, views, trained, rule_x, taught, rule, counts, lever, seed):
    """The k-fold of the estimate (every draw's photos left out in turn, with their views), and with ``bias=cv`` the
    kept rows folded alike: the held-out gate logits, so that any bias can be read off."""
    folds, mixed = lever["folds"], mixer(lever["share"])
    rng = np.random.default_rng(seed)
    fold = rng.permutation(len(views)) % folds
    old_fold = rng.permutation(len(old_x)) % folds if lever["bias"] == "cv" else None
    held, away = np.zeros((len(views), taught + 1), np.float32), np.zeros(len(views), bool)
    old_held = np.zeros((len(old_x), taught + 1), np.float32)
    for f in range(folds):
        keep = fold != f
        if keep.all():
            continue
        old_keep = np.ones(len(old_x), bool) if old_fold is None else old_fold != f
        w, b = fit_head(np.r_[old_x[old_keep], views[keep].reshape(-1, views.shape[-1])],
                        np.r_[old_y[old_keep], [taught] * int(keep.sum()) * views.shape[1]], taught + 1, c=lever["C"])
        held[~keep] = (torch.from_numpy(views[~keep, 0]) @ w.T + b).numpy()
        if old_fold is not None:
            old_held[~old_keep] = (torch.from_numpy(old_x[~old_keep]) @ w.T + b).numpy()
        r = taught_rule_for(lever, rule, counts, rule_x[keep], taught)
        away[~keep] = r.rejects(r.scores(np.empty((int((~keep).sum()), 0)), rule_x[~keep]))

    def said(logits: np.ndarray, gate: np.ndarray, bias: float) -> np.ndarray:
        return mixed(torch.from_numpy(logits), torch.from_numpy(gate), bias).numpy().argmax(1)

    def estimate(bias: float) -> dict:
        correct = int(((said(trained, held, bias) == taught) & ~away).sum())
        low, high = recall_range({"name": "", "photos": len(views), "correct": correct, "confused": {}})
        return {"point": correct / len(views), "low": low, "high": high}

    def chosen() -> float:  # the bias that best balances the taught class's recall and the kept rows' accuracy
        grid = np.arange(0.0, 3.01, 0.25)
        score = [(said(trained, held, b) == taught).mean() / (taught + 1)
                 + (said(old_logits, old_held, b) == old_y).mean() * taught / (taught + 1) for b in grid]
        return float(grid[int(np.argmax(score))])

    return estimate, chosen


def rotation(work: Path, feats: dict, base: dict, species: str, draws: int, lever: dict, views: Views) -> list[dict]:
    """Each draw of ``species`` taught with ``lever``: the scores teach_rotations.py keeps."""
    full = torch.load(work / "runs" / f"without-{species}" / runs.BEST, map_location="cpu", weights_only=False)
    rule = rule_from_checkpoint(full)
    assert rule is not None, "a base run keeps its rule"
    taught, kind, rows = len(base["classes"]), lever["feat"], base["rows"]
    old_x = gate_x(feats, rows["old"], kind, base["old"])
    test_x = gate_x(feats, rows["test"], kind, base["test"])
    names, test_names = np.array([*base["classes"], species]), np.array(base["test_names"])
    mine = test_names == species
    before = base["test"]["logits"].argmax(1)
    accepted_before = rule.scores(base["test"]["logits"], base["test"]["features"]) >= rule.threshold
    found = []
    for draw in range(draws):
        start = time.perf_counter()
        photos = shots(work, species, draw)
        ids = [feats["index"][_name(p)] for p in photos]
        at = [rows["shots"].index(i) for i in ids]
        enc = {k: v[at] for k, v in base["shots"].items()}
        enc_m = {k: v[at] for k, v in base["mirrored"].items()}
        stack = [gate_x(feats, ids, kind, enc), gate_x(feats, ids, kind, enc_m, mirrored=True)]
        if lever["views"]:
            stack += views(photos, draw, str(lever["views"]), kind)
        taught_views = np.stack(stack, 1)  # (n, views, d)
        estimate, chosen = crossval(old_x, base["old_y"], base["old"]["logits"], taught_views, enc["logits"],
                                    enc["features"], taught, rule, base["counts"], lever, draw)
        bias = chosen() if lever["bias"] == "cv" else float(lever["bias"])
        w, b = fit_head(np.r_[old_x, taught_views.reshape(-1, taught_views.shape[-1])],
                        np.r_[base["old_y"], [taught] * taught_views.shape[0] * taught_views.shape[1]], taught + 1,
                        c=lever["C"])
        logits = mixer(lever["share"])(torch.from_numpy(base["test"]["logits"]),
                                       torch.from_numpy(test_x) @ w.T + b, bias).numpy()
        r = taught_rule_for(lever, rule, base["counts"], enc["features"], taught)
        accepted = r.scores(logits, base["test"]["features"]) >= r.threshold
        right = names[logits.argmax(1)] == test_names
        found.append({"species": species, "draw": draw, "bias": bias, "recall": right[mine].mean(),
                      "known": (right & accepted)[mine].mean(),
                      "old_before": (names[before] == test_names)[~mine].mean(), "old_after": right[~mine].mean(),
                      "accepted": accepted[mine].mean(), "old_accepted_before": accepted_before[~mine].mean(),
                      "old_accepted_after": accepted[~mine].mean(), "estimate": estimate(bias),
                      "seconds": time.perf_counter() - start})
    return found


def parse_lever(text: str) -> dict:
    """'today' or 'key=value,key=value' over :data:`TODAY`."""
    lever = dict(TODAY)
    for part in filter(None, text.split(",")):
        if part == "today":
            continue
        key, _, value = part.partition("=")
        if key not in (*TODAY, "rule", "lam"):
            raise SystemExit(f"lever {text!r}: unknown key {key!r}")
        lever[key] = value if key in ("share", "feat", "rule", "views") or value == "cv" else float(value)
    lever["folds"] = int(lever["folds"])
    return lever


def row(name: str, found: list[dict]) -> str:
    """A markdown row: recall (worst species) with the rule off and on, the old species, acceptance, the estimate."""
    def pct(key: str, rows: list[dict] = found) -> float:
        return 100 * float(np.mean([r[key] for r in rows]))

    by = {s: [r for r in found if r["species"] == s] for s in dict.fromkeys(r["species"] for r in found)}
    worst = {k: min(by, key=lambda s: pct(k, by[s])) for k in ("recall", "known")}
    said = [(r["estimate"], r["known"]) for r in found]
    error = 100 * float(np.mean([abs(e["point"] - k) for e, k in said]))
    held = sum(e["low"] <= k <= e["high"] for e, k in said)
    rotations = sum(np.mean([r["estimate"]["low"] for r in rs]) <= np.mean([r["known"] for r in rs])
                    <= np.mean([r["estimate"]["high"] for r in rs]) for rs in by.values())
    return (f"| {name} | {pct('recall'):.1f}% ({pct('recall', by[worst['recall']]):.1f}%, {worst['recall']}) | "
            f"{pct('known'):.1f}% ({pct('known', by[worst['known']]):.1f}%, {worst['known']}) | "
            f"{pct('old_before'):.1f}% -> {pct('old_after'):.1f}% | {pct('accepted'):.1f}% | "
            f"{pct('old_accepted_before'):.1f}% -> {pct('old_accepted_after'):.1f}% | {error:.1f} pts; {held} of "
            f"{len(said)} draws, {rotations} of {len(by)} rotations | {np.mean([r['bias'] for r in found]):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--features", type=Path, required=True, help="FEATS (made when absent)")
    parser.add_argument("--levers", nargs="+", default=["today"])
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--species", nargs="+", default=["daisy", "dandelion", "rose", "sunflower", "tulip"])
    args = parser.parse_args()
    torch.set_num_threads(2)
    feats, views = features(args.work, args.features), Views()
    bases = {s: base_outputs(args.work, feats, s, args.draws, args.features.with_name(f"base-{s}.pt"))
             for s in args.species}
    print("| lever | taught recall, rule off (worst) | rule on (worst) | old species before -> after | taught "
          "accepted | old accepted before -> after | estimate: error; range held | bias (mean) |\n|" + "---|" * 8)
    for text in args.levers:
        lever = parse_lever(text)
        found = [r for s in args.species for r in rotation(args.work, feats, bases[s], s, args.draws, lever, views)]
        print(row(text, found), flush=True)


if __name__ == "__main__":
    main()
