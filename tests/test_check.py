"""vit-flowers check on made-up folders with planted problems, the cheap hashes, and the split that keeps
duplicates together (issue 36)."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_flowers import check
from vit_flowers.checking.check_files import DUPLICATES_CSV, LABELS_CSV, REPORT_HTML, flagged_files
from vit_flowers.checking.moves import MOVED_CSV
from vit_flowers.checking.photo_check import find_duplicates, find_photos, label_issues
from vit_flowers.data.duplicates import (
    HASH_BITS,
    HASH_NEAR_BITS,
    FileHashes,
    duplicate_groups,
    hash_files,
    image_hash,
    near_pairs,
    union_groups,
)
from vit_flowers.data.splits import folder_samples, keep_groups_together, load_split
from vit_flowers.data.synthetic import CLASSES, make_synthetic_flowers

SIZE = 128  # px of the made-up photos
PER_CLASS = 40  # 200 distinct photos


def _images(per_class: int, seed: int) -> list[tuple[Image.Image, str]]:
    images, labels = make_synthetic_flowers(per_class, SIZE, seed=seed)
    return [(Image.fromarray(im.permute(1, 2, 0).numpy()), CLASSES[int(y)]) for im, y in zip(images, labels)]


def _jpeg(img: Image.Image, path: Path, quality: int = 95) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, "JPEG", quality=quality)


def _plant(root: Path) -> dict[str, list]:
    """200 distinct photos with copies planted: what a check must find (paths relative to ``root``)."""
    photos = _images(PER_CLASS, seed=3)
    names = []
    for i, (img, cls) in enumerate(photos):
        names.append(f"{cls}/p{i:03d}.jpg")
        _jpeg(img, root / names[-1])
    other = {c: CLASSES[(CLASSES.index(c) + 1) % len(CLASSES)] for c in CLASSES}  # a wrong class for each
    plants: dict[str, list] = {"exact": [], "near": [], "across": [], "swapped": []}

    def plant(kind: str, i: int, new: str, image: Image.Image | None = None, quality: int = 95) -> None:
        if image is None:
            shutil.copyfile(root / names[i], root / new)  # the same bytes, another name
        else:
            _jpeg(image, root / new, quality)
        plants[kind].append((names[i], new))

    cls = [c for _, c in photos]
    for i in (0, 1):
        plant("exact", i, f"{cls[i]}/renamed_{i}.jpg")
    plant("across", 2, f"{other[cls[2]]}/stray_2.jpg")  # byte-identical, filed under two classes
    plant("across", 3, f"{other[cls[3]]}/stray_3.jpg", photos[3][0], quality=60)  # re-encoded, another class
    for i in (4, 5, 6):
        plant("near", i, f"{cls[i]}/q40_{i}.jpg", photos[i][0], quality=40)
    for i, side in ((7, 96), (8, 96), (9, 192), (10, 256)):
        plant("near", i, f"{cls[i]}/resized_{i}.jpg", photos[i][0].resize((side, side), Image.Resampling.BICUBIC))
    for i in (11, 12, 13):
        cut = int(SIZE * 0.04)  # 4% off every side
        plant("near", i, f"{cls[i]}/cropped_{i}.jpg", photos[i][0].crop((cut, cut, SIZE - cut, SIZE - cut)))
    for i in range(100, 190, 9):  # ten photos of every class filed under a wrong class
        moved = f"{other[cls[i]]}/p{i:03d}.jpg"
        (root / names[i]).rename(root / moved)
        plants["swapped"].append(moved)
    return plants


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _listing(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> tuple[Path, Path, dict[str, list], dict[str, bytes]]:
    """(photos, check output, what was planted, the photos' files before the check): one check for the module."""
    base = tmp_path_factory.mktemp("check")
    root, out = base / "photos", base / "out"
    plants = _plant(root)
    before = _listing(root)
    assert check.main([str(root), "--output", str(out), "--quiet"]) == 0
    return root, out, plants, before


def _pairs(out: Path) -> dict[frozenset, dict[str, str]]:
    return {frozenset((r["path_a"], r["path_b"])): r for r in _read(out / DUPLICATES_CSV)}


def test_check_finds_every_identical_and_cross_class_duplicate(checked):
    _, out, plants, _ = checked
    pairs = _pairs(out)
    for a, b in plants["exact"] + plants["across"]:
        assert frozenset((a, b)) in pairs, (a, b)
    assert all(pairs[frozenset(p)]["match"] == "bytes" for p in plants["exact"])
    assert {pairs[frozenset(p)]["kind"] for p in plants["across"]} == {"across_classes"}
    assert {pairs[frozenset(p)]["kind"] for p in plants["exact"]} == {"within_class"}


def test_check_finds_re_encoded_resized_and_cropped_copies(checked):
    _, out, plants, _ = checked
    pairs = _pairs(out)
    found = [frozenset(p) in pairs for p in plants["near"]]
    assert sum(found) >= 0.9 * len(found), [p for p, f in zip(plants["near"], found) if not f]


def test_check_lists_no_false_duplicate(checked):
    _, out, plants, _ = checked
    planted = {frozenset(p) for kind in ("exact", "near", "across") for p in plants[kind]}
    assert set(_pairs(out)) <= planted  # every listed pair is a planted one: distinct drawings never pair up


def test_check_ranks_label_swaps_near_the_top(checked):
    _, out, plants, _ = checked
    rows = _read(out / LABELS_CSV)
    assert list(rows[0]) == ["path", "given_label", "suggested_label", "score"]
    top = [r["path"] for r in rows[:20]]
    assert sum(p in top for p in plants["swapped"]) >= 0.6 * len(plants["swapped"]), top
    scores = [float(r["score"]) for r in rows]
    assert scores == sorted(scores, reverse=True)
    by_path = {r["path"]: r for r in rows}
    for path in plants["swapped"]:  # a swap's suggestion is the class it was drawn as
        if path in by_path:
            assert CLASSES[(CLASSES.index(by_path[path]["suggested_label"]) + 1) % 5] == path.split("/")[0]


def test_check_report_is_self_contained_and_nothing_moved(checked):
    root, out, _, before = checked
    page = (out / REPORT_HTML).read_text()
    assert "data:image/jpeg;base64," in page
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<link" not in page
    assert page.count("<img") >= 2 * min(len(_pairs(out)), 150)
    assert _listing(root) == before  # a check never moves, renames or deletes a photo


def test_check_refuses_an_output_that_holds_a_check(checked, caplog):
    root, out, _, _ = checked
    report = (out / REPORT_HTML).read_bytes()
    assert check.main([str(root), "--output", str(out), "--quiet"]) == 1
    assert "already holds a check" in caplog.text and "--overwrite" in caplog.text
    assert (out / REPORT_HTML).read_bytes() == report


def test_move_to_quarantine_and_undo(checked, tmp_path):
    root, out, plants, before = checked
    photos = tmp_path / "photos"
    shutil.copytree(root, photos)
    quarantine = tmp_path / "q"
    assert check.main([str(photos), "--from", str(out), "--move-to", str(quarantine), "--quiet"]) == 0
    moved = _read(quarantine / MOVED_CSV)
    flagged = flagged_files(out).moves
    assert len(moved) == len(flagged) > 0
    for rel in flagged:  # gone from the folder, in the quarantine under the same class folder
        assert not (photos / rel).exists() and (quarantine / rel).read_bytes() == before[rel]
    for a, _ in plants["exact"]:  # of a pair, the first photo stays
        assert (photos / a).exists()
    assert check.main(["--undo", str(quarantine / MOVED_CSV), "--quiet"]) == 0
    assert _listing(photos) == before
    assert not (quarantine / MOVED_CSV).exists() and not any(quarantine.iterdir())


def test_move_to_names_what_is_missing(tmp_path, caplog):
    (tmp_path / "photos").mkdir()
    assert check.main([str(tmp_path / "photos"), "--from", str(tmp_path / "nowhere"), "--move-to",
                       str(tmp_path / "q")]) == 1
    assert str(tmp_path / "nowhere" / DUPLICATES_CSV) in caplog.text


# ------------------------------------------------------------------------------------------ pieces, no network


def test_pairs_are_marked_across_the_split_when_sides_are_given():
    feats = np.eye(4, dtype=np.float32)
    feats[1] = feats[0]  # 0 and 1 the same picture, 2 and 3 distinct
    none = FileHashes([f"{i}" for i in range(4)], np.zeros((4, HASH_BITS), bool), np.zeros(4, bool))
    ok = np.ones(4, bool)
    assert [(p.a, p.b, p.kind) for p in find_duplicates(feats, ok, none, [0, 0, 1, 1])] == [(0, 1, "within_class")]
    pairs = find_duplicates(feats, ok, none, [0, 0, 1, 1], ["train", "val", "train", "val"])
    assert [(p.a, p.b, p.kind, p.match) for p in pairs] == [(0, 1, "across_split", "features")]
    assert find_duplicates(feats, ok, none, [0, 1, 1, 1], ["train", "val", None, None])[0].kind == "across_classes"


def test_label_issues_flag_confident_disagreement_only():
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.95, 0.05], [0.2, 0.8], [0.45, 0.55]])
    labels = np.array([0, 0, 0, 1, 1, 1])  # photo 3 looks like class 0 with confidence; photo 5 is a coin toss
    issues = label_issues(probs, labels)
    assert [(x.index, x.given, x.suggested) for x in issues] == [(3, 1, 0), (2, 0, 1)]
    assert issues[0].score == pytest.approx(0.9)


