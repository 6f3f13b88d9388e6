"""Numbers at the edges, item caps, read-stage traces and replay inputs (issue 62, items 6-10 and the minor ones):
every bound lives in ``branchgate.limits`` and is enforced by one rule — a list of a decision past ``MAX_ITEMS`` and
a count past ``MAX_COUNT`` are a ``LimitError`` naming the field and the bound (``inference/inputs.py``), a trace
event with a count out of bounds a skipped line naming its file and line (``trace_schema``), a replay option out of
range an error before any work. Each test failed (a traceback, a silent result or a late refusal) before.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from branchgate.cli import main
from branchgate.errors import InputError, LimitError
from branchgate.inference.inputs import as_candidates, as_hits, as_read_decision, check_numbers
from branchgate.limits import MAX_CANDIDATES, MAX_COUNT, MAX_HITS, MAX_ITEMS
from branchgate.logs_to_dataset.trace_schema import parse_event

PRE, READ = "pretrained:pre-model", "pretrained:read-model"
pytestmark = pytest.mark.filterwarnings("ignore:.*decision outside the training range")
HUGE = 10**400


# -- traces ----------------------------------------------------------------------------------------------------------
def _events(run_id: str, steps) -> list[dict]:
    return [{"v": 2, "run_id": run_id, "seq": i, "type": t, **f} for i, (t, f) in enumerate(steps)]


def read_run(run_id: str = "run-0", n_hits: int = 3, empty_hit: int | None = None) -> list[dict]:
    """A run with one search (``n_hits`` hits, all read, each with a key point) and one search without a list."""
    hits = [
        {"hit_id": f"d{r}", "title": f"Title {r}", "snippet": f"snippet about {r}", "rank": r} for r in range(n_hits)
    ]
    if empty_hit is not None:
        hits[empty_hit].update(title="", snippet="")
    steps = [
        ("run_start", {"root_query": "why do cats purr"}),
        ("llm_call", {"purpose": "plan", "in_tokens": 10, "out_tokens": 10}),
        ("frame_open", {"frame_id": "f0", "depth": 0, "frame_query": "why do cats purr"}),
        ("candidate", {"frame_id": "f0", "candidate_id": "c0", "query": "cat purring", "goal": "mechanism"}),
        ("candidate", {"frame_id": "f0", "candidate_id": "c1", "query": "cat sounds"}),
        ("decision", {"candidate_id": "c0", "action": "expand"}),
        ("decision", {"candidate_id": "c1", "action": "expand"}),
        ("results", {"candidate_id": "c0", "query": "cat purring", "hits": hits}),
    ]
    for h in hits:
        steps.append(("read", {"candidate_id": "c0", "hit_id": h["hit_id"], "action": "read"}))
        text = f"page {h['hit_id']} says cats purr at {h['rank']} Hz"
        steps.append(
            ("evidence", {"evidence_id": "e" + h["hit_id"], "text": text, "hit_id": h["hit_id"], "tokens": 50})
        )
        steps[-1][1]["labels"] = [f"k{h['rank']}"]
    steps += [
        (
            "retrieval",
            {"candidate_id": "c0", "query": "cat purring", "evidence_ids": ["e" + h["hit_id"] for h in hits]},
        ),
        ("llm_call", {"purpose": "process", "in_tokens": 100, "out_tokens": 5}),
        ("evidence", {"evidence_id": "x1", "text": "cats purr when content", "tokens": 50, "labels": ["kx"]}),
        ("retrieval", {"candidate_id": "c1", "query": "cat sounds", "evidence_ids": ["x1"]}),
        ("llm_call", {"purpose": "process", "in_tokens": 50, "out_tokens": 5}),
        ("llm_call", {"purpose": "synthesis", "in_tokens": 200, "out_tokens": 50}),
        ("report", {"text": "cats purr", "evidence_ids": ["ed0"], "cited_ids": ["ed0"]}),
        ("run_end", {"status": "ok", "totals": {"n_key_points": n_hits + 1}}),
    ]
    return _events(run_id, steps)


def big_frame_run(k: int) -> list[dict]:
    """One frame of ``k`` candidates, two of them expanded: the first and the last (past the cap when k > 256)."""
    last = k - 1
    steps = [("run_start", {"root_query": "q"}), ("frame_open", {"frame_id": "f0", "frame_query": "q"})]
    steps += [
        ("candidate", {"frame_id": "f0", "candidate_id": f"c{i}", "order": i, "query": f"sub {i}"}) for i in range(k)
    ]
    steps += [
        ("decision", {"candidate_id": "c0", "action": "expand"}),
        ("evidence", {"evidence_id": "e0", "text": "a", "tokens": 10, "labels": ["k1"]}),
        ("retrieval", {"candidate_id": "c0", "query": "sub 0", "evidence_ids": ["e0"]}),
        ("decision", {"candidate_id": f"c{last}", "action": "expand"}),
        ("evidence", {"evidence_id": "e1", "text": "b", "tokens": 10, "labels": ["k2"]}),
        ("retrieval", {"candidate_id": f"c{last}", "query": f"sub {last}", "evidence_ids": ["e1"]}),
        ("run_end", {"status": "ok", "totals": {"n_key_points": 2}}),
    ]
    return _events("big", steps)


def write(path: Path, events: list[dict], text: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text is not None else "".join(json.dumps(e) + "\n" for e in events))
    return path


def cli(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.err + cap.out


def gate_cli(capsys, monkeypatch, body: str, *args) -> tuple[int, str, str]:
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(body.encode())))
    capsys.readouterr()
    rc = main(["gate", *map(str, args)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# -- item 7: items per decision --------------------------------------------------------------------------------------
def test_inputs_refuse_more_than_max_items_without_reading_an_iterator_further():
    with pytest.raises(LimitError, match=f"candidates: has 1000000 candidates: at most {MAX_ITEMS} per decision"):
        as_candidates([f"c{i}" for i in range(1_000_000)])
    pulled = []

    def endless():
        i = 0
        while True:
            pulled.append(i)
            yield f"c{i}"
            i += 1

    with pytest.raises(LimitError, match=f"more than {MAX_ITEMS} candidates.*branchgate.limits.MAX_ITEMS"):
        as_candidates(endless())
    assert len(pulled) == MAX_ITEMS + 1  # read one past the bound, no further
    with pytest.raises(LimitError, match="state.read: has 300 items"):
        as_read_decision({"read": ["a text"] * 300}, [{"title": "t"}])
    assert len(as_hits([{"title": f"t{i}"} for i in range(MAX_ITEMS)])) == MAX_ITEMS  # the bound itself is fine


@pytest.mark.parametrize("model", [PRE, READ, "pretrained:pre"])
def test_gate_select_with_a_million_items_is_a_limit_error(model):
    """It ended in onnxruntime's raw "Failed to allocate memory" (hits), or ran for minutes (the teacher gate)."""
    from branchgate.inference.gate import Gate

    gate = Gate.load(model, threads=1)
    items = [{"title": f"t{i}", "snippet": "s"} for i in range(1_000_000)] if gate.stage == "read" else ["q"] * 10**6
    with pytest.raises(LimitError, match=f"at most {MAX_ITEMS} per decision"):
        gate.select({"root_query": "q"}, items)
    if gate.stage == "pre":
        with pytest.raises(LimitError, match="state.retained: has 1000000 items"):
            gate.select({"root_query": "q", "retained": ["r"] * 10**6}, ["a"])
    else:
        with pytest.raises(LimitError, match="state.read: has 1000000 items"):
            gate.select({"root_query": "q", "read": ["r"] * 10**6}, [{"title": "a"}])


