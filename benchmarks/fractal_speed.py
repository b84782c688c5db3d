"""How fast fractals are drawn: the numpy renderer that fills the cache against the torch renderer that
streams (``fractal_render: stream``), in one process, rounds alternating, medians.

    python benchmarks/fractal_speed.py                    # 112 px (the pretraining cache size), batch 128, CPU
    python benchmarks/fractal_speed.py --device cuda --batch 1024 --rounds 5

Images per second of each, and their ratio (torch / numpy). The numpy side draws instances of the same
categories with ``render_fractal`` on the cache's thread pool (``make_fractal_dataset`` without its one-off
search for the categories); the torch side is one ``FractalStream.batch`` call per round (on a GPU,
synchronised before the clock stops). Set ``--threads`` to what training uses.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import harness  # noqa: F401  (puts the checkout on sys.path)
import numpy as np
import torch

from vit_flowers.data.fractals import FractalStream, render_fractal, sample_ifs
from vit_flowers.data.images import DECODE_THREADS


def _timed(fn, device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=112, help="pixels a side")
    parser.add_argument("--batch", type=int, default=128, help="images the torch renderer draws per call")
    parser.add_argument("--numpy-images", type=int, default=128, help="images the numpy renderer draws per round")
    parser.add_argument("--classes", type=int, default=1000, help="categories the batch draws from")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    stream = FractalStream(args.classes, 1, args.size, seed=0, device=device)
    g = torch.Generator(device).manual_seed(0)
    idx = torch.randint(len(stream), (args.batch,), generator=torch.Generator().manual_seed(0))
    systems = [sample_ifs(np.random.default_rng([0, int(c)])) for c in stream.labels[idx[:args.numpy_images]]]
    stream.batch(idx, g)  # warm-up
    rates: dict[str, list[float]] = {"numpy": [], "torch": []}
    with ThreadPoolExecutor(DECODE_THREADS) as pool:
        for r in range(args.rounds):
            rngs = [np.random.default_rng([0, r, i]) for i in range(len(systems))]
            numpy_s = _timed(lambda rngs=rngs: list(pool.map(render_fractal, systems, [args.size] * len(systems), rngs)),
                             device)
            torch_s = _timed(lambda: stream.batch(idx, g), device)
            rates["numpy"].append(len(systems) / numpy_s)
            rates["torch"].append(args.batch / torch_s)
    numpy_rate, torch_rate = (statistics.median(v) for v in rates.values())
    ratio = statistics.median(t / n for t, n in zip(rates["torch"], rates["numpy"]))
    print(f"{args.size} px, {args.threads} threads, {device}: numpy {numpy_rate:.0f} img/s, torch "
          f"{torch_rate:.0f} img/s (batch {args.batch}), torch / numpy {ratio:.2f}x (median of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
