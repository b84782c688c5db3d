"""What `vit-flowers check` finds in a folder of labelled photos: duplicates, likely wrong labels, tiny photos.

One pass of EfficientNet-Lite0's ImageNet trunk (the hybrid ViT's patch embedding, shipped with the project)
turns every photo into a pooled feature vector; the cheap hashes of :mod:`.data.duplicates` come beside it.

- Duplicates: byte-identical files (SHA-256), and pairs whose features point the same way (cosine similarity
  at least :data:`COSINE_NEAR`) or whose pixel hashes nearly agree (re-encoded, resized, cropped a little,
  renamed). Each pair is marked ``within_class``, ``across_classes`` (a conflicting label) or ``across_split``
  (one side in train, the other in val: a leak).
- Likely wrong labels: out-of-sample class probabilities from k-fold cross-validation of a logistic
  regression on the features (no photo is scored by a model that saw it), flagged as confident learning
  does (Northcutt et al. 2021): another class is predicted and its probability reaches that class's own
  average self-confidence. Ranked by the margin p(suggested) - p(given).

:func:`find_photos` lists a folder's photos (and each one's side of a train/val split), :func:`check_photos` runs
every check on them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from ..data.duplicates import FileHashes, closest_later, exact_pairs, hash_files, near_pairs
from ..data.image_files import decode_in_chunks
from ..data.images import decode_file
from ..data.splits import check_same_classes, find_split_dirs, load_split, scan_class_folders
from ..inference import INFERENCE_BATCH

__all__ = ["Photos", "CheckResult", "FEATURE_SIZE", "COSINE_NEAR", "TINY_SIDE", "KINDS", "DuplicatePair", "LabelIssue",
           "trunk_features", "find_duplicates", "out_of_sample_probabilities", "label_issues", "tiny_photos",
           "find_photos", "check_photos"]

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # imported where it is built: a check that finds nothing to do never loads it
    from ..models.efficientnet import EfficientNetTrunk

FEATURE_SIZE: int = 224  # the trunk's input (shorter side, centre crop): ImageNet's own size
# Pairs at least this similar in feature space are the same photo. Measured on 150 flowers5 photos, each copied
# 9 ways (benchmarks/README.md, "Checking photos (#36)"): copies cropped 2% off each side (or 4% off two) reach it
# 97-99% of the time, 4% (8%) 84-93%, 6% (12%) 58-75%, but JPEG re-encodes and half-size copies only 19-65% (the
# perceptual hash finds all of those); 0.93 would find more crops but list 43 pairs of flowers5 instead of 30,
# most of the extra ones distinct daisies.
COSINE_NEAR: float = 0.95
TINY_SIDE: int = 64  # a photo whose shorter side is under this many pixels is listed as tiny
KINDS: tuple[str, ...] = ("across_classes", "across_split", "within_class")  # a pair's kind, first that applies


@dataclass(frozen=True)
class DuplicatePair:
    """Two photos (indices) that are one: ``match`` "bytes", "pixels" (hash) or "features"; ``similarity``
    the cosine similarity of their features (1.0 for identical bytes)."""

    a: int
    b: int
    kind: str
    similarity: float
    match: str


@dataclass(frozen=True)
class LabelIssue:
    """A photo whose out-of-sample probabilities point to another class: ``score`` = p(suggested) - p(given)."""

    index: int
    given: int
    suggested: int
    score: float


def _trunk() -> EfficientNetTrunk:
    from ..models.efficientnet import EfficientNetTrunk, load_imagenet_trunk


    trunk = EfficientNetTrunk(stride=32, variant="lite0")
    load_imagenet_trunk(trunk)
    return trunk.eval()


def trunk_features(paths: Sequence[Path], size: int = FEATURE_SIZE, batch_size: int = INFERENCE_BATCH,
                   progress: bool = True) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """(features (N, 320) float32, unit length, zero for unreadable files; ok (N,) bool; {index: why unreadable})
    of the photos at ``paths``: Lite0's trunk (stride 32, ImageNet weights) averaged over its grid, fp32."""
    trunk = _trunk()
    feats = np.zeros((len(paths), trunk.out_channels), dtype=np.float32)
    ok = np.zeros(len(paths), dtype=bool)
    errors: dict[int, str] = {}
    chunks = decode_in_chunks(paths, lambda p: decode_file(p, size), batch_size, read_ahead=False)
    with torch.inference_mode(), tqdm(total=len(paths), desc="features", unit="img", leave=False,
                                      disable=None if progress else True) as bar:
        for indices, pixels, failed in chunks:
            errors.update({e.index: e.reason for e in failed})
            if pixels:
                x = torch.stack(pixels).float().div_(127.5).sub_(1.0)  # (B, 3, S, S): (x - 0.5) / 0.5, as trained
                pooled = trunk(x).mean(dim=(2, 3))  # (B, C)
                feats[indices] = torch.nn.functional.normalize(pooled, dim=1).numpy()
                ok[indices] = True
            bar.update(len(indices) + len(failed))
    return feats, ok, errors


