"""The open_deep_research drop-in on the package's real LangGraph graph, offline: a scripted chat model (tool
binding and structured output) and a fake search stand in for the LLM provider and Tavily (tests/odr_support.py).

Skipped when open-deep-research is not installed (it is not a branchgate dependency; the integration venv is
built from .ci/integrations/odr.txt).
"""

from __future__ import annotations

from collections import Counter

import pytest

odr = pytest.importorskip(
    "open_deep_research", reason="open-deep-research is not installed (see .ci/integrations/odr.txt)"
)

import open_deep_research.deep_researcher as graph_module  # noqa: E402
import open_deep_research.utils as odr_utils  # noqa: E402
from export_support import exported, read_controller_from, runs_in_every_split  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from odr_support import (  # noqa: E402
    CONFIG,
    OFF_TOPIC,
    QUESTION,
    SUPERVISOR_TOPICS,
    URL,
    KeywordGate,
    KeywordReadGate,
    fake_page_search,
    fake_search,
    install_offline,
    run_graph,
)

from branchgate.inference.agents.open_deep_research import _edited, gate_open_deep_research  # noqa: E402
from branchgate.inference.gate import Gate  # noqa: E402
from branchgate.logs_to_dataset.build import build  # noqa: E402
from branchgate.logs_to_dataset.traces import read_events  # noqa: E402

OVERFLOW = "Error: Did not run this research"
CAP = CONFIG["configurable"]["max_concurrent_research_units"]


@pytest.fixture()
def offline(monkeypatch):
    """The scripted model and a fake search that logs the query lists the package passed it."""
    model = install_offline(monkeypatch)
    searched = []

    async def logged(search_queries, *args, **kwargs):
        searched.append(list(search_queries))
        return await fake_search(search_queries, *args, **kwargs)

    monkeypatch.setattr(odr_utils, "tavily_search_async", logged)
    return model, searched


def run(gate, trace, **options):
    with gate_open_deep_research(gate, trace=trace, **options) as hook:
        state = run_graph()
        hook.record_report(state["final_report"])
    return hook, state, list(read_events(trace, strict=True))


def by_type(events, t):
    return [e for e in events if e.type == t]


def test_gates_delegations_and_queries_of_the_real_graph(offline, tmp_path, encoder):
    model, searched = offline
    gate = Gate.load(exported(encoder)["files"]["int8"])
    hook, state, events = run(gate, tmp_path / "traces" / "gated.jsonl", root_query=QUESTION)
    frames = {e.frame_id: e for e in by_type(events, "frame_open")}
    cands = {e.candidate_id: e for e in by_type(events, "candidate")}
    decisions = {e.candidate_id: e for e in by_type(events, "decision")}
    assert events[0].type == "run_start" and events[0].root_query == QUESTION and hook.write_errors == 0
    assert by_type(events, "run_end")[0].status == "ok" and set(decisions) == set(cands)

    # supervisor turns: every ConductResearch call the model made is a candidate; the Gate chose which run
    top = [f for f in frames.values() if f.depth == 0]
    assert [[cands[c].query for c in cands if c.startswith(f.frame_id + ".")] for f in top] == SUPERVISOR_TOPICS
    gated = [d for d in decisions.values() if d.actor.startswith("controller:")]
    assert gated and all(d.p_keep is not None and 0.0 <= d.p_keep <= 1.0 for d in gated)
    assert any(d.action == "prune" for d in gated)  # the gate pruned something
    ran_topics = [cands[e.candidate_id].query for e in by_type(events, "learning")]
    expanded = [
        cands[c].query for c, d in decisions.items() if d.action == "expand" and frames[cands[c].frame_id].depth == 0
    ]
    assert sorted(ran_topics) == sorted(expanded) == sorted({*ran_topics})  # one researcher per expanded call
    assert hook.counts["not_run"] == 1  # the last turn also called ResearchComplete: the package ran nothing
    # never emptied, never above the package's cap: no call was answered with the overflow error
    supervisor_turns = [m for m in state["supervisor_messages"] if isinstance(m, AIMessage) and m.tool_calls]
    assert len(supervisor_turns) == len(SUPERVISOR_TOPICS)
    for m in supervisor_turns:
        conduct = [c for c in m.tool_calls if c["name"] == "ConductResearch"]
        assert 1 <= len(conduct) <= CAP
    assert not any(
        isinstance(m, ToolMessage) and str(m.content).startswith(OVERFLOW) for m in state["supervisor_messages"]
    )
    assert model.replies["supervisor"] == len(SUPERVISOR_TOPICS)

    # researcher searches: each call is a frame below its ConductResearch candidate; the search got the kept queries
    below = [f for f in frames.values() if f.depth == 1]
    assert below and all(decisions[f.parent_candidate].action == "expand" for f in below)
    kept_lists = [
        [cands[c].query for c in cands if c.startswith(f.frame_id + ".") and decisions[c].action == "expand"]
        for f in below
    ]
    assert all(kept_lists) and sorted(map(tuple, kept_lists)) == sorted(map(tuple, searched))
    n_generated = sum(1 for c in cands.values() if frames[c.frame_id].depth == 1)
    assert sum(map(len, searched)) < n_generated  # queries were pruned before the search ran
    retrieved = {e.candidate_id for e in by_type(events, "retrieval")}
    assert retrieved == {c for c, d in decisions.items() if d.action == "expand"}
    report = by_type(events, "report")[0]
    assert report.cited_ids and set(report.cited_ids) <= {e.evidence_id for e in by_type(events, "evidence")}

    # ... and the trace becomes a decision dataset: one row per candidate
    manifest = build(
        [tmp_path / "traces"],
        tmp_path / "dataset",
        encoder_obj=encoder,
        labels="citations",
        cache=tmp_path / "cache",
        progress=False,
    )
    assert manifest["n_decisions"]["total"] == len(cands) and manifest["n_runs"]["total"] == 1
    assert manifest["n_expanded"] == sum(1 for d in decisions.values() if d.action == "expand")
    labels = Counter()
    for split in manifest["labels"].values():
        labels.update({lab: n for lab, n in split.items()})
    assert labels["1"] > 0  # branches whose evidence the report cites
    assert labels["-1"] == len(cands) - manifest["n_expanded"]  # never expanded: excluded


