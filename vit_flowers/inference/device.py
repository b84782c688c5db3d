"""Which device a command runs on: a GPU where the user has one (CUDA, then Apple MPS), else the CPU."""

from __future__ import annotations

import torch

__all__ = ["pick_device"]


def pick_device(name: str = "auto") -> torch.device:
    """``"auto"``: CUDA, then Apple MPS, then CPU. Any other name is checked and returned as a device."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {name!r} requested but Apple MPS is not available here; use --device cpu")
    return device
