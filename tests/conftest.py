"""Shared pytest fixtures."""

from pathlib import Path

import pytest
import torch

FLOWERS5 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "flowers5"


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def flowers5_dir() -> Path:
    """The real photos beside the project; the test is skipped when they are absent."""
    if not FLOWERS5.is_dir():
        pytest.skip(f"real flower photos not found at {FLOWERS5}")
    return FLOWERS5