def test_record_only_leaves_the_package_alone(offline, tmp_path):
    model, searched = offline
    hook, state, events = run(None, tmp_path / "record.jsonl")
    decisions = by_type(events, "decision")
    assert {d.actor for d in decisions} == {"default"} and all(d.p_keep is None for d in decisions)
    first = [d for d in decisions if d.candidate_id.startswith("f0.")]
    assert [d.action for d in first] == ["expand"] * CAP + ["prune"] * (len(SUPERVISOR_TOPICS[0]) - CAP)
    overflow = [
        m for m in state["supervisor_messages"] if isinstance(m, ToolMessage) and str(m.content).startswith(OVERFLOW)
    ]
    assert len(overflow) == len(SUPERVISOR_TOPICS[0]) - CAP  # the package's own answer to the calls it did not run
    below = {f.frame_id for f in by_type(events, "frame_open") if f.depth == 1}
    assert sum(map(len, searched)) == sum(1 for c in by_type(events, "candidate") if c.frame_id in below)  # all ran
    assert events[0].root_query.startswith("Why do honeybee colonies collapse")  # default: the research brief


def test_a_gate_that_keeps_nothing_still_runs_one_branch_per_list(offline, tmp_path):
    model, searched = offline

    class KeepsNothing(KeywordGate):
        def select(self, state, candidates, tau=None, max_keep=None):
            sel = super().select(state, candidates, tau, max_keep)
            sel.kept = []
            return sel

    hook, state, events = run(KeepsNothing(), tmp_path / "empty.jsonl")
    turns = [m for m in state["supervisor_messages"] if isinstance(m, AIMessage) and m.tool_calls]
    assert [sum(c["name"] == "ConductResearch" for c in m.tool_calls) for m in turns] == [1] * len(SUPERVISOR_TOPICS)
    assert searched and all(len(q) == 1 for q in searched)
    for f in by_type(events, "frame_open"):  # the kept one is the best p_keep (ties: the first)
        ds = [d for d in by_type(events, "decision") if d.candidate_id.startswith(f.frame_id + ".")]
        best = max(ds, key=lambda d: d.p_keep)
        assert [d.candidate_id for d in ds if d.action == "expand"] in ([best.candidate_id], [])


def test_hook_restores_the_package(offline, tmp_path):
    originals = (graph_module.configurable_model, graph_module.researcher_subgraph, odr_utils.tavily_search_async)
    hook = gate_open_deep_research(None, trace=tmp_path / "t.jsonl")
    assert graph_module.configurable_model is not originals[0]
    with pytest.raises(RuntimeError, match="another branchgate hook"):
        gate_open_deep_research(None)
    hook.close()
    assert (
        graph_module.configurable_model,
        graph_module.researcher_subgraph,
        odr_utils.tavily_search_async,
    ) == originals


def test_edited_message_keeps_provider_copies_consistent():
    calls = [
        {"name": "ConductResearch", "args": {"research_topic": "a"}, "id": "c1", "type": "tool_call"},
        {"name": "ConductResearch", "args": {"research_topic": "b"}, "id": "c2", "type": "tool_call"},
        {"name": "tavily_search", "args": {"queries": ["x", "y", "z"]}, "id": "c3", "type": "tool_call"},
    ]
    wire = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": "{}"}} for c in calls]
    blocks = [{"type": "text", "text": "thinking"}] + [
        {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]} for c in calls
    ]
    msg = AIMessage(content=blocks, tool_calls=calls, additional_kwargs={"tool_calls": wire})
    out = _edited(msg, msg.tool_calls, drop={1}, queries={2: ["x", "z"]})
    assert [c["id"] for c in out.tool_calls] == ["c1", "c3"] and out.tool_calls[1]["args"]["queries"] == ["x", "z"]
    assert [w["id"] for w in out.additional_kwargs["tool_calls"]] == ["c1", "c3"]
    assert out.additional_kwargs["tool_calls"][1]["function"]["arguments"] == '{"queries": ["x", "z"]}'
    assert [b.get("id") for b in out.content] == [None, "c1", "c3"] and out.content[2]["input"]["queries"] == ["x", "z"]
    assert [c["id"] for c in msg.tool_calls] == ["c1", "c2", "c3"]  # the model's own message is not changed


