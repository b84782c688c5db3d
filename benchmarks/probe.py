"""How much a pretrained ViT's frozen features already know about flowers: a linear probe, in seconds.

A 4-minute fine-tune tells whether pretrained weights help, but it moves by a point or two by chance and
costs minutes per snapshot. A linear probe does not train the ViT at all: each photo of the split's train
list goes once through the frozen model (eval mode, centre view at the model's size), a logistic regression
(scikit-learn) learns the classes from the normalised CLS token plus the mean of the patch tokens, and its
top-1 on the val list is the figure (a choice between pretrainings is tuning: the test list stays unseen
unless ``--on test``). Run it on each pretraining snapshot and on the same model at random initialisations
(``--random SEED``): features that transfer read above the random ones.

    python benchmarks/probe.py --split checkpoints/accuracy/split.json RUN/best.pt
    python benchmarks/probe.py --split checkpoints/accuracy/split.json --random 0 RUN/best.pt
    python benchmarks/probe.py --split checkpoints/accuracy/split.json a.pt b.pt c.pt --json probe.json

The split file is one ``benchmarks/accuracy.py`` writes (``root``, ``classes``, ``train``, ``val``, ``test``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch
from harness import split_photos

from vit_flowers.data.augment import eval_transform
from vit_flowers.data.datasets import TensorImageDataset
from vit_flowers.data.splits import load_split
from vit_flowers.models.vit import ViT
from vit_flowers.runs.checkpoint import load_model

log = logging.getLogger("benchmarks.probe")


@torch.inference_mode()
def features(model: ViT, images_uint8: torch.Tensor, mean: list[float], std: list[float],
             batch_size: int = 256) -> torch.Tensor:
    """(N, 2 * dim): the CLS token and the mean patch token of the final norm's output."""
    out = []
    for images in images_uint8.split(batch_size):
        tokens = model.forward_features(eval_transform(images, model.image_size, mean, std))  # (B, 1 + N, dim)
        out.append(torch.cat([tokens[:, 0], tokens[:, 1:].mean(1)], dim=1).float())
    return torch.cat(out)


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, eval_x: torch.Tensor, eval_y: torch.Tensor) -> float:
    """Top-1 on eval of a logistic regression fitted on train (features standardised by train's statistics)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train_x.numpy())
    clf = LogisticRegression(max_iter=2000, C=0.5).fit(scaler.transform(train_x.numpy()), train_y.numpy())
    return float((clf.predict(scaler.transform(eval_x.numpy())) == eval_y.numpy()).mean())


def probe(checkpoint: Path, split: dict, on: str = "val", random_seed: int | None = None,
          photos: dict[tuple[str, int], TensorImageDataset] | None = None) -> dict[str, float | str]:
    """The linear probe's top-1 on the ``on`` list from the checkpoint's features (or, with ``random_seed``, from
    its model's features at a random initialisation drawn with that seed). ``photos`` keeps the decoded lists
    by (list, size) from one checkpoint to the next."""
    model, ckpt = load_model(checkpoint)
    if random_seed is not None:
        torch.manual_seed(random_seed)
        model.init_weights()
    photos = {} if photos is None else photos
    feats = {}
    for name in ("train", on):
        if (name, model.image_size) not in photos:
            photos[name, model.image_size] = split_photos(split, name, Path(split["root"]), model.image_size)
        ds = photos[name, model.image_size]
        feats[name] = (features(model, ds.images, ckpt["mean"], ckpt["std"]), ds.labels)
    acc = linear_probe(*feats["train"], *feats[on])
    init = "trained" if random_seed is None else f"random (seed {random_seed})"
    return {"checkpoint": str(checkpoint), "init": init, f"{on}_acc": acc}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", type=Path, help="checkpoint files (best.pt, last.pt, ...)")
    parser.add_argument("--split", type=Path, required=True, help="a split.json written by benchmarks/accuracy.py")
    parser.add_argument("--random", type=int, metavar="SEED",
                        help="probe the checkpoint's model at a random initialisation drawn with SEED instead")
    parser.add_argument("--on", choices=("val", "test"), default="val", help="the list the probe is scored on")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        split = load_split(args.split)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if not isinstance(split.get(args.on), list):
        parser.error(f"split file {args.split} has no {args.on!r} list")
    results, photos = [], {}
    for path in args.checkpoints:
        start = time.perf_counter()
        try:
            r = probe(path, split, on=args.on, random_seed=args.random, photos=photos)
        except (OSError, RuntimeError, ValueError) as exc:  # CheckpointError is a RuntimeError
            log.error("%s", exc)
            return 2
        log.info("%s (%s): linear probe %s top-1 %.1f%% (%.0f s)", path, r["init"], args.on,
                 100 * r[f"{args.on}_acc"], time.perf_counter() - start)
        results.append(r)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
