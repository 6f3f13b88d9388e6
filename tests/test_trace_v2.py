"""Trace schema v2 (the read gate): ``results`` / ``read`` events, ``evidence.hit_id``, v1 compatibility, and the
Search-o1 reader's result lists."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from branchgate.errors import InputError
from branchgate.logs_to_dataset.drgym import parse_documents, parse_trace
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.logs_to_dataset.trace_schema import (
    SCHEMA_FILE,
    SCHEMA_VERSION,
    Evidence,
    Raw,
    Read,
    Results,
    SchemaVersionError,
    parse_event,
)
from branchgate.logs_to_dataset.traces import ReadReport, TraceWriter, read_events
from branchgate.texts import SNIPPET_WORDS

FIX = Path(__file__).parent / "fixtures"
HITS = [
    {"hit_id": "d1", "title": "First", "snippet": "one two", "rank": 0, "url": "https://a.example/1"},
    {"hit_id": "d2", "title": "Second", "snippet": "", "rank": 1, "url": None},
]


def _results(**over) -> dict:
    event = {"v": 2, "run_id": "r", "seq": 3, "type": "results", "candidate_id": "c0", "query": "q", "hits": HITS}
    return {**event, **over}


def _runs(path) -> tuple[dict, ReadReport]:
    report = ReadReport()
    return {r.run_id: r for r in read_runs([path], report=report)}, report


def _of(run, etype: str) -> list:
    return [e for e in run.events if e.type == etype]


# --- schema ---------------------------------------------------------------------------------------------------


def test_version_is_2_and_v1_lines_parse_as_before():
    assert SCHEMA_VERSION == 2
    v1 = {"v": 1, "run_id": "r", "seq": 0, "type": "evidence", "evidence_id": "e", "text": "t", "labels": ["k#1"]}
    ev = parse_event(v1)
    assert isinstance(ev, Evidence) and ev.v == 1 and ev.hit_id is None and ev.labels == ["k#1"]
    # results/read did not exist in version 1: a v1 line of those types stays a raw event, as v1 read it
    old = parse_event({**_results(), "v": 1})
    assert isinstance(old, Raw) and old.source_type == "results" and old.data["hits"] == HITS
    with pytest.raises(SchemaVersionError, match="schema version 3 is newer"):
        parse_event({**_results(), "v": 3})


def test_results_and_read_parse_and_default_to_v2():
    res = parse_event(_results())
    assert isinstance(res, Results) and [h.hit_id for h in res.hits] == ["d1", "d2"]
    assert res.hits[1].url is None and res.hits[0].rank == 0
    read = parse_event(
        {"v": 2, "run_id": "r", "seq": 4, "type": "read", "candidate_id": "c0", "hit_id": "d1", "action": "defer"}
    )
    assert isinstance(read, Read) and read.actor == "default" and read.score is None and read.deferred_from is None
    assert Read(run_id="r", seq=0, candidate_id="c", hit_id="h", action="read").v == 2
    assert Evidence(run_id="r", seq=0, evidence_id="e", text="t", hit_id="h").model_dump()["hit_id"] == "h"


@pytest.mark.parametrize(
    "obj, needle",
    [
        (_results(hits=[HITS[0], {**HITS[1], "hit_id": "d1"}]), "field 'hits': value error, duplicate hit_id 'd1'"),
        (_results(hits=[{**HITS[0], "rank": -1}]), "field 'hits.0.rank'"),
        (_results(hits=[{"title": "no id", "rank": 0}]), "field 'hits.0.hit_id'"),
        ({k: v for k, v in _results().items() if k != "hits"}, "field 'hits'"),
        (
            {"v": 2, "run_id": "r", "seq": 0, "type": "read", "candidate_id": "c", "hit_id": "h", "action": "open"},
            "field 'action'",
        ),
        ({"v": 2, "run_id": "r", "seq": 0, "type": "read", "candidate_id": "c", "action": "read"}, "field 'hit_id'"),
    ],
)
def test_bad_results_and_read_events_name_the_field(obj, needle):
    with pytest.raises(InputError) as exc:
        parse_event(obj, "t.jsonl", 7)
    assert needle in str(exc.value) and "t.jsonl:7" in str(exc.value)


def test_duplicate_hit_line_is_skipped_and_reported(tmp_path):
    path = tmp_path / "t.jsonl"
    bad = _results(hits=[HITS[0], HITS[0]])
    path.write_text(json.dumps(_results()) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    report = ReadReport()
    assert [e.type for e in read_events(path, report=report)] == ["results"]
    assert [(s.line, "duplicate hit_id" in s.reason) for s in report.skipped] == [(2, True)]


def test_writer_writes_v2_and_results_read_evidence_round_trip(tmp_path):
    path = tmp_path / "gate.jsonl"
    with TraceWriter(path) as w:
        w.write(type="run_start", run_id="r", root_query="q")
        w.write(type="results", run_id="r", candidate_id="c0", query="q", hits=HITS)
        w.write(
            type="read", run_id="r", candidate_id="c0", hit_id="d1", action="read", actor="gate", score=0.8, p_keep=0.7
        )
        w.write(type="read", run_id="r", candidate_id="c0", hit_id="d2", action="defer", actor="gate")
        w.write(type="evidence", run_id="r", evidence_id="d1", text="First page", hit_id="d1")
        w.write(type="read", run_id="r", candidate_id="c0", hit_id="d2", action="skip", deferred_from=3)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert {line["v"] for line in lines} == {2}
    events = list(read_events(path, strict=True))
    assert [e.type for e in events] == ["run_start", "results", "read", "read", "evidence", "read"]
    assert [h.model_dump() for h in events[1].hits] == HITS
    assert (events[2].action, events[2].actor, events[2].score, events[2].p_keep) == ("read", "gate", 0.8, 0.7)
    assert events[4].hit_id == "d1" and events[5].deferred_from == 3 and events[5].seq == 5
    runs, report = _runs(path)  # the canonical reader gives the same events
    assert report.skipped == [] and [e.model_dump() for e in runs["r"].events] == [e.model_dump() for e in events]


def test_json_schema_accepts_v2_events_and_v1_lines_of_newer_types():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))
    read = {"v": 2, "run_id": "r", "seq": 4, "type": "read", "candidate_id": "c0", "hit_id": "d1", "action": "skip"}
    for good in (_results(), read, {**_results(), "v": 1, "hits": "anything"}):  # the last one reads as raw
        validator.validate(good)
    for bad in (_results(hits=[{"hit_id": "x", "rank": -1}]), {**read, "action": "open"}, {**read, "v": 3}):
        assert not validator.is_valid(bad), bad


# --- Search-o1 result lists -------------------------------------------------------------------------------------


def _check_hits_match_the_trace(run, trace_text: str) -> None:
    """Each search with a result block: a results event whose hits are its documents, a read per hit."""
    _, searches, _, _ = parse_trace(trace_text)
    blocks = [parse_documents(s.result) for s in searches if s.result is not None]
    results, reads = _of(run, "results"), _of(run, "read")
    assert len(results) == len(blocks) == len(_of(run, "retrieval"))
    for res, docs in zip(results, blocks):
        ids = list(dict.fromkeys(d.id for d in docs))
        assert [h.hit_id for h in res.hits] == ids and [h.rank for h in res.hits] == list(range(len(ids)))
        assert all(len(h.snippet.split()) <= SNIPPET_WORDS and "\n" not in h.title for h in res.hits)
    assert [(r.candidate_id, r.hit_id) for r in reads] == [(x.candidate_id, h.hit_id) for x in results for h in x.hits]
    assert {(r.action, r.actor, r.score) for r in reads} <= {("read", "agent", None)}


def test_searcho1_fixture_writes_results_and_reads():
    runs, _ = _runs(FIX / "searcho1")
    run = runs["9000001"]
    _check_hits_match_the_trace(run, (FIX / "searcho1" / "9000001.a").read_text(encoding="utf-8"))
    r0, r1 = _of(run, "results")
    assert (r0.candidate_id, r0.query) == ("c0", "how do cats produce the purring sound")
    first = r0.hits[0]
    assert (first.hit_id, first.rank, first.title, first.url) == (
        "clueweb22-en0001-02-00003",
        0,
        "How Do Cats Purr? | Example Vet",
        "https://www.example-vet.org/cat-purring-mechanism",
    )
    # the next 20 words after the title line, on one line (the text goes on: "per second. The vibration ...")
    words = (
        "Purring is produced by rapid twitching of the laryngeal muscles, which open and close the glottis 25 to 150"
    )
    assert first.snippet == words + " times" and len(first.snippet.split()) == SNIPPET_WORDS == 20
    assert r0.hits[2].snippet.endswith("in pain.")  # a short text: the whole rest of it
    assert [h.hit_id for h in r1.hits] == ["clueweb22-en0012-34-05678", "clueweb22-en0007-55-00042"]
    assert len(_of(run, "read")) == 5  # one per hit, the repeated document included
    # evidence only the first time a document appears in the run, and it names its hit
    assert [(e.evidence_id, e.hit_id) for e in _of(run, "evidence")] == [
        (h.hit_id, h.hit_id) for h in [*r0.hits, r1.hits[0]]
    ]
    # order: decision, results, reads, then evidence and retrieval
    types = [e.type for e in run.events if e.type in ("decision", "results", "read", "evidence", "retrieval")]
    assert types[:9] == ["decision", "results", "read", "read", "read", "evidence", "evidence", "evidence", "retrieval"]
    cut = runs["9000003"]  # a document without a ClueWebID is its URL; the search never run has no results
    assert [h.hit_id for h in _of(cut, "results")[0].hits][0] == "https://oceanservice.example.gov/facts/tides.html"
    assert len(_of(cut, "results")) == len(_of(cut, "decision")) == 1 and _of(runs["9000002"], "results") == []


def test_searcho1_repeated_document_within_a_block_is_one_hit(tmp_path):
    doc = "Doc {} (URL: https://x.example/{}, ClueWebID: {})\nTitle {}\n" + " ".join(f"w{i}" for i in range(30)) + "\n"
    block = doc.format(1, "a", "cw-a", "A") + doc.format(2, "b", "cw-b", "B") + doc.format(3, "a", "cw-a", "A again")
    trace = f"<|begin_search_query|>q1<|end_search_query|>\n<|begin_search_result|>{block}<|end_search_result|>\nDone."
    (tmp_path / "1.q").write_text("question", encoding="utf-8")
    (tmp_path / "1.a").write_text(trace, encoding="utf-8")
    runs, report = _runs(tmp_path)
    run = runs["1"]
    (res,) = _of(run, "results")
    assert [(h.hit_id, h.rank, h.title) for h in res.hits] == [("cw-a", 0, "Title A"), ("cw-b", 1, "Title B")]
    assert res.hits[0].snippet == " ".join(f"w{i}" for i in range(SNIPPET_WORDS))
    assert [r.hit_id for r in _of(run, "read")] == ["cw-a", "cw-b"]
    assert _of(run, "retrieval")[0].evidence_ids == ["cw-a", "cw-b"]
    assert report.warnings["searcho1: document repeated within a result block (one hit, the first)"] == 1


def test_searcho1_result_block_without_documents_has_an_empty_result_list(tmp_path):
    trace = "<|begin_search_query|>q1<|end_search_query|>\n<|begin_search_result|>No results.<|end_search_result|>\nok"
    (tmp_path / "2.q").write_text("question", encoding="utf-8")
    (tmp_path / "2.a").write_text(trace, encoding="utf-8")
    run = _runs(tmp_path)[0]["2"]
    assert [(r.candidate_id, r.hits) for r in _of(run, "results")] == [("c0", [])] and _of(run, "read") == []
    assert _of(run, "retrieval")[0].evidence_ids == []


def test_searcho1_dataset_rows_ignore_the_new_events():
    """The decision points of a Search-o1 run are the same with or without its results/read events."""
    from branchgate.logs_to_dataset.decision_points import run_decisions

    runs, _ = _runs(FIX / "searcho1")
    for run in runs.values():
        with_new = run_decisions(run.run_id, run.events)
        without = run_decisions(run.run_id, [e for e in run.events if e.type not in ("results", "read")])
        assert _decision_summary(with_new) == _decision_summary(without)
    assert Counter(e.type for r in runs.values() for e in r.events)["read"] == 5 + 2


def _decision_summary(rd) -> tuple:
    frames = [
        (f.frame_id, f.retained, f.context_ids, [(c.candidate_id, c.expanded, c.evidence_ids) for c in f.candidates])
        for f in rd.frames
    ]
    return frames, sorted(rd.evidence), rd.problems


@pytest.mark.shared
def test_real_searcho1_hits_per_search(shared):
    d = shared("drgym", "Searcho1_ClueWeb22")
    names = sorted(p.name for p in d.glob("*.a"))[:40]
    seen_hits = 0
    for name in names:
        path = d / name
        runs, report = _runs(path)
        if not runs:
            continue
        (run,) = runs.values()
        _check_hits_match_the_trace(run, path.read_text(encoding="utf-8"))
        for res, ret in zip(_of(run, "results"), _of(run, "retrieval")):
            assert [h.hit_id for h in res.hits] == ret.evidence_ids  # no read stage: every hit's doc is retrieved
        evidence = {e.evidence_id: e for e in _of(run, "evidence")}
        assert all(e.hit_id == eid for eid, e in evidence.items())
        assert {r.hit_id for r in _of(run, "read")} == set(evidence)
        seen_hits += sum(len(r.hits) for r in _of(run, "results"))
    assert seen_hits > 20
