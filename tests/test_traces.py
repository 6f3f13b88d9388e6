"""Canonical trace schema, the append-only writer and the streaming reader (incl. malformed files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from branchgate.errors import InputError
from branchgate.logs_to_dataset.trace_schema import (
    SCHEMA_FILE,
    SCHEMA_VERSION,
    Candidate,
    Raw,
    RunStart,
    SchemaVersionError,
    json_schema,
    parse_event,
    schema_text,
)
from branchgate.logs_to_dataset.traces import ReadReport, TraceWriter, read_events

FIX = Path(__file__).parent / "fixtures"
BROKEN = FIX / "canonical_broken"


def _read(path, strict=False):
    report = ReadReport()
    return list(read_events(path, strict=strict, report=report)), report


# --- schema -----------------------------------------------------------------------------------------


def test_every_event_carries_the_version_and_round_trips():
    ev = parse_event({"v": 1, "run_id": "r", "seq": 0, "type": "run_start", "root_query": "q", "extra_field": 3})
    assert isinstance(ev, RunStart) and ev.v == 1 and ev.extra_field == 3  # a v1 line keeps its version
    assert json.loads(ev.model_dump_json())["v"] == 1


@pytest.mark.parametrize(
    "obj, needle",
    [
        ({"run_id": "r", "seq": 0, "type": "run_start", "root_query": "q"}, "missing field 'v'"),
        ({"v": "1", "run_id": "r", "seq": 0, "type": "run_start", "root_query": "q"}, "field 'v'"),
        ({"v": True, "run_id": "r", "seq": 0, "type": "run_start", "root_query": "q"}, "field 'v'"),
        ({"v": 0, "run_id": "r", "seq": 0, "type": "run_start", "root_query": "q"}, "field 'v'"),
        ({"v": 1, "run_id": "r", "seq": 0, "type": "candidate", "frame_id": "f", "candidate_id": "c"}, "field 'query'"),
        ({"v": 1, "run_id": "r", "seq": -1, "type": "run_start", "root_query": "q"}, "field 'seq'"),
        ({"v": 1, "run_id": 7, "seq": 0, "type": "run_start", "root_query": "q"}, "field 'run_id'"),
        (
            {"v": 1, "run_id": "r", "seq": 0, "type": "decision", "candidate_id": "c", "action": "maybe"},
            "field 'action'",
        ),
        ({"v": 1, "seq": 0, "type": "mystery"}, "field 'run_id'"),
        ([1, 2], "JSON object"),
    ],
)
def test_invalid_events_name_the_problem(obj, needle):
    with pytest.raises(InputError) as exc:
        parse_event(obj, "t.jsonl", 4)
    assert needle in str(exc.value) and "t.jsonl:4" in str(exc.value)


def test_newer_version_is_a_clear_error():
    with pytest.raises(SchemaVersionError, match="newer than this branchgate understands"):
        parse_event({"v": SCHEMA_VERSION + 1, "run_id": "r", "seq": 0, "type": "run_start", "root_query": "q"})


def test_unknown_type_is_kept_as_raw():
    obj = {"v": 1, "run_id": "r", "seq": 3, "ts": 5.0, "type": "tool_trace", "tool": "bm25", "latency_ms": 12}
    ev = parse_event(obj)
    assert isinstance(ev, Raw) and ev.source_type == "tool_trace" and ev.data == obj and ev.seq == 3


def test_shipped_json_schema_is_current():
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text(), (
        "trace.schema.json is stale: run python3 scripts/write_trace_schema.py"
    )
    assert json.loads(SCHEMA_FILE.read_text(encoding="utf-8")) == json.loads(json.dumps(json_schema()))


def test_json_schema_accepts_fixtures_and_rejects_bad_lines():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))
    lines = (FIX / "canonical" / "two_runs.jsonl").read_text(encoding="utf-8").splitlines()
    for line in lines:  # includes one unknown type ("tool_trace")
        validator.validate(json.loads(line))
    good = json.loads(lines[0])
    for bad in (
        {**good, "v": SCHEMA_VERSION + 1},
        {k: v for k, v in good.items() if k != "v"},
        {k: v for k, v in good.items() if k != "root_query"},
        {**good, "seq": -1},
    ):
        assert not validator.is_valid(bad), bad


# --- writer + reader --------------------------------------------------------------------------------


def test_writer_assigns_seq_per_run_and_flushes_each_event(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as w:
        w.write(type="run_start", run_id="a", root_query="qa")
        w.write(type="run_start", run_id="b", root_query="qb")
        w.write(type="frame_open", run_id="a", frame_id="f0")
        w.write(Candidate(run_id="a", seq=7, frame_id="f0", candidate_id="c0", query="x"))
        # readable while the writer is still open: every event is already on disk
        events, report = _read(path)
        assert [(e.run_id, e.seq, e.type) for e in events] == [
            ("a", 0, "run_start"),
            ("b", 0, "run_start"),
            ("a", 1, "frame_open"),
            ("a", 7, "candidate"),
        ]
        assert report.skipped == []
        nxt = w.write(type="candidate", run_id="a", frame_id="f0", candidate_id="c1", query="y")
        assert nxt.seq == 8
    assert path.read_text(encoding="utf-8").count("\n") == 5


def test_reader_skips_an_in_progress_last_line_and_strict_fails(tmp_path):
    path = tmp_path / "live.jsonl"
    with TraceWriter(path) as w:
        w.write(type="run_start", run_id="a", root_query="q")
        with open(path, "a", encoding="utf-8") as fh:  # another process is half-way through a line
            fh.write('{"v":1,"run_id":"a","seq":1,"type":"frame_op')
        events, report = _read(path)
        assert len(events) == 1
        assert [(s.line, s.reason) for s in report.skipped] == [(2, "truncated last line")]
        with pytest.raises(InputError, match=r"live.jsonl:2: truncated last line"):
            _read(path, strict=True)


def test_writer_recovers_from_a_truncated_last_line(tmp_path):
    path = tmp_path / "crashed.jsonl"
    with TraceWriter(path) as w:
        w.write(type="run_start", run_id="a", root_query="q")
        w.write(type="frame_open", run_id="a", frame_id="f0")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"v":1,"run_id":"a","seq":2,"type":"cand')  # crash mid-line
    with TraceWriter(path) as w:  # reopen: terminates the broken line, continues numbering
        ev = w.write(type="candidate", run_id="a", frame_id="f0", candidate_id="c0", query="x")
    assert ev.seq == 2
    events, report = _read(path)
    assert [e.type for e in events] == ["run_start", "frame_open", "candidate"]
    assert len(report.skipped) == 1 and report.skipped[0].line == 3 and "invalid JSON" in report.skipped[0].reason


def test_unknown_type_round_trips_through_the_writer(tmp_path):
    path = tmp_path / "raw.jsonl"
    with TraceWriter(path) as w:
        w.write(type="checkpoint", run_id="a", state={"n": 1})
    (ev,), _ = _read(path)
    assert isinstance(ev, Raw) and ev.source_type == "checkpoint" and ev.data["state"] == {"n": 1}
    with TraceWriter(path) as w:
        w.write(ev)
    evs, _ = _read(path)
    assert evs[1].source_type == "checkpoint" and evs[1].data == ev.data


def test_valid_last_line_without_newline_is_read(tmp_path):
    path = tmp_path / "hand.jsonl"
    path.write_text('{"v":1,"run_id":"a","seq":0,"type":"run_start","root_query":"q"}', encoding="utf-8")
    events, report = _read(path)
    assert len(events) == 1 and report.skipped == []


# --- malformed files: the documented outcome of each ------------------------------------------------


@pytest.mark.parametrize(
    "name, n_events, skipped",
    [
        ("truncated.jsonl", 2, [(3, "truncated last line")]),
        ("bad_middle.jsonl", 2, [(2, "invalid JSON"), (3, "invalid JSON"), (4, "must be a JSON object")]),
        ("garbage.jsonl", 0, [(None, "binary data")]),
        ("empty.jsonl", 0, [(None, "empty file")]),
        ("missing_field.jsonl", 3, [(3, "field 'query'"), (4, "field 'run_id'"), (5, "missing field 'v'")]),
        ("unknown_type.jsonl", 4, []),
    ],
)
def test_malformed_file_outcomes(name, n_events, skipped):
    events, report = _read(BROKEN / name)
    assert len(events) == n_events == report.events
    assert len(report.skipped) == len(skipped)
    for s, (line, needle) in zip(report.skipped, skipped):
        assert s.line == line and needle in s.reason and s.file.endswith(name)
    if skipped:
        with pytest.raises(InputError) as exc:
            _read(BROKEN / name, strict=True)
        assert name in str(exc.value)
    if name == "unknown_type.jsonl":
        assert isinstance(events[2], Raw) and events[2].source_type == "checkpoint"


def test_future_version_fails_even_without_strict():
    with pytest.raises(SchemaVersionError, match=r"future_version.jsonl:3: schema version 3 is newer"):
        _read(BROKEN / "future_version.jsonl")