def test_find_photos_takes_the_sides_from_a_split_file(tmp_path):
    for cls in ("a", "b"):
        for i in range(2):
            _jpeg(Image.new("RGB", (8, 8), (i * 90, 0, 0)), tmp_path / cls / f"{i}.jpg")
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": ["a/0.jpg", "b/0.jpg"], "val": ["a/1.jpg"]}))
    photos = find_photos(tmp_path, split)
    assert dict(zip(map(photos.rel, range(4)), photos.sides)) == {"a/0.jpg": "train", "a/1.jpg": "val",
                                                                   "b/0.jpg": "train", "b/1.jpg": None}
    split.write_text(json.dumps({"train": ["elsewhere/0.jpg"], "val": []}))
    with pytest.raises(ValueError, match="names none of the photos"):
        find_photos(tmp_path, split)


def test_find_photos_takes_the_sides_from_train_and_val_folders(tmp_path):
    for side in ("train", "val"):
        for cls in ("a", "b"):
            _jpeg(Image.new("RGB", (8, 8), "red"), tmp_path / side / cls / "0.jpg")
    photos = find_photos(tmp_path)
    assert photos.classes == ["a", "b"] and photos.labels.tolist() == [0, 1, 0, 1]
    assert dict(zip(map(photos.rel, range(4)), photos.sides)) == {"train/a/0.jpg": "train", "train/b/0.jpg": "train",
                                                                   "val/a/0.jpg": "val", "val/b/0.jpg": "val"}


