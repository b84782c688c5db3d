"""Shared pytest fixtures."""

import shutil
from pathlib import Path

import pytest
import torch
from helpers import train_micro_run

FLOWERS5 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "flowers5"

# One intra-op thread for the whole session (module-scoped fixtures included): the tests' tiny models
# run as fast on one thread, and many times faster than with two when other processes share 2 cores.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session", autouse=True)
def _user_cache(tmp_path_factory):
    """A cache folder of the test session's own (XDG_CACHE_HOME): precision auto's verdicts
    (vit_flowers/inference/precision_cache.py) never reach the real home's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture
def flowers5_dir() -> Path:
    """The real photos beside the project; the test is skipped when they are absent."""
    if not FLOWERS5.is_dir():
        pytest.skip(f"real flower photos not found at {FLOWERS5}")
    return FLOWERS5



@pytest.fixture(scope="session")
def _micro_source(tmp_path_factory) -> Path:
    """One trained micro run for the whole session (:func:`helpers.train_micro_run`); tests get copies of it."""
    return train_micro_run(tmp_path_factory.mktemp("micro-source") / "checkpoints")


@pytest.fixture(scope="module")
def micro_run(_micro_source, tmp_path_factory) -> Path:
    """A module's own copy of the session's micro run, ``<tmp>/checkpoints/micro/{best.pt, config.yaml,
    metrics.csv}`` with ``<tmp>/checkpoints/latest``: a test may write into it without touching another module's."""
    checkpoints = tmp_path_factory.mktemp("micro") / "checkpoints"
    shutil.copytree(_micro_source.parent, checkpoints, symlinks=True)
    return checkpoints / _micro_source.name
