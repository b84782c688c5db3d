"""A training step on 2 threads against 1, on an idle machine and beside ``--busy`` processes that spin on the CPU
(#62): the head start's small step (a batch of cached trunk grids through the encoder) and an end-to-end hybrid step
(a batch of photos through the whole network). Each figure: the mean of ``--steps`` steps after one to warm up.

    python benchmarks/threads_busy.py                 # vit_tiny_cpu hybrid at 224 px, batch 64, 4 spinning processes
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from harness import machine

from vit_flowers.models.patch_embed import hybrid_embed
from vit_flowers.models.vit import create_vit

SPIN = "import time\\nend = time.time() + {seconds}\\nwhile time.time() < end:\\n    pass\\n"


def seconds_a_step(step: Callable[[], None], threads: int, steps: int) -> float:
    torch.set_num_threads(threads)
    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--busy", type=int, default=4, help="spinning processes in the busy arm (default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="steps timed for each figure (default: %(default)s)")
    args = p.parse_args()
    torch.manual_seed(0)
    model = create_vit("vit_tiny_cpu", 5, image_size=224, patch_size=32, patch_embed="lite0")
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)
    grids, photos = torch.randn(64, 320, 7, 7), torch.randn(64, 3, 224, 224)

    def update(logits: torch.Tensor) -> None:
        optimizer.zero_grad()
        logits.logsumexp(-1).mean().backward()
        optimizer.step()

    def head_start() -> None:
        update(model.forward_head(model.forward_features(hybrid_embed(model.to_patch_embedding).tokens(grids),
                                                         embedded=True)))

    def end_to_end() -> None:
        update(model(photos))

    print(f"{machine()}\n| load | step | 2 threads | 1 thread |\n|---|---|---|---|")
    for busy in (0, args.busy):
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=600)]) for _ in range(busy)]
        try:
            time.sleep(1)
            for name, step in (("head start", head_start), ("end to end", end_to_end)):
                two, one = (seconds_a_step(step, n, args.steps) for n in (2, 1))
                print(f"| {busy} busy | {name} | {two:.2f} s | {one:.2f} s |", flush=True)
        finally:
            for proc in spinners:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