def test_gate_cli_with_100k_candidates_or_hits_exits_2_naming_the_limit(capsys, monkeypatch):
    body = json.dumps({"state": {"root_query": "q"}, "candidates": [f"c{i}" for i in range(100_000)]})
    rc, out, err = gate_cli(capsys, monkeypatch, body, "--pre", PRE)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert f"field 'candidates': has 100000 candidates: at most {MAX_ITEMS}" in err
    body = json.dumps({"state": {"root_query": "q"}, "hits": [{"title": f"t{i}"} for i in range(100_000)]})
    rc, out, err = gate_cli(capsys, monkeypatch, body, "--read", READ)
    assert rc == 2 and "field 'hits': has 100000 hits" in err and "branchgate.limits.MAX_ITEMS" in err


def test_gate_cli_budgeted_run_lists_are_bounded(capsys, monkeypatch, tmp_path):
    run = {"state": {"root_query": "q"}, "run_id": "r", "budget_nodes": 3}
    body = json.dumps({**run, "candidates": [f"c{i}" for i in range(1000)]})
    rc, out, err = gate_cli(capsys, monkeypatch, body, "--pre", PRE, "--state", tmp_path / "s.json")
    assert rc == 2 and "has 1000 candidates" in err
    body = json.dumps({**run, "candidates": ["a"], "spend": [1] * 1000})
    rc, out, err = gate_cli(capsys, monkeypatch, body, "--pre", PRE, "--state", tmp_path / "s.json")
    assert rc == 2 and "field 'spend': has 1000 spends" in err


