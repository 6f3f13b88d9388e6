"""The read stage every agent hook shares (``inference/agents/read_hook.py``), without any agent package: results in,
the results to read out, and the events a read dataset is built from."""

from __future__ import annotations

import pytest
from export_support import exported, exported_read

from branchgate.inference.agents.read_hook import ReadHook, SearchCall, as_hit
from branchgate.inference.agents.recorder import TraceRecorder
from branchgate.inference.gate import Gate
from branchgate.logs_to_dataset.read_points import run_read_points
from branchgate.logs_to_dataset.traces import TraceWriter, read_events
from branchgate.texts import SNIPPET_WORDS


class Hook(ReadHook, TraceRecorder):
    def __init__(self, trace, read=None, **options):
        super().__init__(None, trace, root_query="Why do honeybee colonies collapse?")
        self._init_read(read, **options)


RESULTS = [
    {"href": "https://a.example/mites", "title": "Varroa mites", "body": "Mites spread viruses " + "word " * 40},
    {"url": "https://a.example/prices", "title": "Honey prices", "content": "Prices by country."},
    {"title": "no URL", "body": "passed on, never recorded"},
    {"href": "https://a.example/empty"},  # no text: passed on, never recorded
]


def test_a_result_becomes_a_hit_as_a_search_engine_shows_it():
    hit = as_hit(RESULTS[0], 0)
    assert hit["id"] == hit["url"] == "https://a.example/mites" and hit["title"] == "Varroa mites"
    assert len(hit["snippet"].split()) == SNIPPET_WORDS and hit["rank"] == 0
    assert as_hit({"url": "u", "raw_content": "Page title\nthe page text"}, 3)["title"] == "Page title"
    assert as_hit(RESULTS[2], 0) is None and as_hit(RESULTS[3], 0) is None and as_hit("text", 0) is None


def test_record_only_reads_everything_and_records_it(tmp_path):
    hook = Hook(tmp_path / "t.jsonl")
    out = hook.read_results(SearchCall("f0.c0", "honeybee mites", "why", 1), RESULTS)
    assert out == RESULTS  # the agent's own behaviour
    eid = hook._evidence_id("the page text of the mites page", "https://a.example/mites")
    hook._end("ok")
    hook._close_writer()
    events = list(read_events(tmp_path / "t.jsonl", strict=True))
    (results,) = [e for e in events if e.type == "results"]
    assert [h.hit_id for h in results.hits] == ["https://a.example/mites", "https://a.example/prices"]
    reads = [e for e in events if e.type == "read"]
    assert [(r.action, r.actor) for r in reads] == [("read", "default"), ("read", "default")]
    evidence = next(e for e in events if e.type == "evidence")
    assert evidence.evidence_id == eid and evidence.hit_id == "https://a.example/mites"
    assert hook.counts["hits"] == hook.counts["hits_read"] == 2 and hook.counts["searches"] == 1


def test_a_read_controller_decides_and_a_url_read_before_is_not_read_again(tmp_path, encoder):
    gate = Gate.load(exported_read(encoder)["files"]["fp32"])
    hook = Hook(tmp_path / "t.jsonl", read=gate, read_tau=0.0)  # τ 0: every new hit is read
    first = hook.read_results(SearchCall("f0.c0", "honeybee mites", "", 0), RESULTS[:2])
    again = hook.read_results(SearchCall("f0.c1", "varroa", "", 0), RESULTS[:2])
    assert first == RESULTS[:2] and again == []
    hook._close_writer()
    reads = [e for e in read_events(tmp_path / "t.jsonl", strict=True) if e.type == "read"]
    assert [r.actor for r in reads[:2]] == [f"controller:{gate.name}"] * 2 and all(
        0 <= r.p_keep <= 1 for r in reads[:2]
    )
    assert [(r.action, r.actor, r.p_keep) for r in reads[2:]] == [("skip", "seen", None)] * 2


class NoneRead:
    """A read controller that reads nothing (every p_keep 0.2, τ 0.5)."""

    stage, name = "read", "none"

    def select(self, state, hits, tau=None, max_keep=None, floor=None):
        import numpy as np

        from branchgate.inference.selection import Selection

        return Selection([], np.full(len(hits), 0.2, np.float32), np.zeros(len(hits), np.float32), False, 0.5)


def test_when_nothing_passes_nothing_is_read_and_the_branch_ends():
    hook = Hook(None, read=NoneRead())
    assert hook.read_results(SearchCall("f0.c0", "honeybee mites"), RESULTS) == RESULTS[2:]  # only the unrecorded ones
    assert hook.counts["hits_skipped"] == 2 and hook.counts["hits_read"] == 0


def test_the_wrong_controller_is_refused_and_a_failing_gate_reads_everything(encoder, caplog):
    with pytest.raises(ValueError, match="read: a read controller is needed"):
        Hook(None, read=Gate.load(exported(encoder)["files"]["fp32"]))

    class Broken:
        stage, name = "read", "broken"

        def select(self, *args, **kwargs):
            raise RuntimeError("boom")

    hook = Hook(None, read=Broken())
    assert hook.read_results(SearchCall("c", "q"), RESULTS) == RESULTS
    assert "the read gate failed" in caplog.text


def test_the_agents_own_search_is_a_read_point_of_its_frame(tmp_path):
    with TraceWriter(tmp_path / "t.jsonl") as w:
        w.write(type="run_start", run_id="r", root_query="Why do honeybee colonies collapse?")
        w.write(type="frame_open", run_id="r", frame_id="f0", depth=0, frame_query="bees")
        hit = {"hit_id": "u1", "title": "Mites", "snippet": "varroa", "rank": 0}
        w.write(type="results", run_id="r", candidate_id="f0.own1", query="bees", hits=[hit], frame_id="f0")
        w.write(type="results", run_id="r", candidate_id="nowhere", query="bees", hits=[hit])
        w.write(type="run_end", run_id="r", status="ok")
    points, problems = run_read_points(read_events(tmp_path / "t.jsonl", strict=True))
    assert len(points) == 1 and problems == {"results_without_candidate": 1}
    p = points[0]
    assert (p.frame_id, p.candidate_id, p.frame_query, p.parent_goal, p.depth) == ("f0", "f0.own1", "bees", "", 0)
