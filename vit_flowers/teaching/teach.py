"""Teaching a trained run a new class (or more photos of one it has) from a few photos, without retraining: the
library part of the ``teach`` command (:mod:`vit_flowers.teach`), which the web app's Teach tab runs too.

:func:`teach` writes a new run fitted on the kept features of the run's training photos (``teach_sample``, or for an
older run its training photos found again by :mod:`vit_flowers.inference.run_data`) and of the photos given, and
their mirror images: for a hybrid, the trained head and a gate on the trunk's pooled output for the taught classes
(:mod:`.gate`); for another model, a new head, a logistic regression
(:func:`vit_flowers.inference.calibration.fit_head`) on the encoder's features. The trunk does not change. Before
the user relies on it, teach estimates how often each taught class will be recognised by a k-fold over the photos
given (:mod:`.estimate`, kept in best.pt's ``taught``) and measures the "none of these" rule again with the taught
classes in (:mod:`.rule`). Class names follow one rule (:mod:`vit_flowers.data.class_names`); the run taught is only
read, and the new run is written in one go at the end, where ``--output`` allows it (:mod:`.output`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ..data.class_names import check_class_name
from ..data.image_files import list_images, printable_name
from ..inference.batches import iter_image_batches
from ..inference.calibration import (
    TEACH_PER_CLASS,
    balanced_sample,
    class_counts,
    fit_head,
    teach_sample,
    unknown_state,
)
from ..inference.features import Outputs, batch_outputs, head_inputs
from ..inference.run_data import photos_of, rebuilt_photos
from ..inference.unknown import UnknownRule, rule_from_checkpoint
from ..models.taught import taught_classes, trained_head
from ..models.vit import ViT
from ..runs import folders as runs
from ..runs.checkpoint import (
    Checkpoint,
    ClassMeans,
    ModelFacts,
    Taught,
    TaughtEstimate,
    TeachSample,
    load_model,
    resolve_checkpoint,
)
from . import gate
from .estimate import FEW_PHOTOS, GOOD_RECALL, RuleFor, TaughtPhotos, advice, cross_validate, recall
from .output import check_output, write_run
from .rule import taught_rule

__all__ = ["Photos", "TeachResult", "read_photos", "photo_features", "training_state", "class_photos", "teach"]

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
    """(``class_means``, ``teach_sample``) of a run (:mod:`vit_flowers.inference.calibration`): from its best.pt, else
    (a run trained before they were kept, or a hybrid's kept without its trunk outputs) from up to ``TEACH_PER_CLASS``
    of its training photos a class, found as ``evaluate`` and ``export`` find a run's photos
    (:mod:`vit_flowers.inference.run_data`)."""
    kept = ckpt["teach_sample"]
    if ckpt["class_means"] and kept and ("trunk" in kept or not gate.reads_trunk(model)):
        return ckpt["class_means"], kept
    log.info("%s keeps no features of its training photos (trained before they were): reading up to %d a class",
             run_dir, TEACH_PER_CLASS)
    images, labels = _training_photos(ckpt, run_dir, TEACH_PER_CLASS)
    counts = ckpt["class_means"] or class_counts(labels, len(ckpt["classes"]))
    return counts, teach_sample(model, images, labels, ckpt["mean"], ckpt["std"])


def _training_photos(ckpt: ModelFacts, run_dir: Path, per_class: int) -> tuple[torch.Tensor, np.ndarray]:
    """Up to ``per_class`` training photos of each class of the run (evenly spaced), found again as
    :func:`vit_flowers.inference.run_data.rebuilt_photos` finds them: uint8 images and labels."""
    found = rebuilt_photos(ckpt, run_dir, "train")
    if list(found.classes) != list(ckpt["classes"]):
        raise ValueError(f"{run_dir}: its training photos have the classes {found.classes}, its best.pt "
                         f"{ckpt['classes']}")
    photos = photos_of(found, balanced_sample(np.array(found.labels), per_class).tolist(), ckpt)
    return photos.images, photos.labels


def _add_class(state: Checkpoint, name: str, out: Outputs, mirrored: Outputs) -> str:
    """Add a class's photos (``out``, and ``mirrored``: their mirror images) to ``state`` (a checkpoint dict, in
    place): the features the head is fitted on (``teach_sample``) and the photo counts of the class means
    (``class_means``; the unknown rule's means take the photos in after, :func:`.rule.taught_rule`). A new class is
    appended. Returns what was done, for the log."""
    classes, means, sample = state["classes"], state["class_means"], state["teach_sample"]
    assert means is not None and sample is not None, "teach sets them first"
    c = classes.index(name) if name in classes else len(classes)
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


def class_photos(name: str, photos: Photos, size: int) -> tuple[torch.Tensor, list[str]]:
    """(the readable photos of a class, uint8 (N, 3, size, size); the warnings about them, each also logged): a
    folder's files that are not images are named, fewer than :data:`FEW_PHOTOS` photos warned about. ValueError
    naming the folder when it is none or holds no readable photo."""
    warnings: list[str] = []

    def warn(text: str) -> None:  # logged at once (before a refusal that may follow)
        warnings.append(text)
        log.warning("%s", text)

    if isinstance(photos, Path):
        where = f"--add {name}={printable_name(photos)}"
        if not photos.is_dir():
            raise ValueError(f"{where}: not a folder")
        paths, skipped = list_images(photos)
        if skipped:
            names = [printable_name(p.relative_to(photos)) for p in skipped]
            warn(f"{where}: {len(skipped)} file(s) that are not images left out: "
                 f"{', '.join(names[:10])}{', ...' if len(names) > 10 else ''}")
        if not paths:
            raise ValueError(f"{where}: no photos in it{f' (only {len(skipped)} other file(s))' if skipped else ''}")
    else:
        paths, where = list(photos), f"the {len(photos)} photo(s) of {name}"
    images = read_photos(paths, size, where)
    if len(images) < FEW_PHOTOS:
        warn(f"{where}: only {len(images)} photo(s) ({FEW_PHOTOS}-20 are enough to start); the estimate says how "
             f"well {name} will be recognised")
    return images, warnings


def _described(photos: Photos) -> str:
    """What ``taught`` records of a class's photos: the folder, or how many files."""
    return str(photos) if isinstance(photos, Path) else f"{len(photos)} photo(s)"


@dataclass
class TeachResult:
    """What :func:`teach` wrote and found: the new run's best.pt, its classes, the estimate of each taught class
    (:mod:`.estimate`; none for a class of one photo, and none when nothing was fitted: :func:`_refits`) and the
    warnings about the photos given."""

    best: Path
    classes: list[str]
    estimates: list[TaughtEstimate] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _checked_names(adds: Sequence[tuple[str, Photos]]) -> list[tuple[str, Photos]]:
    """``adds`` with each name checked (:func:`vit_flowers.data.class_names.check_class_name`), each class once."""
    checked = [(check_class_name(name), photos) for name, photos in adds]
    names = [name for name, _ in checked]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"class name {twice[0]!r} is given twice: give each class once, with one folder")
    return checked