def _similar_pairs(feats: np.ndarray, ok: np.ndarray, threshold: float, block: int = 1024) -> dict[tuple[int, int],
                                                                                                     float]:
    """{(i, j): cosine}, i < j, of readable photos at least ``threshold`` similar, each with its closest later ones
    (:func:`~vit_flowers.data.duplicates.closest_later`), a block of rows at a time (20,000 photos never hold a
    20,000 x 20,000 matrix)."""
    index = np.flatnonzero(ok)
    x = feats[index]
    out: dict[tuple[int, int], float] = {}
    for start in range(0, len(index), block):
        sim = x[start:start + block] @ x.T  # (rows, M)
        a, b = closest_later(sim >= threshold, sim, start)
        out.update({(int(index[i + start]), int(index[j])): float(sim[i, j]) for i, j in zip(a, b)})
    return out


def _kind(i: int, j: int, labels: Sequence[int], sides: Sequence[str | None] | None) -> str:
    if labels[i] != labels[j]:
        return "across_classes"
    if sides is not None and sides[i] and sides[j] and sides[i] != sides[j]:
        return "across_split"
    return "within_class"


def find_duplicates(feats: np.ndarray, ok: np.ndarray, hashes: FileHashes, labels: Sequence[int],
                    sides: Sequence[str | None] | None = None,
                    threshold: float = COSINE_NEAR) -> list[DuplicatePair]:
    """Every pair of duplicates (see the module docstring), most similar first. ``sides``: each photo's side of
    a train/val split ("train", "val" or None when the split does not name it), or None without a split."""
    found: dict[tuple[int, int], tuple[float, str]] = {
        pair: (cos, "features") for pair, cos in _similar_pairs(feats, ok, threshold).items()}
    for i, j, _ in near_pairs(hashes.bits, hashes.has_image_hash):  # HASH_NEAR_BITS, as the split
        found[(i, j)] = (float(feats[i] @ feats[j]), "pixels")
    for i, j in exact_pairs(hashes.sha256):
        found[(i, j)] = (1.0, "bytes")
    pairs = [DuplicatePair(i, j, _kind(i, j, labels, sides), round(cos, 4), match)
             for (i, j), (cos, match) in found.items()]
    return sorted(pairs, key=lambda p: (-p.similarity, p.a, p.b))


def out_of_sample_probabilities(feats: np.ndarray, labels: np.ndarray, folds: int = 5,
                                seed: int = 0) -> np.ndarray | None:
    """(N, C) class probabilities of each photo from a logistic regression fitted on the other folds (stratified
    k-fold, ``folds`` or fewer when a class has fewer photos); None when a class has a single photo (nothing
    left to learn it from once that photo is held out)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    smallest = int(np.bincount(labels).min())
    if smallest < 2:
        return None
    # C=0.1: a strong penalty, since 320 features against a few hundred photos a class overfit otherwise
    model = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000))
    cv = StratifiedKFold(n_splits=min(folds, smallest), shuffle=True, random_state=seed)
    return cross_val_predict(model, feats, labels, cv=cv, method="predict_proba")


def label_issues(probs: np.ndarray, labels: np.ndarray) -> list[LabelIssue]:
    """The photos confident learning flags (module docstring), most suspect first. ``probs`` (N, C) are
    out-of-sample probabilities, ``labels`` (N,) the folders' classes (every class present)."""
    n, classes = probs.shape
    given_p = probs[np.arange(n), labels]
    # per class, the average probability its own photos give it: a class the model is unsure of in general gets
    # a lower bar, so its mislabelled photos are not drowned by a confident class's
    thresholds = np.array([given_p[labels == c].mean() for c in range(classes)])
    suggested = probs.argmax(axis=1)
    flagged = (suggested != labels) & (probs[np.arange(n), suggested] >= thresholds[suggested])
    margin = probs[np.arange(n), suggested] - given_p
    issues = [LabelIssue(int(i), int(labels[i]), int(suggested[i]), round(float(margin[i]), 4))
              for i in np.flatnonzero(flagged)]
    return sorted(issues, key=lambda issue: (-issue.score, issue.index))


