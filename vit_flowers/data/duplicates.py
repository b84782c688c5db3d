"""Cheap content hashes of photos, and groups of duplicates: what the train/val split and `vit-flowers check` share.

Two hashes per file: the SHA-256 of its bytes (byte-identical copies, whatever their names) and a perceptual
hash of its pixels (:func:`image_hash`: the same photo re-encoded, resized or cropped a little). Decoding for
the pixel hash asks libjpeg for a reduced-scale decode (``load_image``'s draft), so a folder of a few
thousand photos hashes in seconds; no network runs. :func:`near_pairs` compares the pixel hashes in blocks of
bounded size (a matrix product of the bits as +-1) and :func:`union_groups` joins pairs into groups (union-find).

    hashes = hash_files(paths)                               # FileHashes: sha256 and pixel hash per file
    groups = duplicate_groups(hashes)                        # [[0, 7], [12, 13, 40], ...] indices into paths
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from .image_files import DECODE_THREADS, ImageLoadError, load_image

__all__ = ["HASH_SIDE", "HASH_BITS", "HASH_NEAR_BITS", "MIN_HASH_CONTRAST", "FileHashes", "file_sha256",
           "image_hash", "hash_files", "MAX_PAIRS_PER_PHOTO", "NEAR_BLOCK_ENTRIES", "closest_later", "near_pairs",
           "exact_pairs", "union_groups", "duplicate_groups"]

# The pixel hash is a perceptual hash (pHash): the signs, against their median, of the lowest HASH_SIDE x
# HASH_SIDE frequencies of a 64 x 64 grey thumbnail's DCT (whole image, squashed), its constant term left out.
# Low frequencies survive re-encoding and resizing, and move little with a crop of a few percent; a difference
# hash of neighbouring cells flipped a fifth of its bits on a resize of textured made-up photos.
HASH_SIDE: int = 16
_THUMB = 64
HASH_BITS: int = HASH_SIDE * HASH_SIDE - 1
# At most this many of the 255 bits may differ between two copies of one photo. Measured on 200 flowers5 photos
# (benchmarks/HISTORY.md, "Checking photos (#36)"): JPEG re-encodes at quality 30-95 differ by at most 16, half-size
# copies by at most 26, while the closest distinct photos of flowers5 differ by 34 or more (burst shots of one
# flower), most by over 60. Crops move the hash further (2% off each side: 30-50): the network's features find those.
HASH_NEAR_BITS: int = 32
# A thumbnail whose grey levels span less than this (0-255) is nearly flat: its hash is noise, and two flat
# images would match however different. Such images are left to the byte hash.
MIN_HASH_CONTRAST: float = 12.0
_DCT = np.cos(np.pi * (2 * np.arange(_THUMB)[None, :] + 1) * np.arange(HASH_SIDE)[:, None] / (2 * _THUMB))
_CHUNK = 1 << 20  # bytes read at a time for the SHA-256


@dataclass
class FileHashes:
    """Per file: the SHA-256 hex digest of its bytes (None when unreadable) and its pixel hash, HASH_BITS bools
    (all False when it could not be decoded or is flat: ``has_image_hash`` says which)."""

    sha256: list[str | None]
    bits: np.ndarray  # (N, HASH_BITS) bool
    has_image_hash: np.ndarray  # (N,) bool

    def __len__(self) -> int:
        return len(self.sha256)


def file_sha256(path: str | os.PathLike) -> str | None:
    """The SHA-256 of a file's bytes, or None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def image_hash(img: Image.Image) -> np.ndarray | None:
    """The perceptual hash of an RGB image: (HASH_BITS,) bool; None for a nearly flat image."""
    grey = np.asarray(img.convert("L").resize((_THUMB, _THUMB), Image.Resampling.BOX), dtype=np.float64)
    if np.ptp(grey) < MIN_HASH_CONTRAST:
        return None
    low = (_DCT @ grey @ _DCT.T).ravel()[1:]  # (HASH_BITS,) the lowest frequencies, the mean (DC) left out
    return low > np.median(low)


def _hash_one(path: Path) -> tuple[str | None, np.ndarray | None]:
    try:
        bits = image_hash(load_image(path, min_size=_THUMB))  # a reduced-scale JPEG decode: ~1 ms a photo
    except ImageLoadError:
        bits = None
    return file_sha256(path), bits


def hash_files(paths: Sequence[str | os.PathLike], num_threads: int | None = None) -> FileHashes:
    """Both hashes of every file, decoded on ``num_threads`` threads (default DECODE_THREADS); unreadable files
    get None / no pixel hash and never stop it."""
    bits = np.zeros((len(paths), HASH_BITS), dtype=bool)
    has = np.zeros(len(paths), dtype=bool)
    sha: list[str | None] = []
    with ThreadPoolExecutor(max_workers=num_threads or DECODE_THREADS) as pool:
        for i, (digest, b) in enumerate(pool.map(_hash_one, map(Path, paths))):
            sha.append(digest)
            if b is not None:
                bits[i], has[i] = b, True
    return FileHashes(sha, bits, has)