def test_pixel_hash_matches_copies_and_leaves_flat_images_alone():
    (img, _), (other, _) = _images(1, seed=9)[:2]
    buffer = io.BytesIO()
    img.save(buffer, "JPEG", quality=40)
    variants = [img, Image.open(buffer).convert("RGB"), img.resize((64, 64)), other,
                Image.new("RGB", (50, 50), "red"), Image.new("RGB", (50, 50), "blue")]
    hashes = [image_hash(v) for v in variants]
    assert hashes[4] is None and hashes[5] is None  # flat: no pixel hash, so never a match
    bits = np.array([h if h is not None else np.zeros(HASH_BITS, bool) for h in hashes])
    pairs = {(i, j) for i, j, _ in near_pairs(bits, np.array([h is not None for h in hashes]))}
    assert pairs == {(0, 1), (0, 2), (1, 2)}


def test_duplicate_groups_leave_blank_images_alone(tmp_path):
    (img, _), = _images(1, seed=9)[:1]
    for name in ("a.png", "b.png"):
        img.save(tmp_path / name)
        Image.new("RGB", (20, 14), "red").save(tmp_path / f"blank_{name}")  # byte-identical placeholders
    assert duplicate_groups(hash_files(sorted(tmp_path.iterdir()))) == [[0, 1]]


def test_union_groups_joins_chains():
    assert union_groups(6, [(4, 1), (1, 3), (0, 5)]) == [[0, 5], [1, 3, 4]]
    assert union_groups(3, []) == []


def test_keep_groups_together_moves_a_straddling_group_to_its_majority_side():
    train, val = [0, 1, 2, 5, 6], [3, 4, 7]
    assert keep_groups_together(train, val, []) == (train, val, [])
    new_train, new_val, moved = keep_groups_together(train, val, [[0, 3, 4], [1, 7], [2, 5]])
    assert moved == [[0, 3, 4], [1, 7]]  # 2 of 3 in val: to val; a tie: to train; [2, 5] already together
    assert (new_train, new_val) == ([1, 2, 5, 6, 7], [0, 3, 4])


