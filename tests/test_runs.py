"""Run folders (vit_flowers/runs/folders.py): which folders a new run may start in, what --overwrite may delete, and
what a start that fails leaves behind. The end-to-end cases (a second run under the same name, a failed start)
are in test_train.py."""

import ast
import math
from pathlib import Path

import pytest

from vit_flowers.runs import folders as runs
from vit_flowers.runs.errors import CheckpointError


def test_a_folder_without_results_is_a_place_to_start(tmp_path):
    runs.check_new_run(tmp_path / "missing", overwrite=False)
    prepared = tmp_path / "prepared"  # as benchmarks/accuracy.py prepares a run: its split pinned beforehand
    prepared.mkdir()
    (prepared / runs.SPLIT).write_text("{}")
    (prepared / runs.CURVES).write_bytes(b"a stale plot")
    runs.check_new_run(prepared, overwrite=False)
    (prepared / runs.METRICS).write_text("epoch\n")
    with pytest.raises(runs.RunExistsError, match=r"already holds a run \(metrics.csv\): choose another --run-name, "
                                                  r"or start it afresh with --overwrite"):
        runs.check_new_run(prepared, overwrite=False)  # no last.pt: --resume is not offered


def test_overwrite_deletes_only_a_folder_of_run_files(tmp_path):
    run = tmp_path / "r"
    (run / runs.REPORT).mkdir(parents=True)
    for name in (runs.BEST, runs.LAST, runs.ONNX, runs.SPLIT, runs.REPORT + "/report.html", ".last.pt.1.0badc0de.tmp"):
        (run / name).write_bytes(b"x")
    runs.check_new_run(run, overwrite=True)
    runs.clear_run_dir(run)
    assert run.is_dir() and not any(run.iterdir())

    home = tmp_path / "home"  # --out-dir / --run-name mistyped onto a folder of other things
    home.mkdir()
    (home / runs.BEST).write_bytes(b"x")
    (home / "thesis.tex").write_text("years of work")
    with pytest.raises(runs.RunExistsError, match=r"--overwrite: .*home holds files that are not a run's "
                                                  r"\(thesis.tex\), so it is not deleted"):
        runs.check_new_run(home, overwrite=True)
    assert (home / "thesis.tex").read_text() == "years of work"


def test_the_latest_link_is_never_a_run_folder(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / runs.LATEST).symlink_to("r", target_is_directory=True)
    for overwrite in (False, True):
        with pytest.raises(runs.RunExistsError, match=r"latest is a link, not a run folder \(the newest run\)"):
            runs.check_new_run(tmp_path / runs.LATEST, overwrite=overwrite)


def test_a_removed_run_takes_the_latest_link_back_to_the_newest_run_left(tmp_path):
    """A run removed after train marked it (a cancel on the web app's Train tab): ``latest`` goes back to the newest
    run with a checkpoint, not to one still being filled, and goes away when no run is left; it pointed at nothing."""
    import os
    import shutil

    for name, age in (("old", 2e9), ("older", 1e9), ("half", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / runs.BEST).write_bytes(b"weights")
        if age is not None:
            os.utime(tmp_path / name / runs.BEST, (age, age))
    (tmp_path / "half" / runs.IN_PROGRESS).write_bytes(b"")  # the newest checkpoint, but a training fills it
    gone = tmp_path / "cancelled"
    gone.mkdir()
    runs.mark_latest(gone)
    runs.unmark_latest(gone)  # still there: left alone
    assert os.readlink(tmp_path / runs.LATEST) == "cancelled"
    shutil.rmtree(gone)
    runs.unmark_latest(tmp_path / "other")  # the link points at another run: left alone
    assert os.readlink(tmp_path / runs.LATEST) == "cancelled"
    runs.unmark_latest(gone)
    assert os.readlink(tmp_path / runs.LATEST) == "old" and (tmp_path / runs.LATEST / runs.BEST).is_file()
    for name in ("old", "older"):
        shutil.rmtree(tmp_path / name)
    runs.mark_latest(gone)
    runs.unmark_latest(gone)
    assert not (tmp_path / runs.LATEST).is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half"]


def test_free_names_and_the_folders_a_failed_start_removes(tmp_path):
    (tmp_path / "ck" / "run").mkdir(parents=True)
    (tmp_path / "ck" / "run-2").mkdir()
    assert runs.free_run_dir(tmp_path / "ck", "run") == tmp_path / "ck" / "run-3"
    made = runs.make_run_dir(tmp_path / "new" / "deeper" / "run")
    assert made == [tmp_path / "new" / "deeper" / "run", tmp_path / "new" / "deeper", tmp_path / "new"]
    assert not any((tmp_path / "new" / "deeper" / "run").iterdir())  # the write probe is gone
    runs.remove_new_folders(made)
    assert not (tmp_path / "new").exists()
    made = runs.make_run_dir(tmp_path / "ck" / "other")
    (tmp_path / "ck" / "other" / runs.CONFIG).write_text("written")
    runs.remove_new_folders(made)  # something was written into it: kept
    assert (tmp_path / "ck" / "other" / runs.CONFIG).is_file()
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match=f"cannot write to the run folder {blocker / 'ck' / 'run'}"):
        runs.make_run_dir(blocker / "ck" / "run")


def test_metrics_csv_round_trips_and_reads_bad_cells_as_nan(tmp_path):
    path = tmp_path / runs.METRICS
    path.write_text(runs.metrics_text([{"epoch": 1, "val_acc": 0.5, "not a column": 7}, {"epoch": 2}],
                                      ["epoch", "val_acc"]))
    assert path.read_text().splitlines() == ["epoch,val_acc", "1,0.5", "2,"]
    path.write_text(path.read_text() + "3,oops,extra\n4\n")
    rows = runs.read_metrics(path)
    assert [r["epoch"] for r in rows] == [1.0, 2.0, 3.0, 4.0] and rows[0]["val_acc"] == 0.5
    assert all(math.isnan(r["val_acc"]) for r in rows[1:]) and all(set(r) == {"epoch", "val_acc"} for r in rows)
    with pytest.raises(FileNotFoundError, match="training metrics not found: .*nowhere.csv"):
        runs.read_metrics(tmp_path / "nowhere.csv")


RUN_FILE_NAMES = {runs.BEST, runs.LAST, runs.CONFIG, runs.METRICS, runs.CURVES, runs.SPLIT, runs.REPORT, runs.ONNX,
                  runs.ONNX_INT8, runs.LATEST}


@pytest.mark.parametrize("folder", ["vit_flowers", "benchmarks"])
def test_the_run_files_are_named_only_in_runs_folders(folder):
    """Code names a run's files by runs.BEST, runs.METRICS, ...: no string in the code (docstrings and messages may
    mention them) is a run file's name or ends in one."""
    root = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted((root / folder).rglob("*.py")):
        if path == root / "vit_flowers" / "runs" / "folders.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        keys = {id(k) for d in ast.walk(tree) if isinstance(d, ast.Dict) for k in d.keys}  # {"report": False}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in keys and any(
                    node.value == name or node.value.endswith("/" + name) for name in RUN_FILE_NAMES):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    assert not found, "run file names spelled out instead of runs.*:\n" + "\n".join(found)
