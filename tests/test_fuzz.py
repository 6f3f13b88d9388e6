"""Property-based tests (hypothesis) of every reader, the trace schema, `branchgate gate` on stdin and Gate.select.

Inputs: arbitrary bytes, arbitrary JSON, and valid events with one field mutated. Properties: no exception
escapes but the project's own (``BranchgateError``); every skipped record is counted with its file (and line,
for line-based formats); a good run next to a bad one is kept; a non-empty candidate list never yields an empty
selection. Profiles (tests/conftest.py): "fast" by default, ``--hypothesis-profile long`` for a long run.
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402 (after the importorskip above)
from test_hardening import gptr_doc, logs, run_lines  # noqa: E402

from branchgate.cli import main  # noqa: E402
from branchgate.data.dataset_schema import split_of  # noqa: E402
from branchgate.errors import BranchgateError, InputError  # noqa: E402
from branchgate.logs_to_dataset.decision_points import partial_reason, run_decisions  # noqa: E402
from branchgate.logs_to_dataset.readers import read_runs  # noqa: E402
from branchgate.logs_to_dataset.trace_schema import SchemaVersionError, parse_event, to_json  # noqa: E402
from branchgate.logs_to_dataset.traces import ReadReport  # noqa: E402

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.integers(min_value=10**30, max_value=10**400)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)
# JSON text that parses but breaks later: nesting past any recursion limit, integers past Python's digit limit
json_texts = (
    st.builds(json.dumps, json_values)
    | st.builds(lambda n, v: "[" * n + json.dumps(v) + "]" * n, st.integers(90, 3000), json_values)
    | st.builds(
        lambda n: '{"v": 1, "run_id": "x", "seq": 0, "type": "run_start", "n": ' + "7" * n + "}",
        st.integers(4200, 5000),
    )
)
GPTR_TAGS = [
    "subqueries",
    "running_subquery_research",
    "subquery_context_not_found",
    "added_source_url",
    "research_step_finalized",
    "starting_research",
    "other",
]
MARKERS = [
    "<|begin_search_query|>",
    "<|end_search_query|>",
    "<|begin_search_result|>",
    "<|end_search_result|>",
    "Doc 1 (URL: http://a, ClueWebID: c1)\n",
    "Doc 2 (URL: http://b)\n",
    "text ",
    "\n",
]


def read_dir(files: dict[str, bytes], strict: bool = False):
    """Write ``files`` into a temporary folder, read it and check what was read (``check_runs``): (runs, report).
    The folder is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bg-fuzz-") as tmp:
        d = Path(tmp)
        for name, data in files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
        report = ReadReport()
        try:
            runs = list(read_runs([str(d)], strict=strict, report=report))
        except SchemaVersionError:  # a newer "v" is fatal by contract (ARCHITECTURE.md), never skipped
            hypothesis.reject()
        check_runs(runs, report, d)
        return runs, report


def check_runs(runs, report, folder: Path) -> None:
    """Everything a reader produced is usable downstream, and every skipped record names a file in ``folder``."""
    for s in report.skipped:
        assert s.file and Path(s.file).is_relative_to(folder) and s.reason
    for run in runs:
        run.run_id.encode("utf-8")  # hashable for splits and caches
        split_of(run.run_id)
        partial_reason(run.events)
        for e in run.events:
            to_json(e).encode("utf-8")
        try:
            run_decisions(run.run_id, run.events, run.file)
        except InputError:
            pass


GOOD = ("\n".join(run_lines()) + "\n").encode()


def assert_good_kept(runs) -> None:
    good = [r for r in runs if r.run_id == "good"]
    assert len(good) == 1 and len(good[0].events) == 8


def strict_read(files) -> None:
    try:
        read_dir(files, strict=True)
    except BranchgateError:
        pass


# -- canonical traces -------------------------------------------------------------------------------------
@given(st.binary(max_size=300))
def test_canonical_arbitrary_bytes(data):
    runs, report = read_dir({"good.jsonl": GOOD, "bad.jsonl": data})
    assert_good_kept(runs)
    strict_read({"bad.jsonl": data})


@given(st.lists(json_texts, max_size=6))
def test_canonical_arbitrary_json_lines(lines):
    runs, report = read_dir({"good.jsonl": GOOD, "bad.jsonl": ("\n".join(lines) + "\n").encode()})
    assert_good_kept(runs)
    bad = [s for s in report.skipped if s.file.endswith("bad.jsonl")]
    events = sum(len(r.events) for r in runs if r.file.endswith("bad.jsonl"))
    assert events + len([s for s in bad if s.line is not None]) == len(lines) or (not lines and len(bad) == 1)