def test_split_keeps_duplicates_on_one_side_and_records_them(tmp_path):
    photos = _images(6, seed=4)  # 30 distinct photos
    for i, (img, cls) in enumerate(photos):
        _jpeg(img, tmp_path / cls / f"p{i:02d}.jpg")
    for i, (img, cls) in enumerate(photos[:10]):  # ten of them twice: a copy and a half-size re-encode
        shutil.copyfile(tmp_path / cls / f"p{i:02d}.jpg", tmp_path / cls / f"copy{i:02d}.jpg")
        _jpeg(img.resize((64, 64)), tmp_path / cls / f"small{i:02d}.jpg", quality=50)
    for seed in range(4):
        found = folder_samples(tmp_path, 0.4, seed)
        val = {p.name for p, _ in found.val}
        for i in range(10):
            sides = {f"{n}{i:02d}.jpg" in val for n in ("p", "copy", "small")}
            assert len(sides) == 1, (seed, i)
        assert found.split["duplicates"]["groups"] == 10 and found.split["duplicates"]["photos"] == 30


def test_old_split_files_without_duplicates_still_load(tmp_path):
    for i, (img, cls) in enumerate(_images(2, seed=4)):
        _jpeg(img, tmp_path / "photos" / cls / f"p{i}.jpg")
    split = folder_samples(tmp_path / "photos", 0.5, 0).split
    del split["duplicates"]  # as written before issue 36
    (tmp_path / "split.json").write_text(json.dumps(split))
    found = folder_samples(tmp_path / "photos", 0.5, 0, tmp_path / "split.json")
    assert [p.relative_to(tmp_path / "photos").as_posix() for p, _ in found.val] == split["val"]
    assert "duplicates" not in load_split(tmp_path / "split.json")


def test_a_training_run_keeps_copies_together_and_its_report_says_so(tmp_path):
    from helpers import smoke_config, write_class_folders

    from vit_flowers.train import train

    photos = write_class_folders(tmp_path / "photos", per_class=5, classes=["daisy", "rose"])
    for cls in ("daisy", "rose"):
        shutil.copyfile(photos / cls / "img_000.png", photos / cls / "copy.png")
    run = train(smoke_config(tmp_path, dataset="folder", data=str(photos), epochs=1, run_name="r")).run_dir
    split = load_split(run / "split.json")
    assert split["duplicates"]["groups"] == 2
    for cls in ("daisy", "rose"):
        assert (f"{cls}/copy.png" in split["val"]) == (f"{cls}/img_000.png" in split["val"])
    assert "2 groups of duplicate photos (4 photos)" in (run / "report" / "report.md").read_text()
    assert "vit-flowers check" in (run / "report" / "report.html").read_text()


def test_the_training_report_points_to_check():
    from vit_flowers.reporting.report import _details
    from vit_flowers.training.run_end import data_check_info

    assert data_check_info({"train": []}, "photos") == {}  # a run from before issue 36: nothing said
    info = data_check_info({"duplicates": {"groups": 3, "photos": 7, "moved_groups": 1, "moved_photos": 1}},
                           "photos")
    line = dict(_details(info))["Duplicates in the data"]
    assert line.startswith("3 groups of duplicate photos (7 photos)") and "vit-flowers check photos" in line


# ------------------------------------------------------------------------------------------ the real photos

KNOWN_PAIRS = [("daisy/10993710036_2033222c91.jpg", "daisy/10993818044_4c19b86c82.jpg"),
               ("tulip/7166552648_28b6dce578.jpg", "tulip/7166552648_28b6dce578_n.jpg"),
               # the same photo re-coloured by a filter, and in grey (looked at)
               ("rose/12406418663_af20dc225f_n.jpg", "rose/12407768513_3440238148_n.jpg"),
               ("rose/13279526615_a3b0059bec.jpg", "rose/13342823005_16d3df58df_n.jpg")]


def test_the_known_flowers5_pairs_are_grouped(flowers5_dir):
    files = [flowers5_dir / name for pair in KNOWN_PAIRS for name in pair]
    files += sorted(set((flowers5_dir / "rose").iterdir()) - set(files))[:40]  # distinct photos beside them
    assert duplicate_groups(hash_files(files)) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_a_crowd_of_alike_photos_lists_each_photos_closest_copies_only():
    """300 photos that all look alike (a burst, or made-up test photos) would make 44,850 pairs: each photo keeps
    its MAX_PAIRS_PER_PHOTO closest later ones, the closest first, and the crowd stays one group."""
    from vit_flowers.data.duplicates import MAX_PAIRS_PER_PHOTO

    rng = np.random.default_rng(0)
    n = 300
    bits = np.repeat(rng.random((1, HASH_BITS)) < 0.5, n, axis=0)
    for i in range(n):  # photo i differs from the first in i % 20 bits: distances of 0 to 38 between them
        bits[i, : i % 20] ^= True
    pairs = near_pairs(bits, np.ones(n, bool))
    per_photo = np.bincount([i for i, _, _ in pairs], minlength=n)
    assert per_photo.max() == MAX_PAIRS_PER_PHOTO and len(pairs) <= MAX_PAIRS_PER_PHOTO * n
    assert all(i < j for i, j, _ in pairs)
    first = sorted(d for i, _, d in pairs if i == 0)  # photo 0's closest: 14 later copies at distance 0
    assert first == [0] * MAX_PAIRS_PER_PHOTO
    assert union_groups(n, [(i, j) for i, j, _ in pairs]) == [list(range(n))]
    feats = np.tile(rng.normal(size=(1, 8)), (n, 1)) + rng.normal(scale=1e-3, size=(n, 8))
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    found = find_duplicates(feats.astype(np.float32), np.ones(n, bool), FileHashes([None] * n, bits, np.zeros(n, bool)),
                            [0] * n)
    assert MAX_PAIRS_PER_PHOTO * (n - MAX_PAIRS_PER_PHOTO) <= len(found) <= MAX_PAIRS_PER_PHOTO * n


