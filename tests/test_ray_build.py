"""``dataset build --engine ray`` (logs_to_dataset/ray_build.py) builds the same dataset as ``--engine local``.

Runs against the real Ray Data in its own venv (``bash .ci/integration ray``, .ci/integrations/ray.txt) with a
local ``ray.init(num_cpus=2)`` (no dashboard, no network); skipped where Ray is not installed.
"""

from __future__ import annotations

import json
import math
import sqlite3
import sys

import numpy as np
import pytest

ray = pytest.importorskip(
    "ray", reason="Ray is the ray extra (pip install 'branchgate[ray]'); run by bash .ci/integration ray"
)
pytest.importorskip("ray.data", reason="needs Ray Data: pip install 'branchgate[ray]'")

from branchgate.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def ray_local():
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def sample_traces(tmp_path_factory):
    """Traces of the bundled sample (the reference pipeline, as quickstart simulates them), 2 runs."""
    out = tmp_path_factory.mktemp("sim")
    assert (
        main(
            [
                "simulate",
                "--env",
                "sample",
                "--out",
                str(out),
                "--encoder",
                "packaged",
                "--seed",
                "0",
                "--workers",
                "1",
                "--runs",
                "2",
            ]
        )
        == 0
    )
    return out / "traces"


@pytest.fixture(scope="module")
def both(sample_traces, ray_local, tmp_path_factory):
    """The sample built by each engine, each with its own (cold) embedding cache: the Ray build encodes on Ray."""
    from branchgate.logs_to_dataset.build import build
    from branchgate.logs_to_dataset.ray_build import build_ray

    d = tmp_path_factory.mktemp("builds")
    m_local = build([sample_traces], d / "local", encoder="packaged", cache=d / "local.sqlite", progress=False)
    m_ray = build_ray([sample_traces], d / "ray", encoder="packaged", cache=d / "ray.sqlite", progress=False)
    return d, m_local, m_ray


def _same(a, b, col):
    if isinstance(a, float) or isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-6), col
    else:
        assert a == b, col


def test_ray_build_equals_local_build_row_by_row(both):
    from datasets import load_from_disk

    d, m_local, _ = both
    local, on_ray = load_from_disk(str(d / "local")), load_from_disk(str(d / "ray"))
    assert list(local) == list(on_ray)
    assert m_local["n_decisions"]["total"] > 0
    for split in local:
        assert local[split].features == on_ray[split].features, split
        assert local[split].num_rows == on_ray[split].num_rows, split
        for i, (a, b) in enumerate(zip(local[split], on_ray[split])):
            for col in a:
                _same(a[col], b[col], f"{split}[{i}].{col}")


def test_ray_build_manifest_equals_local_manifest(both):
    d, m_local, m_ray = both
    on_disk = json.loads((d / "ray" / "manifest.json").read_text())
    assert on_disk["encoder"] == m_ray["encoder"] == "sentence-transformers/all-MiniLM-L6-v2"

    def comparable(m):  # less what differs between any two builds: times, the cache's file, the embedder's
        m = {k: v for k, v in m.items() if k != "timings"}  # processes and its parity on the probes
        m["embedding_cache"] = {k: v for k, v in m["embedding_cache"].items() if k != "path"}
        m["embedder"] = {k: v for k, v in m["embedder"].items() if k in ("path", "parity_tolerance")}
        return m

    assert comparable(m_ray) == comparable(m_local)
    assert m_ray["embedder"]["path"] == "onnx" and m_ray["embedder"]["parity_max_abs_diff"] <= 1e-6
    assert m_ray["embedding_cache"]["misses"] > 0  # the Ray build encoded (on its actors), not read a warm cache


def test_ray_embeddings_in_the_cache_equal_local_ones(both):
    """The actors' vectors land in the same embedding cache ``train`` reads, within 1e-6 of the local ones."""
    d, _, _ = both

    def vectors(path):
        with sqlite3.connect(str(path)) as db:
            return {(enc, key): np.frombuffer(v, dtype=np.float32) for enc, key, v in db.execute("SELECT * FROM emb")}

    local, on_ray = vectors(d / "local.sqlite"), vectors(d / "ray.sqlite")
    assert local.keys() == on_ray.keys() and local
    worst = max(float(np.abs(local[k] - on_ray[k]).max()) for k in local)
    assert worst <= 1e-6, worst


def test_ray_read_stage_build_equals_local(ray_local, tmp_path):
    """``--stage read --engine ray``: the read stage's rows (its own columns, key-point and teacher labels) come
    back from Ray as the local build makes them."""
    from pathlib import Path

    from datasets import load_from_disk

    from branchgate.logs_to_dataset.build import build
    from branchgate.logs_to_dataset.ray_build import build_ray

    traces = Path(__file__).parent / "fixtures" / "searcho1_kp"
    opts = {"encoder": "packaged", "progress": False, "stage": "read"}
    m_local = build([traces], tmp_path / "local", cache=tmp_path / "l.sqlite", **opts)
    m_ray = build_ray([traces], tmp_path / "ray", cache=tmp_path / "r.sqlite", **opts)
    assert m_ray["stage"] == "read" and m_ray["read"] == m_local["read"] and m_ray["labels"] == m_local["labels"]
    assert m_local["label_kinds"] == {"keypoints": 4, "teacher:sc": 1}
    local, on_ray = load_from_disk(str(tmp_path / "local")), load_from_disk(str(tmp_path / "ray"))
    for split in local:
        assert local[split].features == on_ray[split].features and "rank" in local[split].features, split
        assert local[split].num_rows == on_ray[split].num_rows, split
        for i, (a, b) in enumerate(zip(local[split], on_ray[split])):
            for col in a:
                _same(a[col], b[col], f"{split}[{i}].{col}")


def test_engine_ray_without_ray_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError, as in an install without the extra
    monkeypatch.setitem(sys.modules, "ray.data", None)
    (tmp_path / "t").mkdir()
    rc = main(
        [
            "dataset",
            "build",
            "--engine",
            "ray",
            "--traces",
            str(tmp_path / "t"),
            "--out",
            str(tmp_path / "o"),
            "--encoder",
            "packaged",
            "--no-progress",
        ]
    )
    assert rc == 2
    assert "pip install 'branchgate[ray]'" in capsys.readouterr().err
