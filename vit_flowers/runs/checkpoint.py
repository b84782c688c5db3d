"""Checkpoints: their layout (:class:`Checkpoint`, versioned, with a migration of older files), atomic writes, safe
loads, and rebuilding a model from one.

A checkpoint is a plain dict of tensors and Python values, loaded with ``torch.load(..., weights_only=True)``:
loading never runs code from the file. A file that it cannot load is reported in one line that says what it is
(:func:`vit_flowers.runs.torch_files.read_torch_file`): a pickle that would run code is refused as such; anything else
(ONNX, not a zip, truncated, ...) is said to be no PyTorch checkpoint. :func:`save_safetensors` writes a model's
weights for ``train --pretrained``.

Its keys are those of :class:`Checkpoint` (a ``TypedDict``: the file stays a plain dict), built by
:func:`make_checkpoint`, the one place that lays them out (training and the tests call it); :func:`load_checkpoint`
checks them and brings a file of an older format (``format`` ``vit_flowers/1`` or ``/2``) up to today's
(:data:`FORMAT`): :func:`migrate`.
"""

from __future__ import annotations

import io
import json
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypedDict, cast

import torch

from ..models.taught import build_vit, moved_keys
from ..models.vit import ViT
from . import folders as runs
from .errors import CheckpointError  # (torch-free: the ONNX Runtime path raises it too)
from .folders import mark_latest  # (here too, as the callers of latest_run import it)
from .torch_files import read_torch_file

__all__ = [
    "FORMAT",
    "PREFIX",
    "VERSION",
    "ClassMeans",
    "TeachSample",
    "Taught",
    "TaughtEstimate",
    "UnknownState",
    "ModelFacts",
    "Checkpoint",
    "CheckpointError",
    "atomic_write",
    "atomic_write_text",
    "save_checkpoint",
    "save_safetensors",
    "load_checkpoint",
    "make_checkpoint",
    "migrate",
    "model_from_checkpoint",
    "kept_weights",
    "load_model",
    "resolve_checkpoint",
    "latest_run",
    "mark_latest",
]

log = logging.getLogger(__name__)
PREFIX = "vit_flowers/"  # a checkpoint's ``format`` is PREFIX + its version
VERSION = 3  # the version of the layout below, which this code writes; it reads 1 to VERSION
FORMAT = f"{PREFIX}{VERSION}"
SAFETENSORS_FORMAT = f"{PREFIX}1"  # the ``format`` metadata of save_safetensors' files (weights and model_config)


class ClassMeans(TypedDict):
    """A checkpoint's ``class_means``: how many of the run's training photos (up to 200 a class and 1,000 in all;
    before #53, up to 4,000 in all) each class's means are taken over
    (:func:`vit_flowers.inference.calibration.class_counts`): the weight of the unknown rule's class means when
    ``teach`` adds photos to a class. (Format 2 kept the CLS token's means here too, which nothing read.)"""

    counts: list[int]  # the photos each class's mean is taken over


class _TeachFeatures(TypedDict):
    """What every ``teach_sample`` holds (:class:`TeachSample`)."""

    head_input: str  # what the features are (a ViT's head_input, e.g. "cls+patches")
    # (n, d) float16: up to 200 training photos a class (1,000 in all), and (2n) their mirror images for a model that
    # is not a hybrid (a hybrid trained end to end before #53 kept them too; format 2 held, for a hybrid that ended
    # on its head start, a copy of the trunk row as the mirror, dropped on load)
    features: torch.Tensor
    labels: torch.Tensor  # (n or 2n,) int64 class numbers, row for row


class TeachSample(_TeachFeatures, total=False):  # total=False: NotRequired is Python 3.11's
    """A checkpoint's ``teach_sample``: the features ``teach`` refits a head on
    (:func:`vit_flowers.inference.calibration.teach_sample`)."""

    # (n, C_trunk) float16: a hybrid's pooled trunk output of the same photos, what a taught class's gate is fitted
    # on (vit_flowers.teaching.gate); absent for other models and for runs trained before 2026-12-06
    trunk: torch.Tensor


