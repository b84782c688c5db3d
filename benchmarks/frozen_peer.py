"""The Teachable Machine / Create ML recipe as a peer: a frozen ImageNet network's pooled features and a logistic
regression, on the same splits of flowers5 as benchmarks/accuracy.py (test 15%, val 10%, the rest train).

The network is timm's whole ``tf_efficientnet_lite0`` with the ImageNet weights that ship with the project (the
1,280 pooled features before its classifier), photos decoded by the project's own resize (shorter side, centre
crop). Wall-clock seconds cover decoding, both feature passes and the fit.

    python benchmarks/frozen_peer.py --split-seed 2024 --size 224
    python benchmarks/frozen_peer.py --split-seed 2024 --variant lite2 --size 260   # a larger trunk's features
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
from harness import DEFAULT_DATA, frozen_lite, make_split, pooled_features, split_photos
from sklearn.linear_model import LogisticRegression

from vit_flowers.inference.runtime import keep_freed_memory

log = logging.getLogger("benchmarks.frozen_peer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--split-seed", type=int, default=2024)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--variant", default="lite0", choices=["lite0", "lite1", "lite2"],
                        help="which EfficientNet-Lite (lite1 / lite2: the imagenet-large extra's weights)")
    parser.add_argument("--c", type=float, default=0.5, help="the logistic regression's inverse regularisation")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    net = frozen_lite(args.variant)
    split = make_split(args.data, 0.15, 0.10, args.split_seed)
    feats = {}
    for name in ("train", "val", "test"):
        ds = split_photos(split, name, args.data, args.size)
        feats[name] = (pooled_features(net, ds.images, args.size).numpy(), ds.labels.numpy())
    clf = LogisticRegression(C=args.c, max_iter=3000).fit(*feats["train"])
    result = {"split_seed": args.split_seed, "variant": args.variant, "size": args.size, "C": args.c,
              "val": clf.score(*feats["val"]), "test": clf.score(*feats["test"]),
              "seconds": time.perf_counter() - start}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
