"""bench/calibration.py: the same statistics of simulated and real logs, and the table comparing them."""

from __future__ import annotations

from pathlib import Path

import pytest

from branchgate.bench.calibration import calibrate, checks, shape, table
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import simulate

REAL = Path(__file__).parent / "fixtures" / "searcho1_kp" / "Searcho1_ClueWeb22"


def test_shape_of_real_search_o1_logs():
    s = shape([REAL])
    assert s["runs"] == 2 and s["runs_with_searches"] >= 1
    assert s["hits_per_search"] >= s["new_hits_per_search"] > 0
    assert s["labelled_hits"] > 0 and 0 < s["positive_rate"] <= 1
    assert s["reads_per_run"] > 0  # a log without read events reads every new hit it lists


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "sim"
    simulate("sample", Config(depth=2, top_k=5), out, runs=3, progress=False)
    return out / "traces"


def test_simulated_and_real_side_by_side(sim):
    cal = calibrate({"traces": [sim]}, {"traces": [REAL]})
    s = cal["sim"]["shape"]
    assert s["runs"] == 3 and s["hits_per_search"] <= 5
    what = {r["what"]: r for r in cal["checks"]}
    row = what["read: hits per search"]
    assert row["diff"] == pytest.approx(row["sim"] - row["real"])
    lines = table(cal)
    assert lines[0].startswith("| statistic |") and any("positive rate" in x for x in lines)


def test_targets_are_checked_where_set():
    sim = {"read": {"positive_rate": 0.1, "auroc": {"dpp": 0.90, "sc": 0.75}}, "frontier": {"kpr_at": {"30%": 0.9}}}
    real = {"read": {"positive_rate": 0.15, "auroc": {"dpp": 0.82, "sc": 0.74}}, "frontier": {"kpr_at": {"30%": 0.7}}}
    ok = {r["what"]: r.get("ok") for r in checks(sim, real)}
    assert ok["read: dpp AUROC"] is False and ok["read: sc AUROC"] is True
    assert ok["read: DPP frontier KPR at 30% of tokens"] is False and ok["read: positive rate"] is None
