import os

import pytest
import torch

from vit_flowers.checkpoint import (
    FORMAT,
    CheckpointError,
    model_from_checkpoint,
    latest_run,
    load_checkpoint,
    load_model,
    mark_latest,
    resolve_checkpoint,
    make_checkpoint,
    save_checkpoint,
)
from vit_flowers.models.vit import create_vit


def make_state(num_classes=3):
    model = create_vit("vit_micro", num_classes)
    return make_checkpoint(model, classes=[f"c{i}" for i in range(num_classes)], image_size=32, mean=[0.5] * 3,
                           std=[0.5] * 3, config={}, epoch=1, best_accuracy=0.5)


def test_round_trip_rebuilds_identical_model(tmp_path):
    state = make_state()
    save_checkpoint(state, tmp_path / "a.pt")
    model, loaded = load_model(tmp_path / "a.pt")
    reference = model_from_checkpoint(state)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), reference.eval()(x))
    assert loaded["classes"] == ["c0", "c1", "c2"]
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]  # no temporary file left


def test_failed_write_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(make_state(), path)
    before = path.read_bytes()

    def disk_full(obj, f, *a, **k):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device"):
        save_checkpoint(make_state(), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_unwritable_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match="cannot write"):
        save_checkpoint(make_state(), blocker / "run" / "best.pt")


class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "payload": Evil()}, path)
    with pytest.raises(CheckpointError, match="refusing to load"):
        load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("content, message", [
    (b"", "truncated or not a PyTorch file"),
    (b"hello world", "truncated or not a PyTorch file"),
])
def test_garbage_files(tmp_path, content, message):
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_foreign_or_incomplete_checkpoints(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a vit_flowers checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    state = make_state()
    del state["classes"]
    torch.save(state, tmp_path / "inc.pt")
    with pytest.raises(CheckpointError, match="missing classes"):
        load_checkpoint(tmp_path / "inc.pt")


def test_weights_of_another_model_give_a_clear_error(tmp_path):
    state = make_state()
    state["model"] = create_vit("vit_micro", 3, dim=32, heads=2).state_dict()
    save_checkpoint(state, tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match="do not fit"):
        load_model(tmp_path / "m.pt")
    state = make_state()
    state["classes"] = ["a", "b"]
    save_checkpoint(state, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="3 outputs but the checkpoint lists 2 classes"):
        load_model(tmp_path / "c.pt")


def test_latest_and_resolution(tmp_path):
    with pytest.raises(CheckpointError, match="no trained run"):
        resolve_checkpoint(None, tmp_path)
    for name in ("run-a", "run-b"):
        save_checkpoint(make_state(), tmp_path / name / "best.pt")
    mark_latest(tmp_path / "run-a")
    assert latest_run(tmp_path) == (tmp_path / "run-a").resolve()
    assert resolve_checkpoint(None, tmp_path).parent.name == "run-a"
    assert resolve_checkpoint(tmp_path / "run-b", tmp_path) == tmp_path / "run-b" / "best.pt"
    with pytest.raises(CheckpointError, match="not found"):
        resolve_checkpoint(tmp_path / "missing.pt", tmp_path)
