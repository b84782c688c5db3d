"""Shared pytest fixtures."""

from pathlib import Path

import pytest
import torch

FLOWERS5 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "flowers5"

# One intra-op thread for the whole session (module-scoped fixtures included): the tests' tiny models
# run as fast on one thread, and many times faster than with two when other processes share 2 cores.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def flowers5_dir() -> Path:
    """The real photos beside the project; the test is skipped when they are absent."""
    if not FLOWERS5.is_dir():
        pytest.skip(f"real flower photos not found at {FLOWERS5}")
    return FLOWERS5

