#!/usr/bin/env python
"""ONNX Runtime against PyTorch on the recipe model's shape, in one run (benchmarks/README.md; earlier: HISTORY.md).

    python benchmarks/onnx_speed.py                                   # ~2 min on 2 idle cores (random weights)
    python benchmarks/onnx_speed.py --checkpoint /tmp/onnx-ck/f5/best.pt   # a trained run: accuracy rows too
    python benchmarks/onnx_speed.py --sections model,cold --rounds 7 --json /tmp/onnx.json

Sections:

1. ``model``: images/s at batch 1 and 64 of PyTorch eager fp32 (eval + inference_mode, as predict runs it),
   PyTorch bf16 autocast, ONNX Runtime fp32 and ONNX Runtime int8 (``export --int8``'s static quantization),
   in alternating rounds in one process (the order rotates every round); ratios are medians of the per-round
   ratios against PyTorch fp32.
2. ``accuracy`` (with ``--checkpoint`` of a run whose validation photos are found): the top-1 accuracy of each
   on those photos and on how many of them each gives PyTorch fp32's top-1.
3. ``predict``: ``python -m vit_flowers.predict FOLDER --recursive`` end to end on ``--data`` (the flowers5
   photos) with the .pt, the .onnx and the int8 .onnx, a fresh process each, alternating.
4. ``cold``: a one-photo ``predict`` in a fresh process (as a user or a script calls it): wall time and peak
   resident memory (GNU time's ``%M``), alternating, medians.

Without ``--checkpoint`` the model is ``create_vit("vit_tiny_cpu", 5, image_size=96, patch_size=16,
patch_embed="conv_deep")`` with random weights (speed does not depend on them), calibrated on synthetic flowers.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from harness import DEFAULT_DATA, Contender, Report, alternate, forward_fn, machine, ratio

from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD
from vit_flowers.data.image_files import list_images
from vit_flowers.data.synthetic import CLASSES
from vit_flowers.inference.onnx_export import (
    CALIBRATION_PHOTOS,
    CHECK_PHOTOS,
    accuracy,
    batched_logits,
    export_onnx,
    onnx_metadata,
    quantize_int8,
)
from vit_flowers.inference.onnx_runtime import load_onnx
from vit_flowers.inference.run_data import training_photos, validation_photos
from vit_flowers.inference.runtime import keep_freed_memory
from vit_flowers.models.vit import create_vit
from vit_flowers.runs import folders as runs
from vit_flowers.runs.checkpoint import load_model, make_checkpoint, save_checkpoint

logger = logging.getLogger("onnx_speed")
SECTIONS = ("model", "accuracy", "predict", "cold")
GNU_TIME = "/usr/bin/time"  # GNU time (apt-get install time): the peak memory of a fresh process


def prepare(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The PyTorch model, its checkpoint file, and model.onnx / model.int8.onnx exported from it into ``folder``."""
    if args.checkpoint:
        source = Path(args.checkpoint)
        model, ckpt = load_model(source)
    else:
        torch.manual_seed(0)
        model = create_vit("vit_tiny_cpu", len(CLASSES), image_size=96, patch_size=16, patch_embed="conv_deep").eval()
        source = folder / runs.BEST
        ckpt = make_checkpoint(model, classes=list(CLASSES), image_size=96, mean=list(IMAGENET_MEAN),
                               std=list(IMAGENET_STD), config={}, epoch=0, best_accuracy=0.0)
        save_checkpoint(ckpt, source)
    fp32 = export_onnx(model, onnx_metadata(ckpt, source))
    start = time.perf_counter()
    calibration = training_photos(ckpt, source.parent, CALIBRATION_PHOTOS)
    int8 = quantize_int8(fp32, calibration, ckpt, onnx_metadata(ckpt, source))
    logger.info("int8 quantization took %.1f s", time.perf_counter() - start)
    paths = {"pt": source, "onnx": folder / runs.ONNX, "int8": folder / runs.ONNX_INT8}
    paths["onnx"].write_bytes(fp32)
    paths["int8"].write_bytes(int8)
    return dict(model=model, ckpt=ckpt, paths=paths, fp32=load_onnx(paths["onnx"]), int8=load_onnx(paths["int8"]))


