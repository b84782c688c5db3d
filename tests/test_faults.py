"""Fault injection in training: kill -9 at random moments and in the middle of a checkpoint write, a loss
that becomes infinite, an output folder that cannot be written, a disk that fills up mid-run.

Complements test_train.py (NaN loss, resume after an exception) and test_checkpoint.py (atomic write,
full disk and unwritable folder at the checkpoint level). The record is docs/robustness.md.
"""

from __future__ import annotations

import csv
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vit_flowers import train as train_mod
from vit_flowers.runs.checkpoint import load_checkpoint, save_checkpoint
from vit_flowers.training import trainer

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
EPOCHS = 4
KILL_SEED = 20240611
CLI = ["--config", str(SMOKE), "--deterministic", "true", "--threads", "1", "--progress", "false"]

# One interpreter imports torch once, then forks real training runs (python -m vit_flowers.train's main) and
# SIGKILLs them: each run costs its training time only, not five seconds of imports.
KILL_DRIVER = textwrap.dedent("""
    import io, json, os, random, signal, sys, time
    import torch
    from vit_flowers import train
    from vit_flowers.runs.checkpoint import load_checkpoint

    out, seed, epochs, kills = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    cli = json.loads(sys.argv[5]) + ["--epochs", epochs]
    torch.set_num_threads(1)

    def kill_inside_save(name, nth):
        # the nth checkpoint write of `name` (into its temporary: runs.checkpoint.atomic_write) writes half of the
        # bytes, then the process is SIGKILLed
        from vit_flowers.runs import checkpoint
        real, seen = checkpoint.atomic_write, [0]
        def write(path, writer):
            if os.path.basename(str(path)) == name:
                seen[0] += 1
                if seen[0] == nth:
                    def half(f):
                        buf = io.BytesIO()
                        writer(buf)
                        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                        f.flush()
                        os.fsync(f.fileno())
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(path, half)
            return real(path, writer)
        checkpoint.atomic_write = write

    def start(argv, kill_in=None):
        pid = os.fork()
        if pid == 0:
            code = 98
            try:
                if kill_in:
                    kill_inside_save(*kill_in)
                code = train.main(argv)
            finally:
                os._exit(code)
        return pid

    def finish(pid):
        status = os.waitpid(pid, 0)[1]
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def state(run_dir):
        # what is on disk now: every checkpoint must load; temporaries left by killed writers are listed
        found = {"tmp": sorted(p.name for p in os.scandir(run_dir) if p.name.endswith(".tmp"))
                 if os.path.isdir(run_dir) else []}
        for name in ("last.pt", "best.pt"):
            path = os.path.join(run_dir, name)
            if os.path.exists(path):
                try:
                    found[name] = load_checkpoint(path)["epoch"]
                except Exception as exc:
                    found[name] = "broken: %s" % exc
        return found

    result = {}
    # the uninterrupted run; note when its training starts (config.yaml, written once the data is loaded) and ends
    t0, ref, seen = time.perf_counter(), out + "/ref/ref", {}
    pid = start(cli + ["--out-dir", out + "/ref", "--run-name", "ref"])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        for name in ("config.yaml", "report"):
            if name not in seen and os.path.exists(os.path.join(ref, name)):
                seen[name] = time.perf_counter() - t0
        if done:
            break
        time.sleep(0.005)
    result["reference_exit"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    window = (seen["config.yaml"], seen["report"])

    # kill -9 while the second epoch's last.pt is half written (a new run: --resume auto refuses an empty folder)
    run_cli = cli + ["--out-dir", out + "/killed", "--resume", "auto"]
    latest = out + "/killed/latest"
    result["write_kill_exit"] = finish(start(run_cli[:-2], kill_in=("last.pt", 2)))
    result["after_write_kill"] = state(os.path.realpath(latest))

    # then kill -9 at seeded random moments of the training window, --resume auto each time; let the last one finish
    rng = random.Random(seed)
    result["kills"] = []
    for _ in range(kills):
        delay = rng.uniform(*window)
        pid = start(run_cli)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        result["kills"].append({"delay": round(delay, 2), "exit": finish(pid), **state(os.path.realpath(latest))})
    result["final_exit"] = finish(start(run_cli))
    result["final"] = state(os.path.realpath(latest))
    print(json.dumps(result))
""")


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory) -> tuple[Path, dict]:
    """An uninterrupted smoke run, and a run killed inside a checkpoint write, then at random moments, and
    continued with --resume auto after each kill (see KILL_DRIVER)."""
    out = tmp_path_factory.mktemp("kill")
    script = out / "kill_driver.py"
    script.write_text(KILL_DRIVER)
    proc = subprocess.run([sys.executable, str(script), str(out), str(KILL_SEED), str(EPOCHS), "4", json.dumps(CLI)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


def assert_same_training_state(a: Path, b: Path) -> None:
    sa, sb = load_checkpoint(a)["train_state"], load_checkpoint(b)["train_state"]
    for part in ("model", "ema"):
        assert sa[part].keys() == sb[part].keys()
        for key, value in sa[part].items():
            assert torch.equal(value, sb[part][key]), f"{part}.{key}"
    assert [r["val_acc"] for r in sa["history"]] == [r["val_acc"] for r in sb["history"]]


def test_kill_during_a_checkpoint_write_leaves_the_previous_checkpoint_whole(killed_runs):
    _, r = killed_runs
    assert r["reference_exit"] == 0
    assert r["write_kill_exit"] == -signal.SIGKILL
    after = r["after_write_kill"]
    assert after["last.pt"] == 1  # the complete epoch-1 file, not half of epoch 2
    assert after["best.pt"] in (1, 2)  # best.pt (written before last.pt) is whole either way
    assert len(after["tmp"]) == 1 and after["tmp"][0].startswith(".last.pt.")  # the half-written temporary


def test_kill_at_random_moments_then_resume_auto_matches_an_uninterrupted_run(killed_runs):
    out, r = killed_runs
    assert len(r["kills"]) == 4 and all(k["exit"] in (-signal.SIGKILL, 0) for k in r["kills"]), r["kills"]
    assert any(k["exit"] == -signal.SIGKILL for k in r["kills"])  # 0: that run had finished before its kill
    for k in r["kills"]:  # after every kill, whatever is on disk loads
        assert not str(k.get("last.pt", "")).startswith("broken"), k
        assert not str(k.get("best.pt", "")).startswith("broken"), k
    epochs = [r["after_write_kill"]["last.pt"]] + [k["last.pt"] for k in r["kills"]]
    assert epochs == sorted(epochs)  # progress is never lost
    assert r["final_exit"] == 0 and r["final"]["last.pt"] == EPOCHS
    run = (out / "killed" / "latest").resolve()
    assert_same_training_state(out / "ref" / "ref" / "last.pt", run / "last.pt")
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [int(row["epoch"]) for row in rows] == list(range(1, EPOCHS + 1))
    assert (run / "report" / "report.html").is_file()


def test_temporaries_of_killed_writers_are_removed_by_the_next_save(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs (reaped)
    orphan = tmp_path / f".last.pt.{dead.pid}.0badc0de.tmp"
    live = tmp_path / f".last.pt.{os.getppid()}.0badc0de.tmp"  # a writer still at work: left alone
    other = tmp_path / ".notes.tmp"  # not one of ours
    for path in (orphan, live, other):
        path.write_bytes(b"half a checkpoint")
    save_checkpoint({"x": torch.zeros(1)}, tmp_path / "best.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["best.pt", live.name, other.name])


# ---------------------------------------------------------------------------------------------- in-process faults


def cli(tmp_path: Path, *extra: str) -> list[str]:
    return [*CLI, "--out-dir", str(tmp_path / "ck"), "--run-name", "r", *extra]


def test_infinite_loss_stops_the_cli_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, caplog):
    real_epoch, calls = trainer.train_one_epoch, []

    def second_epoch_explodes(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            monkeypatch.setattr(torch.nn.functional, "cross_entropy", lambda *a, **k: torch.tensor(float("inf")))
        return real_epoch(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_one_epoch", second_epoch_explodes)
    assert train_mod.main(cli(tmp_path, "--epochs", "2")) == 2
    assert "the loss became inf at epoch 2, step 1" in caplog.text and "last good checkpoint is kept" in caplog.text
    assert load_checkpoint(tmp_path / "ck" / "r" / "last.pt")["epoch"] == 1


def test_output_folder_that_cannot_be_written_is_a_clear_error(tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the output folder should be")  # blocks root too, unlike chmod
    assert train_mod.main([*CLI, "--out-dir", str(blocker / "ck")]) == 2
    assert f"cannot write to the run folder {blocker / 'ck'}" in caplog.text
    assert "Traceback" not in caplog.text
    assert blocker.read_text() == "a file where the output folder should be"


def test_disk_full_while_saving_in_the_middle_of_a_run(tmp_path, monkeypatch, caplog):
    from vit_flowers.runs import checkpoint

    real_write = checkpoint.atomic_write
    saves: list[str] = []

    def disk_fills_up_in_epoch_2(path, writer):
        if Path(path).suffix != ".pt":
            return real_write(path, writer)
        saves.append(Path(path).name)
        if len(saves) < 3:  # best.pt and last.pt of epoch 1
            return real_write(path, writer)

        def full(f):
            f.write(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, full)

    monkeypatch.setattr(checkpoint, "atomic_write", disk_fills_up_in_epoch_2)
    assert train_mod.main(cli(tmp_path, "--epochs", "3")) == 2
    run = tmp_path / "ck" / "r"
    assert "No space left on device" in caplog.text and "the previous file (if any) is unchanged" in caplog.text
    assert f"cannot write {run}" in caplog.text
    assert load_checkpoint(run / "last.pt")["epoch"] == 1 and load_checkpoint(run / "best.pt")["epoch"] == 1
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]
    assert len(list(csv.DictReader((run / "metrics.csv").open()))) == 1
    assert len(saves) == 3  # best.pt and last.pt of epoch 1, then the failed one of epoch 2


def test_disk_full_while_writing_the_final_report(tmp_path, monkeypatch, caplog):
    real_write_text = Path.write_text

    def full_inside_report(self, *args, **kwargs):
        if self.parent.name == "report":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_inside_report)
    caplog.set_level(logging.ERROR)
    assert train_mod.main(cli(tmp_path, "--epochs", "1")) == 2  # an error message, not a traceback
    run = tmp_path / "ck" / "r"
    assert "No space left on device" in caplog.text and str(run / "report") in caplog.text
    assert load_checkpoint(run / "last.pt")["epoch"] == 1
