"""The bench's read stage pieces without a run: policy points per stage, the two-stage targets, per-search rows and
curve-vs-curve comparisons (the end-to-end bench with a read gate is in tests/test_bench.py)."""

from __future__ import annotations

import numpy as np
import pytest

from branchgate.bench.closed_loop import curve_vs
from branchgate.bench.read_report import targets
from branchgate.bench.settings import gate_stages
from branchgate.bench.sweeps import (
    BOTH_FAMILY,
    BOTH_REVERSE_FAMILY,
    FLOOR_FAMILY,
    READ_FAMILY,
    PolicyPoint,
    both_family,
    is_both_family,
    late_teacher_points,
    read_gate_points,
)
from branchgate.errors import InputError
from branchgate.training.stats import Rows, per_decision


def test_read_gate_points_put_each_controller_in_its_own_stage():
    pts = read_gate_points({"gate_taus": [0.1, 0.3]}, "R.onnx", READ_FAMILY, "P.onnx")
    by = {p.name: p for p in pts}
    assert {p.family for p in pts} == {READ_FAMILY, FLOOR_FAMILY, BOTH_FAMILY, BOTH_REVERSE_FAMILY}
    assert by["read_gate@tau=0.1"].stages == {
        "pre": "none",
        "read": "gate:R.onnx,tau=0.1",
        "post": "none",
        "synth": "none",
    }
    assert by["read_gate+floor@tau=0.3"].read == "gate:R.onnx,tau=0.3,floor=root"
    assert by["gate+read_gate@tau=0.1"].pre == "gate:P.onnx" and by["gate+read_gate@tau=0.1"].read.endswith("tau=0.1")
    assert (
        by["read_gate+gate@tau=0.3"].pre == "gate:P.onnx,tau=0.3" and by["read_gate+gate@tau=0.3"].read == "gate:R.onnx"
    )
    # a later label source's read gate runs alone; read_gate_taus replaces gate_taus
    later = read_gate_points({"gate_taus": [0.1], "read_gate_taus": [0.2]}, "R2.onnx", "read_gate[citations]")
    assert [p.name for p in later] == ["read_gate[citations]", "read_gate[citations]@tau=0.2"]


def test_late_teachers_sweep_keep_top_k_at_read_and_post():
    pts = late_teacher_points({"teachers": ["mmr", "dpp"], "read_max_items": [1, 4], "post_max_items": [2]})
    by = {p.name: p for p in pts}
    assert set(by) == {"mmr@read1", "mmr@read4", "dpp@read1", "dpp@read4", "mmr@post2", "dpp@post2"}
    assert (
        by["dpp@read4"].read == "dpp:max_items=4"
        and by["dpp@read4"].pre == "none"
        and by["dpp@read4"].family == "dpp@read"
    )
    assert by["mmr@post2"].post == "mmr:max_items=2" and by["mmr@post2"].read == "none"
    with pytest.raises(InputError, match="late_teachers"):
        late_teacher_points({"late_teachers": ["nope"], "read_max_items": [1]})
    # a point without a read stage keeps its old spec string (and fingerprint)
    assert PolicyPoint("x", "x", "dpp", "sc", "none").spec == "dpp | sc | none"


def test_late_teachers_sweep_their_threshold_too():
    section = {"teachers": ["dpp"], "read_thresholds": {"dpp": [0.02, 0.05]}, "post_thresholds": {"dpp": [0.1]}}
    by = {p.name: p for p in late_teacher_points(section)}
    assert set(by) == {"dpp@read_threshold=0.02", "dpp@read_threshold=0.05", "dpp@post_threshold=0.1"}
    p = by["dpp@read_threshold=0.05"]
    assert (p.read, p.pre, p.post, p.family, p.budget) == (
        "dpp:threshold=0.05",
        "none",
        "none",
        "dpp@read_threshold",
        0.05,
    )
    assert by["dpp@post_threshold=0.1"].post == "dpp:threshold=0.1"
    for bad, match in (({"nope": [0.1]}, "unknown teacher"), ({"dpp": 0.1}, "list of numbers"), ([0.1], "expected")):
        with pytest.raises(InputError, match=match) as e:
            late_teacher_points({"teachers": ["dpp"], "read_thresholds": bad})
        assert e.value.file == "policies.read_thresholds"


