"""Fixtures of the research probes' tests (run from the repository root: ``python3 -m pytest research/tests``)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def sample_runs(tmp_path_factory):
    """Four unpruned runs of the reference pipeline on the bundled sample (depth 2): every branch expanded."""
    from branchgate.pipeline.config import Config
    from branchgate.pipeline.simulate import simulate

    out = tmp_path_factory.mktemp("sim")
    simulate("sample", Config(depth=2), out, runs=4, progress=False)
    return out