def _row(rep: Report, section: str, cs: dict[str, Contender], base: str, goals: dict[str, float]) -> None:
    for name, c in cs.items():
        extra: dict[str, Any] = {}
        if name != base:
            r = ratio(c, cs[base])
            extra = dict(vs=base, ratio=r)
            if name in goals:
                extra["target"] = f">= {goals[name]}x: {'met' if r >= goals[name] else 'NOT met'}"
        rep.add(section, name, c, **extra)


def bench_model(args: argparse.Namespace, rep: Report, m: dict[str, Any]) -> None:
    goals = {1: {"ONNX Runtime fp32": 1.5}, 64: {"ONNX Runtime fp32": 1.0, "ONNX Runtime int8": 2.5}}
    for batch, calls in ((1, 40), (64, 3)):
        size = m["ckpt"]["image_size"]
        x = torch.randn(batch, 3, size, size)
        xn = x.numpy()
        cs = {"PyTorch eager fp32": Contender(forward_fn(m["model"], x), batch, calls),
              "PyTorch bf16 autocast": Contender(forward_fn(m["model"], x, bf16=True), batch, calls),
              "ONNX Runtime fp32": Contender(lambda xn=xn: m["fp32"].logits(xn), batch, calls),
              "ONNX Runtime int8": Contender(lambda xn=xn: m["int8"].logits(xn), batch, calls)}
        alternate(cs, rounds=args.rounds, warmup=2)
        _row(rep, f"model, batch {batch}", cs, "PyTorch eager fp32", goals[batch])
        rep.add(f"model, batch {batch}", "ONNX Runtime int8 / PyTorch bf16", unit="", value="",
                vs="PyTorch bf16 autocast", ratio=ratio(cs["ONNX Runtime int8"], cs["PyTorch bf16 autocast"]))


def bench_accuracy(args: argparse.Namespace, rep: Report, m: dict[str, Any]) -> None:
    ckpt, source = m["ckpt"], m["paths"]["pt"]
    val = validation_photos(ckpt, source.parent, args.data_val, CHECK_PHOTOS)
    if val.source.startswith("synthetic"):
        rep.note("accuracy: skipped, the run's validation photos were not found")
        return
    model = m["model"]
    logits = {"PyTorch eager fp32": batched_logits(lambda x: model(x).float().numpy(), val, ckpt)}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits["PyTorch bf16 autocast"] = batched_logits(lambda x: model(x).float().numpy(), val, ckpt)
    logits["ONNX Runtime fp32"] = batched_logits(lambda x: m["fp32"].logits(x.numpy()), val, ckpt)
    logits["ONNX Runtime int8"] = batched_logits(lambda x: m["int8"].logits(x.numpy()), val, ckpt)
    top1 = {name: lg.argmax(1) for name, lg in logits.items()}
    base = top1["PyTorch eager fp32"]
    base_acc = accuracy(logits["PyTorch eager fp32"], val.labels)
    for name, pred in top1.items():
        acc = accuracy(logits[name], val.labels)
        same = int((pred == base).sum())
        target = ""
        if name == "ONNX Runtime fp32":
            target = f"same top-1 on every photo: {'met' if same == len(base) else 'NOT met'}"
        elif name == "ONNX Runtime int8":
            target = f"<= 0.5 points lost: {'met' if acc >= base_acc - 0.005 else 'NOT met'}"
        rep.add(f"accuracy, {len(base)} photos ({val.source})", name, unit="", vs="PyTorch eager fp32",
                value=f"{100 * acc:.2f}% ({100 * (acc - base_acc):+.2f} points); same top-1 on {same}",
                target=target)


