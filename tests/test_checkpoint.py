import io
import json
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
from helpers import smoke_config, write_class_folders

from vit_flowers import train as train_mod
from vit_flowers.evaluate import main as evaluate_main
from vit_flowers.export import main as export_main
from vit_flowers.models.vit import create_vit
from vit_flowers.predict import main as predict_main
from vit_flowers.runs.checkpoint import (
    FORMAT,
    Checkpoint,
    CheckpointError,
    latest_run,
    load_checkpoint,
    load_model,
    make_checkpoint,
    mark_latest,
    model_from_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from vit_flowers.teach import main as teach_main
from vit_flowers.training.pretrained import PretrainedError, load_pretrained


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
    """The disk fills up while a checkpoint is written: the OS's message (torch's zip writer, writing the file
    itself, put a RuntimeError of its own over it), the previous file kept, no temporary file left."""
    from vit_flowers.runs import checkpoint

    path = tmp_path / "last.pt"
    save_checkpoint(make_state(), path)
    before = path.read_bytes()

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(bytes(memoryview(data)[:7]))  # a part of it, then no room
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):  # flush, fileno, tell, ...
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(checkpoint, "open", lambda *a, **k: FullDisk(open(*a, **k)),  # noqa: SIM115 - FullDisk closes
                        raising=False)
    with pytest.raises(CheckpointError, match="No space left on device"):
        save_checkpoint(make_state(), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.skipif(os.name != "posix", reason="limits the file size with setrlimit")
def test_a_real_write_that_fails_mid_checkpoint_is_one_clear_error(tmp_path):
    """The operating system refuses a write halfway through the file (here a file size limit; a full disk is the same
    OSError): CheckpointError naming the file, where torch.save into the file raised its zip writer's RuntimeError."""
    script = (
        "import resource, sys, torch\n"
        "from vit_flowers.runs.checkpoint import CheckpointError, save_checkpoint\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "try:\n"
        "    save_checkpoint({'weights': torch.zeros(100_000)}, sys.argv[1])\n"
        "except CheckpointError as exc:\n"
        "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "best.pt")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith(f"cannot write {tmp_path / 'best.pt'}: File too large"), (
        done.stdout + done.stderr[-2000:])
    assert list(tmp_path.iterdir()) == []  # no temporary file left


def test_unwritable_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match="cannot write"):
        save_checkpoint(make_state(), blocker / "run" / "best.pt")


class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, monkeypatch, zipped):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "payload": Evil()}, path, _use_new_zipfile_serialization=zipped)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert str(error.value) == (f"refusing to load {path}: it holds a Python object that is not a tensor or a plain "
                                f"value ({os.system.__module__}.system), and loading it could run code. Only load "
                                f"checkpoints you trust.")
    assert not (tmp_path / "pwned").exists()


def _saved(state, **kwargs) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf, **kwargs)
    return buf.getvalue()


def _zip_of_text() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("notes.txt", "not a checkpoint")
    return buf.getvalue()


ONNX_HEAD = b"\x08\x0e\x12\x07pytorch\x1a\x052.4.0:"  # ModelProto: ir_version 14, producer_name, ..., graph

# a file that is not a checkpoint -> the one line that says what it is instead
NOT_CHECKPOINTS = {
    "empty": (lambda: b"", "the file is empty"),
    "text": (lambda: b"hello world\n", "it is a text file, not a PyTorch checkpoint"),
    "random bytes": (lambda: np.random.default_rng(1).bytes(4000),
                     "it is not a PyTorch checkpoint (it starts like neither a zip archive nor a pickle)"),
    "onnx": (lambda: ONNX_HEAD + np.random.default_rng(2).bytes(400), "it is an ONNX model, not a PyTorch checkpoint"),
    "safetensors": (lambda: b"\x20\0\0\0\0\0\0\0" + b'{"w":{"dtype":"F32","shape":[0]}}  ',
                    "it is a safetensors file, not a PyTorch checkpoint"),
    "truncated zip": (lambda: _saved(make_state())[:5000], "it is truncated (a zip archive whose end is missing)"),
    "truncated legacy": (lambda: _saved(make_state(), _use_new_zipfile_serialization=False)[:5000],
                         "it is truncated (the pickle ends early)"),
    "damaged zip": (lambda: _saved(make_state()).replace(b"\x80\x02}q\x00(X", b"\x80\x02}q\x00(\xff"),
                    "it is damaged (a PyTorch zip archive whose contents cannot be read)"),
    "zip": (_zip_of_text, "it is a zip archive, not a PyTorch checkpoint"),
    "plain pickle": (lambda: pickle.dumps({"a": [1, 2]}, protocol=4),
                     "it is a Python pickle, not a PyTorch checkpoint"),
}