def test_both_stages_at_looser_pre_taus():
    section = {"gate_taus": [0.3], "read_gate_taus": [0.1], "both_pre_taus": [0.02]}
    pts = read_gate_points(section, "R.onnx", READ_FAMILY, "P.onnx")
    by = {p.name: p for p in pts}
    fam = both_family(0.02)
    assert fam == "gate+read_gate[pre=0.02]" and is_both_family(fam) and is_both_family(BOTH_FAMILY)
    assert by[f"{fam}@tau=0.1"].pre == "gate:P.onnx,tau=0.02" and by[f"{fam}@tau=0.1"].read == "gate:R.onnx,tau=0.1"
    assert by[fam].read == "gate:R.onnx" and by[fam].family == fam
    # without a pre gate (a later label source) there is nothing to compose
    assert not any(is_both_family(p.family) for p in read_gate_points(section, "R.onnx", "read_gate[citations]"))


def test_gate_stages_need_pre():
    assert gate_stages({"gate_stages": ["pre", "read"]}) == ["pre", "read"]
    assert gate_stages({"gate_stages": "pre"}) == ["pre"]
    for bad in (["read"], ["pre", "post"], ["pre", "pre"]):
        with pytest.raises(InputError, match="gate_stages"):
            gate_stages({"gate_stages": bad})


def _pol(family, tokens, kpr):
    return {"family": family, "tokens": {"mean": tokens}, "kpr": {"mean": kpr}}


def test_targets_interpolate_each_curve_at_the_token_share():
    pol = {
        "none": _pol("none", 1000.0, 0.5),
        "gate@a": _pol("gate", 200.0, 0.40),
        "gate@b": _pol("gate", 400.0, 0.46),
        "both@a": _pol(BOTH_FAMILY, 250.0, 0.48),
        "both@b": _pol(BOTH_FAMILY, 600.0, 0.49),
        "read@a": _pol(READ_FAMILY, 500.0, 0.49),
    }
    t = targets(pol)
    assert t["gate"]["kpr_share_at"] == pytest.approx(0.86)  # 0.43 / 0.5, halfway between 200 and 400 tokens
    assert t[BOTH_FAMILY]["best_within"] == {"point": "both@a", "token_share": 0.25, "kpr_share": pytest.approx(0.96)}
    assert t[READ_FAMILY]["kpr_share_at"] is None and t[READ_FAMILY]["best_within"] is None
    assert targets({"gate@a": _pol("gate", 1.0, 1.0)}) == {}


def test_per_decision_marks_a_search_positive_when_any_hit_is():
    rows = Rows(
        [0, 1, 0, 0, -1],
        [0, 2, 0, 0, 0],
        ["a", "a", "a", "b", "b"],
        ["s1", "s1", "s2", "s3", "s3"],
        [0, 0, 1, 0, 0],
        {"gate": np.array([0.1, 0.9, 0.3, 0.2, 0.8])},
        [0, 1, 0, 0, 1],
    )
    d = per_decision(rows)
    assert list(d.frames) == ["s1", "s2", "s3"] and list(d.labels) == [1, 0, 0]
    assert list(d.scorers["gate"]) == [0.9, 0.3, 0.2]  # the unlabelled hit of s3 does not count
    assert list(d.runs) == ["a", "a", "b"] and list(d.depth) == [0, 1, 0] and list(d.utility) == [2, 0, 0]


def test_curve_vs_pairs_one_curve_at_each_point_of_another():
    pts = [PolicyPoint("g1", "gate", "gate:P"), PolicyPoint("g2", "gate", "gate:P,tau=0.5")]
    pts += [
        PolicyPoint("b1", BOTH_FAMILY, "gate:P", read="gate:R"),
        PolicyPoint("b2", BOTH_FAMILY, "gate:P", read="gate:R,tau=0.5"),
    ]
    runs = {
        "g1": {"q1": {"tokens": 100, "kpr": 0.3}, "q2": {"tokens": 100, "kpr": 0.5}},
        "g2": {"q1": {"tokens": 300, "kpr": 0.5}, "q2": {"tokens": 300, "kpr": 0.6}},
        "b1": {"q1": {"tokens": 100, "kpr": 0.4}, "q2": {"tokens": 100, "kpr": 0.6}},
        "b2": {"q1": {"tokens": 300, "kpr": 0.6}, "q2": {"tokens": 300, "kpr": 0.7}},
    }
    out = curve_vs(pts, runs, BOTH_FAMILY, "gate", boot=20)
    assert set(out) == {"g1", "g2"}
    assert out["g1"]["kpr_delta"]["mean"] == pytest.approx(0.1) and out["g2"]["kpr_delta"]["mean"] == pytest.approx(0.1)
    assert not out["g1"]["extrapolated"] and out["g1"]["queries"] == 2
