"""Errors that the commands report as one line naming the file. Torch-free, so that the ONNX Runtime path
(:mod:`vit_flowers.inference.onnx_runtime`) raises and catches the same ones as the PyTorch path."""

from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, read, trusted or used; the message names the file."""