@pytest.mark.parametrize("kind", NOT_CHECKPOINTS)
def test_a_file_that_is_not_a_checkpoint_says_what_it_is_in_one_line(tmp_path, kind):
    content, description = NOT_CHECKPOINTS[kind]
    path = tmp_path / "best.pt"
    path.write_bytes(content())
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert str(error.value) == f"cannot read checkpoint {path}: {description}"


def test_random_bytes_never_pass_on_torchs_unsafe_advice(tmp_path):
    rng = np.random.default_rng(0)
    magic = [b"", b"PK\x03\x04", b"\x80\x02", b"\x80\x04\x95", b"c", ONNX_HEAD]
    for i in range(120):
        path = tmp_path / f"{i}.pt"
        path.write_bytes(magic[i % len(magic)] + rng.bytes(int(rng.integers(0, 3000))))
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(path)
        message = str(error.value)
        assert "weights_only" not in message and "could run code" not in message, message
        assert "\n" not in message and message.startswith(f"cannot read checkpoint {path}: "), message
    path.write_bytes(np.random.default_rng(3).bytes(3000))
    with pytest.raises(PretrainedError) as error:  # --pretrained reads weights files through the same load
        load_pretrained(path, num_classes=3, image_size=32, heads=3)
    assert str(error.value) == (f"pretrained: cannot read the weights file {path}: it is not a PyTorch checkpoint "
                                f"(it starts like neither a zip archive nor a pickle)")


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


# ------------------------------------------------------------------- files of format 1 (before the layout's version)
def main_checkpoint(num_classes=3, calibrated=True, last=False, taught=False) -> tuple[torch.nn.Module, dict]:
    """(a model, the dict the code of main up to 2026-12-06 saved for it): format vit_flowers/1, make_checkpoint's
    keys; ``calibrated``: with what the end of training added since 2026-12-03 (class_means, unknown,
    teach_sample); ``last``: a last.pt's train_state; ``taught``: what teach added. Keys written by hand, so that
    a change of today's layout cannot change them."""
    model = create_vit("vit_micro", num_classes).eval()
    dim = model.config["dim"]
    state = {"format": "vit_flowers/1", "model": model.state_dict(), "weights": "ema",
             "model_config": dict(model.config), "classes": [f"c{i}" for i in range(num_classes)], "image_size": 32,
             "mean": [0.5] * 3, "std": [0.25] * 3, "config": {"model": "vit_micro", "epochs": 4}, "epoch": 3,
             "best_accuracy": 0.75}
    if last:
        state["train_state"] = {"model": model.state_dict(), "optimizer": {}, "scheduler": {}, "ema": None,
                                "history": [{"epoch": 1.0}], "amp": "fp32"}
    if calibrated:
        state["class_means"] = {"means": torch.randn(num_classes, dim), "counts": [4] * num_classes, "within": 1.5}
        state["unknown"] = {"rule": "mahalanobis", "threshold": -7.5, "accept": 0.95, "val_accepted": 0.96,
                            "n_val": 12, "means": torch.randn(num_classes, dim), "precision": torch.eye(dim)}
        state["teach_sample"] = {"head_input": "cls+patches", "features": torch.randn(6, 2 * dim).half(),
                                 "labels": torch.arange(num_classes).repeat(2)}
    if taught:
        state["taught"] = {"from": "checkpoints/a/best.pt", "head": "logistic regression on cls+patches",
                           "added": [["c2", "photos/c2"]]}
    return model, state


@pytest.mark.parametrize("calibrated", [True, False], ids=["calibrated", "before-unknown"])
@pytest.mark.parametrize("last", [False, True], ids=["best", "last"])
def test_a_checkpoint_of_format_1_loads_as_todays(tmp_path, calibrated, last):
    model, old = main_checkpoint(calibrated=calibrated, last=last, taught=calibrated)
    torch.save(old, tmp_path / "old.pt")
    loaded, ckpt = load_model(tmp_path / "old.pt")
    assert ckpt["format"] == FORMAT != old["format"] and set(ckpt) == set(Checkpoint.__annotations__)
    kept = {k for k in old if k != "format"}
    assert all(ckpt[k] is not None for k in kept) and all(ckpt[k] is None for k in set(ckpt) - kept - {"format"})
    assert ckpt["classes"] == old["classes"] and ckpt["epoch"] == 3 and ckpt["weights"] == "ema"
    if calibrated:
        torch.testing.assert_close(ckpt["unknown"]["precision"], old["unknown"]["precision"])
        assert ckpt["teach_sample"]["head_input"] == "cls+patches" and ckpt["taught"]["from"].endswith("best.pt")
        assert ckpt["class_means"] == {"counts": [4, 4, 4]}  # the CLS token's means, which nothing read, dropped
    assert (ckpt["train_state"] is not None) == last
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x))
    save_checkpoint(ckpt, tmp_path / "again.pt")  # saved again: today's format, the same content
    assert load_checkpoint(tmp_path / "again.pt").keys() == ckpt.keys()


