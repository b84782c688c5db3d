#!/usr/bin/env python
"""Speed of vit_flowers on a small CPU, against timm and torch.nn.Transformer, in one run.

    python benchmarks/speed.py --quick        # about a minute on 2 idle cores: every comparison, 3 rounds
    python benchmarks/speed.py                # about 5 minutes: 7 rounds, levers, torch.compile, process settings
    python benchmarks/speed.py --sections train,infer --shapes recipe --json /tmp/speed.json

What it measures (benchmarks/README.md has the latest figures):

1. training throughput (images/s; forward, backward and AdamW step) of ``vit_flowers.models.vit.ViT`` against
   timm's ``VisionTransformer`` of the same shape (patch size, dim, depth, heads, MLP ratio, drop path,
   batch, threads; linear patch embedding, as timm's), with the training loop's optimizer
   (``create_optimizer_v2(model, "adamw")``) and loss, at three shapes: "recipe" (configs/flowers5.yaml;
   its own patch embedding is timed too when it is not the linear one), "tiny64" (vit_tiny_cpu at 64 px,
   patch 8, batch 64) and "ti16" (ViT-Ti/16, 224 px, batch 32);
2. inference throughput of the same pairs (ours: eval + ``inference_mode``; timm: the better of
   eval + ``no_grad`` and eval + ``inference_mode``);
3. achieved GFLOP/s of the training step (FLOPs counted by ``FlopCounterMode``, forward + backward)
   against this machine's fp32 matmul peak (square matmuls, best size), measured in the same run;
4. ``inference.predictions.predict_images`` (the predict CLI's engine) end-to-end on the flowers5 JPEGs against
   model-only forward at the same batch size, with decode-only and no-decode rows to show where the gap
   is (skipped, with a note, when the folder is absent);
5. ``Seq2SeqTransformer`` against ``torch.nn.Transformer`` of the same shape (training step, inference);
6. ``hybrid``: the hybrid ViT of configs/flowers5-imagenet.yaml (EfficientNet-Lite0 stages as its patch
   embedding) against timm's whole ``tf_efficientnet_lite0`` at the same input size and batch, training step and
   batch-64 inference, in fp32 and bf16 autocast.

The full run adds the levers that are not the model's (fused AdamW, bf16 autocast, torch.compile with its
compile time, one thread, a larger batch), process settings timed in fresh processes (OpenMP wait policy,
one thread, glibc's malloc defaults against ``runtime.keep_freed_memory``, which the CLIs and this script
apply), and an A/A pair (timm against a second timm) that shows the noise of
the machine during the run.

Noise: the contenders of one comparison run in alternating rounds in one process (the order rotates every
round), so a busy neighbour slows all of them alike; figures are medians over rounds and a ratio is the
median of the per-round ratios. ``spread`` is (max - min) / median over one contender's rounds. When
another process keeps a core busy, libgomp's default spin-waiting makes every 2-thread figure several
times slower and erratic: run with ``OMP_WAIT_POLICY=PASSIVE`` (or ``--threads 1``) on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from harness import DEFAULT_DATA, ROOT, Contender, Report, alternate, forward_fn, machine, ratio
from timm.models.vision_transformer import VisionTransformer
from timm.optim import create_optimizer_v2
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vit_flowers.inference.runtime import keep_freed_memory
from vit_flowers.models.seq2seq import PositionalEncoding, Seq2SeqTransformer
from vit_flowers.models.vit import PRESETS, ViT

logger = logging.getLogger("speed")

RECIPE = ROOT / "configs" / "flowers5.yaml"
HYBRID = ROOT / "configs" / "flowers5-imagenet.yaml"
NUM_CLASSES = 5


@dataclass
class VitShape:
    """A ViT shape to time: the full ``ViT`` keyword arguments (linear patch embedding, so that timm can
    build the same model), the batch size, and the recipe's own patch embedding when it differs."""

    label: str
    vit: dict[str, Any]
    batch: int
    train_calls: int  # steps per round
    infer_calls: int  # forwards per round
    stem: str = "linear"