def exact_pairs(sha256: Sequence[str | None]) -> list[tuple[int, int]]:
    """(i, j), i < j, of every two files with the same bytes (each file of a group paired with its first)."""
    first: dict[str, int] = {}
    pairs = []
    for i, digest in enumerate(sha256):
        if digest is None:
            continue
        if digest in first:
            pairs.append((first[digest], i))
        else:
            first[digest] = i
    return pairs


# a photo's closest copies listed: a burst of 1,000 alike shots gives 10,000 pairs, not 500,000
MAX_PAIRS_PER_PHOTO = 10


def closest_later(near: np.ndarray, closeness: np.ndarray, start: int,
                  limit: int = MAX_PAIRS_PER_PHOTO) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns) of a block's pairs: row ``r`` (item ``start + r``) with the columns after it where ``near``
    holds, at most ``limit`` a row, the highest ``closeness`` first. Pairs thus come once each, never an item with
    itself, and a folder of many alike photos stays linear in pairs and memory; each photo is still paired with
    its closest copies, so the groups they join (union-find) stay whole."""
    later = np.arange(near.shape[1])[None, :] > (start + np.arange(near.shape[0]))[:, None]
    return _closest(near & later, closeness, limit)


def _closest(near: np.ndarray, closeness: np.ndarray, limit: int = MAX_PAIRS_PER_PHOTO,
             ) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns) where ``near`` holds, at most ``limit`` a row, the highest ``closeness`` first (``near`` is
    changed: the caller's own copy)."""
    crowded = np.flatnonzero(near.sum(axis=1) > limit)
    if len(crowded):
        score = np.where(near[crowded], closeness[crowded], -np.inf)
        top = np.argpartition(-score, limit - 1, axis=1)[:, :limit]  # each crowded row's `limit` closest
        near[crowded] = False
        near[crowded[:, None], top] = True
    rows, columns = np.nonzero(near)
    return rows, columns


# entries of one block of near_pairs' comparisons at once (64 MB of float32), whatever the number of photos
NEAR_BLOCK_ENTRIES = 1 << 24


def near_pairs(bits: np.ndarray, valid: np.ndarray, max_bits: int = HASH_NEAR_BITS,
               block_entries: int = NEAR_BLOCK_ENTRIES) -> list[tuple[int, int, int]]:
    """(i, j, differing bits), i < j, of valid pixel hashes at most ``max_bits`` apart, each hash with its
    :data:`MAX_PAIRS_PER_PHOTO` closest later ones (:func:`closest_later`). With the bits as +-1, two hashes of
    ``B`` bits that agree on ``x . y`` more bits than they differ on are ``(B - x . y) / 2`` apart: a block of rows
    against the hashes after them is one matrix product (BLAS, on every core; exact in float32, whose integers go to
    2**24), of at most ``block_entries`` entries, so memory stays flat in the number of photos (100,000 photos: the
    hashes as float32, 100 MB, and 64 MB blocks; they were 2,048 rows against every photo, 3 GB)."""
    index = np.flatnonzero(valid)
    signs = np.where(bits[index], np.float32(1), np.float32(-1))  # (M, B)
    n_bits, out, start = bits.shape[1], [], 0
    while start < len(index):
        rows = max(1, min(len(index) - start, block_entries // (len(index) - start)))
        agree = signs[start:start + rows] @ signs[start:].T  # (rows, M - start): rows against themselves and later
        near = agree >= n_bits - 2 * max_bits
        near[:, :rows] &= np.triu(np.ones((rows, rows), bool), 1)  # column c is item start + c: the later ones
        hit = np.flatnonzero(near.any(axis=1))  # (few rows have a pair: the rest are skipped at once)
        a, b = _closest(near[hit], agree[hit])
        out += [(int(index[start + hit[i]]), int(index[start + j]), int(n_bits - agree[hit[i], j]) // 2)
                for i, j in zip(a, b)]
        start += rows
    return out


def union_groups(n: int, pairs: Iterable[tuple[int, int]]) -> list[list[int]]:
    """Connected components of ``pairs`` over 0..n-1 with two or more members (union-find), each sorted, in
    order of their first member."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving keeps the trees flat
            i = parent[i]
        return i

    for i, j in pairs:
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    members: dict[int, list[int]] = {}
    for i in range(n):
        members.setdefault(root(i), []).append(i)
    return sorted((m for m in members.values() if len(m) > 1), key=lambda m: m[0])


def duplicate_groups(hashes: FileHashes, max_bits: int = HASH_NEAR_BITS) -> list[list[int]]:
    """Groups of photos that are byte-identical or whose pixel hashes are at most ``max_bits`` apart. Files
    without a pixel hash (unreadable, or a flat colour: a placeholder, not a photo) are left out, so that a folder
    of blank test images is not one group with nothing left to validate on."""
    sha = [digest if ok else None for digest, ok in zip(hashes.sha256, hashes.has_image_hash)]
    pairs = exact_pairs(sha) + [(i, j) for i, j, _ in near_pairs(hashes.bits, hashes.has_image_hash, max_bits)]
    return union_groups(len(hashes), pairs)
