"""The common-sense suite (``bench/common_sense.py``): hand-written decisions, and the shipped controllers on them."""

from __future__ import annotations

import json

import pytest

from branchgate.bench import common_sense as cs
from branchgate.errors import InputError
from branchgate.inference.gate import Gate
from branchgate.pretrained import NAMES

# Controllers that do not pass yet, with the measured reason (docs/research/honest-simulator.md). A strict xfail:
# the day one passes, this list must shrink.
_DPP_PRE = "DPP at its τ (F1 on the samples): order 0.93 (the encoder's cosine: 0.92), keeps 0.58 of the relevant"
_DPP_READ = "DPP at its τ (F1 on the samples, where positives are rare) keeps 0.68 of the relevant hits (order 0.98)"
KNOWN_FAILING = {
    "pre": _DPP_PRE,
    "pre-teacher": _DPP_PRE,
    "read": _DPP_READ,
    "read-teacher": _DPP_READ,
    "pre-model": "order 0.93 (the encoder's cosine: 0.92), keeps 0.79 of the relevant sub-queries and 0.09 of the rest",
    "read-model": "keeps 0.78 of the relevant hits (order 0.99, irrelevant kept 0.00)",
}


def test_suite_is_large_varied_and_well_formed():
    decisions = {s: cs.load(s) for s in cs.STAGES}
    assert sum(len(d) for d in decisions.values()) >= 50
    assert all(len(d) >= 25 for d in decisions.values())  # both stages
    domains = {d.domain for ds in decisions.values() for d in ds}
    assert len(domains) >= 15
    for stage, ds in decisions.items():
        assert len({d.id for d in ds}) == len(ds), stage
        # the items are shown in a mixed order: relevant ones are not listed (ranked) first on the whole
        pos = {r: [j / (len(d.items) - 1) for d in ds for j, x in enumerate(d.relevant) if x == r] for r in (1, 0)}
        assert abs(sum(pos[1]) / len(pos[1]) - sum(pos[0]) / len(pos[0])) < 0.15, stage
        for d in ds:
            assert any(d.relevant) and not all(d.relevant), d.id
            if stage == "read":
                assert d.query and all(h["title"] and h["snippet"] for h in d.items), d.id


def test_bad_suite_file_names_the_file(tmp_path):
    bad = tmp_path / "pre.json"
    bad.write_text(json.dumps({"decisions": [{"question": "q", "relevant": ["a"], "irrelevant": []}]}))
    with pytest.raises(InputError, match="relevant"):
        cs.load("pre", bad)
    bad.write_text("{not json")
    with pytest.raises(InputError, match="pre.json"):
        cs.load("pre", bad)


@pytest.fixture(scope="module")
def results():
    return {n: cs.check(Gate.load(f"pretrained:{n}", threads=1)) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_pretrained_controllers_pass_the_suite(results, name, request):
    if name in KNOWN_FAILING:
        request.applymarker(pytest.mark.xfail(strict=True, reason=KNOWN_FAILING[name]))
    r = results[name]
    assert r["decisions"] >= 25
    assert 0.0 <= r["irrelevant_kept"] <= 1.0 and 0.0 <= r["relevant_kept"] <= 1.0
    assert r["passed"], cs.line(r)


def test_line_reports_figures_and_verdict(results):
    text = cs.line(results["read"])
    assert "common sense (read" in text and ("pass" in text or "FAIL" in text)