def test_a_run_budget_stops_the_research_without_crashing(offline, tmp_path, encoder):
    model, searched = offline
    gate = Gate.load(exported(encoder)["files"]["int8"])
    hook, state, events = run(gate, tmp_path / "budget.jsonl", root_query=QUESTION, budget_nodes=3)
    decisions = by_type(events, "decision")
    assert by_type(events, "run_end")[0].status == "ok" and events[0].config["budget"]["budget_nodes"] == 3
    assert sum(d.action == "expand" for d in decisions) <= 3 and hook.gate.budget.spent_nodes <= 3
    assert any(d.actor == "budget" for d in decisions) and hook.counts["exhausted"] >= 1
    assert all(d.remaining["nodes"] >= 0 for d in decisions)
    assert sum(map(len, searched)) <= 3  # the budget's nodes bound the searches that ran
    assert state.get("final_report") is not None


# -- the read gate (issue 51) -------------------------------------------------------------------------------
@pytest.fixture()
def pages(monkeypatch):
    """The scripted model and a search whose results carry their pages' raw content: the package summarises each."""
    model = install_offline(monkeypatch)
    monkeypatch.setattr(odr_utils, "tavily_search_async", fake_page_search)
    return model


def test_read_gate_skips_summaries_and_keeps_skipped_results_out_of_the_messages(pages, tmp_path, encoder):
    model = pages
    _, state, events = run(None, tmp_path / "rec" / "all.jsonl")
    summaries_all = model.replies["Summary"]
    reads = by_type(events, "read")
    assert summaries_all == len(reads) > 0 and all(r.action == "read" and r.actor == "default" for r in reads)
    model.replies.clear()
    gate = KeywordReadGate()
    hook, state, events = run(None, tmp_path / "gated.jsonl", read=gate)
    reads = by_type(events, "read")
    skipped = {r.hit_id for r in reads if r.action == "skip"}
    read = {r.hit_id for r in reads if r.action == "read"}
    assert skipped and all(any(w in u for w in OFF_TOPIC) for u in skipped) and not skipped & read
    assert model.replies["Summary"] == len(read) == summaries_all - len(skipped)  # no summary of a skipped result
    notes = " ".join(map(str, state.get("raw_notes") or [])) + " ".join(map(str, state.get("notes") or []))
    assert read & set(URL.findall(notes)) and not skipped & set(URL.findall(notes))
    evidence = {e.source: e for e in by_type(events, "evidence")}
    assert set(evidence) == read and all(e.hit_id == e.source for e in evidence.values())
    assert hook.counts["hits_skipped"] == len(skipped) and gate.seen
    print(f"\nopen_deep_research: {summaries_all} pages summarised without the read gate, {len(read)} with it")
    # the record-only trace is a read dataset: one row per new hit
    manifest = build(
        [tmp_path / "rec"],
        tmp_path / "ds",
        encoder_obj=encoder,
        labels="citations",
        cache=tmp_path / "cache",
        progress=False,
        stage="read",
    )
    assert manifest["stage"] == "read" and manifest["read"]["hits"] == summaries_all
    assert manifest["n_decisions"]["total"] == summaries_all and manifest["run_problems"] == {}


def test_a_pre_retrieval_controller_is_refused_as_the_read_gate(pages, tmp_path, encoder):
    with pytest.raises(ValueError, match="read: a read controller is needed"):
        gate_open_deep_research(None, read=Gate.load(exported(encoder)["files"]["int8"]))


def test_recorded_result_lists_train_and_export_a_read_controller(pages, tmp_path):
    """The hook's record-only traces (one run per split) → ``dataset build --stage read`` (citations) → train →
    export; the controller then gates a run, and only what it reads is summarised."""
    model = pages
    for run_id in runs_in_every_split("odr-read"):
        run(None, tmp_path / "logs" / f"{run_id}.jsonl", run_id=run_id)
    gate = Gate.load(read_controller_from(tmp_path / "logs", tmp_path))
    assert gate.stage == "read"
    model.replies.clear()
    hook, _, events = run(None, tmp_path / "gated.jsonl", read=gate)
    reads = by_type(events, "read")
    assert reads and all(r.actor == f"controller:{gate.name}" or r.actor == "seen" for r in reads)
    assert model.replies.get("Summary", 0) == sum(r.action == "read" for r in reads) == hook.counts["hits_read"]