def vit_shapes() -> dict[str, VitShape]:
    """"recipe" follows configs/flowers5.yaml; "tiny64" is vit_tiny_cpu at its preset 64 px / patch 8 (the
    recipe of the speed issue); "ti16" is ViT-Ti/16 at 224 px."""
    from vit_flowers.training.config import load_config

    cfg = load_config(RECIPE, overrides={"data": str(DEFAULT_DATA)})  # only the model and batch are used
    kw = cfg.model_kwargs()
    stem = kw.pop("patch_embed", "linear")
    recipe = {**PRESETS[cfg.model.preset], **kw}
    label = (f"configs/flowers5.yaml: {cfg.model.preset}, {recipe['image_size']} px, patch {recipe['patch_size']}, "
             f"{stem} patch embedding, batch {cfg.optim.batch_size}")
    shapes = {
        "recipe": VitShape(label, recipe, cfg.optim.batch_size, 3, 8, stem),
        "tiny64": VitShape("vit_tiny_cpu preset: 64 px, patch 8, batch 64",
                           {**PRESETS["vit_tiny_cpu"], "drop_path": 0.1}, 64, 2, 6),
        "ti16": VitShape("ViT-Ti/16: 224 px, patch 16, batch 32", {**PRESETS["vit_ti16"], "drop_path": 0.1}, 32, 1, 2),
    }
    for shape in shapes.values():
        v = shape.vit
        shape.label += (f" (dim {v['dim']}, depth {v['depth']}, heads {v['heads']}, mlp {v['mlp_dim']}, "
                        f"drop_path {v.get('drop_path', 0.0)})")
    return shapes


VIT_SHAPES: dict[str, VitShape] = vit_shapes()


def _verdict(value: float, goal: float) -> str:
    return f">= {goal:g}: {'met' if value >= goal else 'NOT met'}"


# --------------------------------------------------------------------------- models
def our_vit(shape: str, **overrides: Any) -> ViT:
    return ViT(**{**VIT_SHAPES[shape].vit, "num_classes": NUM_CLASSES, **overrides})


def timm_vit(shape: str) -> VisionTransformer:
    """timm's VisionTransformer of the same shape (CLS token, token pooling, qkv bias, LayerNorm eps 1e-6)."""
    v = VIT_SHAPES[shape].vit
    dropout = v.get("dropout", 0.0)
    return VisionTransformer(
        img_size=v["image_size"], patch_size=v["patch_size"], num_classes=NUM_CLASSES, embed_dim=v["dim"],
        depth=v["depth"], num_heads=v["heads"], mlp_ratio=v["mlp_dim"] / v["dim"], proj_drop_rate=dropout,
        attn_drop_rate=dropout, drop_path_rate=v.get("drop_path", 0.0),
    )


