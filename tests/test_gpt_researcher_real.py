"""The GPT-Researcher drop-in on the real ``gpt_researcher`` package (its DeepResearchSkill, its
GPTResearcher), with only the LLM call and the web search replaced by local stand-ins.

Skipped when gpt-researcher is not installed (it is not a branchgate dependency; ``pip install
"gpt-researcher<0.16"`` on Python 3.11, 0.16 needs 3.12). test_adapters.py covers the hook against a fake
skill in every run.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from branchgate.inference.gate import Gate
from branchgate.inference.gpt_researcher import gate_deep_research
from branchgate.logs_to_dataset.build import build
from branchgate.logs_to_dataset.traces import read_events
from export_support import exported

gptr = pytest.importorskip("gpt_researcher", reason="gpt-researcher is not installed (optional; see the module docstring)")
deep = pytest.importorskip("gpt_researcher.skills.deep_research")

TOPICS = ["varroa mite loads and colony losses", "neonicotinoid exposure field studies", "honey prices by country",
          "queen failure causes", "beekeeping history trivia", "pathogen spillover from managed bees"]


@pytest.fixture()
def offline_researcher(monkeypatch):
    """GPT-Researcher's deep research with a scripted LLM, no web search, and nested researchers that
    return a fixed context instead of browsing."""
    generated = []

    async def completion(messages, **kwargs):
        text = messages[-1]["content"]
        wanted = re.search(r"generate (\d+) unique search queries", text)
        if wanted:
            lines = []
            for _ in range(int(wanted.group(1))):
                topic = f"{TOPICS[len(generated) % len(TOPICS)]} {len(generated)}"
                generated.append(topic)
                lines += [f"Query: {topic}", f"Goal: understand {topic}"]
            return "\n".join(lines)
        if "extract key learnings" in text:
            query = re.search(r"for the query '(.*?)'", text).group(1)
            return f"Learning [https://example.org/{len(query)}]: a finding on {query}\nQuestion: what else about {query}?"
        if "unique questions" in text:
            return "Question: Which drivers matter most?\nQuestion: What changed since 2020?"
        raise AssertionError(f"unexpected prompt: {text[:120]}")

    async def no_search(*args, **kwargs):
        return []

    real_conduct = gptr.GPTResearcher.conduct_research

    async def conduct(self, on_progress=None):
        if self.deep_researcher is not None:
            return await real_conduct(self, on_progress)
        return f"Context for {self.query}: first passage. Second passage."

    monkeypatch.setenv("OPENAI_API_KEY", "sk-offline-test")
    monkeypatch.setattr(deep, "create_chat_completion", completion)
    monkeypatch.setattr(deep, "get_search_results", no_search)
    monkeypatch.setattr(gptr.GPTResearcher, "conduct_research", conduct)

    def make(breadth=4, depth=2):
        researcher = gptr.GPTResearcher(query="Why are honeybee colonies collapsing?", report_type="deep")
        researcher.deep_researcher.breadth, researcher.deep_researcher.depth = breadth, depth
        return researcher

    return make


def run(researcher, gate, trace):
    hook = gate_deep_research(researcher, gate, trace)
    asyncio.run(researcher.conduct_research())
    hook.close()
    return hook, list(read_events(trace, strict=True))


def test_records_the_whole_real_deep_research_tree(offline_researcher, tmp_path, encoder):
    hook, events = run(offline_researcher(breadth=4, depth=2), None, tmp_path / "record.jsonl")
    frames = [e for e in events if e.type == "frame_open"]
    cands = {e.candidate_id: e for e in events if e.type == "candidate"}
    decisions = {e.candidate_id: e for e in events if e.type == "decision"}
    assert events[0].type == "run_start" and events[0].root_query == "Why are honeybee colonies collapsing?"
    assert events[-1].type == "run_end" and events[-1].status == "ok" and hook.write_errors == 0
    assert len(frames) == 1 + 4 and len(cands) == 4 + 4 * 2 and set(decisions) == set(cands)
    assert all(d.action == "expand" for d in decisions.values())
    root = [c for c in cands.values() if c.frame_id == frames[0].frame_id]
    assert sorted(f.parent_candidate for f in frames[1:]) == sorted(c.candidate_id for c in root)
    goal = {c.candidate_id: c.goal for c in root}
    assert all(f.depth == 1 and f.parent_goal == goal[f.parent_candidate] for f in frames[1:])
    assert len([e for e in events if e.type == "retrieval"]) == len(cands)
    assert all(e.tokens > 0 for e in events if e.type == "retrieval")
    # ... and the trace becomes a decision dataset: one row per candidate
    manifest = build([tmp_path / "record.jsonl"], tmp_path / "dataset", encoder_obj=encoder,
                     cache=tmp_path / "cache", progress=False)
    assert manifest["n_decisions"]["total"] == len(cands) and manifest["n_runs"]["total"] == 1


def test_gates_the_real_deep_research(offline_researcher, tmp_path, encoder):
    gate = Gate.load(exported(encoder)["files"]["int8"])
    hook, events = run(offline_researcher(breadth=4, depth=2), gate, tmp_path / "gated.jsonl")
    frames = [e for e in events if e.type == "frame_open"]
    decisions = [e for e in events if e.type == "decision"]
    kept = [d.candidate_id for d in decisions if d.action == "expand"]
    root_kept = [c for c in kept if c.startswith(f"{frames[0].frame_id}.")]
    assert decisions and all(d.actor == "controller:gate" and 0.0 <= d.p_keep <= 1.0 for d in decisions)
    assert 1 <= len(root_kept) <= 4 and len(frames) == 1 + len(root_kept)  # one child frame per kept branch
    for frame in frames:  # never an empty list: GPT-Researcher's deep research fails on one
        assert any(c.startswith(f"{frame.frame_id}.") for c in kept)
    assert len([e for e in events if e.type == "retrieval"]) == len(kept) == hook.counts["expanded"]