# -- item 6: huge numbers through `branchgate gate` ------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, field",
    [
        ({"costs": [HUGE, 1]}, "costs[0]"),
        ({"spend": HUGE}, "spend"),
        ({"spend": [1, HUGE]}, "spend[1]"),
        ({"budget_tokens": HUGE}, "budget_tokens"),
        ({"budget_nodes": MAX_COUNT + 1}, "budget_nodes"),
    ],
)
def test_gate_cli_huge_budget_numbers_are_named_errors(capsys, monkeypatch, tmp_path, extra, field):
    """``costs: [10**400, ...]`` was an OverflowError traceback."""
    body = json.dumps(
        {"state": {"root_query": "q"}, "candidates": ["a", "b"], "run_id": "r", "budget_nodes": 3, **extra}
    )
    rc, out, err = gate_cli(capsys, monkeypatch, body, "--pre", PRE, "--state", tmp_path / "s.json")
    assert rc == 2 and out == "" and "Traceback" not in err
    assert f"field '{field}': must be at most" in err and "branchgate.limits.MAX_COUNT" in err


def test_gate_cli_state_file_holding_a_huge_number_is_a_named_error(capsys, monkeypatch, tmp_path):
    state = tmp_path / "runs.json"
    text = '{"runs": {"r": {"version": 1, "budget": {"nodes": 5, "spent_tokens": ' + "9" * 400 + '}}}, "ended": {}}'
    state.write_text(text)
    body = json.dumps({"state": {"root_query": "q"}, "candidates": ["a"], "run_id": "r"})
    rc, out, err = gate_cli(capsys, monkeypatch, body, "--pre", PRE, "--state", state)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert f"{state}: field 'runs.r.budget.spent_tokens' holds an integer of 400 digits" in err
    assert state.read_text() == text  # never rewritten
    with pytest.raises(LimitError, match="field 'a\\[1\\]' holds inf"):
        check_numbers({"a": [1, float("inf")]}, "f.json")


# -- minor: a read request with both hits and items ------------------------------------------------------------------
def test_gate_cli_read_request_with_hits_and_items_is_refused(capsys, monkeypatch):
    body = json.dumps({"state": {"root_query": "q"}, "hits": [{"title": "a"}], "items": [{"title": "b"}]})
    rc, out, err = gate_cli(capsys, monkeypatch, body, "--read", READ)
    assert rc == 2 and out == "" and "fields 'hits' and 'items'" in err


# -- items 8-9: counts in traces -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "etype, fields, field",
    [
        ("evidence", {"evidence_id": "e", "text": "t", "tokens": -1005}, "tokens"),
        ("llm_call", {"in_tokens": HUGE}, "in_tokens"),
        ("llm_call", {"out_tokens": -1}, "out_tokens"),
        ("retrieval", {"candidate_id": "c", "query": "q", "tokens": -3}, "tokens"),
        (
            "results",
            {"candidate_id": "c", "query": "q", "hits": [{"hit_id": "h", "title": "t", "rank": 10**30}]},
            "hits.0.rank",
        ),
        ("frame_open", {"frame_id": "f", "frame_query": "q", "depth": 10**30}, "depth"),
        ("candidate", {"frame_id": "f", "candidate_id": "c", "query": "q", "order": 10**30}, "order"),
    ],
)
def test_counts_out_of_bounds_are_a_named_bad_line(etype, fields, field):
    """Negative token counts were accepted (an unpruned replay of -1005 tokens); 10**30 ranks and 10**400 tokens
    were OverflowError tracebacks in the row store and the replay report."""
    with pytest.raises(InputError, match=f"runs.jsonl:7: invalid event: field '{field}'"):
        parse_event({"v": 2, "run_id": "r", "seq": 1, "type": etype, **fields}, "runs.jsonl", 7)


