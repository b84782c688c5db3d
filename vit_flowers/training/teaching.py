"""Teaching a trained run a new class (or more photos of one it has) from a few photos, without retraining: the
library part of the ``teach`` command (:mod:`vit_flowers.teach`), which the web app's Teach tab runs too.

:func:`teach` writes a new run fitted on the kept features of the run's training photos (``teach_sample``, or for an
older run its training photos read again, found again by :mod:`.run_data`) and of the photos given, and their
mirror images: for a hybrid, the trained head and a gate on the trunk's pooled output for the taught classes
(:mod:`.teach_gate`); for another model, a new head, a logistic regression
(:func:`.calibration.fit_head`) on the encoder's features. Nothing else changes; the run taught
is only read, and the new run's folder must not hold a run (or ``overwrite``).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..data.image_files import list_images, printable_name
from ..inference.batches import iter_image_batches
from ..inference.features import Outputs, batch_outputs, head_inputs
from ..inference.unknown import rule_from_checkpoint
from ..models.vit import ViT
from ..runs import folders as runs
from ..runs.checkpoint import (
    Checkpoint,
    ClassMeans,
    ModelFacts,
    TeachSample,
    load_model,
    resolve_checkpoint,
    save_checkpoint,
)
from . import teach_gate
from .calibration import TEACH_PER_CLASS, balanced_sample, class_means, fit_head, teach_sample
from .run_data import photos_of, rebuilt_photos

__all__ = ["Photos", "read_photos", "photo_features", "training_state", "teach"]

log = logging.getLogger(__name__)

Photos = Path | Sequence[Path]  # a class's photos: a folder of them, or the files themselves


def read_photos(paths: Sequence[Path], size: int, where: str) -> torch.Tensor:
    """uint8 images (N, 3, size, size) of the readable ``paths`` (decoded as predict decodes them); unreadable ones
    are named in a warning; ValueError naming ``where`` when none can be read."""
    paths = list(paths)
    images, failed = [], []
    for batch in iter_image_batches(paths, size, batch_size=64):
        images.append(batch.images)
        failed += [f"{printable_name(e.path)}: {e.reason}" for e in batch.errors]
    if failed:
        log.warning("%s: %d photo(s) left out:\n  %s", where, len(failed), "\n  ".join(failed[:10]))
    if not images or sum(len(b) for b in images) == 0:
        raise ValueError(f"{where}: none of its {len(paths)} photo(s) could be read")
    return torch.cat(images)


def photo_features(model: ViT, ckpt: ModelFacts, paths: Sequence[Path], where: str,
                   mirror: bool = False) -> Outputs:
    """The model's :class:`~vit_flowers.inference.features.Outputs` for the readable ``paths`` (``mirror``: their
    mirror images); ValueError naming ``where`` when none can be read."""
    images = read_photos(paths, ckpt["image_size"], where)
    return batch_outputs(model, images, ckpt["mean"], ckpt["std"], mirror=mirror)


def training_state(model: ViT, ckpt: Checkpoint, run_dir: Path) -> tuple[ClassMeans, TeachSample]:
    """(``class_means``, ``teach_sample``) of a run (:mod:`.calibration`): from its best.pt, else (a run trained
    before they were kept, or a hybrid's kept without its trunk outputs) from up to ``TEACH_PER_CLASS`` of its training
    photos a class, found as ``evaluate`` and ``export`` find a run's photos (:mod:`vit_flowers.training.run_data`)."""
    kept = ckpt["teach_sample"]
    if ckpt["class_means"] and kept and ("trunk" in kept or not teach_gate.reads_trunk(model)):
        return ckpt["class_means"], kept
    log.info("%s keeps no features of its training photos (trained before they were): reading up to %d a class",
             run_dir, TEACH_PER_CLASS)
    images, labels = _training_photos(ckpt, run_dir, TEACH_PER_CLASS)
    plain = batch_outputs(model, images, ckpt["mean"], ckpt["std"])
    means = ckpt["class_means"] or class_means(plain.cls, labels, len(ckpt["classes"]))
    return means, teach_sample(model, images, labels, ckpt["mean"], ckpt["std"], seen=plain)


def _training_photos(ckpt: ModelFacts, run_dir: Path, per_class: int) -> tuple[torch.Tensor, np.ndarray]:
    """Up to ``per_class`` training photos of each class of the run (evenly spaced), found again as
    :func:`vit_flowers.training.run_data.rebuilt_photos` finds them: uint8 images and labels."""
    found = rebuilt_photos(ckpt, run_dir, "train")
    if list(found.classes) != list(ckpt["classes"]):
        raise ValueError(f"{run_dir}: its training photos have the classes {found.classes}, its best.pt "
                         f"{ckpt['classes']}")
    photos = photos_of(found, balanced_sample(np.array(found.labels), per_class).tolist(), ckpt)
    return photos.images, photos.labels


def _with_photos(means: torch.Tensor, counts: list[int], c: int, feats: np.ndarray) -> torch.Tensor:
    """``means`` (C, dim) with row ``c`` (a new row when ``c == C``) the mean of its ``counts[c]`` photos and
    ``feats``."""
    n = counts[c] if c < len(counts) else 0
    old = means[c].double().numpy() * n if c < len(means) else 0.0
    row = torch.from_numpy(((old + feats.astype(np.float64).sum(axis=0)) / (n + len(feats))).astype(np.float32))
    return torch.cat([means[:c], row[None], means[c + 1:]])


def _add_class(state: Checkpoint, name: str, out: Outputs, mirrored: Outputs) -> str:
    """Add a class's photos (``out``, and ``mirrored``: their mirror images) to ``state`` (a checkpoint dict, in
    place): the features the head is fitted on (``teach_sample``), the class means of the CLS token and the
    unknown rule's where it has some. A new class is appended, an existing class's means take the photos in,
    weighted by photo count. Returns what was done, for the log."""
    classes, means, sample = state["classes"], state["class_means"], state["teach_sample"]
    assert means is not None and sample is not None, "teach sets them first"
    c = classes.index(name) if name in classes else len(classes)
    unknown = state["unknown"]
    if unknown and unknown.get("means") is not None:
        unknown["means"] = _with_photos(torch.as_tensor(unknown["means"]), means["counts"], c, out.features)
    means["means"] = _with_photos(means["means"], means["counts"], c, out.cls)
    feats = np.concatenate([head_inputs(o, sample["head_input"]) for o in (out, mirrored)])
    sample["features"] = torch.cat([sample["features"], torch.from_numpy(feats).half()])
    sample["labels"] = torch.cat([sample["labels"], torch.full((len(feats),), c, dtype=torch.int64)])
    if "trunk" in sample:  # a hybrid's: what its gate is fitted on
        sample["trunk"] = torch.cat([sample["trunk"], torch.from_numpy(np.r_[out.trunk, mirrored.trunk]).half()])
    n = len(out.cls)
    if c < len(classes):
        means["counts"][c] += n
        return f"{name}: {n} photo(s) added to its {means['counts'][c] - n}"
    classes.append(name)
    means["counts"].append(n)
    return f"{name}: a new class from {n} photo(s)"


def _photo_list(name: str, photos: Photos) -> tuple[list[Path], str]:
    """(the image files, how to name them in a message) of a class's :data:`Photos`."""
    if isinstance(photos, Path):
        return list_images(photos)[0], f"--add {name}={photos}"
    return list(photos), f"the {len(photos)} photo(s) of {name}"


def _described(photos: Photos) -> str:
    """What ``taught`` records of a class's photos: the folder, or how many files."""
    return str(photos) if isinstance(photos, Path) else f"{len(photos)} photo(s)"


def teach(run: str | Path, adds: Sequence[tuple[str, Photos]], output: str | Path, overwrite: bool = False) -> Path:
    """Write ``output``, a run that predicts ``run``'s classes and those of ``adds`` ((name, a folder of photos or
    the photo files)): its best.pt with a head fitted on the features of the run's kept training photos and the
    photos given, and ``run``'s config.yaml and split.json. Returns its best.pt. ``run`` is only read. Raises
    CheckpointError / ValueError / OSError with a message for the user."""
    source = resolve_checkpoint(run)
    output = Path(output)
    if output.resolve() == source.parent.resolve():
        raise ValueError(f"--output {output} is the run being taught: teach never changes it; choose a new folder")
    runs.check_new_run(output, overwrite)
    model, ckpt = load_model(source)
    means, sample = training_state(model, ckpt, source.parent)
    sample = sample.copy()  # what _add_class adds to (copies: the run taught is only read)
    state = ckpt.copy()
    state["classes"], state["teach_sample"] = list(ckpt["classes"]), sample
    state["class_means"] = {**means, "counts": list(means["counts"])}
    state["unknown"] = dict(ckpt["unknown"]) if ckpt["unknown"] else None
    for name, photos in adds:
        paths, where = _photo_list(name, photos)
        images = read_photos(paths, ckpt["image_size"], where)
        outs = [batch_outputs(model, images, ckpt["mean"], ckpt["std"], mirror=m) for m in (False, True)]
        log.info("%s", _add_class(state, name, *outs))
    taught, head = _fitted(model, sample, len(state["classes"]))
    log.info("the new run: %s", head)
    state["taught"] = {"from": str(source), "head": head, "added": [[n, _described(f)] for n, f in adds]}
    state["model"], state["model_config"] = taught.state_dict(), dict(taught.config)
    state["train_state"] = None
    rule = rule_from_checkpoint(state, where=str(source))
    if rule is None or not rule.needs_features:  # a logit rule's threshold belongs to the old head
        if rule is not None:
            log.warning("unknown: off in the new run (%s's %s rule depends on its old head)", source, rule.rule)
        state["unknown"] = None
    _write_run(output, overwrite, state, source.parent)
    return output / runs.BEST


def _fitted(model: ViT, sample: TeachSample, num_classes: int) -> tuple[ViT, str]:
    """(the taught model, what its head is) for ``num_classes`` classes fitted on ``sample``: a hybrid's gate
    (:mod:`.teach_gate`; none when no class is new), another model's head refitted as a logistic regression."""
    if teach_gate.reads_trunk(model):
        if num_classes == model.num_classes - model.taught:  # photos added to trained classes: their means only
            return model, "the trained head (no class taught)"
        gated = teach_gate.gated_model(model, sample, num_classes)
        return gated, teach_gate.describe(gated)
    log.info("not a hybrid (no pretrained trunk to read): the head is refitted on the encoder's features")
    weight, bias = fit_head(sample["features"].float().numpy(), sample["labels"].numpy(), num_classes)
    taught = ViT(**{**model.config, "num_classes": num_classes, "head_input": sample["head_input"]})
    kept = {k: v for k, v in model.state_dict().items() if not k.startswith("mlp_head.")}
    taught.load_state_dict({**kept, "mlp_head.weight": weight, "mlp_head.bias": bias})
    return taught, f"logistic regression on {sample['head_input']}"


def _write_run(output: Path, overwrite: bool, state: Checkpoint, source_dir: Path) -> None:
    """The new run folder: best.pt, and the trained run's config.yaml and split.json (what its photos were)."""
    made = runs.make_run_dir(output)
    try:
        if overwrite:
            runs.clear_run_dir(output)
        for name in (runs.CONFIG, runs.SPLIT):
            if (source_dir / name).is_file():
                shutil.copyfile(source_dir / name, output / name)
        save_checkpoint(state, output / runs.BEST)
    except BaseException:
        runs.remove_new_folders(made)
        raise