def _near_pairs_all_at_once(bits: np.ndarray, valid: np.ndarray, max_bits: int) -> set[tuple[int, int, int]]:
    """What near_pairs found before #53 (every hash against every other, no cap needed here): the reference."""
    index = np.flatnonzero(valid)
    dist = (bits[index][:, None, :] != bits[index][None, :, :]).sum(-1)
    return {(int(index[i]), int(index[j]), int(dist[i, j])) for i, j in zip(*np.nonzero(dist <= max_bits)) if i < j}


@pytest.mark.parametrize("block_entries", [1, 97, 5_000, 1 << 24])
def test_near_pairs_in_bounded_blocks_find_the_pairs_of_every_hash_against_every_other(block_entries):
    """The split's near-duplicate search goes a bounded block of rows at a time against the later hashes (#53: it
    held 2,048 rows against every photo, 3 GB at 100,000 photos): blocks of one row, of odd sizes and of all at once
    find the same pairs and distances as every hash compared with every other, at the threshold's edge (32 and
    33 bits apart) too, with unhashed photos left out, and the same groups."""
    rng = np.random.default_rng(53)
    base = rng.random((60, HASH_BITS)) < 0.5
    copies = []
    for k, flips in enumerate([0, 1, 5, 16, 31, 32, 33, 34, 40, 2, 0, 32]):  # copies of photos 0..11, so far apart
        copy = base[k].copy()
        copy[rng.choice(HASH_BITS, flips, replace=False)] ^= True
        copies.append(copy)
    bits = np.concatenate([base, np.array(copies), base[:3]])  # and photos 0-2 twice more: groups of three
    valid = np.ones(len(bits), bool)
    valid[[7, 64]] = False  # no pixel hash (a flat image): never paired
    found = near_pairs(bits, valid, block_entries=block_entries)
    assert len(found) == len(set(found)) and all(i < j for i, j, _ in found)
    expected = _near_pairs_all_at_once(bits, valid, HASH_NEAR_BITS)
    assert set(found) == expected
    assert {(k, 60 + k) for k in (0, 1, 2, 3, 5, 9, 10, 11)} <= {(i, j) for i, j, _ in expected}  # (64: unhashed)
    assert (6, 66, 33) not in expected and (5, 65, 32) in expected  # the threshold's edge
    pairs = [(i, j) for i, j, _ in found]
    assert union_groups(len(bits), pairs) == union_groups(len(bits), [(i, j) for i, j, _ in expected])


def test_a_crowd_of_alike_photos_is_left_where_the_split_put_it(tmp_path, caplog):
    """Two classes of 25 byte-identical copies each: moved whole, each group would empty the val side (20,000
    made-up photos did exactly that: 'no images to load for val'). Groups over MAX_GROUP photos stay where the
    stratified split put them, with a warning naming the command that lists them."""
    import logging

    from vit_flowers.data.splits import MAX_GROUP

    for img, cls in _images(1, seed=5)[:2]:
        _jpeg(img, tmp_path / cls / "p00.jpg")
        for k in range(1, MAX_GROUP + 5):
            shutil.copyfile(tmp_path / cls / "p00.jpg", tmp_path / cls / f"p{k:02d}.jpg")
    with caplog.at_level(logging.WARNING):
        found = folder_samples(tmp_path, 0.2, 0)
    assert len(found.val) == 10 and len(found.train) == 40
    assert f"2 groups of more than {MAX_GROUP} alike photos (50 photos) left where the split put them" in caplog.text
    assert f"vit-flowers check {tmp_path}" in caplog.text
