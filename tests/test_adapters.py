"""Plug-ins: the generic gated wrapper and the GPT-Researcher deep-research drop-in (against a fake skill)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from export_support import exported

from branchgate.decide import decide
from branchgate.inference.agents.adapters import candidate_fields, gated
from branchgate.inference.agents.gpt_researcher import gate_research
from branchgate.inference.gate import Gate, Selection
from branchgate.inference.inputs import as_state
from branchgate.logs_to_dataset.traces import read_events


class RuleGate:
    """A deterministic stand-in gate: p_keep from a rule on the query text; records the states it saw."""

    name = "rule"

    def __init__(self, keep_words=("keep",), tau=0.5):
        self.keep_words, self.tau, self.states = keep_words, tau, []

    def select(self, state, candidates, tau=None, max_keep=None):
        self.states.append(as_state(state))
        p = np.array(
            [0.9 if any(w in candidate_fields(c)[0] for w in self.keep_words) else 0.1 for c in candidates], np.float32
        )
        tau = self.tau if tau is None else tau
        d = decide(p, tau, max_keep=max_keep)
        return Selection(d.kept, p, p, d.fallback, tau)


class EmptyGate(RuleGate):
    def select(self, state, candidates, tau=None, max_keep=None):
        sel = super().select(state, candidates, tau, max_keep)
        sel.kept = []
        return sel


# -- generic wrapper ----------------------------------------------------------------------------------------
def test_gated_sync_function_keeps_a_subset_of_the_same_objects():
    made = []

    def plan(question, n=4):
        made[:] = [{"query": f"{question} part {i} {'keep' if i % 2 else 'drop'}", "goal": f"g{i}"} for i in range(n)]
        return made

    calls = []
    gate = RuleGate()
    wrapped = gated(plan, gate, on_decision=calls.append)
    kept = wrapped("bees", n=4)
    assert [made.index(k) for k in kept] == [1, 3] and all(k is made[i] for k, i in zip(kept, [1, 3]))
    assert calls[0].selection.kept == [1, 3] and gate.states[0].root_query == "bees"
    assert wrapped.__name__ == "plan"
    # the kept branches become the retained context of the next call
    wrapped("bees again")
    assert gate.states[1].retained == ["bees part 1 keep\ng1", "bees part 3 keep\ng3"]
    wrapped.reset()
    assert wrapped.retained == []


def test_gated_async_function_never_returns_empty_for_non_empty_input():
    async def plan(prompt):
        return ["nothing to keep here", "nor here"]

    wrapped = gated(plan, RuleGate())
    assert asyncio.iscoroutinefunction(plan)
    kept = asyncio.run(wrapped("q"))
    assert kept == ["nothing to keep here"]  # top-1 fallback (ties → first)

    async def none(prompt):
        return []

    assert asyncio.run(gated(none, RuleGate())("q")) == []


def test_gated_with_the_real_gate_and_custom_state(encoder):
    gate = Gate.load(exported(encoder)["files"]["int8"])

    def plan(topic, depth):
        return [("varroa mites", "parasites"), ("pesticides", ""), ("honey prices", "economics")]

    wrapped = gated(plan, gate, state=lambda topic, depth: {"root_query": topic, "depth": depth}, max_keep=2)
    kept = wrapped("why do bee colonies collapse", 1)
    assert 1 <= len(kept) <= 2 and all(k in plan("", 0) for k in kept)


def test_candidate_fields_accepts_common_shapes():
    class Obj:
        query, goal = "q", "g"

    assert candidate_fields("q") == ("q", "")
    assert candidate_fields(("q", "g")) == ("q", "g")
    assert candidate_fields({"query": "q", "researchGoal": "g"}) == ("q", "g")
    assert candidate_fields(Obj()) == ("q", "g")


# -- GPT-Researcher drop-in ---------------------------------------------------------------------------------
class FakeDeepResearchSkill:
    """Same method shapes and control flow as gpt_researcher.skills.deep_research.DeepResearchSkill:
    generate_search_queries → one nested research + process_research_results per query (concurrently, under
    a semaphore) → recursion per result with breadth // 2 and a 'Previous research goal' query. Like the
    real one, it fails on an empty query list."""

    def __init__(self, query="Why are honeybee colonies collapsing?", breadth=4, depth=2, curated=False):
        self.researcher = type("R", (), {"query": query})()
        self.breadth, self.depth, self.concurrency_limit = breadth, depth, 2
        self.curated = curated
        self.generated = 0

    async def generate_search_queries(self, query, num_queries=3):
        await asyncio.sleep(0)
        base = self.generated
        self.generated += num_queries
        words = ["varroa mites keep", "pesticides keep", "honey prices", "weather keep", "beekeeping keep", "trivia"]
        return [
            {"query": f"{words[(base + i) % len(words)]} {base + i}", "researchGoal": f"goal {base + i}"}
            for i in range(num_queries)
        ]

    async def process_research_results(self, query, context, num_learnings=3):
        await asyncio.sleep(0)
        return {
            "learnings": [f"learned about {query}"],
            "followUpQuestions": [f"what else on {query}?"],
            "citations": {},
        }

    async def deep_research(
        self, query, breadth, depth, learnings=None, citations=None, visited_urls=None, on_progress=None
    ):
        serp_queries = await self.generate_search_queries(query, num_queries=breadth)
        if not serp_queries:
            raise UnboundLocalError("cannot access local variable 'all_learnings'")  # the real skill's failure
        semaphore = asyncio.Semaphore(self.concurrency_limit)

        async def process_query(serp_query):
            async with semaphore:
                if self.curated:
                    context = [{"Content": f"passage on {serp_query['query']}", "url": "https://example.org/a"}]
                else:
                    context = f"passage on {serp_query['query']}\nmore text"
                results = await self.process_research_results(query=serp_query["query"], context=context)
                return {
                    "learnings": results["learnings"],
                    "followUpQuestions": results["followUpQuestions"],
                    "researchGoal": serp_query["researchGoal"],
                }

        results = await asyncio.gather(*[process_query(q) for q in serp_queries])
        all_learnings = list(learnings or [])
        for result in results:
            all_learnings.extend(result["learnings"])
            if depth > 1:
                next_query = f"""
                Previous research goal: {result["researchGoal"]}
                Follow-up questions: {" ".join(result["followUpQuestions"])}
                """
                deeper = await self.deep_research(
                    query=next_query,
                    breadth=max(2, breadth // 2),
                    depth=depth - 1,
                    learnings=all_learnings,
                    citations=citations,
                    visited_urls=visited_urls,
                    on_progress=on_progress,
                )
                all_learnings = deeper["learnings"]
        return {"learnings": all_learnings}

    async def run(self, on_progress=None):
        combined = f"Initial Query: {self.researcher.query}\nFollow - up Questions and Answers:\n"
        results = await self.deep_research(query=combined, breadth=self.breadth, depth=self.depth)
        return "\n".join(results["learnings"])


def _events(path):
    return list(read_events(path, strict=True))


def test_hook_gates_and_records_the_whole_tree(tmp_path):
    skill = FakeDeepResearchSkill()
    gate = RuleGate()
    trace = tmp_path / "run.jsonl"
    hook = gate_research(skill, gate, trace, run_id="r1")
    asyncio.run(skill.run())
    hook.close()
    events = _events(trace)
    types = Counter(e.type for e in events)
    assert events[0].type == "run_start" and events[-1].type == "run_end" and events[-1].status == "ok"
    assert events[0].root_query == "Why are honeybee colonies collapsing?" and events[0].system == "gpt-researcher"
    assert [e.seq for e in events] == list(range(len(events)))
    # root frame: 4 candidates, 3 kept ("keep" in the text) → 3 child frames of 2 candidates each
    frames = [e for e in events if e.type == "frame_open"]
    assert len(frames) == 4 and frames[0].depth == 0 and all(f.depth == 1 for f in frames[1:])
    cands = {e.candidate_id: e for e in events if e.type == "candidate"}
    decisions = {e.candidate_id: e for e in events if e.type == "decision"}
    assert types["candidate"] == 4 + 3 * 2 and set(decisions) == set(cands)
    kept_root = [
        c for c in cands.values() if c.frame_id == frames[0].frame_id and decisions[c.candidate_id].action == "expand"
    ]
    assert [c.query.split()[0] for c in kept_root] == ["varroa", "pesticides", "weather"]
    assert [f.parent_candidate for f in frames[1:]] == [c.candidate_id for c in kept_root]
    assert [f.parent_goal for f in frames[1:]] == [c.goal for c in kept_root]
    assert all(decisions[c].actor == "controller:rule" and decisions[c].p_keep is not None for c in decisions)
    # every expanded candidate has one retrieval with its evidence, learnings and follow-ups
    expanded = [c for c, d in decisions.items() if d.action == "expand"]
    retrievals = {e.candidate_id: e for e in events if e.type == "retrieval"}
    assert set(retrievals) == set(expanded)
    evidence = {e.evidence_id for e in events if e.type == "evidence"}
    assert all(set(r.evidence_ids) <= evidence and r.tokens > 0 for r in retrievals.values())
    assert types["learning"] == types["followup"] == len(expanded)
    # the retained context grows: child frames see the root frame's kept branches
    assert gate.states[0].retained == [] and len(gate.states[1].retained) == 3
    assert gate.states[1].parent_goal == kept_root[0].goal and gate.states[1].depth == 1
    assert events[-1].totals["expanded"] == len(expanded) and events[-1].totals["frames"] == 4


def test_hook_never_returns_an_empty_candidate_list(tmp_path, encoder):
    for gate in (EmptyGate(), RuleGate(keep_words=("nothing",)), Gate.load(exported(encoder)["files"]["int8"])):
        skill = FakeDeepResearchSkill(breadth=3, depth=2)
        hook = gate_research(skill, gate, tmp_path / f"{type(gate).__name__}.jsonl", tau=1.0)
        asyncio.run(skill.run())  # the fake raises on an empty list, like GPT-Researcher
        hook.close()
        events = _events(tmp_path / f"{type(gate).__name__}.jsonl")
        frames = [e for e in events if e.type == "frame_open"]
        assert len(frames) == 2  # one kept at the root → one child frame
        assert sum(e.action == "expand" for e in events if e.type == "decision") == 2


def test_hook_without_gate_records_only_and_handles_curated_context(tmp_path):
    skill = FakeDeepResearchSkill(breadth=2, depth=2, curated=True)
    hook = gate_research(type("GPTResearcher", (), {"deep_researcher": skill})(), None, tmp_path / "t.jsonl")
    out = asyncio.run(skill.run())
    hook.close()
    assert "learned about" in out
    events = _events(tmp_path / "t.jsonl")
    assert all(e.action == "expand" and e.actor == "default" for e in events if e.type == "decision")
    assert len([e for e in events if e.type == "frame_open"]) == 3
    ev = [e for e in events if e.type == "evidence"]
    assert ev and ev[0].source == "https://example.org/a"
    hook.uninstall()
    assert "deep_research" not in vars(skill)


def test_hook_rejects_objects_that_are_not_a_deep_research_skill():
    with pytest.raises(TypeError, match="DeepResearchSkill"):
        gate_research(object(), RuleGate())


def test_drop_in_is_import_safe_without_gpt_researcher():
    """In a fresh interpreter where gpt_researcher cannot be imported, the drop-in still imports, never tries
    to import it, and hooks a duck-typed skill."""
    code = (
        "import sys\n"
        "sys.modules['gpt_researcher'] = None  # any import of it now raises ImportError\n"
        "import branchgate.inference.agents.gpt_researcher as mod\n"
        "class Skill:\n"
        "    async def generate_search_queries(self, query, num_queries=3): return []\n"
        "    async def deep_research(self, query, breadth, depth): return {}\n"
        "hook = mod.gate_research(Skill(), None)\n"
        "assert 'gpt_researcher' not in {m for m in sys.modules if sys.modules[m] is not None}\n"
        "print(type(hook).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ResearchHook"


def test_a_second_candidate_list_in_one_frame_is_its_own_decision_point(tmp_path):
    """Two generate_search_queries calls inside one deep_research: each list is gated as positions 0..n-1, and
    the trace records each as its own decision point, so the dataset sees what the Gate saw."""
    from branchgate.logs_to_dataset.decision_points import run_decisions

    class TwoLists(FakeDeepResearchSkill):
        async def deep_research(self, query, breadth, depth, **kwargs):
            first = await self.generate_search_queries(query, num_queries=3)
            second = await self.generate_search_queries(query, num_queries=2)
            return {"learnings": [q["query"] for q in first + second]}

    skill, gate = TwoLists(), RuleGate()
    hook = gate_research(skill, gate, tmp_path / "t.jsonl", run_id="two")
    asyncio.run(skill.run())
    hook.close()
    events = _events(tmp_path / "t.jsonl")
    by_frame = {}
    for e in events:
        if e.type == "candidate":
            by_frame.setdefault(e.frame_id, []).append(e.order)
    assert list(by_frame.values()) == [[0, 1, 2], [0, 1]]
    rd = run_decisions("two", events)
    assert [len(f.candidates) for f in rd.frames] == [3, 2]
    assert [[c.order for c in f.candidates] for f in rd.frames] == [[0, 1, 2], [0, 1]]
    # the second list's state holds the first list's kept branches, in the Gate's call and in the dataset alike
    assert gate.states[1].retained == rd.frames[1].retained and len(rd.frames[1].retained) == 2
