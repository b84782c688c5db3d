"""Numeric precision: fp32, or bf16 autocast where it is faster on this machine.

Whether bf16 pays on a CPU depends on the chip: with native bf16 matrix units (Intel AMX, AMD's
AVX512-BF16) autocast runs a step of our models much faster than fp32; without them bf16 is emulated and
slower. CPU names do not tell reliably, so ``precision: auto`` times a few steps of the actual model at the
actual batch shape in both precisions and keeps bf16 only when it is clearly faster. Two things keep that probe
from costing minutes where bf16 cannot pay: an x86 CPU whose flags list no bf16 instructions (AVX2 laptops, and
AVX-512 without BF16) stays fp32 without it; and the probe stops after its first bf16 step when that step
alone took several fp32 steps' time (emulated bf16 ran at 0.06x of fp32 on an AVX2 EPYC). CUDA GPUs use bf16
where they support it; Apple MPS stays fp32. Weights, optimizer state and checkpoints are fp32 whatever
the choice: autocast only changes the arithmetic of matrix products and convolutions.

A probe's verdict is kept per machine and model shape (:func:`probe_key`) in the user's cache folder
(:mod:`vit_flowers.inference.precision_cache`): the first run on a machine times it (~30 s for the default
hybrid's training step), later runs read it back in milliseconds.
"""

from __future__ import annotations

import copy
import logging
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import PRECISIONS, precision_cache
from .loaded import LoadedModel

__all__ = ["PRECISIONS", "MIN_SPEEDUP", "CPU_BF16_FLAGS", "autocast", "autocast_dtype", "bf16_speedup", "dtype_name",
           "inference_dtype", "machine", "native_bf16_cpu", "parse_dtype", "probe_key"]

log = logging.getLogger(__name__)

MIN_SPEEDUP = 1.15  # bf16 must run at least this many times the speed of fp32 for "auto" to pick it
GIVE_UP_SLOWDOWN = 3.0  # a first bf16 step this many times slower than the first fp32 one ends the probe: no
#                         warm-up makes up for that (first steps of both pay the same one-off costs)


def autocast(device: torch.device, amp_dtype: torch.dtype | None) -> torch.autocast:
    """``torch.autocast`` to ``amp_dtype`` on ``device``, or a disabled one for plain fp32 (``amp_dtype`` None)."""
    return torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None)


def dtype_name(amp_dtype: torch.dtype | None) -> str:
    """"bf16" or "fp32": how a choice is logged and stored in a checkpoint."""
    return "bf16" if amp_dtype == torch.bfloat16 else "fp32"


def parse_dtype(name: str) -> torch.dtype | None:
    """The inverse of :func:`dtype_name`."""
    if name not in ("bf16", "fp32"):
        raise ValueError(f"precision must be bf16 or fp32, got {name!r}")
    return torch.bfloat16 if name == "bf16" else None


def _alternating_medians(steps: list[Callable[[], object]], repeats: int,
                         give_up: float = GIVE_UP_SLOWDOWN) -> list[float]:
    """The median seconds of each step, timed in alternating rounds after one warm-up call of each (first-call
    allocations and kernel selection): a machine that speeds up or slows down while it runs slows them alike.
    When a warm-up call takes over ``give_up`` times the first one's, only the warm-up times come back: that
    step cannot win, and timing it again would cost minutes on a CPU that emulates it."""
    warm: list[float] = []
    for step in steps:
        start = time.perf_counter()
        step()
        warm.append(time.perf_counter() - start)
        if warm[-1] > give_up * warm[0]:
            return warm + [float("inf")] * (len(steps) - len(warm))
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(repeats):
        for step, seconds in zip(steps, times):
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
    return [statistics.median(seconds) for seconds in times]


def bf16_speedup(model: nn.Module, example: torch.Tensor, *, train: bool, repeats: int = 3) -> float:
    """How many times the speed of fp32 a bf16-autocast step of ``model`` on ``example`` runs on its device.

    ``train``: a forward + backward step in train mode (on a copy, so the model's weights, gradients and
    BatchNorm statistics stay untouched); otherwise a forward pass without autograd, in the model's own mode
    (evaluate and predict probe their eval-mode model as it will run). The global RNG state
    is restored afterwards, so a seeded run draws the same numbers with or without the probe.
    """
    device = example.device
    probe = copy.deepcopy(model).train() if train else model  # a forward without autograd changes nothing

    def step(amp_dtype: torch.dtype | None) -> Callable[[], object]:
        def run() -> object:
            with autocast(device, amp_dtype), torch.set_grad_enabled(train):
                out = probe(example)
                out = out[0] if isinstance(out, tuple) else out
                if train:
                    out.float().sum().backward()
                    probe.zero_grad(set_to_none=True)
            return out
        return run

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        fp32, bf16 = _alternating_medians([step(None), step(torch.bfloat16)], repeats)
    return fp32 / max(bf16, 1e-9)


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's names of the native bf16 instructions (x86)


def _cpuinfo(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, list[str]] | None:
    """(the CPU's model name, its flags) from ``cpuinfo``; None where that cannot be read (another system)."""
    name, flags = "", None
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags" and flags is None:
                    flags = value.split()
    except OSError:
        return None
    return None if flags is None else (name, flags)


