"""The simulator's text and hits (issue 65): pages as hits, fluent candidates, MuSiQue's own sub-questions."""

from __future__ import annotations

import json
import random

from branchgate.pipeline import env as envmod
from branchgate.pipeline import env_build
from branchgate.pipeline.config import Config
from branchgate.pipeline.generate import OfflineGenerator, agent_steps, fill_gold, gold_steps, topic_of
from branchgate.pipeline.simulate import simulate
from branchgate.pipeline.textutil import STOPWORDS
from branchgate.texts import title_of
from tests.test_env import write_drgym


def test_topic_is_the_question_without_its_question_words():
    assert topic_of("Why are honeybee colonies collapsing?") == "honeybee colonies collapsing"
    assert topic_of("How many Publix stores are in the state that borders Georgia?") == "Publix stores are in the state"
    long = topic_of("What is the name of the waterfall in the country where the Bubye River is found?")
    assert long == "the name of the waterfall in the country" and len(long.split()) <= 8


def test_gold_steps_read_as_questions_and_fill_their_references():
    meta = {"decomposition": ["Hello Love >> performer", "What city did #1 live when he died?"]}
    kps = [{"text": "Hello Love >> performer Hank Snow"}, {"text": "What city did #1 live when he died? Tennessee"}]
    steps = gold_steps(meta, kps)
    assert steps == [("performer of Hello Love", "Hank Snow"), ("What city did #1 live when he died?", "Tennessee")]
    assert fill_gold(steps[1][0], [a for _, a in steps]) == "What city did Hank Snow live when he died?"
    assert fill_gold("Who founded #2?", ["x"]) is None  # an unknown answer: no candidate
    assert gold_steps({"decomposition": ["A supporting sentence.", "Another one."]}, []) == []  # statements


def test_offline_candidates_are_fluent_and_the_plan_asks_the_first_sub_question():
    env = envmod.load("sample")
    gen = OfflineGenerator(env)
    golds, queries = 0, []
    for n, q in enumerate(env.queries[:10]):
        texts = [env.texts[i] for i, _ in env.bm25.search(q.query, 10)]
        cands = gen.plan(q.query, texts, 6, random.Random(n))
        queries += [c.query for c in cands]
        first = gold_steps(q.meta, q.key_points)[0][0]
        golds += any(c.origin == "gold" and c.query == first for c in cands)
    assert golds >= 8
    for text in queries:  # language, not a string of keywords: function words join the content words
        ws = text.lower().replace("?", "").split()
        assert len(ws) < 4 or any(w in STOPWORDS or w in {"definition", "statistics"} for w in ws), text


def test_some_offline_candidates_drift_to_another_question_and_find_none_of_its_key_points():
    env = envmod.load("sample")
    gen = OfflineGenerator(env)
    others = {q.query.strip() for q in env.queries}
    off = 0
    for n, q in enumerate(env.queries[:40]):
        texts = [env.texts[i] for i, _ in env.bm25.search(q.query, 10)]
        for c in gen.plan(q.query, texts, 6, random.Random(n)):
            if c.origin != "offtopic":
                continue
            off += 1
            assert q.query not in c.query and c.focus and others  # written for another question, not this one
            found = {k for i, _ in env.bm25.search(c.query, 5) for k in env.labels[i]}
            assert not {k for k in found if k.startswith(f"{q.id}#")}, c.query  # plainly irrelevant: no key point
    assert 10 <= off <= 45  # about a tenth of 240 candidates


def test_page_environment_lists_whole_pages_with_titles(tmp_path):
    src = write_drgym(tmp_path / "src")
    out = env_build.build("drgym", [str(src)], tmp_path / "env", unit="page", progress=False)
    env = envmod.load(out)
    assert env.unit == "page" and json.loads((out / "manifest.json").read_text())["unit"] == "page"
    assert sorted(env.docs) == ["docA", "docX"]  # one passage per document with a full text; docB/docC: spans only
    a = env.docs.index("docA")
    assert set(env.labels[a]) == {"q1#1", "q1#2"}  # its own key points, as the Search-o1 reader labels docA
    simulate(str(out), Config(depth=1, top_k=5), tmp_path / "sim", progress=False)
    evs = [json.loads(x) for f in sorted((tmp_path / "sim" / "traces").glob("*.jsonl")) for x in f.open()]
    hits = [h for e in evs if e["type"] == "results" for h in e["hits"]]
    assert hits and all(h["title"] == title_of(env.texts[env.index_of[h["hit_id"]]]) for h in hits)
    assert all(h["title"] and h["title"] not in h["snippet"] for h in hits)  # the title is not repeated as snippet


def test_a_drgym_question_keeps_its_agents_own_queries_and_the_plan_asks_the_first(tmp_path):
    """DeepResearchGym: the Search-o1 agent's searches for a question are its real-text sub-queries."""
    src = write_drgym(tmp_path / "src")
    plain = envmod.load(env_build.build("drgym", [str(src)], tmp_path / "plain", unit="page", progress=False))
    assert all("agent_queries" not in q.meta for q in plain.queries)  # off by default
    out = env_build.build("drgym", [str(src)], tmp_path / "env", unit="page", progress=False, agent_queries=True)
    env = envmod.load(out)
    by_id = {q.id: q for q in env.queries}
    assert by_id["q1"].meta["agent_queries"] == ["sky blue"]  # the trace's one search
    assert "agent_queries" not in by_id["q2"].meta  # no trace: nothing invented
    assert agent_steps(by_id["q1"].meta) == [("sky blue", "")]
    q = by_id["q1"]
    cands = OfflineGenerator(env).plan(q.query, [env.texts[0]], 4, random.Random(0))
    assert [c.query for c in cands if c.origin == "gold"] == ["sky blue"]