def _run(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of a fresh process running ``cmd``, started by GNU time: a child forked
    from this big process would start with its resident size (``ru_maxrss`` counts the pages of the fork)."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as report:
        start = time.perf_counter()
        proc = subprocess.run([GNU_TIME, "-f", "%M", "-o", report.name, *cmd], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
        return seconds, int(report.read().split()[-1]) / 1024  # KiB


def _alternate_processes(commands: dict[str, list[str]], rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in commands}
    names = list(commands)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seconds, mb = _run(commands[name])
            out[name][0].append(seconds)
            out[name][1].append(mb)
    return out


def _predict_cmd(m: dict[str, Any], kind: str, *inputs: str) -> list[str]:
    return [sys.executable, "-m", "vit_flowers.predict", *inputs, "--checkpoint", str(m["paths"][kind])]


def bench_predict(args: argparse.Namespace, rep: Report, m: dict[str, Any], folder: Path) -> None:
    """The predict CLI on the whole folder: the .pt as a user runs it (--precision auto: bf16 where the probe finds
    it faster) and in fp32, the .onnx and the int8 .onnx; labels compared with the fp32 .pt's."""
    if not args.data.is_dir():
        rep.note(f"predict: skipped, no photo folder at {args.data}")
        return
    n = len(list_images(args.data)[0])
    variants = {".pt (default --precision auto)": ("pt", []), ".pt --precision fp32": ("pt", ["--precision", "fp32"]),
                ".onnx": ("onnx", []), ".int8.onnx": ("int8", [])}
    outs = {name: folder / f"predict-{i}.csv" for i, name in enumerate(variants)}
    commands = {name: _predict_cmd(m, kind, str(args.data), "--recursive", "--quiet", "--output", str(outs[name]),
                                   *extra) for name, (kind, extra) in variants.items()}
    runs = _alternate_processes(commands, max(1, min(args.rounds, 3)))
    labels = {}
    for name, out in outs.items():
        with open(out, newline="") as f:
            labels[name] = [row["label"] for row in csv.DictReader(f)]
    cs = {name: Contender(lambda: None, n, rates=[n / s for s in runs[name][0]]) for name in runs}
    base, fp32 = list(variants)[:2]
    for name, c in cs.items():
        same = sum(a == b for a, b in zip(labels[name], labels[fp32]))
        extra = dict(vs=base, ratio=ratio(c, cs[base])) if name != base else {}
        rep.add(f"predict {n} photos end to end, fresh process", f"--checkpoint {name}", c,
                target=f"same label as the fp32 .pt on {same} of {len(labels[fp32])}", **extra)


def bench_cold(args: argparse.Namespace, rep: Report, m: dict[str, Any], photo: Path) -> None:
    commands = {kind: _predict_cmd(m, kind, str(photo)) for kind in m["paths"]}
    runs = _alternate_processes(commands, args.rounds)
    for kind, (seconds, mb) in runs.items():
        s, peak = statistics.median(seconds), statistics.median(mb)
        target = f"<= 1 s and 300 MB: {'met' if s <= 1 and peak <= 300 else 'NOT met'}" if kind == "onnx" else ""
        rep.add("cold one-photo predict (new process)", f"--checkpoint {m['paths'][kind].name}", unit="",
                value=f"{s:.2f} s (min {min(seconds):.2f}), peak RSS {peak:.0f} MB", target=target)


def _one_photo(args: argparse.Namespace, folder: Path) -> Path:
    from vit_flowers.inference.onnx_runtime import decode_image

    photos = sorted(args.data.rglob("*.jpg")) if args.data.is_dir() else []
    readable = next((p for p in photos if not isinstance(decode_image(p, 96), str)), None)
    if readable is not None:
        return readable
    from PIL import Image

    from vit_flowers.data.synthetic import make_synthetic_flowers

    images, _ = make_synthetic_flowers(1, 128, seed=1)
    Image.fromarray(images[0].permute(1, 2, 0).numpy()).save(folder / "flower.jpg")
    return folder / "flower.jpg"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="a trained checkpoint (default: random weights of the recipe's shape)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of photos for predict and cold")
    p.add_argument("--data-val", default=None, help="validation folder for accuracy (default: the run's split)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default: %(default)s)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {','.join(SECTIONS)}")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if set(args.sections) - set(SECTIONS):
        p.error(f"unknown --sections {sorted(set(args.sections) - set(SECTIONS))}; choose from {SECTIONS}")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    keep_freed_memory()  # as the CLIs do
    start = time.perf_counter()
    rep = Report(meta=dict(machine=machine(), command="python " + " ".join([sys.argv[0], *sys.argv[1:]]),
                           load_start=", ".join(f"{v:.1f}" for v in os.getloadavg()), rounds=args.rounds))
    steps: dict[str, Callable[[dict[str, Any], Path], None]] = {
        "model": lambda m, f: bench_model(args, rep, m),
        "accuracy": lambda m, f: bench_accuracy(args, rep, m) if args.checkpoint else rep.note(
            "accuracy: skipped (random weights; give --checkpoint)"),
        "predict": lambda m, f: bench_predict(args, rep, m, f),
        "cold": lambda m, f: bench_cold(args, rep, m, _one_photo(args, f)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        m = prepare(args, Path(tmp))
        for section in args.sections:
            steps[section](m, Path(tmp))
    rep.finish(start, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