def test_replay_skips_a_line_with_a_huge_count_and_says_where(tmp_path, capsys, caplog):
    events = read_run()
    text = "".join(json.dumps(e) + "\n" for e in events).replace('"in_tokens": 100,', f'"in_tokens": {HUGE},', 1)
    traces = write(tmp_path / "logs" / "r.jsonl", [], text)
    line = next(i for i, x in enumerate(text.splitlines(), 1) if str(HUGE) in x)
    rc, err = cli(
        capsys,
        "replay",
        "--traces",
        traces,
        "--pre",
        PRE,
        "--out",
        tmp_path / "o",
        "--bootstrap",
        "20",
        "--no-progress",
    )
    assert rc == 0 and "Traceback" not in err
    assert f"1 record(s) skipped, not replayed: {traces}:{line}: invalid event: field 'in_tokens'" in caplog.text
    report = json.loads((tmp_path / "o" / "replay.json").read_text())
    assert report["skipped"]["records"] == 1 and report["skipped"]["first"][0]["line"] == line


def test_read_build_with_a_rank_of_ten_to_the_thirty_skips_that_line(tmp_path, encoder):
    from branchgate.logs_to_dataset.build import build

    events = read_run()
    events[7]["hits"][1]["rank"] = 10**30
    traces = write(tmp_path / "logs" / "r.jsonl", events)
    manifest = build(
        [traces],
        tmp_path / "ds",
        stage="read",
        cache=tmp_path / "c.sqlite",
        progress=False,
        encoder_obj=encoder,
        embed="torch",
    )
    assert manifest["skipped"][0]["line"] == 8 and "hits.1.rank" in manifest["skipped"][0]["reason"]


def test_read_build_leaves_out_hits_without_title_and_snippet_and_counts_them(tmp_path, encoder):
    """A hit with an empty title and snippet was ``KeyError: ''`` (labels.py) at any label source."""
    from branchgate.logs_to_dataset.build import build

    traces = write(tmp_path / "logs" / "r.jsonl", read_run(empty_hit=1))
    for labels in ("keypoints", "teacher:sc"):
        manifest = build(
            [traces],
            tmp_path / labels.replace(":", "_"),
            stage="read",
            labels=labels,
            cache=tmp_path / "c.sqlite",
            progress=False,
            encoder_obj=encoder,
            embed="torch",
        )
        assert manifest["run_problems"]["hits_without_text"] == 1
        assert manifest["read"]["new_hits"] == 2  # d0 and d2 have rows; d1 is left out


def test_replay_read_leaves_out_hits_without_text_and_past_the_cap(tmp_path, capsys):
    """An empty hit made the read replay exit 2 (the Gate refuses it); a list over the Gate's cap would too."""
    events = read_run(n_hits=MAX_HITS + 10, empty_hit=0)
    traces = write(tmp_path / "logs" / "r.jsonl", events)
    rc, err = cli(
        capsys,
        "replay",
        "--traces",
        traces,
        "--read",
        READ,
        "--out",
        tmp_path / "o",
        "--bootstrap",
        "20",
        "--no-progress",
    )
    assert rc == 0, err
    report = json.loads((tmp_path / "o" / "replay.json").read_text())
    assert report["left_out"] == {
        "candidates": 0,
        "hits": 9,
        "hits_without_text": 1,
        "runs": 1,
        "caps": {"candidates": MAX_CANDIDATES, "hits": MAX_HITS},
    }
    assert f"9 hits past the first {MAX_HITS} of their search; 1 hits with neither title nor snippet" in err
    assert report["unpruned"]["hits_read"] == MAX_HITS


def test_replay_counts_the_candidates_past_the_cap_and_prints_them(tmp_path, capsys):
    """A frame of 100,000 candidates replayed 1 search of the log's 2, and half its value, with no word of why."""
    traces = write(tmp_path / "logs" / "r.jsonl", big_frame_run(MAX_CANDIDATES + 100))
    rc, err = cli(
        capsys,
        "replay",
        "--traces",
        traces,
        "--pre",
        PRE,
        "--out",
        tmp_path / "o",
        "--bootstrap",
        "20",
        "--no-progress",
    )
    assert rc == 0, err
    report = json.loads((tmp_path / "o" / "replay.json").read_text())
    assert report["left_out"]["candidates"] == 100 and report["unpruned"]["searches"] == 1
    assert f"100 candidates past the first {MAX_CANDIDATES} of their frame" in report["summary"]
    assert f"100 candidates past the first {MAX_CANDIDATES}" in err


# -- item 9: an all-zero embedding cache -----------------------------------------------------------------------------
def test_an_all_zero_embedding_cache_is_refused(encoder, tmp_path):
    """It gave every teacher column 0 (DPP, MMR, SC) or 1 (CD), with no warning."""
    from branchgate.data.embedding_cache import EmbeddingCache

    cache = tmp_path / "c.sqlite"
    EmbeddingCache(encoder, cache).get(["a text", "another"])
    db = sqlite3.connect(cache)
    db.execute("UPDATE emb SET vec = ?", (np.zeros(encoder.dim, np.float32).tobytes(),))
    db.commit()
    db.close()
    with pytest.raises(InputError, match=f"{cache}: holds all-zero vectors"):
        EmbeddingCache(encoder, cache).get(["a text"])