def teach(run: str | Path, adds: Sequence[tuple[str, Photos]], output: str | Path,
          overwrite: bool = False) -> TeachResult:
    """Write ``output``, a run that predicts ``run``'s classes and those of ``adds`` ((name, a folder of photos or
    the photo files)): its best.pt with a head fitted on the features of the run's kept training photos and the
    photos given, an estimate of each taught class and the unknown rule recalibrated, and ``run``'s config.yaml and
    split.json. ``run`` is only read; ``output`` is written in one go at the end. Raises CheckpointError /
    ValueError / OSError with a message for the user."""
    source, output = resolve_checkpoint(run), Path(output)
    adds = _checked_names(adds)
    check_output(source.parent, output, overwrite)
    model, ckpt = load_model(source)
    given = [(name, *class_photos(name, photos, ckpt["image_size"])) for name, photos in adds]
    means, sample = training_state(model, ckpt, source.parent)
    state = ckpt.copy()
    state["classes"], state["teach_sample"] = list(ckpt["classes"]), sample.copy()  # copies: the run is only read
    state["class_means"] = {**means, "counts": list(means["counts"])}
    rule = rule_from_checkpoint(ckpt, where=str(source))
    record: Taught = {"from": str(source), "head": "", "added": [[n, _described(f)] for n, f in adds]}
    state["taught"] = record
    taught: dict[int, tuple[Outputs, Outputs]] = {}
    for name, images, _ in given:
        outs = [batch_outputs(model, images, ckpt["mean"], ckpt["std"], mirror=m) for m in (False, True)]
        log.info("%s", _add_class(state, name, *outs))
        taught[state["classes"].index(name)] = (outs[0], outs[1])
    estimates: list[TaughtEstimate] = []
    if _refits(model, len(state["classes"])):
        fold_rule = partial(taught_rule, rule, list(means["counts"]))
        estimates = record["estimate"] = _estimate(model, sample, taught, state["classes"], fold_rule)
    else:
        log.info("the photos join their classes' means and kept features; no head is fitted (the trained head stays, "
                 "so the new run predicts as the run does): nothing to estimate")
    fitted, record["head"] = _fitted(model, state["teach_sample"], len(state["classes"]))
    log.info("the new run: %s", record["head"])
    state["model"], state["model_config"] = fitted.state_dict(), dict(fitted.config)
    state["train_state"] = None
    features = {c: plain.features for c, (plain, _) in taught.items()}  # what the rule compares
    _write_rule(state, source, rule, taught_rule(rule, means["counts"], features))
    write_run(output, overwrite, state, source.parent)
    return TeachResult(output / runs.BEST, list(state["classes"]), estimates, [w for *_, ws in given for w in ws])


