"""Where an end-to-end training step of the photo default goes: forward and backward time of each EfficientNet-Lite0
stage, the projection, each Transformer block and the head, in fp32 and under bf16 autocast; then what a whole
step costs when the lower stages run frozen (forward only, no activations kept) on the same batch (#47).

    python benchmarks/step_profile.py                       # batch 32 at 224 px, bf16 and fp32, 5 rounds (~3 min)
    python benchmarks/step_profile.py --batch 16 --rounds 3 --precisions bf16 --json out.json

Each part runs on a detached copy of its input (requires_grad like the whole network's), so its backward is its own:
the weight gradients and the gradient it passes down. Parts alternate round by round; the medians are the figures.
The model is ``train.PHOTO_DEFAULTS``'s (EfficientNet-Lite0 cut at stride 32, 4 pre-norm blocks, dim 192) in training
mode with its BatchNorm on ImageNet's statistics (``backbone_bn: frozen_stats``), as the default trains it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from harness import machine
from torch import nn

from vit_flowers.models.efficientnet import set_batchnorm_mode
from vit_flowers.models.vit import ViT, create_vit
from vit_flowers.train import PHOTO_DEFAULTS

log = logging.getLogger("step_profile")

# the issue's names for Lite0's stages (1-based, as EfficientNet's paper numbers them): the stem joins stage 1
STAGE_GROUPS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("stem + stage 1", (0,)), ("stage 2", (1,)), ("stage 3", (2,)), ("stages 4-5", (3, 4)), ("stages 6-7", (5, 6)))


def default_model() -> ViT:
    """The photo default's network (random weights: the time does not depend on them), in training mode."""
    d = PHOTO_DEFAULTS
    model = create_vit(d["model"], num_classes=5, image_size=d["image_size"], patch_size=d["patch_size"],
                       patch_embed=d["patch_embed"], depth=d["depth"], drop_path=d["drop_path"])
    model.train()
    set_batchnorm_mode(model.to_patch_embedding.trunk, d["backbone_bn"])
    return model


def parts(model: ViT) -> list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
    """The network as a chain of named functions, each taking the previous one's output."""
    embed = model.to_patch_embedding
    trunk = embed.trunk

    def stage_group(indices: tuple[int, ...], with_stem: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(x: torch.Tensor) -> torch.Tensor:
            if with_stem:
                x = (x * embed.input_scale + embed.input_shift).contiguous(memory_format=torch.channels_last)
                x = trunk.bn1(trunk.conv_stem(x))
            for i in indices:
                x = trunk.blocks[i](x)
            return x
        return run

    chain: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
        (name, stage_group(idx, with_stem=k == 0)) for k, (name, idx) in enumerate(STAGE_GROUPS)]
    chain.append(("projection, CLS, positions", lambda x: model._tokens(embed.tokens(x), embedded=True)))
    blocks = model.transformer.layers
    chain += [(f"block {i + 1}", block) for i, block in enumerate(blocks)]
    chain.append(("norm, head", lambda x: model.forward_head(model.norm(x))))
    return chain


def time_parts(model: ViT, images: torch.Tensor, amp: torch.dtype | None, rounds: int) -> list[dict[str, float]]:
    """Median forward and backward ms of each part over ``rounds`` rounds (after one warm-up round)."""
    chain = parts(model)
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name, _ in chain}
    for r in range(rounds + 1):
        x = images
        for k, (name, fn) in enumerate(chain):
            x = x.detach().requires_grad_(k > 0)
            with torch.autocast("cpu", dtype=amp) if amp else contextlib.nullcontext():
                t0 = time.perf_counter()
                out = fn(x)
                t1 = time.perf_counter()
            out.backward(torch.randn_like(out))
            t2 = time.perf_counter()
            if r:
                times[name][0].append(1e3 * (t1 - t0))
                times[name][1].append(1e3 * (t2 - t1))
            x = out
        model.zero_grad(set_to_none=True)
    return [{"part": name, "forward_ms": statistics.median(f), "backward_ms": statistics.median(b)}
            for name, (f, b) in times.items()]


def frozen_step_ms(model: ViT, images: torch.Tensor, amp: torch.dtype | None, frozen_groups: int,
                   rounds: int) -> float:
    """Median ms of a whole step (forward, loss, backward) with the first ``frozen_groups`` of ``STAGE_GROUPS`` run
    under ``no_grad``: their activations are not kept and no gradient reaches them."""
    chain = parts(model)
    labels = torch.randint(0, 5, (len(images),))
    ms = []
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=amp) if amp else contextlib.nullcontext():
            x = images
            with torch.no_grad():
                for _, fn in chain[:frozen_groups]:
                    x = fn(x)
            for _, fn in chain[frozen_groups:]:
                x = fn(x)
            loss = nn.functional.cross_entropy(x.float(), labels)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if r:
            ms.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(ms)


def markdown(results: dict[str, dict], batch: int) -> str:
    lines = [f"Batch {batch} at 224 px, median ms ({machine()}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads).", ""]
    precisions = list(results)
    head = "| part | " + " | ".join(f"{p} fwd | {p} bwd | {p} share" for p in precisions) + " |"
    lines += [head, "|---|" + "---|---|---|" * len(precisions)]
    rows = {p: results[p]["parts"] for p in precisions}
    totals = {p: sum(r["forward_ms"] + r["backward_ms"] for r in rows[p]) for p in precisions}
    for i, part in enumerate(rows[precisions[0]]):
        cells = []
        for p in precisions:
            r = rows[p][i]
            cells.append(f"{r['forward_ms']:.0f} | {r['backward_ms']:.0f} | "
                         f"{(r['forward_ms'] + r['backward_ms']) / totals[p]:.0%}")
        lines.append(f"| {part['part']} | " + " | ".join(cells) + " |")
    lines.append("| **sum** | " + " | ".join(f"{totals[p]:.0f} (fwd+bwd) | | " for p in precisions) + " |")
    lines += ["", "| lower stages run frozen (no_grad) | " + " | ".join(f"{p} step ms | {p} speed-up"
                                                                          for p in precisions) + " |",
              "|---|" + "---|---|" * len(precisions)]
    for k, name in enumerate(["none (today)"] + [g[0] for g in STAGE_GROUPS]):
        cells = [f"{results[p]['frozen'][k]:.0f} | {results[p]['frozen'][0] / results[p]['frozen'][k]:.2f}x"
                 for p in precisions]
        lines.append(f"| {'through ' if k else ''}{name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precisions", default="bf16,fp32", help="comma-separated: bf16, fp32")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(0)
    model = default_model()
    images = torch.randn(args.batch, 3, PHOTO_DEFAULTS["image_size"], PHOTO_DEFAULTS["image_size"])
    results: dict[str, dict] = {}
    for p in args.precisions.split(","):
        amp = torch.bfloat16 if p == "bf16" else None
        log.info("%s: parts ...", p)
        results[p] = {"parts": time_parts(model, images, amp, args.rounds)}
        log.info("%s: whole steps, lower stages frozen ...", p)
        results[p]["frozen"] = [frozen_step_ms(model, images, amp, k, args.rounds)
                                for k in range(len(STAGE_GROUPS) + 1)]
    print(markdown(results, args.batch))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "batch": args.batch, "results": results}, indent=1))


if __name__ == "__main__":
    main()
