"""Read decision points (trace schema v2): one per ``results`` event, with the run's context and read hits
before it, each hit's novelty, read action and full text, the caps and problem counts, and the read stage's
``keypoints`` label (``keypoint_gains``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from branchgate.errors import InputError
from branchgate.logs_to_dataset import read_points
from branchgate.logs_to_dataset.decision_points import MAX_CONTEXT
from branchgate.logs_to_dataset.read_points import (
    MAX_HITS,
    evidence_labels,
    keypoint_gains,
    run_read_points,
)
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.logs_to_dataset.traces import ReadReport, TraceWriter, read_events

FIX = Path(__file__).parent / "fixtures"


def _hits(*ids: str) -> list[dict]:
    return [
        {"hit_id": h, "title": f"T {h}", "snippet": f"s {h}", "rank": r, "url": f"https://x/{h}"}
        for r, h in enumerate(ids)
    ]


def _written(tmp_path, steps: list[tuple[str, dict]]) -> list:
    """The events of ``steps`` (type, fields; seq 0, 1, ... in order) written by TraceWriter and read back."""
    path = tmp_path / "run.jsonl"
    with TraceWriter(path) as w:
        for etype, fields in steps:
            w.write(type=etype, run_id="r1", **fields)
    return list(read_events(path, strict=True))


def _ev(eid: str, hit: str | None, labels: list[str] | None) -> tuple[str, dict]:
    return "evidence", {"evidence_id": eid, "text": f"text of {eid}", "hit_id": hit, "labels": labels}


# seq: the position in this list
RUN = [
    ("run_start", {"root_query": "root question"}),  # 0
    ("frame_open", {"frame_id": "f0", "depth": 0, "frame_query": "root question"}),  # 1
    ("candidate", {"frame_id": "f0", "candidate_id": "c0", "query": "sub one", "goal": "goal one"}),  # 2
    ("candidate", {"frame_id": "f0", "candidate_id": "c1", "query": "sub two"}),  # 3
    ("decision", {"candidate_id": "c0", "action": "expand"}),  # 4
    ("results", {"candidate_id": "c0", "query": "sub one", "hits": _hits("d1", "d2", "d3")}),  # 5
    ("read", {"candidate_id": "c0", "hit_id": "d1", "action": "read"}),  # 6
    ("read", {"candidate_id": "c0", "hit_id": "d2", "action": "skip"}),  # 7
    ("read", {"candidate_id": "c0", "hit_id": "d3", "action": "defer"}),  # 8
    _ev("e1", "d1", ["k1", "k2"]),  # 9
    _ev("e2", "d2", ["k2", "k3"]),  # 10: the text a skipped hit would give (as the simulator writes)
    ("retrieval", {"candidate_id": "c0", "query": "sub one", "evidence_ids": ["e1"]}),  # 11
    ("frame_open", {"frame_id": "f1", "depth": 1, "parent_candidate": "c0", "frame_query": "sub one"}),  # 12
    ("candidate", {"frame_id": "f1", "candidate_id": "c2", "query": "sub three", "goal": "goal three"}),  # 13
    ("decision", {"candidate_id": "c2", "action": "expand"}),  # 14
    ("results", {"candidate_id": "c2", "query": "sub three", "hits": _hits("d4", "d1", "d3", "d5")}),  # 15
    ("read", {"candidate_id": "c2", "hit_id": "d4", "action": "read"}),  # 16
    ("read", {"candidate_id": "c2", "hit_id": "d1", "action": "skip"}),  # 17
    ("read", {"candidate_id": "c2", "hit_id": "d3", "action": "skip"}),  # 18
    ("read", {"candidate_id": "c2", "hit_id": "d5", "action": "read"}),  # 19
    _ev("e4", "d4", ["k1", "k6"]),  # 20
    _ev("e5", "d5", ["k6"]),  # 21
    ("retrieval", {"candidate_id": "c2", "query": "sub three", "evidence_ids": ["e4", "e5"]}),  # 22
    ("read", {"candidate_id": "c0", "hit_id": "d3", "action": "read", "deferred_from": 8}),  # 23
    _ev("e3", "d3", ["k4"]),  # 24
    ("retrieval", {"candidate_id": "c0", "query": "sub one", "evidence_ids": ["e3"]}),  # 25
    ("prune", {"stage": "post_retrieval", "item_ids": ["e1"]}),  # 26
    ("prune", {"stage": "pre_synthesis", "item_ids": ["e5"]}),  # 27
    ("prune", {"stage": "pre_retrieval", "item_ids": ["e4"]}),  # 28: not a context prune
    ("decision", {"candidate_id": "c1", "action": "expand"}),  # 29
    ("results", {"candidate_id": "c1", "query": "sub two", "hits": _hits("d6", "d7", "d8")}),  # 30
    ("read", {"candidate_id": "c1", "hit_id": "d6", "action": "read"}),  # 31
    ("read", {"candidate_id": "c1", "hit_id": "d7", "action": "read"}),  # 32 (d8: no read event)
    _ev("d6", None, ["k2", "k5"]),  # 33: found by its evidence id (no hit_id)
    ("retrieval", {"candidate_id": "c1", "query": "sub two", "evidence_ids": ["d6"]}),  # 34 (d7: no evidence)
    ("run_end", {"status": "ok"}),  # 35
]


@pytest.fixture
def points(tmp_path):
    events = _written(tmp_path, RUN)
    pts, problems = run_read_points(events)
    return pts, problems, evidence_labels(events)


def test_one_point_per_results_event_with_the_search_state(points):
    pts, problems, _ = points
    assert problems == {}
    assert [(p.seq, p.frame_id, p.candidate_id, p.depth) for p in pts] == [
        (5, "f0", "c0", 0),
        (15, "f1", "c2", 1),
        (30, "f0", "c1", 0),
    ]
    assert {p.run_id for p in pts} == {"r1"} and {p.root_query for p in pts} == {"root question"}
    assert [(p.frame_query, p.parent_goal) for p in pts] == [
        ("sub one", "goal one"),
        ("sub three", "goal three"),
        ("sub two", ""),
    ]
    assert [[h["rank"] for h in p.hits] for p in pts] == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2]]
    assert pts[0].hits[0]["title"] == "T d1" and pts[0].hits[0]["snippet"] == "s d1"
    assert pts[0].hits[0]["url"] == "https://x/d1"


def test_context_and_read_ids_as_the_walk_proceeds(points):
    pts, _, _ = points
    assert [p.context_ids for p in pts] == [
        [],
        ["e1"],
        ["e4", "e3"],  # e1 (post_retrieval) and e5 (pre_synthesis) pruned; a pre_retrieval prune removes nothing
    ]
    assert [p.read_ids for p in pts] == [[], ["d1"], ["d1", "d4", "d5", "d3"]]  # skips and defers are not reads


def test_is_new_action_and_text(points):
    pts, _, _ = points
    first, second, third = pts
    assert [h["is_new"] for h in first.hits] == [True, True, True]
    # d1 was read before the second search; d3 was deferred then, not yet read: still new
    assert [(h["hit_id"], h["is_new"]) for h in second.hits] == [
        ("d4", True),
        ("d1", False),
        ("d3", True),
        ("d5", True),
    ]
    assert [(h["action"], h["deferred"]) for h in first.hits] == [("read", False), ("skip", False), ("read", True)]
    assert [h["action"] for h in third.hits] == ["read", "read", None]  # d8 has no read event
    # text: by the evidence's hit_id (also for the skipped d2), by evidence id (d6), or None (d7, d8)
    assert [(h["evidence_id"], h["text"]) for h in first.hits] == [
        ("e1", "text of e1"),
        ("e2", "text of e2"),
        ("e3", "text of e3"),  # the deferred hit's evidence comes long after its results event
    ]
    assert [(h["evidence_id"], h["text"]) for h in third.hits] == [("d6", "text of d6"), (None, None), (None, None)]


def test_keypoint_gains_overlap_by_context_and_higher_hits(points):
    pts, _, labels_of = points
    assert labels_of("e1") == {"k1", "k2"} and labels_of("nope") is None
    # first: nothing in context; d2's k2 is covered by d1 above it
    assert keypoint_gains(pts[0], labels_of) == [2, 1, 1]
    # second: context e1 covers k1, k2; d1 is not new (-1); d5's k6 is covered by d4 above it
    assert keypoint_gains(pts[1], labels_of) == [1, -1, 1, 0]
    # third: e1 was pruned (and d2 skipped), so k2 counts again; d7 and d8 have no text
    assert keypoint_gains(pts[2], labels_of) == [2, -1, -1]


def test_unlabelled_runs_give_minus_one(tmp_path):
    steps = [(t, {**f, "labels": None}) if t == "evidence" else (t, f) for t, f in RUN]
    events = _written(tmp_path, steps)
    pts, _ = run_read_points(events)
    labels_of = evidence_labels(events)
    assert [keypoint_gains(p, labels_of) for p in pts] == [[-1] * 3, [-1] * 4, [-1] * 3]


def test_a_hit_not_new_by_context_alone(tmp_path):
    """A hit whose id is an evidence id in the context is not new even if no read event named it."""
    steps = [
        ("run_start", {"root_query": "q"}),
        ("frame_open", {"frame_id": "f0"}),
        ("candidate", {"frame_id": "f0", "candidate_id": "c0", "query": "a"}),
        ("candidate", {"frame_id": "f0", "candidate_id": "c1", "query": "b"}),
        ("retrieval", {"candidate_id": "c0", "query": "a", "evidence_ids": ["x"]}),
        ("results", {"candidate_id": "c1", "query": "b", "hits": _hits("x", "y")}),
    ]
    (p,), _ = run_read_points(_written(tmp_path, steps))
    assert p.read_ids == [] and p.context_ids == ["x"]
    assert [h["is_new"] for h in p.hits] == [False, True]


def test_v1_run_gives_no_points():
    runs = list(read_runs([FIX / "canonical"], report=ReadReport()))
    assert runs and all(e.v == 1 for r in runs for e in r.events)
    for run in runs:
        assert run_read_points(run.events) == ([], {})


def test_no_run_start_is_an_input_error():
    with pytest.raises(InputError, match="no run_start") as info:
        run_read_points([{"type": "frame_open", "run_id": "r9", "seq": 0, "frame_id": "f0"}], file="t.jsonl")
    assert info.value.file == "t.jsonl"


def _base(extra: list[dict]) -> list[dict]:
    """Plain dict events (as decoded JSON): a run start, frame f0 and candidate c0, then ``extra``."""
    head = [
        {"type": "run_start", "root_query": "q"},
        {"type": "frame_open", "frame_id": "f0", "depth": 0},
        {"type": "candidate", "frame_id": "f0", "candidate_id": "c0", "query": "a"},
    ]
    return [{"run_id": "r", "seq": i, **e} for i, e in enumerate(head + extra)]


def test_problems_are_counted_and_dict_events_work():
    dup = [*_hits("a", "b"), {"hit_id": "a", "title": "again", "snippet": "", "rank": 2}]
    events = _base(
        [
            {"type": "results", "candidate_id": "c0", "query": "a", "hits": dup},
            {"type": "results", "candidate_id": "c9", "query": "z", "hits": _hits("z")},  # undeclared
            {"type": "results", "candidate_id": "c1", "query": "b", "hits": _hits("b")},  # declared only later
            {"type": "candidate", "frame_id": "f0", "candidate_id": "c1", "query": "b"},
            {"type": "candidate", "frame_id": "f7", "candidate_id": "c2", "query": "c"},  # unknown frame
            {"type": "results", "candidate_id": "c2", "query": "c", "hits": _hits("c")},
            {"type": "retrieval", "candidate_id": "c9", "evidence_ids": ["z"]},  # ignored: not in context
            {"type": "read", "candidate_id": "c0", "hit_id": "a", "action": "read"},
            {"type": "read", "candidate_id": "c0", "hit_id": "a", "action": "skip"},  # repeated
            {"type": "read", "candidate_id": "c0", "hit_id": "q", "action": "read"},  # not a hit of c0's results
            {"type": "results", "candidate_id": "c1", "query": "b", "hits": _hits("a", "q")},
        ]
    )
    pts, problems = run_read_points(events)
    assert problems == {
        "duplicate_hits": 1,
        "results_without_candidate": 3,
        "retrieval_without_candidate": 1,
        "read_repeated": 1,
        "read_without_results": 1,
    }
    first, last = pts
    assert [(h["hit_id"], h["title"], h["action"]) for h in first.hits] == [("a", "T a", "read"), ("b", "T b", None)]
    assert last.context_ids == [] and last.read_ids == ["a", "q"]  # a read without results still counts as read
    assert [h["is_new"] for h in last.hits] == [False, False]


def test_hits_are_sorted_by_rank_and_capped():
    hits = list(reversed(_hits(*(f"h{i}" for i in range(MAX_HITS + 6)))))
    (p,), problems = run_read_points(_base([{"type": "results", "candidate_id": "c0", "query": "a", "hits": hits}]))
    assert len(p.hits) == MAX_HITS and problems == {"hits_over_cap": 6}
    assert [h["hit_id"] for h in p.hits] == [f"h{i}" for i in range(MAX_HITS)]  # the first by rank


def test_context_and_read_ids_keep_the_newest():
    n = MAX_CONTEXT + 5
    ids = [f"e{i}" for i in range(n)]
    events = _base(
        [
            {"type": "retrieval", "candidate_id": "c0", "evidence_ids": ids},
            {"type": "results", "candidate_id": "c0", "query": "a", "hits": _hits(*ids)[:2]},
            *({"type": "read", "candidate_id": "c0", "hit_id": i, "action": "read"} for i in ids),
            {"type": "results", "candidate_id": "c0", "query": "a", "hits": _hits("e0", "new")},
        ]
    )
    (first, second), problems = run_read_points(events)
    assert first.context_ids == ids[-MAX_CONTEXT:] and len(second.read_ids) == read_points.MAX_READ_IDS
    assert second.read_ids[-1] == ids[-1]
    # the reads of ids that were not hits of c0's results still count as reads (each one counted as a problem)
    assert problems == {"context_over_cap": 2, "read_ids_over_cap": 1, "read_without_results": n - 2}
    # novelty is judged on the whole run, not on the kept lists: e0 was dropped from both, still not new
    assert "e0" not in second.context_ids and "e0" not in second.read_ids
    assert [h["is_new"] for h in second.hits] == [False, True]


def test_searcho1_fixture_read_points():
    runs = {r.run_id: r for r in read_runs([FIX / "searcho1"], report=ReadReport())}
    if not any(e.type == "results" for r in runs.values() for e in r.events):
        pytest.skip("the Search-o1 reader does not emit results events yet (trace schema v2)")
    pts, problems = run_read_points(runs["9000001"].events)
    assert problems == {}
    first, second = pts
    docs = ["clueweb22-en0001-02-00003", "clueweb22-en0004-11-01234", "clueweb22-en0007-55-00042"]
    assert [h["hit_id"] for h in first.hits] == docs and first.context_ids == [] and first.read_ids == []
    assert second.context_ids == docs and second.read_ids == docs and second.depth == 1
    assert [(h["hit_id"], h["is_new"]) for h in second.hits] == [
        ("clueweb22-en0012-34-05678", True),
        ("clueweb22-en0007-55-00042", False),  # the document repeated from the first search
    ]
    assert {h["action"] for p in pts for h in p.hits} == {"read"}
    texts = {e.evidence_id: e.text for e in runs["9000001"].events if e.type == "evidence"}
    assert all(h["text"] == texts[h["hit_id"]] for p in pts for h in p.hits)
    assert first.hits[0]["title"] == "How Do Cats Purr? | Example Vet"
    # no key points for these traces: every hit unlabelled
    labels_of = evidence_labels(runs["9000001"].events)
    assert [keypoint_gains(p, labels_of) for p in pts] == [[-1, -1, -1], [-1, -1]]
    assert run_read_points(runs["9000002"].events) == ([], {})  # a trace without searches


def test_searcho1_keypoint_fixture_labels():
    runs = {r.run_id: r for r in read_runs([FIX / "searcho1_kp"], report=ReadReport())}
    if not any(e.type == "results" for r in runs.values() for e in r.events):
        pytest.skip("the Search-o1 reader does not emit results events yet (trace schema v2)")
    events = runs["9100001"].events
    pts, problems = run_read_points(events)
    assert problems == {}
    gains = [keypoint_gains(p, evidence_labels(events)) for p in pts]
    # search 1: two new documents (points #1 #4, then #2); search 2: the first document again (not new) and one
    # holding no key point; search 3: a document with point #5
    assert gains == [[2, 1], [-1, 0], [1]]


@pytest.mark.shared
def test_real_searcho1_keypoint_labels(shared):
    """On DeepResearchGym's Search-o1 traces the rule gives the issue's figure: 362 of 2,455 hits add a key point
    new to the run; the 93 hits already read earlier in their run are unlabelled."""
    traces = shared("drgym", "Searcho1_ClueWeb22")
    shared("drgym", "key_point")
    runs = list(read_runs([traces], report=ReadReport()))
    if not any(e.type == "results" for e in runs[0].events):
        pytest.skip("the Search-o1 reader does not emit results events yet (trace schema v2)")
    gains, problems = [], {}
    for run in runs:
        pts, run_problems = run_read_points(run.events)
        problems.update(run_problems)
        labels_of = evidence_labels(run.events)
        gains.extend(g for p in pts for g in keypoint_gains(p, labels_of))
    assert problems == {}
    assert len(gains) == 2455 and sum(g > 0 for g in gains) == 362 and sum(g < 0 for g in gains) == 93
