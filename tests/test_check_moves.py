"""`check --move-to` and `--undo` on hand-edited CSVs: every row is checked before anything moves, the quarantine
stays outside the photos, links out of a class folder are never followed, and a refused move leaves every file as
it was (#45). The CSVs are written here, as a user edits them: no features are computed."""

from __future__ import annotations

import csv
import hashlib
import logging
from pathlib import Path

import pytest
from helpers import write_class_folders

from vit_flowers import check
from vit_flowers.checking.check_files import DUPLICATES_CSV, LABELS_CSV
from vit_flowers.checking.moves import MOVED_CSV
from vit_flowers.checking.photo_check import find_photos


def _sha256(*folders: Path) -> dict[str, str]:
    """{path: sha256} of every file below ``folders`` (links as the bytes they lead to, or as where they point)."""
    out = {}
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.is_symlink():
                out[str(p)] = "link -> " + str(p.readlink())
            elif p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _write_check(out: Path, labels: list[str], duplicates: list[tuple[str, str]] = ()) -> Path:
    """A check's two CSVs as a user leaves them: ``labels`` in label_issues.csv, ``duplicates`` as pairs."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LABELS_CSV, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("path", "given_label", "suggested_label", "score"))
        writer.writerows((p, p.split("/")[0], "tulip", "0.5") for p in labels)
    with open(out / DUPLICATES_CSV, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("path_a", "path_b", "kind", "similarity", "match"))
        writer.writerows((a, b, "within_class", "1.0", "bytes") for a, b in duplicates)
    return out


@pytest.fixture
def photos(tmp_path) -> Path:
    """tmp/photos/<5 classes>/img_00{0,1}.png, a file outside it (tmp/outside/secret.png), a folder link from rose
    into daisy and a file link from rose to the outside file."""
    root = write_class_folders(tmp_path / "photos", per_class=2)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.png").write_bytes((root / "rose" / "img_000.png").read_bytes())
    (root / "rose" / "daisy-link").symlink_to("../daisy", target_is_directory=True)
    (root / "rose" / "secret-link.png").symlink_to(tmp_path / "outside" / "secret.png")
    return root


def _move(photos: Path, out: Path, quarantine: Path) -> int:
    return check.main([str(photos), "--from", str(out), "--move-to", str(quarantine), "--quiet"])


def _undo_finds_everything_where_it_was(photos: Path, quarantine: Path, before: dict[str, str], caplog) -> None:
    """A refused move: nothing was made to undo, and every file is as it was (sha256)."""
    caplog.clear()
    assert check.main(["--undo", str(quarantine / MOVED_CSV), "--quiet"]) == 1
    assert "nothing to undo" in caplog.text and "--output" not in caplog.text
    assert _sha256(photos, photos.parent / "outside") == before
    assert not quarantine.exists()


@pytest.mark.parametrize("row", ["rose/../../outside/secret.png", "../outside/secret.png", "ABSOLUTE",
                                 "rose/daisy-link/img_000.png", "rose/secret-link.png"])
def test_a_row_outside_the_photos_is_refused_before_anything_moves(photos, tmp_path, caplog, row):
    """A row that leads outside PHOTOS (by .., as an absolute path, or through a link out of its class folder)
    refuses the whole move, the good rows too; `--undo` then finds everything where it was."""
    row = str(tmp_path / "outside" / "secret.png") if row == "ABSOLUTE" else row
    out = _write_check(tmp_path / "chk", ["daisy/img_001.png", row], [("tulip/img_000.png", "tulip/img_001.png")])
    before = _sha256(photos, tmp_path / "outside")
    quarantine = tmp_path / "q"
    assert _move(photos, out, quarantine) == 1
    assert "nothing was moved" in caplog.text and row in caplog.text
    _undo_finds_everything_where_it_was(photos, quarantine, before, caplog)


def test_a_row_whose_destination_is_its_own_source_is_refused(photos, tmp_path, caplog):
    """A quarantine that holds a link to the photo a row moves: moving it would move the photo onto itself."""
    quarantine = tmp_path / "q"
    (quarantine / "rose").mkdir(parents=True)
    (quarantine / "rose" / "img_000.png").symlink_to(photos / "rose" / "img_000.png")
    out = _write_check(tmp_path / "chk", ["rose/img_000.png"])
    before = _sha256(photos, tmp_path / "outside")
    assert _move(photos, out, quarantine) == 1
    assert "same file" in caplog.text and "nothing was moved" in caplog.text
    assert _sha256(photos, tmp_path / "outside") == before and not (quarantine / MOVED_CSV).exists()


def test_a_destination_through_a_link_out_of_the_quarantine_is_refused(photos, tmp_path, caplog):
    quarantine = tmp_path / "q"
    quarantine.mkdir()
    (quarantine / "rose").symlink_to(photos / "tulip", target_is_directory=True)  # rose's suspects into tulip
    out = _write_check(tmp_path / "chk", ["rose/img_000.png"])
    before = _sha256(photos, tmp_path / "outside")
    assert _move(photos, out, quarantine) == 1
    assert "outside the quarantine" in caplog.text
    assert _sha256(photos, tmp_path / "outside") == before


@pytest.mark.parametrize("inside", ["quarantine", "rose/q", "."])
def test_a_quarantine_inside_the_photos_is_refused(photos, tmp_path, caplog, inside):
    out = _write_check(tmp_path / "chk", ["daisy/img_001.png"])
    before = _sha256(photos, tmp_path / "outside")
    assert _move(photos, out, photos / inside) == 1
    assert "choose a folder outside" in caplog.text
    assert _sha256(photos, tmp_path / "outside") == before
    assert not (photos / "quarantine").exists() and not (photos / "rose" / "q").exists()


def test_a_second_undo_says_the_quarantine_was_already_restored(photos, tmp_path, caplog):
    out = _write_check(tmp_path / "chk", ["daisy/img_001.png"], [("tulip/img_000.png", "tulip/img_001.png")])
    before = _sha256(photos, tmp_path / "outside")
    quarantine = tmp_path / "q"
    assert _move(photos, out, quarantine) == 0
    assert not (photos / "daisy" / "img_001.png").exists() and (quarantine / "tulip" / "img_001.png").is_file()
    record = str(quarantine / MOVED_CSV)
    assert check.main(["--undo", record, "--quiet"]) == 0
    assert _sha256(photos, tmp_path / "outside") == before
    caplog.clear()
    assert check.main(["--undo", record, "--quiet"]) == 1
    assert "already restored" in caplog.text and "check --output" not in caplog.text.replace("--output DIR", "")


def test_a_photo_that_is_a_link_inside_its_class_moves_as_the_link_and_comes_back(photos, tmp_path, caplog):
    """A link to another photo of its class is a photo (listed by check and training); it moves as the link, and
    --undo puts the link back, though it points nowhere while in the quarantine."""
    (photos / "rose" / "again.png").symlink_to("img_000.png")
    out = _write_check(tmp_path / "chk", ["rose/again.png"])
    before = _sha256(photos, tmp_path / "outside")
    quarantine = tmp_path / "q"
    caplog.set_level(logging.INFO)
    assert _move(photos, out, quarantine) == 0
    assert (quarantine / "rose" / "again.png").is_symlink() and (photos / "rose" / "img_000.png").is_file()
    assert check.main(["--undo", str(quarantine / MOVED_CSV), "--quiet"]) == 0
    assert _sha256(photos, tmp_path / "outside") == before
    assert "not moved back" not in caplog.text


def test_check_lists_no_photo_through_a_link_out_of_its_class(photos):
    found = find_photos(photos)
    rel = {found.rel(i) for i in range(len(found.paths))}
    assert len(rel) == 10 and not any("link" in p for p in rel)


@pytest.mark.parametrize("kept", ["../outside/secret.png", "ABSOLUTE", "rose/secret-link.png", "rose/img_009.png"])
def test_a_duplicate_row_whose_kept_copy_is_not_a_photo_is_refused(photos, tmp_path, caplog, kept):
    """The copy a duplicates.csv row says stays (its group's first, here path_a) is checked as the moved ones are:
    outside PHOTOS, through a link out of its class, or missing, it would leave no copy in PHOTOS, so nothing moves
    (#53: `../x.jpg` moved both real copies)."""
    kept = str(tmp_path / "outside" / "secret.png") if kept == "ABSOLUTE" else kept
    out = _write_check(tmp_path / "chk", [], [(kept, "tulip/img_000.png"), (kept, "tulip/img_001.png")])
    before = _sha256(photos, tmp_path / "outside")
    quarantine = tmp_path / "q"
    assert _move(photos, out, quarantine) == 1
    assert "nothing was moved" in caplog.text and "the copy that stays" in caplog.text and kept in caplog.text
    _undo_finds_everything_where_it_was(photos, quarantine, before, caplog)