class TaughtEstimate(TypedDict):
    """How well a taught class will be recognised, measured before the user relies on it: each of the photos given
    predicted by the new run's classifier fitted without it (a k-fold over them, :mod:`vit_flowers.teaching.estimate`,
    which also says the range from ``correct`` and ``photos``)."""

    name: str  # the taught class
    photos: int  # the photos it was taught from that the estimate is taken over
    correct: int  # of those, how many the head fitted without them called ``name``
    confused: dict[str, int]  # the classes the others were called, and how often


# A taught run's ``taught`` (``from`` is a keyword, hence this form): the checkpoint it was taught from, its head
# ("logistic regression on cls+patches") and the classes added ([name, the folder or how many photos], ...)
_TaughtKeys = TypedDict("_TaughtKeys", {"from": str, "head": str, "added": list[list[str]]})


class Taught(_TaughtKeys, total=False):
    """A taught run's ``taught``: ``from``, ``head``, ``added`` (above) and, written since 2026-12-06 (#46; a run
    taught before lacks it), ``estimate``: a :class:`TaughtEstimate` of each class taught from two photos or more."""

    estimate: list[TaughtEstimate]

# A checkpoint's ``unknown``: the "none of these" rule, :meth:`vit_flowers.inference.unknown.UnknownRule.state` with
# its arrays as tensors (rule, threshold, accept, val_accepted, n_val, means, precision); an ONNX export's metadata
# holds the same as JSON (its arrays as lists)
UnknownState = dict[str, Any]


class ModelFacts(TypedDict):
    """What running a trained classifier needs besides its weights: in a :class:`Checkpoint`, and made from an ONNX
    export's metadata (:func:`vit_flowers.inference.onnx_torch.load_onnx_module`)."""

    classes: list[str]  # the head's outputs, in order
    image_size: int  # the side of the square images the model takes, in pixels
    mean: list[float]  # per-channel normalisation of the images in [0, 1]: (x - mean) / std
    std: list[float]
    config: dict[str, Any]  # the training configuration (TrainConfig.flat()); {} when unknown
    unknown: UnknownState | None  # the "none of these" rule; None: the run has none (unknown is off)


class Checkpoint(ModelFacts):
    """What a run's best.pt and last.pt hold (format :data:`FORMAT`): every key is present, None where the run has
    none. Written by :func:`make_checkpoint` (and by ``teach``, a copy with another head), read by
    :func:`load_checkpoint`.

    A file of format ``vit_flowers/2`` (written before 2026-12-07) holds the CLS token's means in ``class_means``
    (dropped) and names a taught model's weights as the ViT held them (``gate.*``, ``taught_bias``, the trained head
    as ``mlp_head.*``: :func:`vit_flowers.models.taught.moved_keys`, as its head of its own holds them now), and a
    hybrid that ended on its head start keeps each photo twice in ``teach_sample`` (kept once: :func:`_without_copies`).
    A file of format ``vit_flowers/1`` (written before 2026-12-06) may lack the keys that were added over time;
    :func:`migrate` gives them their "none" value: ``class_means`` and ``unknown`` (kept since 2026-12-03, f53b9c1:
    runs trained before have no unknown rule), ``teach_sample`` (since 2026-12-03, 9064cf9: ``teach`` reads up to 200
    training photos a class again instead), ``taught`` (only in a run that ``teach`` wrote), ``train_state``
    (last.pt only). Its ``train_state`` may lack ``objective`` (kept since 2026-12-04, 31c948c). ``weights``,
    ``config``, ``epoch`` and ``best_accuracy`` were always written by ``train``; a file made by hand without them
    reads as "raw", {}, 0 and None.
    """

    format: str  # FORMAT: "vit_flowers/<version>"
    model: dict[str, torch.Tensor]  # the weights to evaluate (the EMA's when ``weights`` is "ema")
    weights: str  # "raw" or "ema"
    model_config: dict[str, Any]  # build_vit(model_config) rebuilds the architecture (vit_flowers.models.taught)
    epoch: int  # the epochs trained when these weights were kept
    best_accuracy: float | None  # the best validation accuracy up to then (0..1)
    class_means: ClassMeans | None  # set at the end of training (None: no validation photos, or an older run)
    teach_sample: TeachSample | None  # set at the end of training, with class_means
    taught: Taught | None  # a run written by ``teach``: what it was taught
    # last.pt only, what ``--resume`` needs: raw weights ("model"), "optimizer", "scheduler", "ema" (or None),
    # "history" (metrics.csv's rows), "amp" (the autocast dtype's name), "objective" (its state); since 2026-12-07
    # "head_start" (a head start's optimizer and schedule, during it), "feature_start" (its fields) and "start_kept"
    train_state: dict[str, Any] | None