@given(
    st.integers(0, 7),
    st.sampled_from(
        [
            "v",
            "run_id",
            "seq",
            "type",
            "ts",
            "frame_id",
            "candidate_id",
            "order",
            "query",
            "depth",
            "evidence_ids",
            "action",
            "status",
            "extra",
        ]
    ),
    json_values,
)
def test_canonical_valid_events_with_a_mutated_field(i, key, value):
    events = [json.loads(x) for x in run_lines("bad")]
    events[i][key] = value
    text = "\n".join(json.dumps(e) for e in events) + "\n"
    runs, report = read_dir({"good.jsonl": GOOD, "bad.jsonl": text.encode()})
    assert_good_kept(runs)
    events_read = sum(len(r.events) for r in runs if r.file.endswith("bad.jsonl"))
    assert events_read + sum(1 for s in report.skipped if s.file.endswith("bad.jsonl")) == 8
    assert all(s.line is not None for s in report.skipped)


@given(json_values)
def test_trace_schema_takes_any_json(obj):
    try:
        event = parse_event(obj, "f", 1)
    except InputError as exc:
        assert exc.file == "f" and exc.line == 1
        return
    assert parse_event(json.loads(to_json(event))).type == event.type


# -- GPT-Researcher -------------------------------------------------------------------------------------------
gptr_events = json_values | st.builds(
    logs,
    st.sampled_from(GPTR_TAGS),
    st.text(max_size=40)
    | st.builds(lambda t: "following queries: " + t, st.text(max_size=30))
    | st.builds(lambda t: "Total Research Costs: $" + t, st.text("0123456789.eE+-", max_size=12))
    | st.builds(lambda q: f"Running research for '{q}'...", st.sampled_from(["a", "q", ""])),
    json_values | st.lists(st.sampled_from(["a", "b", "q"]), max_size=3),
)
gptr_docs = json_values | st.builds(
    lambda evs, content: {"events": evs, "content": content, "timestamp": "x"},
    st.lists(gptr_events, max_size=5),
    json_values,
)


@given(gptr_docs | st.binary(max_size=200) | json_texts)
def test_gptr_arbitrary_documents(doc):
    data = doc if isinstance(doc, bytes) else doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()
    runs, report = read_dir({"task_good.json": json.dumps(gptr_doc()).encode(), "task_bad.json": data})
    assert [r.run_id for r in runs].count("task_good") == 1
    assert "task_bad" in [r.run_id for r in runs] or any(s.file.endswith("task_bad.json") for s in report.skipped)
    strict_read({"task_bad.json": data})


# -- Search-o1 -----------------------------------------------------------------------------------------------
@given(
    st.lists(st.sampled_from(MARKERS) | st.text(max_size=8), max_size=12),
    st.binary(max_size=40),
    json_values,
    json_values,
)
def test_searcho1_arbitrary_traces_and_key_point_files(pieces, question, per_doc, aggregated):
    files = {
        "t/good.q": b"q",
        "t/good.a": "".join(MARKERS[:4]).encode(),
        "t/9.q": question,
        "t/9.a": "".join(pieces).encode("utf-8", "surrogatepass"),
        "key_point/9.json": json.dumps(per_doc).encode(),
        "key_point/9_aggregated.json": json.dumps(aggregated).encode(),
    }
    runs, report = read_dir(files)
    assert [r.run_id for r in runs].count("good") == 1
    assert "9" in [r.run_id for r in runs] or any(Path(s.file).stem == "9" for s in report.skipped)
    strict_read(files)


# -- branchgate gate on stdin and Gate.select ------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(encoder) -> str:
    from export_support import exported

    return exported(encoder)["files"]["fp32"]


@pytest.fixture(scope="module")
def gate(model):
    from branchgate.inference.gate import Gate

    return Gate.load(model, threads=1)


texts = st.text(max_size=30)
candidates = st.lists(
    texts | st.fixed_dictionaries({"query": texts, "goal": texts | st.none()}) | json_values, max_size=8
)
states = st.fixed_dictionaries(
    {"root_query": texts},
    optional={
        "frame_query": texts | json_values,
        "parent_goal": texts,
        "retained": st.lists(texts, max_size=3) | json_values,
        "depth": st.integers(0, 10**6) | st.floats() | json_values,
    },
)


@given(states, candidates, st.none() | st.floats() | json_values, st.none() | st.integers(-2, 5) | json_values)
def test_gate_select_only_named_errors_and_never_empty(gate, state, cands, tau, max_keep):
    try:
        sel = gate.select(state, cands, tau=tau, max_keep=max_keep)
    except InputError:
        return
    assert len(sel.p_keep) == len(cands)
    assert bool(sel.kept) == bool(cands)
    assert all(0.0 <= p <= 1.0 for p in sel.p_keep)


@given(
    st.text(max_size=200)
    | json_texts
    | st.builds(lambda s, c: json.dumps({"state": s, "candidates": c}), states, candidates)
)
def test_gate_cli_stdin(model, monkeypatch, capsys, text):
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    rc = main(["gate", "--pre", model, "--threads", "1"])
    out = capsys.readouterr()
    assert rc in (0, 2) and "Traceback" not in out.err
    if rc == 0:
        ans = json.loads(out.out)
        assert bool(ans["kept"]) == bool(json.loads(text)["candidates"])
