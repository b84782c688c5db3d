"""precision auto: the choice follows a timed probe (faked here), the probe leaves the model alone, a
resumed run keeps the precision it started with, and a probe's verdict is kept per machine and model shape in the
user's cache folder."""

import json
import logging

import pytest
import torch
from helpers import smoke_config

from vit_flowers import train
from vit_flowers.inference import precision, precision_cache
from vit_flowers.inference.loaded import LoadedModel
from vit_flowers.models.vit import create_vit
from vit_flowers.runs.checkpoint import load_checkpoint
from vit_flowers.training import setup

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    """Each test its own cache folder: a verdict kept by one test is not read by the next."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.fixture(autouse=True)
def a_cpu_the_probe_decides_for(monkeypatch, request):
    """The tests below fake the probe: on a CPU without bf16 instructions it would not run at all."""
    if "no_bf16_instructions" not in request.node.name:
        monkeypatch.setattr(precision, "native_bf16_cpu", lambda: None)


def test_a_cpu_with_no_bf16_instructions_stays_fp32_without_the_probe(tmp_path, caplog):
    def probe():
        raise AssertionError("a bf16 step on an AVX2-only CPU took minutes: it must not be timed")

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n")
    assert precision.native_bf16_cpu(str(cpuinfo)) is False
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert precision.native_bf16_cpu(str(cpuinfo)) is True
    assert precision.native_bf16_cpu(str(tmp_path / "none")) is None
    with pytest.MonkeyPatch.context() as mp, caplog.at_level("INFO"):
        mp.setattr(precision, "native_bf16_cpu", lambda: False)
        assert precision.autocast_dtype("auto", CPU, probe) is None
        mp.setattr(precision, "native_bf16_cpu", lambda: True)
        assert precision.autocast_dtype("auto", CPU, lambda: 2.0) is torch.bfloat16
    assert "no bf16 instructions (avx512_bf16 / amx_bf16) -> fp32" in caplog.text


def test_fixed_choices_never_probe():
    def probe():
        raise AssertionError("must not be called")

    assert precision.autocast_dtype("fp32", CPU, probe) is None
    assert precision.autocast_dtype("bf16", CPU, probe) is torch.bfloat16
    assert precision.autocast_dtype("auto", torch.device("mps"), probe) is None
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.autocast_dtype("fp16", CPU)


@pytest.mark.parametrize("speedup, expected", [(2.3, torch.bfloat16), (1.16, torch.bfloat16), (1.1, None),
                                               (0.4, None)])
def test_auto_follows_the_probe(speedup, expected, caplog):
    with caplog.at_level("INFO"):
        assert precision.autocast_dtype("auto", CPU, lambda: speedup) is expected
    assert f"{speedup:.2f}x" in caplog.text and ("bf16" if expected else "fp32") in caplog.text
    assert precision.autocast_dtype("auto", CPU, None) is None  # nothing measured: stay fp32


def test_the_probe_stops_after_a_first_bf16_step_far_slower_than_fp32(monkeypatch):
    calls = {"fp32": 0, "bf16": 0}
    now = [0.0]  # perf_counter: fp32 steps take 1 s, bf16 steps 10 s
    monkeypatch.setattr(precision.time, "perf_counter", lambda: now[0])

    def step(name, seconds):
        def run():
            calls[name] += 1
            now[0] += seconds
        return run

    medians = precision._alternating_medians([step("fp32", 1.0), step("bf16", 10.0)], repeats=5)
    assert calls == {"fp32": 1, "bf16": 1}  # one warm-up call each, no timed rounds
    assert medians[0] / medians[1] < precision.MIN_SPEEDUP
    calls.update(fp32=0, bf16=0)
    precision._alternating_medians([step("fp32", 1.0), step("bf16", 2.0)], repeats=5)
    assert calls == {"fp32": 6, "bf16": 6}  # within reach: measured in full


def test_probe_leaves_weights_statistics_gradients_and_rng_alone():
    model = create_vit("vit_micro", 5, patch_embed="conv")  # BatchNorm statistics that a forward would move
    before = {k: v.clone() for k, v in model.state_dict().items()}
    example = torch.randn(4, 3, 32, 32)
    rng = torch.get_rng_state()
    speedup = precision.bf16_speedup(model, example, train=True, repeats=1)
    assert speedup > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())
    assert model.training  # its mode is untouched too


def test_an_auto_run_records_its_choice_and_a_resume_keeps_it(tmp_path, monkeypatch):
    monkeypatch.setattr(setup, "bf16_speedup", lambda *a, **k: 2.0)
    first = train.train(smoke_config(tmp_path, precision="auto", epochs=1))
    assert load_checkpoint(first.run_dir / "last.pt")["train_state"]["amp"] == "bf16"

    def no_probe(*a, **k):
        raise AssertionError("a resumed auto run must not probe again")

    monkeypatch.setattr(setup, "bf16_speedup", no_probe)
    resumed = train.train(smoke_config(tmp_path, precision="auto", epochs=2, resume="auto"))
    last = load_checkpoint(resumed.run_dir / "last.pt")
    assert last["epoch"] == 2 and last["train_state"]["amp"] == "bf16"


def test_inference_probes_only_when_there_is_enough_to_run(monkeypatch):
    model = create_vit("vit_micro", 5).eval()
    loaded = LoadedModel(model, {"image_size": 32}, None, CPU)
    monkeypatch.setattr(precision, "bf16_speedup", lambda *a, **k: 3.0)
    auto = dict(precision="auto", batch_size=8)
    assert precision.inference_dtype(loaded, 32, **auto) is None  # four batches or fewer: not worth a probe
    assert precision.inference_dtype(loaded, 33, **auto) is torch.bfloat16
    assert precision.inference_dtype(loaded, 10_000, precision="fp32", batch_size=8) is None


class CountedProbe:
    """A fake probe that counts its calls and returns ``speedup``."""

    def __init__(self, speedup: float) -> None:
        self.speedup, self.calls = speedup, 0

    def __call__(self) -> float:
        self.calls += 1
        return self.speedup


def _key(**changes):
    model = create_vit("vit_micro", 5)
    return {**precision.probe_key(model, torch.zeros(4, 3, 32, 32), train=True), **changes}


def test_a_verdict_is_kept_in_the_cache_folder_and_read_back_without_probing(tmp_path, caplog):
    key, probe = _key(), CountedProbe(1.5)
    assert precision_cache.cache_file() == tmp_path / "xdg" / "vit_flowers" / "precision.json"
    assert precision.autocast_dtype("auto", CPU, probe, key=key) is torch.bfloat16
    stored = json.loads(precision_cache.cache_file().read_text())["verdicts"]
    assert [v["speedup"] for v in stored] == [1.5] and stored[0]["key"]["cpu"] == key["cpu"]
    probe.speedup = 0.5  # the machine would measure otherwise now: the kept verdict is what counts
    with caplog.at_level("INFO"):
        assert precision.autocast_dtype("auto", CPU, probe, key=key) is torch.bfloat16
    assert probe.calls == 1 and "1.50x" in caplog.text and "precision.json" in caplog.text
    assert precision.autocast_dtype("auto", CPU, probe, key=_key(torch="9.9")) is None  # a new torch: probed
    assert probe.calls == 2


def test_fresh_probes_again_and_replaces_the_verdict():
    key, probe = _key(), CountedProbe(2.0)
    assert precision.autocast_dtype("auto", CPU, probe, key=key) is torch.bfloat16
    probe.speedup = 1.05
    assert precision.autocast_dtype("auto", CPU, probe, key=key, fresh=True) is None
    assert precision.autocast_dtype("auto", CPU, probe, key=key) is None and probe.calls == 2
    assert len(json.loads(precision_cache.cache_file().read_text())["verdicts"]) == 1


def test_an_unreadable_cache_is_ignored_and_replaced(caplog):
    path = precision_cache.cache_file()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    probe = CountedProbe(2.0)
    with caplog.at_level("WARNING"):
        assert precision.autocast_dtype("auto", CPU, probe, key=_key()) is torch.bfloat16
    assert "ignoring" in caplog.text and str(path) in caplog.text
    assert precision.autocast_dtype("auto", CPU, probe, key=_key()) is torch.bfloat16 and probe.calls == 1


def test_a_cache_that_cannot_be_written_costs_only_the_next_probe(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where the folder should be
    probe = CountedProbe(2.0)
    with caplog.at_level("WARNING"):
        assert precision.autocast_dtype("auto", CPU, probe, key=_key()) is torch.bfloat16
    assert "could not keep the verdict" in caplog.text
    assert precision.autocast_dtype("auto", CPU, probe, key=_key()) is torch.bfloat16 and probe.calls == 2


def _three_probes(caplog) -> list[str]:
    """Three verdicts looked up and kept, as one train run does (a training step, forward passes): the cache's
    warnings."""
    probe = CountedProbe(2.0)
    with caplog.at_level("WARNING", logger=precision_cache.__name__):
        for key in (_key(), _key(step="forward"), _key(batch=[8, 3, 32, 32])):
            assert precision.autocast_dtype("auto", CPU, probe, key=key) is torch.bfloat16
    assert probe.calls == 3  # nothing kept: each probed
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_cache_that_cannot_be_written_warns_once_a_process(monkeypatch, tmp_path, caplog):
    """A read-only home: three probes in one run, one line (it was said once a probe, after a misleading "ignoring"
    each time, when the cache folder's place was a file)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where the folder should be
    warnings = _three_probes(caplog)
    assert len(warnings) == 1, warnings
    assert "could not keep the verdict" in warnings[0] and str(blocker) in warnings[0]
    assert blocker.read_text() == ""


def test_a_corrupt_cache_that_cannot_be_replaced_says_each_once(monkeypatch, caplog):
    """A corrupt file that cannot be written over: "ignoring" once and "could not keep" once in three probes (each
    was said once a probe, "ignoring" twice: by the lookup and by the store)."""
    path = precision_cache.cache_file()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(precision_cache, "atomic_write_text", read_only)
    warnings = _three_probes(caplog)
    assert len(warnings) == 2, warnings
    assert "ignoring" in warnings[0] and "could not keep the verdict" in warnings[1]
    assert path.read_text() == "{not json"


def test_the_key_holds_what_the_verdict_depends_on():
    model, example = create_vit("vit_micro", 5), torch.zeros(4, 3, 32, 32)
    key = precision.probe_key(model, example, train=True)
    assert {"cpu", "bf16_flags", "torch", "threads", "device", "model", "batch"} <= set(key)
    assert key["torch"] == torch.__version__ and key["batch"] == [4, 3, 32, 32]
    assert precision.probe_key(create_vit("vit_micro", 7), example, train=True) == key  # the class count: no
    assert precision.probe_key(model, example, train=False) != key
    assert precision.probe_key(model, torch.zeros(8, 3, 32, 32), train=True) != key
    assert precision.probe_key(create_vit("vit_micro", 5, depth=3), example, train=True) != key
    model.transformer.requires_grad_(False)  # a frozen part has no backward to time
    assert precision.probe_key(model, example, train=True) != key


def test_a_cpu_with_no_bf16_instructions_writes_no_verdict(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: False)
    assert precision.autocast_dtype("auto", CPU, CountedProbe(2.0), key=_key()) is None
    assert not precision_cache.cache_file().exists()


def test_a_second_auto_run_reads_the_verdict_and_precision_probe_fresh_times_it_again(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(setup, "bf16_speedup", lambda *a, **k: calls.append(1) or 2.0)
    train.train(smoke_config(tmp_path, precision="auto", epochs=1, run_name="a", report=False))
    second = train.train(smoke_config(tmp_path, precision="auto", epochs=1, run_name="b", report=False))
    assert len(calls) == 1 and load_checkpoint(second.run_dir / "last.pt")["train_state"]["amp"] == "bf16"
    train.train(smoke_config(tmp_path, precision="auto", precision_probe="fresh", epochs=1, run_name="c",
                             report=False))
    assert len(calls) == 2


def test_the_training_probe_times_a_micro_batch_not_the_whole_batch(tmp_path, monkeypatch):
    shapes = []
    monkeypatch.setattr(setup, "bf16_speedup", lambda model, example, **k: shapes.append(len(example)) or 2.0)
    train.train(smoke_config(tmp_path, precision="auto", epochs=1, batch_size=16, micro_batch=4, report=False))
    assert shapes == [4]  # what a step runs at once, so the probe's peak memory is a step's
