"""Reading a file that ``torch.save`` wrote, safely: ``torch.load(..., weights_only=True)``, so that loading never runs
code from the file, and a file that it cannot load reported in one line that says what the file is instead (a
pickle that would run code is refused as such; ONNX, a zip, a truncated file, ... are said to be no PyTorch
checkpoint). Torch's own message, with its advice to load the file unsafely, is never passed on.

It imports nothing from the package but :mod:`vit_flowers.runs.errors`: :mod:`vit_flowers.runs.checkpoint` (our
checkpoints) and :mod:`vit_flowers.training.pretrained` (anyone's weights files) both read through it.
"""

from __future__ import annotations

import pickle
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError

__all__ = ["read_torch_file"]

# how torch's weights-only unpickler names an object that the file wants imported (and could run)
_IMPORT = re.compile(r"GLOBAL ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?: |$)")
_ONNX_FIELDS = b"\x12\x1a\x22\x28\x32\x3a\x42\x72"  # ModelProto's fields 2-8 and 14: what follows ir_version


def read_torch_file(path: str | Path, map_location: str | torch.device = "cpu", what: str = "checkpoint") -> Any:
    """``torch.load(path, weights_only=True)``. A file that it refuses or cannot read raises CheckpointError with
    one line: "refusing to load" for a pickle that wants to import an object (which could run code), else "cannot
    read <what> <path>: " and what the file is instead. Torch's own message (with its advice to load the file
    unsafely) is never passed on."""
    path = Path(path)
    try:
        with warnings.catch_warnings():  # a pickle of protocol 3-5 (not torch.save's 2) gets a warning of its own
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a file that is not a checkpoint
        imported = _IMPORT.search(str(exc)) if isinstance(exc, pickle.UnpicklingError) else None
        if imported:
            raise CheckpointError(f"refusing to load {path}: it holds a Python object that is not a tensor or a plain "
                                  f"value ({imported.group(1)}), and loading it could run code. Only load checkpoints "
                                  f"you trust.") from None
        raise CheckpointError(f"cannot read {what} {path}: {_what_it_is(path, exc)}") from None


def _what_it_is(path: Path, exc: Exception) -> str:
    """What a file that torch could not load looks like instead of a PyTorch checkpoint (``exc``: torch's error)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as err:
        return f"it cannot be read ({err.strerror or err})"
    if not head:
        return "the file is empty"
    if head.startswith(b"PK\x03\x04"):
        return _what_zip_it_is(path)
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):  # a pickle's PROTO opcode
        return _what_pickle_it_is(head, exc)
    if path.suffix.lower() == ".onnx" or _is_onnx(head):
        return "it is an ONNX model, not a PyTorch checkpoint"
    if head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000:  # a JSON header of that length
        return "it is a safetensors file, not a PyTorch checkpoint"
    text = head.decode("utf-8", errors="ignore")  # UTF-8 but for up to 3 bytes: a character cut at byte 64
    if text and len(text.encode()) >= len(head) - 3 and all(c.isprintable() or c.isspace() for c in text):
        return "it is a text file, not a PyTorch checkpoint"
    return "it is not a PyTorch checkpoint (it starts like neither a zip archive nor a pickle)"


def _is_onnx(head: bytes) -> bool:
    """Whether a file that starts with ``head`` looks like an ONNX ModelProto: ir_version, then another field."""
    return len(head) > 2 and head[0] == 0x08 and 0 < head[1] < 0x80 and head[2] in _ONNX_FIELDS


def _what_pickle_it_is(head: bytes, exc: Exception) -> str:
    """What a pickle that torch could not load is: cut short, a damaged checkpoint of torch's old format, or
    another pickle."""
    if isinstance(exc, (EOFError, struct.error)) or "EOF" in str(exc) or "truncated" in str(exc):
        return "it is truncated (the pickle ends early)"
    if head.startswith(pickle.dumps(torch.serialization.MAGIC_NUMBER, protocol=2)):  # what the old format starts with
        return "it is damaged (a PyTorch file of the old format whose contents cannot be read)"
    return "it is a Python pickle, not a PyTorch checkpoint"


def _what_zip_it_is(path: Path) -> str:
    """What a zip archive that torch could not load is: truncated, someone else's, or a damaged checkpoint."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return "it is truncated (a zip archive whose end is missing)"
    if not any(name.endswith("data.pkl") for name in names):  # torch.save writes <name>/data.pkl
        return "it is a zip archive, not a PyTorch checkpoint"
    return "it is damaged (a PyTorch zip archive whose contents cannot be read)"