def _taught_v2(tmp_path):
    """(a taught hybrid, a best.pt of it as main wrote one on 2026-12-06, format 2): the gate and its bias held by
    the ViT itself (``gate.*``, ``taught_bias``), the trained head as ``mlp_head.*``, ``taught`` in model_config and
    the CLS token's means in class_means. Keys written by hand, as test_old_runs' files are committed."""
    from vit_flowers.models.taught import with_gate

    torch.manual_seed(0)
    trained = create_vit("vit_micro", 3, image_size=32, patch_size=32, patch_embed="lite0").eval()
    model = with_gate(trained, torch.randn(5, 320), torch.randn(5), 1.0).eval()
    head = {f"mlp_head.{k}": v for k, v in trained.mlp_head.state_dict().items()}
    weights = {**{k: v for k, v in trained.state_dict().items() if not k.startswith("mlp_head.")}, **head,
               "gate.weight": model.mlp_head.gate.weight, "gate.bias": model.mlp_head.gate.bias,
               "taught_bias": torch.tensor(1.0)}
    state = make_state(num_classes=5)
    state.update(format="vit_flowers/2", model=weights, model_config={**trained.config, "num_classes": 5, "taught": 2},
                 classes=["a", "b", "c", "taught1", "taught2"],
                 class_means={"means": torch.randn(5, 64), "counts": [9, 9, 9, 4, 4]})
    torch.save(state, tmp_path / "best.pt")
    return model, tmp_path / "best.pt"


def test_a_taught_checkpoint_of_format_2_loads_as_todays_and_predicts_the_same(tmp_path):
    """The taught state moved into a head of its own (#55): a format-2 taught run's weights are renamed on load, its
    class_means keep their counts alone; the model gives the logits it gave."""
    from vit_flowers.models.taught import TaughtViT

    model, path = _taught_v2(tmp_path)
    loaded, ckpt = load_model(path)
    assert isinstance(loaded, TaughtViT) and ckpt["format"] == FORMAT and ckpt["model_config"]["taught"] == 2
    assert ckpt["class_means"] == {"counts": [9, 9, 9, 4, 4]}
    assert "mlp_head.gate.weight" in ckpt["model"] and "gate.weight" not in ckpt["model"]
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    model_config = {**create_vit("vit_micro", 3).config, "taught": 0}  # a plain run's of format 2 said taught: 0
    torch.save({**make_state(), "format": "vit_flowers/2", "model_config": model_config}, tmp_path / "plain.pt")
    assert "taught" not in load_model(tmp_path / "plain.pt")[1]["model_config"]


def test_a_head_start_runs_copied_rows_of_format_2_are_kept_once(tmp_path):
    """A format-2 hybrid that ended on its head start kept each photo's trunk row twice (its "mirror", a flipped
    grid, pooled to the same row); loaded, its teach_sample holds each photo once. Real mirror images (other rows)
    are kept."""
    trunk, labels = torch.randn(6, 320).half(), torch.tensor([0, 0, 1, 1, 2, 2])
    for second, kept in ((trunk, 6), (torch.randn(6, 320).half(), 12)):
        sample = {"head_input": "cls+patches", "features": torch.randn(12, 128).half(), "labels": labels.repeat(2),
                  "trunk": torch.cat([trunk, second])}
        torch.save({**make_state(), "format": "vit_flowers/2", "teach_sample": sample}, tmp_path / "h.pt")
        found = load_checkpoint(tmp_path / "h.pt")["teach_sample"]
        assert len(found["labels"]) == len(found["features"]) == len(found["trunk"]) == kept
        assert torch.equal(found["trunk"][:6], trunk) and torch.equal(found["features"], sample["features"][:kept])