# -- item 9: a dataset that is not of these logs ---------------------------------------------------------------------
def test_replay_with_a_dataset_of_other_logs_is_an_error(tmp_path, capsys, encoder):
    """It gave value 0.0 at every τ, with no warning."""
    from branchgate.logs_to_dataset.build import build

    other = write(tmp_path / "other" / "r.jsonl", [e for r in ("zz-0", "zz-1", "zz-2") for e in read_run(r)])
    build(
        [other],
        tmp_path / "ds",
        labels="teacher:sc",
        cache=tmp_path / "c.sqlite",
        progress=False,
        encoder_obj=encoder,
        embed="torch",
    )
    mine = write(tmp_path / "mine" / "r.jsonl", read_run("run-0"))
    rc, err = cli(
        capsys,
        "replay",
        "--traces",
        mine,
        "--pre",
        PRE,
        "--dataset",
        tmp_path / "ds",
        "--out",
        tmp_path / "o",
        "--no-progress",
    )
    assert rc == 2 and "--dataset: no labelled row of" in err and "'zz-0'" in err and "'run-0'" in err
    assert not (tmp_path / "o" / "replay.json").exists()


# -- item 10 and the minor ones: replay options checked before any work ----------------------------------------------
@pytest.mark.parametrize(
    "args, option, says",
    [
        (["--pre", PRE, "--bootstrap", "1000000000"], "--bootstrap", "branchgate.limits.MAX_BOOTSTRAP"),
        (["--pre", PRE, "--labels", "teacher:"], "--labels", "teacher:NAME names a teacher"),
        (["--pre", PRE, "--labels", "judge"], "--labels", "--llm-url and --llm-model"),
        (["--read", READ, "--labels", "judge", "--llm-url", "u", "--llm-model", "m"], "--labels", "--stage read"),
        (["--pre", PRE, "--pre-tau", "0.3"], "--pre-tau", "give it with --pre and --read"),
        (["--pre", PRE, "--read", READ, "--pre-tau", "7"], "--pre-tau", "must be a number in [0, 1]"),
        (["--pre", PRE, "--floor", "root"], "--floor", "give --read"),
        (["--pre", PRE, "--threads", "-5"], "--threads", "must be an integer from 1"),
        (["--pre", PRE, "--taus", "0.2,x"], "--taus", "comma-separated"),
        (["--read", READ, "--run-budgets", "0.5"], "--run-budgets", "no --read"),
        (["--pre", PRE, "--dataset", "no/such/folder"], "no/such/folder", "not a folder"),
    ],
)
def test_replay_options_are_refused_before_any_work(tmp_path, capsys, monkeypatch, args, option, says):
    """``--bootstrap 1000000000`` ran on with growing memory; ``--labels teacher:`` built a dataset for 8 s first;
    ``--pre-tau`` without ``--read`` was ignored, and its errors said ``tau``."""
    import branchgate.logs_to_dataset.readers as readers

    def no_reading(*a, **k):
        raise AssertionError("the logs were read before the options were checked")

    monkeypatch.setattr(readers, "read_runs", no_reading)
    traces = write(tmp_path / "logs" / "r.jsonl", read_run())
    rc, err = cli(capsys, "replay", "--traces", traces, *args, "--out", tmp_path / "o", "--no-progress")
    assert rc == 2 and f"{option}: " in err and says in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_dataset_build_prints_what_the_candidate_cap_left_out(tmp_path, encoder):
    """The 256-candidate cap was recorded in manifest.json only."""
    from branchgate.logs_to_dataset.build import build
    from branchgate.logs_to_dataset.build_report import summary_line
    from branchgate.logs_to_dataset.decision_points import OVER_CANDIDATES

    traces = write(tmp_path / "logs" / "r.jsonl", big_frame_run(MAX_CANDIDATES + 44))
    manifest = build(
        [traces], tmp_path / "ds", cache=tmp_path / "c.sqlite", progress=False, encoder_obj=encoder, embed="torch"
    )
    assert manifest["run_problems"] == {OVER_CANDIDATES: 44}
    line = summary_line(manifest, tmp_path / "ds")
    assert f"counted in the manifest's run_problems: 44 × candidate past the first {MAX_CANDIDATES}" in line