def tiny_photos(paths: Sequence[Path], ok: np.ndarray, min_side: int = TINY_SIDE) -> dict[int, tuple[int, int]]:
    """{index: (width, height)} of the readable photos whose shorter side is under ``min_side`` pixels (read from
    the file's header: no decode)."""
    tiny = {}
    for i in np.flatnonzero(ok):
        try:
            with Image.open(paths[int(i)]) as img:
                size = img.size
        except (OSError, ValueError):  # decoded once already (by torchvision): a header PIL reads otherwise
            continue
        if min(size) < min_side:
            tiny[int(i)] = size
    return tiny


@dataclass
class Photos:
    """The labelled photos of a folder: paths, class index of each, the class names and each photo's side of a
    train/val split (None without one)."""

    root: Path
    paths: list[Path]
    labels: np.ndarray  # (N,) int
    classes: list[str]
    sides: list[str | None] | None

    def rel(self, i: int) -> str:
        """Photo ``i``'s path relative to the folder, as the CSVs and split.json write it."""
        return self.paths[i].relative_to(self.root).as_posix()


@dataclass
class CheckResult:
    """Everything a check found (indices into ``photos``)."""

    photos: Photos
    pairs: list[DuplicatePair]
    issues: list[LabelIssue] | None  # None: a class too small to cross-validate
    unreadable: dict[int, str]
    tiny: dict[int, tuple[int, int]]
    seconds: float


def find_photos(root: str | os.PathLike, split_file: str | os.PathLike | None = None) -> Photos:
    """The photos of ``root``: its class folders, or those of its own train/ val/ (test/) folders (each photo's
    side then is its folder's role); ``split_file`` (a run's split.json, paths relative to ``root``) gives the
    sides of a folder split by training."""
    root = Path(root)
    dirs = find_split_dirs(root) if root.is_dir() else {}
    if dirs:
        classes: list[str] | None = None
        samples: list[tuple[Path, int]] = []
        roles: list[str | None] = []
        for role, folder in dirs.items():
            found, part = scan_class_folders(folder)
            if classes is not None:
                check_same_classes(classes, found, str(folder), f"{dirs['train']}")
            classes = found
            samples += part
            roles += [role] * len(part)
        sides: list[str | None] | None = roles
    else:
        classes, samples = scan_class_folders(root)
        sides = None
    if split_file is not None:
        split = load_split(split_file)
        side_of = {**dict.fromkeys(split["train"], "train"), **dict.fromkeys(split["val"], "val")}
        sides = [side_of.get(p.relative_to(root).as_posix()) for p, _ in samples]
        if not any(sides):
            raise ValueError(f"split file {split_file} names none of the photos of {root} (paths relative to "
                             f"{split.get('root', 'its folder')})")
    return Photos(root, [p for p, _ in samples], np.array([y for _, y in samples]),
                  list(classes or ()), sides)  # (classes is set: dirs names at least one folder)


def check_photos(photos: Photos, *, image_size: int, batch_size: int, folds: int, progress: bool) -> CheckResult:
    """Run every check on ``photos`` (features, hashes, cross-validation: the module docstring)."""
    started = time.perf_counter()
    log.info("%s: %d photos in %d classes; features of EfficientNet-Lite0 (ImageNet) at %d px", photos.root,
             len(photos.paths), len(photos.classes), image_size)
    feats, ok, unreadable = trunk_features(photos.paths, image_size, batch_size, progress)
    hashes = hash_files(photos.paths)
    pairs = find_duplicates(feats, ok, hashes, photos.labels.tolist(), photos.sides)
    issues = None
    readable = np.flatnonzero(ok)
    labels = photos.labels[readable]
    if len(np.unique(labels)) == len(photos.classes):
        probs = out_of_sample_probabilities(feats[readable], labels, folds)
        if probs is not None:
            issues = [LabelIssue(int(readable[x.index]), x.given, x.suggested, x.score)
                      for x in label_issues(probs, labels)]
    if issues is None:
        log.warning("likely wrong labels not looked for: every class needs 2 or more readable photos")
    return CheckResult(photos, pairs, issues, unreadable, tiny_photos(photos.paths, ok),
                       time.perf_counter() - started)