def vit_batch(shape: str, batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    size = VIT_SHAPES[shape].vit["image_size"]
    batch = batch or VIT_SHAPES[shape].batch
    gen = torch.Generator().manual_seed(0)
    return torch.randn(batch, 3, size, size, generator=gen), torch.randint(0, NUM_CLASSES, (batch,), generator=gen)


def train_step(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *, fused: bool = False,
               bf16: bool = False, compile_model: bool = False) -> Callable[[], None]:
    """One optimisation step as in vit_flowers.train: timm's AdamW factory (no decay on norms, biases,
    positions), label-smoothed cross entropy, zero_grad(set_to_none), backward, step."""
    model.train()
    opt = create_optimizer_v2(model, "adamw", lr=1e-4, weight_decay=0.05, **({"fused": True} if fused else {}))
    net = torch.compile(model) if compile_model else model

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(net(images), labels, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def with_threads(fn: Callable[[], Any], threads: int) -> Callable[[], Any]:
    """``fn`` run with ``threads`` intra-op threads, the setting restored afterwards."""

    def run() -> Any:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)

    return run


def timed_first_calls(fn: Callable[[], Any], calls: int = 2) -> float:
    """Seconds for the first ``calls`` calls (compilation included for a compiled model)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - start


# --------------------------------------------------------------------------- sections
def bench_peak(args: argparse.Namespace, rep: Report) -> float:
    """fp32 (and, in the full run, bf16) square matmul GFLOP/s; the peak is the best size's median."""
    sizes = [512, 1024, 2048]
    gen = torch.Generator().manual_seed(0)
    cs: dict[str, Contender] = {}
    for n in sizes:
        a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
        calls = max(1, int(2e9 // (2 * n**3)))  # ~2 GFLOP a round
        cs[f"fp32 {n}"] = Contender(lambda a=a, b=b: a @ b, items=2 * n**3, calls=calls)
        if not args.quick:
            a16, b16 = a.bfloat16(), b.bfloat16()
            cs[f"bf16 {n}"] = Contender(lambda a=a16, b=b16: a @ b, items=2 * n**3, calls=calls * 4)
    alternate(cs, rounds=args.rounds)
    for name, c in cs.items():
        c.rates = [r / 1e9 for r in c.rates]
        rep.add("matmul peak", f"{name} x {name.split()[1]}", c, unit="GFLOP/s")
    peak = max(c.median for name, c in cs.items() if name.startswith("fp32"))
    rep.meta["fp32_peak_gflops"] = peak
    if not args.quick:
        rep.meta["bf16_peak_gflops"] = max(c.median for name, c in cs.items() if name.startswith("bf16"))
    return peak


def _vit_inputs(shape: str, train: bool) -> tuple[Any, torch.Tensor, torch.Tensor, int, int]:
    """(the shape's settings, images, labels, batch size, calls a round), with the seed reset."""
    cfg = VIT_SHAPES[shape]
    x, y = vit_batch(shape)
    torch.manual_seed(0)
    return cfg, x, y, cfg.batch, cfg.train_calls if train else cfg.infer_calls


def bench_vit_train(args: argparse.Namespace, rep: Report, shape: str) -> dict[str, Contender]:
    cfg, x, y, b, calls = _vit_inputs(shape, train=True)
    cs = {
        "ours": Contender(train_step(our_vit(shape), x, y), b, calls),
        "timm": Contender(train_step(timm_vit(shape), x, y), b, calls),
    }
    if cfg.stem != "linear":
        cs[f"ours, {cfg.stem} stem (the recipe)"] = Contender(
            train_step(our_vit(shape, patch_embed=cfg.stem), x, y), b, calls)
    if not args.quick and shape == "recipe":
        cs["timm (A/A twin)"] = Contender(train_step(timm_vit(shape), x, y), b, calls)
        cs["ours + fused AdamW"] = Contender(train_step(our_vit(shape), x, y, fused=True), b, calls)
        cs["ours + bf16 autocast"] = Contender(train_step(our_vit(shape), x, y, bf16=True), b, calls)
        cs["ours, 1 thread"] = Contender(with_threads(train_step(our_vit(shape), x, y), 1), b, calls)
        x2, y2 = vit_batch(shape, 2 * b)
        cs[f"ours, batch {2 * b}"] = Contender(train_step(our_vit(shape), x2, y2), 2 * b, max(1, calls // 2))
        if args.compile:
            fn = train_step(our_vit(shape), x, y, compile_model=True)
            seconds = timed_first_calls(fn)
            rep.note(f"torch.compile (inductor, default mode), training at the recipe shape: the first two steps "
                     f"took {seconds:.0f} s (compilation) before the timed rounds")
            cs["ours + torch.compile"] = Contender(fn, b, calls)
    alternate(cs, rounds=args.rounds, warmup=2 if shape != "ti16" else 1)
    section = f"train {shape}"
    for name, c in cs.items():
        extra: dict[str, Any] = {}
        if name == "ours":
            extra = dict(vs="timm", ratio=ratio(c, cs["timm"]), target=_verdict(ratio(c, cs["timm"]), 1.15))
        elif name != "timm":
            base = "timm" if name.startswith("timm") else "ours"
            extra = dict(vs=base, ratio=ratio(c, cs[base]))
        rep.add(section, name, c, **extra)
    return cs


def bench_vit_infer(args: argparse.Namespace, rep: Report, shape: str) -> dict[str, Contender]:
    cfg, x, _, b, calls = _vit_inputs(shape, train=False)
    ours, theirs = our_vit(shape), timm_vit(shape)
    cs = {
        "ours (inference_mode)": Contender(forward_fn(ours, x), b, calls),
        "timm (no_grad)": Contender(forward_fn(theirs, x, grad_mode="no_grad"), b, calls),
        "timm (inference_mode)": Contender(forward_fn(theirs, x), b, calls),
    }
    if cfg.stem != "linear":
        cs[f"ours, {cfg.stem} stem (the recipe)"] = Contender(forward_fn(our_vit(shape, patch_embed=cfg.stem), x), b,
                                                             calls)
    if not args.quick and shape == "recipe":
        cs["ours + bf16 autocast"] = Contender(forward_fn(our_vit(shape), x, bf16=True), b, calls)
        cs["ours, 1 thread"] = Contender(with_threads(forward_fn(ours, x), 1), b, calls)
        x4, _ = vit_batch(shape, 4 * b)
        cs[f"ours, batch {4 * b}"] = Contender(forward_fn(ours, x4), 4 * b, max(1, calls // 4))
        if args.compile:
            fn = forward_fn(our_vit(shape), x, compile_model=True)
            seconds = timed_first_calls(fn)
            rep.note(f"torch.compile, inference at the recipe shape: the first two calls took {seconds:.0f} s")
            cs["ours + torch.compile"] = Contender(fn, b, calls)
    alternate(cs, rounds=args.rounds, warmup=2)
    best_timm = max(("timm (no_grad)", "timm (inference_mode)"), key=lambda n: cs[n].median)
    section = f"infer {shape}"
    for name, c in cs.items():
        extra: dict[str, Any] = {}
        if name == "ours (inference_mode)":
            r = ratio(c, cs[best_timm])
            extra = dict(vs=best_timm, ratio=r, target=_verdict(r, 1.15))
        elif not name.startswith("timm"):
            extra = dict(vs="ours (inference_mode)", ratio=ratio(c, cs["ours (inference_mode)"]))
        rep.add(section, name, c, **extra)
    return cs


def _cpu_attention_flops() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode has formulas for the CUDA attention kernels but counts the CPU flash-attention kernels
    (forward and backward) as 0 FLOPs: give them the same formulas."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def forward(query, key, value, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def train_flops(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> int:
    """FLOPs of one forward + backward: matmuls, convolutions and attention (FlopCounterMode's formulas, with
    the CPU flash-attention kernels added, which it would count as 0)."""
    model.train()
    with FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops()) as counter:
        F.cross_entropy(model(images), labels).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def bench_mfu(rep: Report, peak: float, train: dict[str, dict[str, Contender]]) -> None:
    for shape, cs in train.items():
        x, y = vit_batch(shape)
        models = {"ours": our_vit(shape), "timm": timm_vit(shape)}
        stem = VIT_SHAPES[shape].stem
        if stem != "linear":
            models[f"ours, {stem} stem (the recipe)"] = our_vit(shape, patch_embed=stem)
        for name, model in models.items():
            flops = train_flops(model, x, y)
            gflops = flops / x.shape[0] * cs[name].median / 1e9
            extra: dict[str, Any] = dict(vs="fp32 matmul peak", ratio=gflops / peak)
            if name == "ours" and shape == "recipe":
                extra["target"] = _verdict(gflops / peak, 0.65)
            rep.add(f"MFU {shape}", f"{name}: {flops / 1e9:.1f} GFLOP/step (fwd+bwd)", unit="GFLOP/s",
                    value=f"{gflops:.0f} GFLOP/s", **extra)


def bench_predict(args: argparse.Namespace, rep: Report) -> None:
    from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD
    from vit_flowers.data.images import list_images
    from vit_flowers.inference.batches import iter_image_batches, predict_batch, predict_files

    if not args.data.is_dir():
        rep.note(f"predict: skipped, no photo folder at {args.data} (give --data)")
        return
    paths, _ = list_images(args.data)
    if not paths:
        rep.note(f"predict: skipped, no images under {args.data}")
        return
    paths = paths[:: max(1, len(paths) // 640)][:640] if args.quick else paths  # quick: 640 across the classes
    batch = 64
    recipe = VIT_SHAPES["recipe"]
    size = recipe.vit["image_size"]
    model = our_vit("recipe", patch_embed=recipe.stem).eval()
    kw = dict(image_size=size, mean=IMAGENET_MEAN, std=IMAGENET_STD, device="cpu", batch_size=batch)
    n = len(paths)

    try:  # the CLI's engine (python -m vit_flowers.predict): decode, model, top-k rows
        from vit_flowers.inference.predictions import predict_images
    except ImportError:  # (an older checkout: batches alone)
        predict_images = None
    classes = sorted({p.parent.name for p in paths})
    end_to_end = "predict.predict_images" if predict_images else "inference.predict_files"

    def predict_all() -> None:
        if predict_images is not None:
            for _ in predict_images(model, paths, classes, **kw):
                pass
        else:
            for _ in predict_files(model, paths, **kw):
                pass

    def decode_only() -> None:  # as predict decodes for a model on the CPU: each batch on all cores, no read-ahead
        for _ in iter_image_batches(paths, size, batch, read_ahead=False):
            pass

    uint8 = [b.images for b in iter_image_batches(paths, size, batch)]  # decoded once, kept in memory

    def from_memory() -> None:
        for images in uint8:
            predict_batch(model, images, IMAGENET_MEAN, IMAGENET_STD, "cpu")

    x = torch.randn(batch, 3, size, size)
    forward = forward_fn(model, x)
    steps = -(-n // batch)

    def model_only() -> None:
        for _ in range(steps):
            forward()

    cs = {
        f"{end_to_end} (decode + model)": Contender(predict_all, n),
        "model-only forward": Contender(model_only, steps * batch),
        "predict_batch on decoded uint8": Contender(from_memory, n),
        "decode only (iter_image_batches)": Contender(decode_only, n),
    }
    alternate(cs, rounds=args.rounds, warmup=1)
    section = f"predict {n} JPEGs, batch {batch}"
    for name, c in cs.items():
        extra: dict[str, Any] = {}
        if name != "model-only forward":
            r = ratio(c, cs["model-only forward"])
            extra = dict(vs="model-only forward", ratio=r)
            if name.startswith(end_to_end):
                extra["target"] = _verdict(r, 0.85)
        rep.add(section, name, c, **extra)
    rep.note(f"predict: the recipe's model ({recipe.label}; untrained weights, speed does not depend on them) on "
             f"{n} photos of {args.data}, vit_flowers.{end_to_end} with its default decode threads, top-3 rows")


class TorchSeq2Seq(nn.Module):
    """torch.nn.Transformer with our embeddings, positions and generator, without the final norms
    (our post-norm model has none), so only the layers differ."""

    def __init__(self, src_vocab: int, tgt_vocab: int, d_model: int, n_heads: int, layers: int, d_ff: int,
                 dropout: float, pad_idx: int = 0) -> None:
        super().__init__()
        self.d_model, self.pad_idx = d_model, pad_idx
        self.src_embed = nn.Embedding(src_vocab, d_model, padding_idx=pad_idx)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model, padding_idx=pad_idx)
        self.pos = PositionalEncoding(d_model, dropout)
        self.transformer = nn.Transformer(d_model, n_heads, layers, layers, d_ff, dropout, batch_first=True)
        self.transformer.encoder.norm = None
        self.transformer.decoder.norm = None
        self.generator = nn.Linear(d_model, tgt_vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        t = tgt.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).triu(1)  # True = blocked (torch's convention)
        scale = self.d_model**0.5
        out = self.transformer(
            self.pos(self.src_embed(src) * scale), self.pos(self.tgt_embed(tgt) * scale), tgt_mask=causal,
            src_key_padding_mask=src == self.pad_idx, tgt_key_padding_mask=tgt == self.pad_idx,
            memory_key_padding_mask=src == self.pad_idx, tgt_is_causal=True,
        )
        return self.generator(out)


def seq2seq_batch(batch: int, length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random (src, tgt_in, tgt_out) with lengths from length/2 to length, padded with 0."""
    gen = torch.Generator().manual_seed(0)

    def tokens() -> torch.Tensor:
        t = torch.randint(3, vocab, (batch, length), generator=gen)
        lengths = torch.randint(length // 2, length + 1, (batch,), generator=gen)
        return t.masked_fill(torch.arange(length)[None] >= lengths[:, None], 0)

    src, tgt = tokens(), tokens()
    return src, tgt[:, :-1], tgt[:, 1:]


def bench_seq2seq(args: argparse.Namespace, rep: Report) -> None:
    shape = dict(d_model=128, n_heads=8, layers=6, d_ff=512, dropout=0.1, vocab=1000, batch=64, length=32)
    src, tgt_in, tgt_out = seq2seq_batch(shape["batch"], shape["length"], shape["vocab"])
    torch.manual_seed(0)
    ours = Seq2SeqTransformer(src_vocab_size=shape["vocab"], tgt_vocab_size=shape["vocab"], d_model=shape["d_model"],
                              n_heads=shape["n_heads"], num_encoder_layers=shape["layers"],
                              num_decoder_layers=shape["layers"], d_ff=shape["d_ff"], dropout=shape["dropout"])
    theirs = TorchSeq2Seq(shape["vocab"], shape["vocab"], shape["d_model"], shape["n_heads"], shape["layers"],
                          shape["d_ff"], shape["dropout"])

    def step_fn(model: nn.Module) -> Callable[[], None]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> None:
            model.train()
            logits = model(src, tgt_in)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    def infer_fn(model: nn.Module) -> Callable[[], None]:
        def forward() -> None:
            model.eval()
            with torch.inference_mode():
                model(src, tgt_in)

        return forward

    label = (f"d_model {shape['d_model']}, {shape['n_heads']} heads, {shape['layers']}+{shape['layers']} layers, "
             f"d_ff {shape['d_ff']}, batch {shape['batch']} x {shape['length']} tokens")
    b = shape["batch"]
    for kind, make, calls in (("train", step_fn, 2), ("infer", infer_fn, 6)):
        cs = {"ours": Contender(make(ours), b, calls), "torch.nn.Transformer": Contender(make(theirs), b, calls)}
        alternate(cs, rounds=args.rounds, warmup=2)
        r = ratio(cs["ours"], cs["torch.nn.Transformer"])
        rep.add(f"seq2seq {kind}", "ours", cs["ours"], unit="seq/s", vs="torch.nn.Transformer", ratio=r,
                target=_verdict(r, 1.0))
        rep.add(f"seq2seq {kind}", "torch.nn.Transformer", cs["torch.nn.Transformer"], unit="seq/s")
    rep.note(f"seq2seq shape: {label}; the source and target lengths vary from 16 to 32 (padding masked)")


def bench_hybrid(args: argparse.Namespace, rep: Report) -> None:
    """The hybrid of configs/flowers5-imagenet.yaml against timm's tf_efficientnet_lite0 (what a timm user
    fine-tunes), the same input size and batch; random weights (speed does not depend on them)."""
    import timm

    from vit_flowers.models.vit import create_vit
    from vit_flowers.training.config import load_config

    cfg = load_config(HYBRID, overrides={"data": str(DEFAULT_DATA)})  # only the model and batch are used
    size, b = cfg.data.image_size, cfg.optim.batch_size
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(b, 3, size, size, generator=gen), torch.randint(0, NUM_CLASSES, (b,), generator=gen)

    def ours() -> nn.Module:
        return create_vit(cfg.model.preset, NUM_CLASSES, **cfg.model_kwargs())

    def lite0() -> nn.Module:
        return timm.create_model("tf_efficientnet_lite0", num_classes=NUM_CLASSES).to(memory_format=torch.channels_last)

    xl = x.contiguous(memory_format=torch.channels_last)
    from vit_flowers.precision import native_bf16_cpu

    precisions = (False,) if native_bf16_cpu() is False else (False, True)  # emulated bf16: 0.06x, hours of rounds
    for kind in ("train", "infer"):
        cs: dict[str, Contender] = {}
        for bf16 in precisions:
            tag = " + bf16 autocast" if bf16 else ""
            make = (lambda m, im, bf16=bf16: train_step(m, im, y, fused=True, bf16=bf16)) if kind == "train" else \
                (lambda m, im, bf16=bf16: forward_fn(m, im, bf16=bf16))
            cs[f"hybrid{tag}"] = Contender(make(ours(), x), b, 2 if kind == "train" else 4)
            cs[f"tf_efficientnet_lite0{tag}"] = Contender(make(lite0(), xl), b, 2 if kind == "train" else 4)
        alternate(cs, rounds=args.rounds, warmup=1)
        for name, c in cs.items():
            extra: dict[str, Any] = {}
            if name.startswith("hybrid"):
                twin = name.replace("hybrid", "tf_efficientnet_lite0")
                extra = dict(vs=twin, ratio=ratio(c, cs[twin]))
            rep.add(f"{kind} hybrid ({size} px, batch {b}, patch {cfg.model.patch_size})", name, c, **extra)


def run_worker(malloc: str, rounds: int = 3) -> dict[str, float]:
    """In a fresh process: recipe-shape inference of ours and timm (alternating, as a predict run meets
    it, before anything else has warmed the allocator), then ours' training; medians of img/s. ``malloc``:
    "keep" applies ``runtime.keep_freed_memory`` first, as the CLIs do; "glibc" leaves glibc's defaults."""
    if malloc == "keep":
        keep_freed_memory()
    x, y = vit_batch("recipe")
    cs = {"infer ours": Contender(forward_fn(our_vit("recipe"), x), x.shape[0], calls=6),
          "infer timm": Contender(forward_fn(timm_vit("recipe"), x), x.shape[0], calls=6)}
    alternate(cs, rounds=rounds, warmup=1)
    train = {"train ours": Contender(train_step(our_vit("recipe"), x, y), x.shape[0], calls=2)}
    alternate(train, rounds=rounds, warmup=2)
    return {name: c.median for name, c in {**cs, **train}.items()}


def bench_process(args: argparse.Namespace, rep: Report) -> None:
    """Process settings (OpenMP, glibc malloc) are read when the process starts: time each in fresh
    processes, alternating, at the recipe shape."""
    # name: (environment, the worker's malloc mode); the first is what the CLIs run with
    settings: dict[str, tuple[dict[str, str | None], str]] = {
        "as the CLIs run (keep_freed_memory, OpenMP default)": ({"OMP_WAIT_POLICY": None}, "keep"),
        "glibc malloc defaults": ({"OMP_WAIT_POLICY": None}, "glibc"),
        "OMP_WAIT_POLICY=PASSIVE": ({"OMP_WAIT_POLICY": "PASSIVE"}, "keep"),
        "OMP_NUM_THREADS=1": ({"OMP_WAIT_POLICY": None, "OMP_NUM_THREADS": "1"}, "keep"),
    }
    kinds = ("infer ours", "infer timm", "train ours")
    rates: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in kinds} for name in settings}
    names = list(settings)
    for r in range(min(args.rounds, 3)):  # a round is ~1 min with the default wait policy on a busy machine
        k = r % len(names)
        for name in names[k:] + names[:k]:
            env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
            variables, malloc = settings[name]
            for key, value in variables.items():
                if value is None:
                    env.pop(key, None)
                else:
                    env[key] = value
            if args.threads and "OMP_NUM_THREADS" not in variables:
                env["OMP_NUM_THREADS"] = str(args.threads)
            proc = subprocess.run([sys.executable, __file__, "--worker", malloc], env=env, capture_output=True,
                                  text=True, check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            for kind in kinds:
                rates[name][kind].append(result[kind])
    base = names[0]
    for kind in kinds:
        cs = {name: Contender(fn=lambda: None, items=0, rates=rates[name][kind]) for name in names}
        for name in names:
            extra: dict[str, Any] = {}
            if name != base:
                extra = dict(vs="as the CLIs run", ratio=ratio(cs[name], cs[base]))
            rep.add(f"process settings: {kind} (recipe)", name, cs[name], **extra)
    for name in names:
        ours = Contender(fn=lambda: None, items=0, rates=rates[name]["infer ours"])
        theirs = Contender(fn=lambda: None, items=0, rates=rates[name]["infer timm"])
        r = ratio(ours, theirs)
        rep.add("process settings: infer ours / timm, fresh process", name, unit="", value="", vs="timm",
                ratio=r, target=_verdict(r, 1.15))
    rep.note("process settings rows: each round starts one fresh process per setting (libgomp reads its "
             "settings at start-up), which times inference first, as a predict run meets it; the rest of this "
             f"benchmark runs in one process with OMP_WAIT_POLICY={rep.meta['omp_wait_policy']} and malloc "
             f"as the CLIs set it (keep_freed_memory: {rep.meta['keep_freed_memory']})")


# --------------------------------------------------------------------------- main
SECTIONS = ("peak", "train", "infer", "predict", "seq2seq", "hybrid", "process")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few rounds, no levers, no torch.compile (~1 minute)")
    p.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3 quick, 7 full)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's, = the cores)")
    p.add_argument("--sections", default=None,
                   help=f"comma-separated subset of {','.join(SECTIONS)} (default: all; --quick skips process)")
    p.add_argument("--worker", choices=("keep", "glibc"), help=argparse.SUPPRESS)
    p.add_argument("--shapes", default=",".join(VIT_SHAPES), help=f"ViT shapes, a subset of {','.join(VIT_SHAPES)}")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile (full run)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of photos for predict")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 7)
    default = [s for s in SECTIONS if not (args.quick and s == "process")]
    sections = [s.strip() for s in args.sections.split(",") if s.strip()] if args.sections else default
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        p.error(f"unknown --sections {unknown}; choose from {','.join(SECTIONS)}")
    args.sections = sections
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if set(args.shapes) - set(VIT_SHAPES):
        p.error(f"unknown --shapes {sorted(set(args.shapes) - set(VIT_SHAPES))}; choose from {','.join(VIT_SHAPES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")  # torch's encoder fast path
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(run_worker(args.worker)))
        return 0
    kept = keep_freed_memory()  # as the CLIs do (vit_flowers.inference.runtime)
    load = os.getloadavg()[0]
    if load >= 0.5 * (os.cpu_count() or 1):
        logger.warning("load average %.1f: other processes are busy, so the 2-thread figures will be noisy; with the "
                       "default OpenMP spin-waiting, much slower (OMP_WAIT_POLICY=PASSIVE or --threads 1 steady them)",
                       load)
    start = time.perf_counter()
    rep = Report(meta=dict(machine=machine(), command="python " + " ".join([sys.argv[0], *sys.argv[1:]]),
                           load_start=", ".join(f"{v:.1f}" for v in os.getloadavg()), quick=args.quick,
                           rounds=args.rounds, omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "(default)"),
                           keep_freed_memory="applied" if kept else "not applied (not glibc, or MALLOC_* set)"))
    peak = bench_peak(args, rep) if "peak" in args.sections or "train" in args.sections else None
    train: dict[str, dict[str, Contender]] = {}
    for shape in args.shapes:
        logger.info("ViT shape %s: %s", shape, VIT_SHAPES[shape].label)
        if "train" in args.sections:
            train[shape] = bench_vit_train(args, rep, shape)
        if "infer" in args.sections:
            bench_vit_infer(args, rep, shape)
    if train and peak:
        bench_mfu(rep, peak, train)
    if "predict" in args.sections:
        bench_predict(args, rep)
    if "seq2seq" in args.sections:
        bench_seq2seq(args, rep)
    if "hybrid" in args.sections:
        bench_hybrid(args, rep)
    if "process" in args.sections:
        bench_process(args, rep)
    rep.finish(start, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