def test_a_taught_run_of_format_2_starts_a_fine_tune_from_its_trained_network(tmp_path):
    """--pretrained from a taught run: the trained network and a new head (the gate is not trained on)."""
    model, path = _taught_v2(tmp_path)
    tuned = load_pretrained(path, num_classes=5, image_size=32)
    assert type(tuned).__name__ == "ViT" and tuned.num_classes == 5 and "taught" not in tuned.config
    trunk = {k: v for k, v in model.state_dict().items() if not k.startswith("mlp_head.")}
    assert all(torch.equal(tuned.state_dict()[k], v) for k, v in trunk.items())


def test_a_hand_made_checkpoint_of_format_1_gets_the_keys_it_lacks(tmp_path):
    _, old = main_checkpoint(calibrated=False)
    for key in ("weights", "config", "epoch", "best_accuracy"):
        del old[key]
    torch.save(old, tmp_path / "bare.pt")
    ckpt = load_checkpoint(tmp_path / "bare.pt")
    assert (ckpt["weights"], ckpt["config"], ckpt["epoch"], ckpt["best_accuracy"]) == ("raw", {}, 0, None)
    del old["model_config"]
    torch.save(old, tmp_path / "inc.pt")
    with pytest.raises(CheckpointError, match=r"inc.pt is incomplete: missing model_config$"):
        load_checkpoint(tmp_path / "inc.pt")


def test_a_newer_format_or_a_foreign_one_is_named_in_one_line(tmp_path):
    _, state = main_checkpoint()
    for found in ("vit_flowers/4", "vit_flowers/12"):
        torch.save({**state, "format": found}, tmp_path / "new.pt")
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(tmp_path / "new.pt")
        assert str(error.value) == (f"{tmp_path / 'new.pt'} is a vit_flowers checkpoint of format {found!r}, newer "
                                    f"than this vit_flowers reads ({FORMAT!r} at most): upgrade vit_flowers to use it")
    for found in ("vit_flowers/0", "vit_flowers/x", "vit_flowers/", 2, None):
        torch.save({**state, "format": found}, tmp_path / "odd.pt")
        with pytest.raises(CheckpointError, match=r"odd.pt is not a vit_flowers checkpoint \(format "):
            load_checkpoint(tmp_path / "odd.pt")
    with pytest.raises(PretrainedError, match="upgrade vit_flowers"):  # --pretrained reads ours through it too
        load_pretrained(tmp_path / "new.pt", num_classes=3, image_size=32, heads=3)


def test_a_new_checkpoint_holds_every_key_and_the_version(tmp_path):
    state = make_state()
    assert state["format"] == FORMAT == "vit_flowers/3" and set(state) == set(Checkpoint.__annotations__)
    assert [k for k, v in state.items() if v is None] == ["class_means", "unknown", "teach_sample", "taught",
                                                           "train_state"]
    save_checkpoint(state, tmp_path / "a.pt")
    raw = torch.load(tmp_path / "a.pt", weights_only=True)  # a plain dict of tensors and values on disk
    assert type(raw) is dict and raw.keys() == state.keys()


def test_a_run_folder_of_format_1_predicts_evaluates_exports_is_taught_and_resumes(tmp_path):
    run = train_mod.train(smoke_config(tmp_path, run_name="old")).run_dir  # calibrated: it has an unknown rule
    for name in ("best.pt", "last.pt"):  # as main wrote them: format 1, no key that is None today
        torch.save({**{k: v for k, v in load_checkpoint(run / name).items() if v is not None},
                    "format": "vit_flowers/1"}, run / name)
    photos = write_class_folders(tmp_path / "photos", per_class=2)
    assert predict_main([str(photos), "--recursive", "--checkpoint", str(run), "--output", str(tmp_path / "p.csv"),
                         "--quiet"]) == 0
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 1 + 10
    assert evaluate_main(["--checkpoint", str(run), "--output", str(tmp_path / "eval"), "--quiet"]) == 0
    assert "unknown" in json.loads((tmp_path / "eval" / "metrics.json").read_text())  # its rule was read
    assert export_main(["--checkpoint", str(run), "--output", str(tmp_path / "m.onnx"), "--quiet"]) == 0
    assert teach_main([str(run), "--add", f"rose={photos / 'rose'}", "--output", str(tmp_path / "taught")]) == 0
    taught = load_checkpoint(tmp_path / "taught" / "best.pt")
    assert torch.load(tmp_path / "taught" / "best.pt", weights_only=True)["format"] == FORMAT
    assert taught["class_means"]["counts"][2] == load_checkpoint(run / "best.pt")["class_means"]["counts"][2] + 2
    resumed = train_mod.train(smoke_config(tmp_path, run_name="old", resume=str(run / "last.pt"), epochs=3))
    assert load_checkpoint(resumed.run_dir / "last.pt")["epoch"] == 3