def native_bf16_cpu(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Whether this x86 Linux CPU has native bf16 instructions (:data:`CPU_BF16_FLAGS`); None where that cannot be
    read (another system or architecture: ARM's bf16 is not listed there), so that the probe decides."""
    found = _cpuinfo(cpuinfo)
    return None if found is None else any(flag in found[1] for flag in CPU_BF16_FLAGS)


def machine(device: torch.device) -> dict[str, Any]:
    """What a probe's verdict depends on about this machine: the processor's name and bf16 flags, torch, the
    device type and the number of threads (:mod:`vit_flowers.inference.precision_cache`)."""
    name, flags = _cpuinfo() or (platform.processor() or platform.machine(), [])
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    return {"cpu": name, "bf16_flags": [flag for flag in CPU_BF16_FLAGS if flag in flags],
            "torch": torch.__version__, "device": device.type, "threads": torch.get_num_threads()}


def probe_key(model: nn.Module, example: torch.Tensor, *, train: bool) -> dict[str, Any]:
    """What :func:`bf16_speedup` of ``model`` on ``example`` depends on, the machine's part (:func:`machine`)
    included: the key of its cached verdict. The model's shape is its ``config`` (a ViT's) less the class count
    (which moves nothing measurable), or its class and size; a training step's also how many of its parameters are
    frozen (a frozen part has no backward to time)."""
    config = getattr(model, "config", None)
    shape = ({k: v for k, v in config.items() if k != "num_classes"} if isinstance(config, dict)
             else {"class": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters())})
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad) if train else 0
    return {**machine(example.device), "step": "train" if train else "forward", "model": shape, "frozen": frozen,
            "batch": list(example.shape)}


def autocast_dtype(precision: str, device: torch.device, probe: Callable[[], float] | None = None,
                   what: str = "a step", key: dict[str, Any] | None = None,
                   fresh: bool = False) -> torch.dtype | None:
    """The autocast dtype for ``precision`` on ``device``: ``torch.bfloat16``, or None for plain fp32.

    ``"auto"`` on a CPU picks bf16 when ``probe()`` (e.g. :func:`bf16_speedup` of the model about to run) returns
    at least :data:`MIN_SPEEDUP`; without a probe it stays fp32. With ``key`` (:func:`probe_key`) the verdict is
    kept in this user's cache (:mod:`vit_flowers.inference.precision_cache`) and read back instead of probing
    again, unless ``fresh``. The measurement and the choice are logged.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if precision == "fp32" or device.type == "mps":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if probe is None or device.type != "cpu":
        return None
    if native_bf16_cpu() is False:  # emulated bf16: an AVX2 EPYC's hybrid step ran 0.07x, its probe took 5 minutes
        log.info("precision auto: this CPU has no bf16 instructions (%s) -> fp32, without timing bf16",
                 " / ".join(CPU_BF16_FLAGS))
        return None
    return _verdict(probe, what, key, fresh)


def _choice(speedup: float) -> torch.dtype | None:
    return torch.bfloat16 if speedup >= MIN_SPEEDUP else None


def _verdict(probe: Callable[[], float], what: str, key: dict[str, Any] | None, fresh: bool) -> torch.dtype | None:
    """:func:`autocast_dtype`'s "auto" on a CPU with bf16 instructions: the cached verdict of ``key`` (unless
    ``fresh``), else ``probe()``'s, then kept under ``key``."""
    stored = precision_cache.lookup(key) if key is not None and not fresh else None
    if stored is not None:
        choice = _choice(float(stored["speedup"]))
        log.info("precision auto: a bf16 autocast %s ran %.2fx the speed of fp32 on this machine (measured %s, "
                 "kept in %s; --precision-probe fresh, or deleting that file, times it again) -> %s", what,
                 stored["speedup"], stored.get("measured", "earlier"), precision_cache.cache_file(),
                 dtype_name(choice))
        return choice
    start = time.perf_counter()
    speedup = probe()
    choice = _choice(speedup)
    log.info("precision auto: a bf16 autocast %s ran %.2fx the speed of fp32 on this CPU -> %s%s (the probe took "
             "%.1f s)", what, speedup, dtype_name(choice), "" if choice else f" (bf16 needs >= {MIN_SPEEDUP:g}x)",
             time.perf_counter() - start)
    if key is not None:
        precision_cache.store(key, speedup)
    return choice


def inference_dtype(loaded: LoadedModel, num_images: int, *, precision: str, batch_size: int) -> torch.dtype | None:
    """The autocast dtype for running ``loaded`` on ``num_images`` images in batches of ``batch_size`` under
    ``precision`` (``--precision``: "auto", "fp32" or "bf16").

    "auto" probes only when there are more than four batches to run: below that the probe (a few batches
    in each precision) would cost more than bf16 can save.
    """
    size = loaded.ckpt["image_size"]
    if precision == "auto" and num_images <= 4 * batch_size:
        return None
    example = torch.zeros(min(batch_size, max(num_images, 1)), 3, size, size, device=loaded.device)
    return autocast_dtype(precision, loaded.device, lambda: bf16_speedup(loaded.model, example, train=False),
                          what="forward pass", key=probe_key(loaded.model, example, train=False))
