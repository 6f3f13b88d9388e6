"""Readers per log format: registry and detection, hand-written fixtures (good and broken), real files."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from branchgate.errors import InputError
from branchgate.logs_to_dataset.readers import READERS, discover, get_reader, read_runs
from branchgate.logs_to_dataset.traces import ReadReport, TraceWriter

FIX = Path(__file__).parent / "fixtures"


def _runs(*paths, fmt=None, strict=False):
    report = ReadReport()
    runs = {r.run_id: r for r in read_runs(list(paths), fmt=fmt, strict=strict, report=report)}
    return runs, report


def _types(run):
    return Counter(e.type for e in run.events)


def _of(run, etype):
    return [e for e in run.events if e.type == etype]


# --- registry -------------------------------------------------------------------------------------


def test_registry_and_autodetection_per_file(tmp_path):
    assert {"canonical", "searcho1", "gptr"} <= set(READERS)
    for d in ("canonical", "searcho1", "gptr"):
        shutil.copytree(FIX / d, tmp_path / "mixed" / d)
    (tmp_path / "mixed" / "README.md").write_text("notes")
    (tmp_path / "mixed" / ".hidden.jsonl").write_text("ignored: hidden")
    report = ReadReport()
    found = discover([tmp_path / "mixed"], report=report)
    by_format = Counter(reader.name for _, reader in found)
    assert by_format == {"canonical": 1, "searcho1": 3, "gptr": 2}
    assert [Path(p).name for p in report.ignored] == ["README.md"]  # .q files are claimed by their .a
    runs, rep = _runs(tmp_path / "mixed")
    assert len(runs) == 7 and rep.formats == by_format and rep.files == 6


def test_format_can_be_forced(tmp_path):
    trace = tmp_path / "run.log"
    shutil.copy(FIX / "canonical" / "two_runs.jsonl", trace)
    assert discover([trace]) == []  # not recognised by name
    runs, _ = _runs(trace, fmt="canonical")
    assert set(runs) == {"caffeine-01", "solar-02"}
    with pytest.raises(InputError, match="unknown trace format 'nope'"):
        get_reader("nope")
    with pytest.raises(InputError, match="no such file"):
        discover([tmp_path / "missing"])


# --- canonical --------------------------------------------------------------------------------------


def test_canonical_groups_runs_and_keeps_unknown_types():
    runs, report = _runs(FIX / "canonical")
    assert list(runs) == ["caffeine-01", "solar-02"] and report.events == 40
    solar = runs["solar-02"]
    (raw,) = _of(solar, "raw")
    assert raw.source_type == "tool_trace" and raw.data["latency_ms"] == 12
    assert [e.seq for e in solar.events] == sorted(e.seq for e in solar.events)


def test_canonical_interleaved_runs_in_one_file(tmp_path):
    path = tmp_path / "interleaved.jsonl"
    with TraceWriter(path) as w:
        for i in range(3):
            for run in ("x", "y"):
                w.write(type="learning", run_id=run, text=f"{run}{i}")
    runs, _ = _runs(path)
    assert [e.text for e in runs["x"].events] == ["x0", "x1", "x2"]
    assert [e.seq for e in runs["y"].events] == [0, 1, 2]


# --- Search-o1 --------------------------------------------------------------------------------------


def test_searcho1_searches_become_a_chain_of_frames():
    runs, report = _runs(FIX / "searcho1")
    assert set(runs) == {"9000001", "9000002", "9000003"}
    run = runs["9000001"]
    assert _of(run, "run_start")[0].root_query == "why do cats purr and does it help them heal?"
    frames = _of(run, "frame_open")
    assert [(f.frame_id, f.depth, f.parent_frame, f.parent_candidate) for f in frames] == [
        ("f0", 0, None, None),
        ("f1", 1, "f0", "c0"),
    ]
    assert [c.query for c in _of(run, "candidate")] == [
        "how do cats produce the purring sound",
        "cat purr frequency bone healing evidence",
    ]
    assert [(d.candidate_id, d.action) for d in _of(run, "decision")] == [("c0", "expand"), ("c1", "expand")]
    ev = _of(run, "evidence")
    assert len(ev) == 4  # 5 documents, one repeated in the second search: deduplicated per run
    assert ev[0].evidence_id == "clueweb22-en0001-02-00003"
    assert ev[0].source == "https://www.example-vet.org/cat-purring-mechanism"
    assert ev[0].text.startswith("How Do Cats Purr?") and ev[0].tokens == len(ev[0].text.split())
    r0, r1 = _of(run, "retrieval")
    assert r0.evidence_ids == ["clueweb22-en0001-02-00003", "clueweb22-en0004-11-01234", "clueweb22-en0007-55-00042"]
    assert r1.evidence_ids == ["clueweb22-en0012-34-05678", "clueweb22-en0007-55-00042"]
    assert "Doc 2" not in ev[-1].text
    learnings = _of(run, "learning")
    assert learnings[0].candidate_id is None and learnings[1].candidate_id == "c0"
    assert "Final Answer" in _of(run, "report")[0].text
    assert _of(run, "run_end")[0].totals["nodes"] == 2


def test_searcho1_without_search_and_with_a_cut_off_search():
    runs, report = _runs(FIX / "searcho1")
    plain = runs["9000002"]
    assert _types(plain) == {"run_start": 1, "report": 1, "run_end": 1}
    assert "Canberra" in _of(plain, "report")[0].text
    cut = runs["9000003"]
    assert [c.candidate_id for c in _of(cut, "candidate")] == ["c0", "c1"]
    assert [d.candidate_id for d in _of(cut, "decision")] == ["c0"]  # the last search never ran
    ids = [e.evidence_id for e in _of(cut, "evidence")]
    assert ids == ["https://oceanservice.example.gov/facts/tides.html", "clueweb22-en0020-10-00100"]
    w = report.warnings
    assert w["searcho1: stray end_search_query tag"] == 1
    assert w["searcho1: search without a result block (trace ends; candidate left undecided)"] == 1
    assert w["searcho1: document without a ClueWebID (URL used as its id)"] == 1


def test_searcho1_broken_files():
    d = FIX / "searcho1_broken"
    runs, report = _runs(d)
    assert set(runs) == {"9100004"}
    reasons = {Path(s.file).name: s.reason for s in report.skipped}
    assert reasons == {
        "9100001.a": "missing question file 9100001.q",
        "9100002.a": "empty trace file",
        "9100003.a": "binary data (NUL bytes), not a Search-o1 text file",
        "9100005.a": "not UTF-8 text (byte 5)",
    }
    cut = runs["9100004"]
    assert _of(cut, "run_end")[0].status == "truncated"
    assert _of(cut, "evidence")[0].text.endswith("The boundary is called the event hor")
    with pytest.raises(InputError, match="9100001.a: missing question file"):
        _runs(d, strict=True)


# --- GPT-Researcher ---------------------------------------------------------------------------------


def test_gptr_standard_research_best_effort():
    runs, report = _runs(FIX / "gptr")
    run = runs["task_1740910503_5b1e0c9f2a"]
    root = "What are the health effects of intermittent fasting?"
    start = _of(run, "run_start")[0]
    assert start.root_query == root and start.system == "gpt-researcher" and start.ts is not None
    (frame,) = _of(run, "frame_open")
    assert frame.depth == 0 and frame.frame_query == root
    cands = _of(run, "candidate")
    assert [c.query for c in cands][-1] == root and len(cands) == 4 and all(c.goal == "" for c in cands)
    assert {d.candidate_id for d in _of(run, "decision")} == {c.candidate_id for c in cands}
    ev = _of(run, "evidence")
    assert len(ev) == 4 and all(e.text == "" and e.source == e.evidence_id for e in ev)  # 5 logs, 1 repeat
    (ret,) = _of(run, "retrieval")  # "No content found" = known empty retrieval
    assert ret.candidate_id == cands[2].candidate_id and ret.evidence_ids == []
    assert _of(run, "report")[0].text.startswith("# Health Effects")
    end = _of(run, "run_end")[0]
    assert end.totals["cost_usd"] == pytest.approx(0.01234) and end.totals["nodes"] == 4
    raw_tags = {e.source_type for e in _of(run, "raw")}
    assert {"gptr:scraping_urls", "gptr:research_step_finalized", "gptr:content", "gptr:starting_research"} <= raw_tags
    assert report.warnings["gptr: source not linked to a subquery and its text not logged"] == 6


def test_gptr_deep_research_frames_are_reported_not_invented():
    runs, report = _runs(FIX / "gptr")
    run = runs["task_1740913001_9c0ffee123"]
    assert _of(run, "run_start")[0].root_query == "How is climate change affecting coffee production?"
    frames = _of(run, "frame_open")
    assert [(f.depth, f.frame_query, f.parent_frame) for f in frames] == [
        (1, "climate change impact on arabica coffee yields", None),
        (1, "coffee farmers adaptation strategies to rising temperatures", None),
    ]  # 2nd: list parsed from text
    assert len(_of(run, "candidate")) == 6 and len(_of(run, "decision")) == 5
    assert _of(run, "run_end")[0].status == "incomplete"
    assert report.warnings["gptr: frame below the root: parent and exact depth not logged (depth set to 1)"] == 2
    assert report.warnings["gptr: announced subquery never run (left undecided)"] == 1


def test_gptr_broken_files():
    d = FIX / "gptr_broken"
    runs, report = _runs(d)
    assert set(runs) == {"task_1740920003_badevents"}
    by_file = Counter(Path(s.file).name for s in report.skipped)
    assert by_file == {
        "task_1740920000_truncated.json": 1,
        "task_1740920001_noevents.json": 1,
        "task_1740920002_empty.json": 1,
        "task_1740920003_badevents.json": 4,
    }
    reasons = [s.reason for s in report.skipped]
    assert any(r.startswith("truncated JSON") for r in reasons)
    assert "events[1]: event is not a JSON object" in reasons
    assert "events[3]: 'subqueries' log without a list of queries" in reasons
    run = runs["task_1740920003_badevents"]
    assert [d.candidate_id for d in _of(run, "decision")] == ["f0.c0"]
    assert any(e.source_type == "gptr:running_subquery_research" for e in _of(run, "raw"))  # unannounced query
    assert report.warnings["gptr: subquery run that no 'subqueries' log announced (kept as raw)"] == 1
    with pytest.raises(InputError, match="task_1740920000_truncated.json"):
        _runs(d, strict=True)


def test_gptr_json_research_handler_events(tmp_path):
    import json

    doc = {
        "timestamp": "2025-03-02T10:00:00",
        "content": {"query": "root q", "report": "r"},
        "events": [
            {
                "timestamp": "2025-03-02T10:00:01",
                "type": "logs",
                "content": "subqueries",
                "output": "...",
                "metadata": ["sub a", "root q"],
            },  # a bare logs event (no CustomLogsHandler wrapper)
            {
                "timestamp": "2025-03-02T10:00:02",
                "type": "sub_query",
                "data": {"query": "sub a", "scraped_data_size": 0},
            },
            {"timestamp": "2025-03-02T10:00:03", "type": "content_found", "data": {"sub_query": "sub a"}},
        ],
    }
    path = tmp_path / "research_20250302.json"
    path.write_text(json.dumps(doc))
    runs, report = _runs(path)
    run = runs["research_20250302"]
    assert [d.candidate_id for d in _of(run, "decision")] == ["f0.c0"]
    assert [e.source_type for e in _of(run, "raw")] == ["gptr:content_found"]
    assert _of(run, "frame_open")[0].depth == 0


# --- real data ----------------------------------------------------------------------------------------


@pytest.mark.shared
def test_real_searcho1_traces(shared):
    d = shared("drgym", "Searcho1_ClueWeb22")
    runs, report = _runs(d)
    assert len(runs) == 800 and report.skipped == [] and report.ignored == []
    n_search = 0
    for run in runs.values():
        t = _types(run)
        assert t["run_start"] == 1 and t["run_end"] == 1
        assert t["decision"] <= t["candidate"] == t["frame_open"]
        assert t["retrieval"] == t["decision"]
        n_search += t["candidate"] > 0
        ids = [e.evidence_id for e in _of(run, "evidence")]
        assert len(ids) == len(set(ids))
    assert 300 < n_search < 800  # a bit under half of the traces search at all


# --- Search-o1 key-point labels (DeepResearchGym key_point/) ----------------------------------------------


def _evidence_labels(run):
    return {e.evidence_id: e.labels for e in _of(run, "evidence")}


def test_searcho1_keypoint_labels_by_doc_id_and_span():
    runs, report = _runs(FIX / "searcho1_kp")
    assert report.ignored == [] and report.skipped == []  # key-point files are companions, not unknown files
    labels = _evidence_labels(runs["9100001"])
    assert labels == {
        "clueweb22-en0000-00-00001": ["9100001#1", "9100001#4"],  # a ground-truth document (its own points)
        "clueweb22-en0000-00-00002": ["9100001#2"],  # span of another document (case/space/quotes differ)
        "clueweb22-en0000-00-00004": [],  # holds only a span shorter than MIN_SPAN_WORDS
        "CLUEWEB22-EN0000-00-00005": ["9100001#5"],  # id matched case-insensitively
    }
    kp = _of(runs["9100001"], "run_start")[0].config["keypoints"]
    assert kp["n_key_points"] == 5 and kp["bad_links"] == 1
    assert kp["labelled_by_id"] == 2 and kp["labelled_by_span_only"] == 1
    w = report.warnings
    assert w["searcho1: key-point link (original_point_number) out of range (ignored)"] == 1
    assert w["searcho1: no key-point file for the query (no labels; utility falls back to the teacher)"] == 1
    assert _evidence_labels(runs["9100002"]) == {"clueweb22-en0000-00-00009": None}
    assert "keypoints" not in _of(runs["9100002"], "run_start")[0].config


def test_searcho1_keypoints_explicit_dir_disabled_and_broken(tmp_path):
    from branchgate.logs_to_dataset.readers.searcho1 import use_keypoints

    traces = tmp_path / "elsewhere" / "so1"
    shutil.copytree(FIX / "searcho1_kp" / "Searcho1_ClueWeb22", traces)
    runs, _ = _runs(traces)  # no sibling key_point/: no labels, no warning about it
    assert _evidence_labels(runs["9100001"])["clueweb22-en0000-00-00001"] is None
    with use_keypoints(FIX / "searcho1_kp" / "key_point"):
        runs, _ = _runs(traces)
    assert _evidence_labels(runs["9100001"])["clueweb22-en0000-00-00001"] == ["9100001#1", "9100001#4"]
    with use_keypoints("none"):
        runs, _ = _runs(FIX / "searcho1_kp")
    assert all(v is None for v in _evidence_labels(runs["9100001"]).values())
    with pytest.raises(InputError, match="not a directory"), use_keypoints(tmp_path / "missing"):
        pass
    bad = tmp_path / "kp"
    shutil.copytree(FIX / "searcho1_kp" / "key_point", bad)
    (bad / "9100001_aggregated.json").write_text('{"key_points": [', encoding="utf-8")
    with use_keypoints(bad):
        runs, report = _runs(traces)
        assert _evidence_labels(runs["9100001"])["clueweb22-en0000-00-00001"] is None
        assert report.warnings["searcho1: unreadable key-point file 9100001_aggregated.json (no labels)"] == 1
        with pytest.raises(InputError, match="unreadable key-point file"):
            _runs(traces, strict=True)


@pytest.mark.shared
def test_real_searcho1_keypoint_labels(shared):
    d = shared("drgym", "Searcho1_ClueWeb22")
    shared("drgym", "key_point")
    runs, report = _runs(d)
    starts = [_of(r, "run_start")[0].config.get("keypoints") for r in runs.values()]
    assert all(starts)  # every real query has its key points
    evs = [e for r in runs.values() for e in _of(r, "evidence")]
    assert all(e.labels is not None for e in evs)
    labelled = sum(1 for e in evs if e.labels)
    by_id = sum(s["labelled_by_id"] for s in starts)
    by_span = sum(s["labelled_by_span_only"] for s in starts)
    assert labelled == by_id + by_span and by_id > 300 and by_span > 20
    assert (
        sum(s["bad_links"] for s in starts)
        == report.warnings["searcho1: key-point link (original_point_number) out of range (ignored)"]
        >= 1
    )