# the keys a file of format 1 may lack (Checkpoint's docstring says since when) and the value that says "none"
V1_DEFAULTS: dict[str, Any] = {"weights": "raw", "config": {}, "epoch": 0, "best_accuracy": None, "class_means": None,
                               "unknown": None, "teach_sample": None, "taught": None, "train_state": None}


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:  # write's result is unused
    """Write a file atomically: ``write(f)`` into a temporary file in the same folder,
    fsync, then rename over ``path``. A crash or a full disk leaves the previous file
    at ``path`` untouched and no temporary file behind; the temporary files of processes
    that were killed while writing (``kill -9``) are removed by the next successful write.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        f = open(tmp, "xb")  # noqa: SIM115 - closed by the `with f:` below; honours the umask, unlike mkstemp
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


def save_checkpoint(state: Checkpoint, path: str | Path) -> None:
    """``torch.save`` into memory, then written through :func:`atomic_write`: a write that fails (a full disk) is the
    file's OSError with its message, where torch's zip writer, writing the file itself, raised a RuntimeError of its
    own over it (or aborted the process)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write(path, lambda f: f.write(buffer.getbuffer()))


def save_safetensors(model: ViT, path: str | Path, half: bool = False, extra: dict[str, str] | None = None) -> Path:
    """Write ``model``'s weights (fp16 with ``half``) and its ``model_config`` to a safetensors file that
    :func:`vit_flowers.training.pretrained.load_pretrained` reads back; ``extra``: more metadata (strings), e.g. how
    the weights were made."""
    from safetensors.torch import save_file

    dtype = torch.float16 if half else torch.float32
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in model.state_dict().items()}
    meta = {"format": SAFETENSORS_FORMAT, "model_config": json.dumps(model.config), **(extra or {})}
    save_file(state, str(path), metadata=meta)
    return Path(path)


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
) -> Checkpoint:
    """A :class:`Checkpoint` of ``model`` (its keys are documented there), as :func:`save_checkpoint` writes it and
    :func:`load_model` reads it back: ``model`` holds ``weights`` (e.g. the EMA's, ``weights_kind`` "ema"), else the
    model's own; ``train_state`` (``last.pt`` only) is what ``--resume`` needs. ``class_means``, ``unknown``,
    ``teach_sample`` and ``taught`` are None: the end of training sets the first three
    (:func:`vit_flowers.inference.calibration.calibrate_checkpoint`), ``teach`` the last."""
    return {"format": FORMAT, "model": weights if weights is not None else model.state_dict(),
            "weights": weights_kind, "model_config": dict(model.config), "classes": list(classes),
            "image_size": image_size, "mean": list(mean), "std": list(std), "config": dict(config),
            "epoch": epoch, "best_accuracy": best_accuracy, "class_means": None, "unknown": None,
            "teach_sample": None, "taught": None, "train_state": train_state}


def _version(state: object, path: Path) -> int:
    """The format version of a loaded file, or CheckpointError naming ``path``: not ours, or of a newer version."""
    found = state.get("format") if isinstance(state, dict) else type(state).__name__
    number = found[len(PREFIX):] if isinstance(found, str) and found.startswith(PREFIX) else ""
    if not number.isdigit() or int(number) < 1:
        raise CheckpointError(f"{path} is not a vit_flowers checkpoint (format {found!r}, expected {FORMAT!r})")
    if int(number) > VERSION:
        raise CheckpointError(f"{path} is a vit_flowers checkpoint of format {found!r}, newer than this vit_flowers "
                              f"reads ({FORMAT!r} at most): upgrade vit_flowers to use it")
    return int(number)


