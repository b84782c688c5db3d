"""Labelling a folder with a run's help (#63): the state file, the folder's scan, suggestions, accepting them (and a
CSV), the copies, and the `label` command; the user's folder never changes."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from helpers import file_digests, write_class_folders

from vit_flowers import label as label_command
from vit_flowers.cli import open_model
from vit_flowers.labelling import loop
from vit_flowers.labelling.state import (
    SKIP,
    StaleState,
    StateError,
    load_state,
    open_state,
    save_state,
    state_path,
)
from vit_flowers.runs.errors import CheckpointError


def _user_folder(tmp_path: Path, photos: Path) -> Path:
    """A folder to label: synthetic flowers in nested folders without class names, a copy of a training photo, two
    copies of one photo, a text file and a file that is not a JPEG."""
    folder = tmp_path / "summer"
    source = write_class_folders(tmp_path / "drawn", 3, seed=21)
    for i, p in enumerate(sorted(source.rglob("*.png"))):
        dest = folder / ("day1" if i % 2 else "day2") / f"IMG_{i:04d}.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dest)
    shutil.copyfile(next((photos / "daisy").iterdir()), folder / "copy_of_training.png")
    shutil.copyfile(folder / "day2" / "IMG_0000.png", folder / "day1" / "same_again.png")
    (folder / "notes.txt").write_text("not a photo\n")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    return folder


@pytest.fixture
def places(tmp_path):
    photos = write_class_folders(tmp_path / "photos", 2, seed=5)
    return photos, _user_folder(tmp_path, photos)


def test_a_new_state_knows_the_training_photos_and_round_trips(places):
    photos, folder = places
    state = open_state(photos, folder=folder, run="run-a")
    assert state.path == state_path(photos.resolve()) == photos.resolve().parent / "photos.labels.json"
    assert state.classes == ["daisy", "dandelion", "rose", "sunflower", "tulip"]
    assert len(state.entries) == 10 and {e.source for e in state.entries.values()} == {"training"}
    save_state(state)
    again = load_state(state.path)
    assert again.to_json() == state.to_json() and again.revision == 1
    assert open_state(photos).folder == folder.resolve()  # read back, not made anew


def test_a_save_from_an_older_read_is_refused_and_writes_nothing(places):
    photos, folder = places
    save_state(open_state(photos, folder=folder))
    first, second = open_state(photos), open_state(photos)
    first.round = 5
    save_state(first)
    before = state_path(photos.resolve()).read_bytes()
    second.round = 9
    with pytest.raises(StaleState, match="another tab or command"):
        save_state(second)
    assert state_path(photos.resolve()).read_bytes() == before


def test_a_write_that_fails_leaves_the_previous_file_whole(places, monkeypatch):
    photos, folder = places
    state = open_state(photos, folder=folder)
    save_state(state)
    before = state.path.read_bytes()
    state.round = 7

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("vit_flowers.runs.checkpoint.os.fsync", full_disk)
    with pytest.raises(CheckpointError, match="No space left"):
        save_state(state)
    monkeypatch.undo()
    assert state.path.read_bytes() == before and state.revision == 1
    assert not [p for p in state.path.parent.iterdir() if p.name.endswith(".tmp")]
    save_state(state)  # the revision was not counted: the next save goes through
    assert load_state(state.path).round == 7


def test_a_damaged_state_file_is_named(places):
    photos, _ = places
    state_path(photos).write_text("{not json")
    with pytest.raises(StateError, match="photos.labels.json"):
        open_state(photos)


def test_the_scan_lists_duplicates_and_non_photos_once(places):
    photos, folder = places
    state = open_state(photos, folder=folder)
    todo = loop.scan_folder(state)
    paths = {p.name for _, p in todo}
    assert len(todo) == 15 + 1  # 15 photos and broken.jpg (its bytes are read; decoding it is the model's part)
    assert "copy_of_training.png" not in paths and ("same_again.png" in paths) != ("IMG_0000.png" in paths)
    assert {Path(p).name for p in state.duplicates} == {"copy_of_training.png", "IMG_0000.png"}  # after day1/
    assert {Path(p).name for p in state.unreadable} == {"notes.txt"}


def test_overlapping_places_are_refused(places):
    photos, folder = places
    with pytest.raises(ValueError, match="overlap"):
        loop.check_places(folder / "day1" / "labels", folder)
    with pytest.raises(ValueError, match="overlap"):
        loop.check_places(photos, photos / "daisy")


def test_a_round_suggests_accepts_and_copies_without_touching_the_folder(places, micro_run):
    photos, folder = places
    before = file_digests(folder)
    loaded = open_model(micro_run, device="cpu")
    state = open_state(photos, folder=folder, run=str(micro_run), classes=list(loaded.ckpt["classes"]))
    todo = loop.scan_folder(state)
    assert loop.suggest(state, loaded, todo, batch_size=8) == 15
    assert any(Path(p).name == "broken.jpg" for p in state.unreadable)  # decoded: listed, skipped
    daisies = loop.ordered(state, "daisy")
    assert [s.confidence for _, s in daisies] == sorted((s.confidence for _, s in daisies), reverse=True)
    uncertain = loop.ordered(state, "daisy", "uncertain")
    assert [s.margin for _, s in uncertain] == sorted(s.margin for _, s in uncertain)
    # the first grid of every class: untick nothing, move the first photo of each to "rose", skip one
    choices = {}
    for cls in state.classes:
        grid = loop.ordered(state, cls)
        choices.update({sha: cls for sha, _ in grid})
    shas = list(choices)
    choices[shas[0]] = "rose" if state.suggestions[shas[0]].label != "rose" else "tulip"
    choices[shas[1]] = SKIP
    result = loop.accept(state, choices)
    assert result.labelled == 15 and result.copied == 14 and result.already == 0
    assert state.entries[shas[0]].source == "user" and state.entries[shas[2]].source == "suggestion"
    assert state.entries[shas[1]].copy is None and state.entries[shas[1]].label == SKIP
    copy = photos / state.entries[shas[0]].copy
    assert copy.parent.name == state.entries[shas[0]].label and copy.read_bytes() == \
        Path(state.entries[shas[0]].path).read_bytes()
    assert not state.suggestions
    save_state(state)
    assert file_digests(folder) == before  # nothing in the user's folder changed
    # labelled once: the same content again is "already", and the next scan has nothing left to offer
    assert loop.accept(state, {shas[0]: "daisy"}).already == 1
    state = open_state(photos, folder=folder)
    assert loop.scan_folder(state) == []
    loop.next_round(state)
    assert state.round == 2


def test_accepting_a_csv_takes_edits_as_the_users_and_refuses_what_it_cannot_use(places, micro_run, tmp_path):
    photos, folder = places
    before = file_digests(folder)
    loaded = open_model(micro_run, device="cpu")
    state = open_state(photos, folder=folder, classes=list(loaded.ckpt["classes"]))
    loop.suggest(state, loaded, loop.scan_folder(state), batch_size=8)
    out = tmp_path / "suggestions.csv"
    assert label_command.write_suggestions(state, out) == 15
    rows = list(csv.DictReader(out.open()))
    rows[0]["label"] = "lily"  # a new class, given by the user
    rows[1]["label"] = "unknown"  # left out: not labelled
    rows[2]["label"] = "Bad/Name"  # refused
    rows.append({**rows[3], "path": str(folder / "gone.png")})
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = loop.accept_csv(state, out)
    assert result.labelled == 15 - 2 and result.new_classes == ["lily"]  # the "unknown" row and the bad name left
    assert set(result.refused) == {rows[2]["path"], str(folder / "gone.png")}
    lily = [e for e in state.entries.values() if e.label == "lily"]
    assert len(lily) == 1 and lily[0].source == "user" and (photos / "lily" / Path(lily[0].copy).name).is_file()
    assert {e.source for e in state.entries.values() if e.source != "training" and e.label != "lily"} == \
        {"suggestion"}
    assert file_digests(folder) == before


def test_the_label_command_suggests_then_accepts(places, micro_run, tmp_path, caplog):
    caplog.set_level("INFO")
    photos, folder = places
    before = file_digests(folder)
    args = [str(folder), "--run", str(micro_run), "--photos", str(photos), "--device", "cpu"]
    assert label_command.main(args) == 0
    suggestions = photos.parent / "photos-suggestions-1.csv"
    assert len(list(csv.DictReader(suggestions.open()))) == 15
    assert "--accept" in caplog.text and "broken.jpg" in caplog.text
    caplog.clear()
    assert label_command.main([*args, "--accept", str(suggestions)]) == 0
    assert "labelled 15 photo(s) (15 copied" in caplog.text and "vit-flowers train --data" in caplog.text
    saved = json.loads(state_path(photos).read_text())
    assert sum(e["source"] == "suggestion" for e in saved["entries"].values()) == 15
    assert sum(len(list((photos / c).iterdir())) for c in saved["classes"] if (photos / c).is_dir()) == 10 + 15
    assert file_digests(folder) == before
    caplog.clear()
    assert label_command.main(args) == 0  # round 2: nothing left
    assert "0 photo(s) to label" in caplog.text and json.loads(state_path(photos).read_text())["round"] == 2


def test_the_label_command_needs_photos_for_a_run_trained_on_drawn_flowers(places, micro_run, caplog):
    _, folder = places
    assert label_command.main([str(folder), "--run", str(micro_run), "--device", "cpu"]) == 1
    assert "--photos DIR" in caplog.text


# ---------------------------------------------------------------------------------------------- the page's Label tab


@pytest.fixture
def engine(micro_run, tmp_path):
    from vit_flowers.app.engine import Engine

    return Engine(open_model(micro_run, device="cpu"), unknown=None, batch_size=8, runs_home=tmp_path / "runs")


def test_the_tab_labels_a_class_at_a_time_and_resumes_from_the_file(places, engine):
    from vit_flowers.app.labelling import accept_grid, grid_html, last_state, open_labelling, resume

    photos, folder = places
    before = file_digests(folder)
    view = open_labelling(engine, str(folder), str(photos))
    assert view.label == "daisy" or view.left.get("daisy", 0) == 0
    first = view.label
    assert len(view.grid) == view.left[first] and "15 photo(s) suggested" in view.message
    page = grid_html(view)
    assert page.count('class="vf-pick"') == len(view.grid) and page.count(" checked>") == len(view.grid)
    assert last_state(engine) is None  # the micro run has no photos of its own, the state is elsewhere
    engine.runs_home = photos.parent
    assert last_state(engine) == view.state.path
    # the first photo moved to another class, the second left for later, the rest accepted
    picks = {sha: first for sha, _ in view.grid}
    shas = list(picks)
    other = next(c for c in view.state.classes if c != first)
    picks[shas[0]] = other
    if len(shas) > 1:
        picks[shas[1]] = ""
    after = accept_grid(view.state.path, first, picks)
    assert f"{len(shas) - (len(shas) > 1)} photo(s) labelled (1 moved" in after.message
    assert after.state.entries[shas[0]].label == other and after.state.entries[shas[0]].source == "user"
    assert after.label != first or len(shas) > 1  # the class is done, or its unticked photo is still there
    # a second tab accepting the same grid: nothing labelled twice, and it is told
    again = accept_grid(view.state.path, first, picks)
    assert "labelled meanwhile elsewhere" in again.message and again.state.revision == after.state.revision + 1
    # the page reopened: the same place, from the file alone
    reopened = resume(last_state(engine))
    assert reopened.state.to_json() == again.state.to_json() and reopened.left == again.left
    # Continue with the same run: nothing predicted again
    assert open_labelling(engine, str(folder), str(photos)).message == ""
    assert file_digests(folder) == before


def test_training_on_the_labels_then_continue_is_a_new_round_of_the_new_run(places, engine, monkeypatch):
    """The loop closed: accepted photos trained on by the Train tab's training (its tiny test recipe), the page
    switched to the new run, Continue: the new run suggests what is left, in round 2."""
    import time

    from vit_flowers.app import training as app_training
    from vit_flowers.app.labelling import accept_grid, open_labelling, train_on_labels

    monkeypatch.setenv(app_training.CONFIG_ENV, str(Path(__file__).parent / "data" / "app_train.yaml"))
    photos, folder = places
    view = open_labelling(engine, str(folder), str(photos))
    first_run = view.state.run
    accept_grid(view.state.path, view.label, {sha: view.label for sha, _ in view.grid[:-1]} |
                {view.grid[-1][0]: ""})  # one left for later
    run = train_on_labels(engine, view.state.path, 1.0)
    assert run.photos == photos.resolve()
    end = time.monotonic() + 180
    while run.training.running:
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)
    assert run.training.state == "done", run.training.progress()
    assert engine.loaded is not None and Path(engine.loaded.path).parent == run.run_dir
    again = open_labelling(engine, str(folder), str(photos))
    assert again.state.round == 2 and again.state.run != first_run
    left = 15 - sum(e.source != "training" for e in again.state.entries.values())
    assert f"{left} photo(s) suggested by {run.run_dir.name}" in again.message


def test_a_class_renamed_mid_way_keeps_its_labels_and_the_runs_suggestions_follow(places, micro_run, caplog):
    photos, folder = places
    args = [str(folder), "--run", str(micro_run), "--photos", str(photos), "--device", "cpu"]
    assert label_command.main(args) == 0
    state = open_state(photos)
    roses = sum(e.label == "rose" for e in state.entries.values())
    assert label_command.main([*args, "--rename", "rose=garden_rose"]) == 0
    state = open_state(photos)
    assert "rose" not in state.classes and state.renamed == {"rose": "garden_rose"}
    assert sum(e.label == "garden_rose" for e in state.entries.values()) == roses
    assert all((photos / e.copy).is_file() for e in state.entries.values() if e.copy)
    assert not (photos / "rose").exists() and not any(s.label == "rose" for s in state.suggestions.values())
    assert label_command.main(args) == 0  # the run still says "rose": its suggestions say garden_rose
    state = open_state(photos)
    assert not any("rose" in (s.label, s.second) for s in state.suggestions.values())
    assert label_command.main([*args, "--rename", "daisy=garden_rose"]) == 1
    assert "exists" in caplog.text
    with pytest.raises(ValueError, match="no class"):
        loop.rename_class(state, "lily", "lilium")


def test_the_check_flags_a_labelled_copy_of_a_training_photo_given_another_class(places, engine, tmp_path):
    """A mistake accepted in bulk is caught before the next training: a re-encoded copy of a training daisy in the
    folder (another file, so not labelled once by content) accepted as a tulip is flagged; the training photos
    PHOTOS held before are not."""
    from PIL import Image

    from vit_flowers.app.labelling import check_labels, findings_html, open_labelling

    photos, folder = places
    daisy = sorted((photos / "daisy").iterdir())[0]
    Image.open(daisy).convert("RGB").save(folder / "re-encoded.jpg", quality=92)
    view = open_labelling(engine, str(folder), str(photos))
    state = view.state
    shas = {Path(s.path).name: sha for sha, s in state.suggestions.items()}
    choices = {sha: state.suggestions[sha].label for sha in state.suggestions}
    choices[shas["re-encoded.jpg"]] = "tulip"
    loop.accept(state, choices)
    save_state(state)
    found = check_labels(engine, state.path)
    copies = {(photos / e.copy).resolve() for e in state.entries.values() if e.source != "training" and e.copy}
    assert found and all(f.copy in copies for f in found)  # only the photos labelled here
    flagged = [f for f in found if f.copy.name.startswith("re-encoded")]
    assert flagged and any(f"the same photo as daisy/{daisy.name} (daisy)" in f.why for f in flagged)
    assert 'data-found="' in findings_html(found, photos)


def test_a_copy_that_fails_labels_nothing_and_leaves_no_half_photo(places, monkeypatch):
    """A disk that fills up mid-copy: that photo is not labelled (and says why), PHOTOS holds no partial file."""
    photos, folder = places
    state = open_state(photos, folder=folder)
    todo = loop.scan_folder(state)
    (sha, path), (sha2, path2) = todo[0], todo[1]
    real = shutil.copyfile

    def full(src, dst, *a, **k):
        if Path(src) == path:
            Path(dst).write_bytes(b"half")  # what a full disk leaves: a partial temporary file
            raise OSError(28, "No space left on device")
        return real(src, dst, *a, **k)

    monkeypatch.setattr("vit_flowers.labelling.loop.shutil.copyfile", full)
    result = loop.accept(state, {sha: "daisy", sha2: "rose"}, paths={sha: path, sha2: path2})
    assert result.labelled == 1 and "No space left" in result.refused[str(path)]
    assert sha not in state.entries and state.entries[sha2].label == "rose"
    assert not [p for p in (photos / "daisy").iterdir() if p.name.startswith(".")]
