"""Shared fixtures. Tests use real components on small data and never need the network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BRANCHGATE_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared_path(*parts: str) -> Path:
    """A path under ../shared/data, or skip the test (a user's fresh clone has no ../shared)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path} (../shared/data is not present in this checkout)")
    return path


@pytest.fixture
def shared():
    """``shared("drgym", "key_point")``: a path under ../shared/data, or the test is skipped (tests import only
    ``branchgate.*``, so they take this helper as a fixture rather than importing conftest)."""
    return shared_path


@pytest.fixture(scope="session")
def encoder():
    """The packaged all-MiniLM-L6-v2 encoder (real weights, offline)."""
    from branchgate.models.encoder import Encoder

    return Encoder.load("packaged")


@pytest.fixture(scope="session")
def embed(encoder):
    return encoder.encode