def migrate(state: dict[str, Any], path: str | Path = "checkpoint") -> Checkpoint:
    """A loaded file's dict as a :class:`Checkpoint` of today's :data:`FORMAT` (a new dict; ``state`` is not
    changed): a file of format 1 gets the keys it lacks (:data:`V1_DEFAULTS`), one of format 1 or 2 the layout of
    format 3 (:func:`_from_v2`). CheckpointError naming ``path`` when it is not one of ours, is of a newer format, or
    lacks a key (one of format 1: one that was always written)."""
    path = Path(path)
    version = _version(state, path)
    if version == 1:
        state = {**V1_DEFAULTS, **state}
    missing = [k for k in Checkpoint.__annotations__ if k not in state]
    if missing:
        raise CheckpointError(f"{path} is incomplete: missing {', '.join(missing)}")
    return cast(Checkpoint, _from_v2(state) if version < 3 else dict(state))


def _from_v2(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint of format 2 in format 3's layout (see :class:`Checkpoint`): ``class_means`` without the CLS
    token's means, a taught model's weights under their new names, ``taught: 0`` out of ``model_config``, a
    ``teach_sample`` without the copies :func:`_without_copies` finds."""
    means = state["class_means"]
    config = {k: v for k, v in state["model_config"].items() if k != "taught" or v}
    return {**state, "format": FORMAT, "model": moved_keys(state["model"]), "model_config": config,
            "class_means": {"counts": list(means["counts"])} if means else means,
            "teach_sample": _without_copies(state["teach_sample"])}


def _without_copies(sample: TeachSample | None) -> TeachSample | None:
    """A format-2 hybrid run that ended on its head start kept each photo twice: its "mirror" was the flipped trunk
    grid, whose pooled output (the ``trunk`` row) is the photo's own, to float16's rounding. Such a sample (the
    second half's labels and trunk rows those of the first) as format 3 keeps it: the photos once."""
    if not sample or "trunk" not in sample or len(sample["labels"]) % 2:
        return sample
    n, trunk = len(sample["labels"]) // 2, sample["trunk"].float()
    if not torch.equal(sample["labels"][:n], sample["labels"][n:]) or not torch.allclose(
            trunk[:n], trunk[n:], rtol=1e-3, atol=1e-3):
        return sample
    return {**sample, "features": sample["features"][:n], "labels": sample["labels"][:n], "trunk": sample["trunk"][:n]}


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load a checkpoint safely (:func:`vit_flowers.runs.torch_files.read_torch_file`), check that it is one of ours
    and bring it up to today's format (:func:`migrate`)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    return migrate(read_torch_file(path, map_location), path)


def kept_weights(run_dir: str | Path) -> runs.KeptWeights | None:
    """Which weights ``run_dir``'s best.pt holds (epoch, raw or EMA); None when there is none or it cannot be read
    (the curves are then drawn without the mark)."""
    path = Path(run_dir) / runs.BEST
    if not path.is_file():
        return None
    try:
        state = load_checkpoint(path)
        return runs.KeptWeights(int(state["epoch"]), str(state["weights"]))
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None


def model_from_checkpoint(state: Checkpoint, path: str | Path = "checkpoint") -> ViT:
    """Rebuild the ViT stored in a loaded checkpoint (a :class:`~vit_flowers.models.taught.TaughtViT` for a taught
    run) and load its weights."""
    try:
        model = build_vit(state["model_config"])
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


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[ViT, Checkpoint]:
    """(model in eval mode on ``device``, its :class:`Checkpoint`) from a checkpoint file."""
    state = load_checkpoint(path)
    return model_from_checkpoint(state, path).to(device).eval(), state


def latest_run(out_dir: str | Path = runs.RUNS_HOME) -> Path | None:
    """The newest run folder under ``out_dir`` (the ``latest`` link, else the newest with a checkpoint)."""
    out_dir = Path(out_dir)
    link = out_dir / runs.LATEST
    if link.is_dir():
        return link.resolve()
    found = {p.parent for name in (runs.LAST, runs.BEST) for p in out_dir.glob(f"*/{name}")}
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def resolve_checkpoint(path: str | Path | None, out_dir: str | Path = runs.RUNS_HOME, name: str = runs.BEST) -> Path:
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
