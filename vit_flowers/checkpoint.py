"""Checkpoints: atomic writes, safe loads, and rebuilding a model from one.

A checkpoint is a plain dict of tensors and Python values, loaded with
``torch.load(..., weights_only=True)``: loading never runs code from the file. A file that it cannot load is
reported in one line that says what it is (:func:`read_torch_file`): a pickle that would run code is refused as
such; anything else (ONNX, not a zip, truncated, ...) is said to be no PyTorch checkpoint.

Its keys are laid out by :func:`make_checkpoint`, the one place that builds them (training, pretraining
and the tests all call it); :func:`load_checkpoint` checks them.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import struct
import uuid
import warnings
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

import torch

from . import runs
from .errors import CheckpointError  # (torch-free: the ONNX Runtime path raises it too)
from .models.vit import ViT

__all__ = [
    "FORMAT",
    "CheckpointError",
    "atomic_write",
    "atomic_write_text",
    "save_checkpoint",
    "read_torch_file",
    "load_checkpoint",
    "make_checkpoint",
    "model_from_checkpoint",
    "load_model",
    "resolve_checkpoint",
    "latest_run",
    "mark_latest",
]

log = logging.getLogger(__name__)
FORMAT = "vit_flowers/1"
REQUIRED = ("format", "model", "model_config", "classes", "image_size", "mean", "std")
# how torch's weights-only unpickler names an object that the file wants imported (and could run)
_IMPORT = re.compile(r"GLOBAL ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?: |$)")
_ONNX_FIELDS = b"\x12\x1a\x22\x28\x32\x3a\x42\x72"  # ModelProto's fields 2-8 and 14: what follows ir_version


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a file atomically: ``write(f)`` into a temporary file in the same folder,
    fsync, then rename over ``path``. A crash or a full disk leaves the previous file
    at ``path`` untouched and no temporary file behind; the temporary files of processes
    that were killed while writing (``kill -9``) are removed by the next successful write.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        f = open(tmp, "xb")  # honours the umask, unlike mkstemp's 0600
    except OSError as exc:
        raise CheckpointError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot write {path}: {exc.strerror or exc}; "
                                  f"the previous file (if any) is unchanged") from exc
        raise
    _fsync_dir(path.parent)
    _remove_orphaned_temporaries(path.parent)


def _remove_orphaned_temporaries(folder: Path) -> None:
    """Delete ``.<name>.<pid>.<hex>.tmp`` files (see :func:`atomic_write`) whose writer no longer runs."""
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows
        return
    for tmp in folder.glob(".*.tmp"):
        parts = tmp.name.rsplit(".", 3)  # ['.<name>', '<pid>', '<hex>', 'tmp']
        if len(parts) != 4 or not parts[1].isdigit() or len(parts[2]) != 8 or int(parts[1]) == os.getpid():
            continue
        try:
            os.kill(int(parts[1]), 0)  # signal 0: only asks whether the process exists
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
            log.debug("removed %s, left by a process that died while writing it", tmp)
        except OSError:  # PermissionError: it exists (another user's process)
            pass


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` through :func:`atomic_write`."""
    atomic_write(path, lambda f: torch.save(state, f))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_checkpoint(
    model: ViT,
    *,
    classes: list[str],
    image_size: int,
    mean: list[float],
    std: list[float],
    config: dict[str, Any],
    epoch: int,
    best_accuracy: float,
    weights: dict[str, torch.Tensor] | None = None,
    weights_kind: str = "raw",
    train_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A checkpoint of ``model``, as :func:`save_checkpoint` writes it and :func:`load_model` reads it back.

    Keys: ``format``; ``model`` (the weights to evaluate: ``weights``, e.g. the EMA's, else the model's own) and
    ``weights`` ("raw" or "ema"); ``model_config`` (``ViT(**model_config)`` rebuilds the architecture);
    ``classes``, ``image_size``, ``mean``, ``std`` (what prediction needs); ``epoch``, ``best_accuracy`` and
    ``config`` (the training configuration as a dict); with ``train_state`` (``last.pt`` only) what
    ``--resume`` needs: raw weights, optimizer, scheduler, EMA, history.
    """
    state = {"format": FORMAT, "model": weights if weights is not None else model.state_dict(),
             "weights": weights_kind, "model_config": dict(model.config), "classes": list(classes),
             "image_size": image_size, "mean": list(mean), "std": list(std), "config": dict(config),
             "epoch": epoch, "best_accuracy": best_accuracy}
    if train_state is not None:
        state["train_state"] = train_state
    return state


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


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint safely (:func:`read_torch_file`) and check that it is one of ours."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    state = read_torch_file(path, map_location)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path} is not a vit_flowers checkpoint (format {found!r}, expected {FORMAT!r})")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"{path} is incomplete: missing {', '.join(missing)}")
    return state


def model_from_checkpoint(state: dict[str, Any], path: str | Path = "checkpoint") -> ViT:
    """Rebuild the ViT stored in a loaded checkpoint and load its weights."""
    try:
        model = ViT(**state["model_config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: its model_config cannot build a ViT: {exc}") from None
    if model.num_classes != len(state["classes"]):
        raise CheckpointError(f"{path}: the head has {model.num_classes} outputs but the checkpoint lists "
                              f"{len(state['classes'])} classes")
    try:
        result = model.load_state_dict(state["model"], strict=False)
    except RuntimeError as exc:  # size mismatch
        reason = str(exc).splitlines()[-1].strip()
        raise CheckpointError(f"{path}: weights do not fit its model_config: {reason}") from None
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"{path}: weights do not match the model (missing {result.missing_keys[:3]}, "
                              f"unexpected {result.unexpected_keys[:3]})")
    return model


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[ViT, dict[str, Any]]:
    """(model in eval mode on ``device``, the checkpoint dict) from a checkpoint file."""
    state = load_checkpoint(path)
    return model_from_checkpoint(state, path).to(device).eval(), state


def latest_run(out_dir: str | Path = "checkpoints") -> Path | None:
    """The newest run folder under ``out_dir`` (the ``latest`` link, else the newest with a checkpoint)."""
    out_dir = Path(out_dir)
    link = out_dir / runs.LATEST
    if link.is_dir():
        return link.resolve()
    found = {p.parent for name in (runs.LAST, runs.BEST) for p in out_dir.glob(f"*/{name}")}
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def mark_latest(run_dir: Path) -> None:
    """Point ``<out_dir>/latest`` at ``run_dir`` (a relative symlink, swapped atomically)."""
    link = run_dir.parent / runs.LATEST
    tmp = run_dir.parent / f".{runs.LATEST}.{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(run_dir.name, target_is_directory=True)
        os.replace(tmp, link)
    except OSError as exc:  # e.g. no symlinks on this file system: latest_run() falls back to mtimes
        log.debug("could not mark %s as latest: %s", run_dir, exc)


def resolve_checkpoint(path: str | Path | None, out_dir: str | Path = "checkpoints", name: str = runs.BEST) -> Path:
    """A checkpoint file from a file, a run folder, or nothing (the newest run's ``name``)."""
    if path is None:
        run = latest_run(out_dir)
        if run is None:
            raise CheckpointError(f"no trained run found in {out_dir}/: train one with `python -m vit_flowers.train`, "
                                  f"or pass --checkpoint PATH")
        path = run
    path = Path(path)
    if path.is_dir():
        for candidate in (name, runs.BEST, runs.LAST):
            if (path / candidate).is_file():
                return path / candidate
        raise CheckpointError(f"no checkpoint ({name}) in {path}")
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    return path
