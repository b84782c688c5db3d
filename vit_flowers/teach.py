"""Teach a trained run a new flower from a few photos, without retraining: a new run that predicts every class.

    python -m vit_flowers.teach checkpoints/my-run --add lily=photos/lily --output checkpoints/my-run-lily
    vit-flowers teach checkpoints/my-run --add lily=photos/lily --add orchid=photos/orchid --output runs/more
    vit-flowers teach checkpoints/my-run --add rose=photos/more-roses --output runs/better-roses   # more photos

Each class is represented by the mean of its photos' features (the model's input to its head,
:mod:`vit_flowers.inference.prototypes`): the existing classes by their training photos' (kept in best.pt at the end of
training; for an older run, read again from its training photos), a taught class by the photos given (5-20
are enough to start). The new run's head is the nearest-class-mean classifier of those means, written as an
ordinary linear head: the new run predicts, evaluates, exports to ONNX and serves the app like any other. Its
"none of these" rule keeps the trained run's threshold, now measured against every class's mean. Photos of a
class the run already has are added to that class's mean.

The trunk does not change: a flower that its features do not tell apart from the others (a new species very
like a known one) needs a real fine-tune on a folder with the new class (``train --data``, from ImageNet
weights: ``--resume`` continues a run on its own classes only and refuses new ones). RUN is never changed;
NEW_RUN must not hold a run (or ``--overwrite``).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .cli import command_parser, setup_logging
from .data.image_files import list_images, printable_name
from .inference.batches import iter_image_batches
from .inference.prototypes import MAX_MEAN_PHOTOS, Outputs, batch_outputs, class_means, ncm_head
from .inference.unknown import rule_from_checkpoint
from .models.vit import ViT
from .runs import folders as runs
from .runs.checkpoint import CheckpointError, load_model, resolve_checkpoint, save_checkpoint
from .training.config import ConfigError

__all__ = ["parse_add", "photo_features", "training_means", "teach", "main"]

log = logging.getLogger(__name__)


def parse_add(text: str) -> tuple[str, Path]:
    """``NAME=FOLDER`` -> (name, folder); ValueError naming what is wrong."""
    name, sep, folder = text.partition("=")
    if not sep or not name.strip() or not folder.strip():
        raise ValueError(f"--add {text!r}: write it as NAME=FOLDER, e.g. --add lily=photos/lily")
    return name.strip(), Path(folder.strip())


def photo_features(model: ViT, ckpt: dict[str, Any], paths: Sequence[Path], where: str) -> Outputs:
    """The model's :class:`~vit_flowers.inference.prototypes.Outputs` for the readable ``paths`` (decoded as predict decodes
    them); unreadable ones are named in a warning; ValueError naming ``where`` when none can be read."""
    paths = list(paths)
    images, failed = [], []
    for batch in iter_image_batches(paths, ckpt["image_size"], batch_size=64):
        images.append(batch.images)
        failed += [f"{printable_name(e.path)}: {e.reason}" for e in batch.errors]
    if failed:
        log.warning("%s: %d photo(s) left out:\n  %s", where, len(failed), "\n  ".join(failed[:10]))
    if not images or sum(len(b) for b in images) == 0:
        raise ValueError(f"{where}: none of its {len(paths)} photo(s) could be read")
    return batch_outputs(model, torch.cat(images), ckpt["mean"], ckpt["std"])


def training_means(model: ViT, ckpt: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """``class_means`` of a run: from its best.pt, else (a run trained before they were kept) from its training
    photos, found as ``evaluate`` finds its photos (:mod:`vit_flowers.training.run_data`)."""
    if ckpt.get("class_means"):
        return ckpt["class_means"]
    from .data.datasets import load_synthetic
    from .training.run_data import run_config, run_folder

    log.info("%s keeps no class means (trained before they were): reading its training photos", run_dir)
    cfg = run_config(run_dir, ckpt)
    if cfg.dataset == "synthetic":
        train = load_synthetic(image_size=ckpt["image_size"], train_per_class=cfg.synthetic_train_per_class,
                               val_per_class=0, seed=cfg.seed).train
        feats = batch_outputs(model, train.images, ckpt["mean"], ckpt["std"]).head
        return class_means(feats, train.labels.numpy(), len(ckpt["classes"]))
    if cfg.dataset != "folder" and cfg.dataset != "flower_photos":
        raise ValueError(f"{run_dir}: teach needs the class means of a run on photos or synthetic flowers, not "
                         f"{cfg.dataset}")
    files = run_folder(cfg, run_dir).files
    if list(files.classes) != list(ckpt["classes"]):
        raise ValueError(f"{run_dir}: its training photos have the classes {files.classes}, its best.pt "
                         f"{ckpt['classes']}")
    samples = files.train[::max(1, len(files.train) // MAX_MEAN_PHOTOS)]
    by_class = [photo_features(model, ckpt, [p for p, y in samples if y == c], f"training photos of {name}").head
                for c, name in enumerate(files.classes)]
    labels = np.concatenate([np.full(len(f), c) for c, f in enumerate(by_class)])
    return class_means(np.concatenate(by_class), labels, len(files.classes))


def _with_photos(means: torch.Tensor, counts: list[int], c: int, feats: np.ndarray) -> torch.Tensor:
    """``means`` (C, dim) with row ``c`` (a new row when ``c == C``) the mean of its ``counts[c]`` photos and
    ``feats``."""
    n = counts[c] if c < len(counts) else 0
    old = means[c].double().numpy() * n if c < len(means) else 0.0
    row = torch.from_numpy(((old + feats.astype(np.float64).sum(axis=0)) / (n + len(feats))).astype(np.float32))
    return torch.cat([means[:c], row[None], means[c + 1:]])


def _add_class(state: dict[str, Any], name: str, out: Outputs) -> str:
    """Add a class's photos to ``state`` (a checkpoint dict, in place): the head's class means, and the unknown
    rule's where it has some. A new class is appended, an existing class's means take the photos in, weighted by
    photo count. Returns what was done, for the log."""
    classes, means = state["classes"], state["class_means"]
    c = classes.index(name) if name in classes else len(classes)
    unknown = state.get("unknown")
    if unknown and unknown.get("means") is not None:
        unknown["means"] = _with_photos(torch.as_tensor(unknown["means"]), means["counts"], c, out.features)
    means["means"] = _with_photos(means["means"], means["counts"], c, out.head)
    if c < len(classes):
        means["counts"][c] += len(out.head)
        return f"{name}: {len(out.head)} photo(s) added to its {means['counts'][c] - len(out.head)}"
    classes.append(name)
    means["counts"].append(len(out.head))
    return f"{name}: a new class from {len(out.head)} photo(s)"


def teach(run: str | Path, adds: Sequence[tuple[str, Path]], output: str | Path, overwrite: bool = False) -> Path:
    """Write ``output``, a run that predicts ``run``'s classes and those of ``adds`` ((name, folder of photos)):
    its best.pt with the nearest-class-mean head, and ``run``'s config.yaml and split.json. Returns its best.pt.
    ``run`` is only read. Raises CheckpointError / ValueError / OSError with a message for the user."""
    source = resolve_checkpoint(run)
    output = Path(output)
    if output.resolve() == source.parent.resolve():
        raise ValueError(f"--output {output} is the run being taught: teach never changes it; choose a new folder")
    runs.check_new_run(output, overwrite)
    model, ckpt = load_model(source)
    means = training_means(model, ckpt, source.parent)
    state = {**ckpt, "classes": list(ckpt["classes"]), "class_means": {**means, "counts": list(means["counts"])},
             "unknown": dict(ckpt["unknown"]) if ckpt.get("unknown") else None,
             "taught": {"from": str(source), "head": "nearest class mean", "added": [[n, str(f)] for n, f in adds]}}
    for name, folder in adds:
        images, _ = list_images(folder)
        log.info("%s", _add_class(state, name, photo_features(model, ckpt, images, f"--add {name}={folder}")))
    weight, bias = ncm_head(state["class_means"]["means"], means["within"])
    model.reset_classifier(len(state["classes"]))
    with torch.no_grad():
        model.mlp_head.weight.copy_(weight)
        model.mlp_head.bias.copy_(bias)
    state.update(model=model.state_dict(), model_config=dict(model.config))
    state.pop("train_state", None)
    rule = rule_from_checkpoint(state, where=str(source))
    if rule is None or not rule.needs_features:  # a logit rule's threshold belongs to the old head
        if rule is not None:
            log.warning("unknown: off in the new run (%s's %s rule depends on its old head)", source, rule.rule)
        state.pop("unknown")
    _write_run(output, overwrite, state, source.parent)
    return output / runs.BEST


def _write_run(output: Path, overwrite: bool, state: dict[str, Any], source_dir: Path) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("teach", __doc__)
    p.add_argument("run", metavar="RUN", help="the trained run (a folder or a checkpoint file); never changed")
    p.add_argument("--add", action="append", required=True, metavar="NAME=FOLDER",
                   help="a class and a folder of its photos (5-20 are enough to start); repeat for more classes; "
                        "a class RUN already has gets the photos added to its own")
    p.add_argument("--output", required=True, metavar="NEW_RUN", help="the new run's folder (must not hold a run)")
    p.add_argument("--overwrite", action="store_true", help="let NEW_RUN replace a run in that folder")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    start = time.perf_counter()
    try:
        adds = [parse_add(text) for text in args.add]
        path = teach(args.run, adds, args.output, args.overwrite)
    except (CheckpointError, ConfigError, ValueError, OSError) as exc:
        log.error("error: %s", exc)
        return 1
    log.info("wrote %s in %.1f s; predict with `vit-flowers predict PHOTOS --checkpoint %s`", path,
             time.perf_counter() - start, path.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