def _estimate(model: ViT, sample: TeachSample, taught: dict[int, tuple[Outputs, Outputs]], names: list[str],
              rule_for: RuleFor) -> list[TaughtEstimate]:
    """:func:`.estimate.cross_validate` of the taught classes against ``sample`` (the run's kept features,
    before the photos were added; a hybrid's trunk outputs, as its gate reads them, its photos predicted through the
    mixture with ``model``'s trained head and the gate's bias; the rule ``rule_for`` makes of the photos fitted on
    judging those left out), each estimate logged with its advice (a warning when it is low)."""
    hybrid, head = gate.reads_trunk(model), trained_head(model)  # a hybrid's sample holds trunk outputs

    def read(out: Outputs) -> np.ndarray:  # (n, d): what the taught classes are fitted on
        return gate.gate_inputs(out.trunk) if hybrid else head_inputs(out, sample["head_input"])

    def trained(out: Outputs) -> np.ndarray | None:  # (n, K): a hybrid's trained head's logits, which it mixes in
        if hybrid and taught_classes(model) == 0:  # the model's own logits: its feature head's included
            return out.logits
        with torch.no_grad():  # a taught model's logits are the mixture: its trained head's alone
            return head(torch.from_numpy(out.head)).numpy() if hybrid else None

    old_x = gate.gate_inputs(sample["trunk"].float().numpy()) if hybrid else sample["features"].float().numpy()
    photos = [TaughtPhotos(c, read(plain), read(mirrored), trained(plain), plain.features)
              for c, (plain, mirrored) in taught.items()]
    estimates = cross_validate(old_x, sample["labels"].numpy(), photos, names, gate_bias=gate.GATE_BIAS,
                               rule_for=rule_for)
    for estimate in estimates:
        low = recall(estimate) < GOOD_RECALL or estimate["photos"] < FEW_PHOTOS
        log.log(logging.WARNING if low else logging.INFO, "estimate: %s", advice(estimate))
    return estimates


def _refits(model: ViT, num_classes: int) -> bool:
    """Whether teaching ``model`` to ``num_classes`` classes fits anything: not for a hybrid that has only its
    trained classes after it (photos added to those: the trained head stays as it is, with no gate)."""
    return not gate.reads_trunk(model) or num_classes > model.num_classes - taught_classes(model)


def _fitted(model: ViT, sample: TeachSample | None, num_classes: int) -> tuple[ViT, str]:
    """(the taught model, what its head is) for ``num_classes`` classes fitted on ``sample``: a hybrid's gate
    (:mod:`.gate`; none when no class is new, :func:`_refits`), another model's head refitted as a logistic
    regression."""
    assert sample is not None, "teach sets it first"
    if not _refits(model, num_classes):  # photos added to a hybrid's trained classes: their means only
        return model, "the trained head (no class taught)"
    if gate.reads_trunk(model):
        gated = gate.gated_model(model, sample, num_classes)
        return gated, gate.describe(gated)
    log.info("not a hybrid (no pretrained trunk to read): the head is refitted on the encoder's features")
    weight, bias = fit_head(sample["features"].float().numpy(), sample["labels"].numpy(), num_classes)
    taught = ViT(**{**model.config, "num_classes": num_classes, "head_input": sample["head_input"]})
    kept = {k: v for k, v in model.state_dict().items() if not k.startswith("mlp_head.")}
    taught.load_state_dict({**kept, "mlp_head.weight": weight, "mlp_head.bias": bias})
    return taught, f"logistic regression on {sample['head_input']}"


def _write_rule(state: Checkpoint, source: Path, before: UnknownRule | None, found: UnknownRule | None) -> None:
    """``state``'s unknown rule (in place): ``found``, the rule :func:`.rule.taught_rule` made of ``before``
    (``source``'s), said in the log: a mahalanobis rule measured again with the taught classes in, another feature
    rule at its threshold with their means in, a logit rule turned off (its threshold belongs to the old head)."""
    state["unknown"] = None if found is None else unknown_state(found)
    if found is None:
        if before is not None:
            log.warning("unknown: off in the new run (%s's %s rule depends on its old head)", source, before.rule)
    elif found.rule != "mahalanobis":
        log.info("unknown: the %s rule keeps its threshold, with the taught classes' means in", found.rule)
    else:
        offsets: Sequence[float] = [] if found.offsets is None else found.offsets.tolist()
        allowances = ", ".join(f"{name} {offset:.3g}" for name, offset in zip(state["classes"], offsets) if offset)
        log.info("unknown: recalibrated with the taught classes in: %s (allowances: %s)", found.describe(),
                 allowances or "none")
