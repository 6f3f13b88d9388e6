"""Label sources (``dataset build --labels``): keypoints, returns (descendants' key points), citations, teacher
with the rate rule, judge's entry; runs lacking what a source needs are counted and excluded; the reference
pipeline's and GPT-Researcher's report citations."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from branchgate.errors import InputError
from branchgate.logs_to_dataset.build import build
from branchgate.logs_to_dataset.label_sources import make, rate_threshold
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.logs_to_dataset.traces import ReadReport, TraceWriter
from branchgate.models.teachers import get

FIX = Path(__file__).parent / "fixtures"


def _frame(out):
    import pandas as pd
    from datasets import load_from_disk

    ds = load_from_disk(str(out))
    return pd.concat([ds[s].to_pandas().assign(split=s) for s in ds], ignore_index=True)


def test_rate_threshold_leaves_both_classes_and_follows_direction():
    u = [0.0] * 17 + [0.001, 0.002, 0.01]
    thr, rate = rate_threshold(u, 0.1)
    assert thr == 0.002 and rate == 0.1  # 2 of 20 at or above
    thr, rate = rate_threshold([0.0] * 19 + [0.003], 0.3)  # ties: the only split leaving both classes
    assert thr == 0.003 and rate == 0.05
    thr, rate = rate_threshold([1.0, 2.0, 3.0, 4.0], 0.25, higher_is_better=False)
    assert thr == 1.0 and rate == 0.25  # lower is better: positive = g <= t
    assert rate_threshold([0.5, 0.5], 0.1) == (0.5, 1.0)  # one level: all positive (the build warns)
    assert rate_threshold([float("nan")], 0.1) is None


def test_rate_rule_gives_every_depth_at_least_the_rate():
    """A teacher's gains shrink with depth: one threshold would label only the root positive; the per-depth
    floor keeps the global threshold where it already passes the rate and lowers it where it does not."""
    from branchgate.logs_to_dataset.labels import MIN_DEPTH_ROWS, LabelRecords, RowBuilder

    rng = np.random.default_rng(0)
    records = LabelRecords(("train", "test"))

    def rows(depth, lo, hi, n):
        return [
            {
                "utility": float(u),
                "utility_kind": "teacher:sc",
                "label_source": "realized",
                "expanded": True,
                "depth": depth,
                "label": None,
            }
            for u in rng.uniform(lo, hi, n)
        ]

    records.add(
        "train",
        rows(0, 0.5, 1.0, 100)
        + rows(1, 0.0, 0.01, 400)
        + rows(2, 0.0, 0.001, 400)
        + rows(5, 0.0, 1e-4, MIN_DEPTH_ROWS - 1),
    )
    records.add("test", rows(1, 0.0, 0.01, 200) + rows(3, 0.0, 0.001, 200))
    builder = RowBuilder({}, "sc", labels="teacher:sc")
    builder.kinds = {"teacher:sc": builder.source}
    fit = builder.finalize(records)["teacher:sc"]
    depth, label = records.depth("train"), records.label("train")
    assert label[depth == 0].mean() > 0.9  # the global threshold passes the rate at the root: kept
    for d in (1, 2):
        assert abs(label[depth == d].mean() - 0.1) < 0.02, d  # lowered to the rate
    assert set(fit["depth_thresholds"]) == {"0", "1", "2"}  # depth 5: too few rows for its own threshold
    assert (
        fit["depth_thresholds"]["0"] == fit["threshold"] > fit["depth_thresholds"]["1"] > fit["depth_thresholds"]["2"]
    )
    assert label[depth == 5].mean() == 0  # below depth 2's threshold, which it takes
    tdepth, tlabel = records.depth("test"), records.label("test")
    assert (
        0.03 < tlabel[tdepth == 1].mean() < 0.2 and 0.03 < tlabel[tdepth == 3].mean() < 0.2
    )  # depth 3 takes depth 2's
    assert fit["rule"].endswith("at least that rate at each depth")


def test_make_parses_specs_and_judge_needs_options():
    sc = get("sc")
    assert make("keypoints", "sc", sc).kind == "keypoints" and make("citations", "sc", sc).kind == "citations"
    assert make("teacher:dpp", "sc", sc).kind == "teacher:dpp" and make("teacher", "sc", sc).kind == "teacher:sc"
    for bad in ("nope", "keypoints:x", "teacher:nope"):
        with pytest.raises(InputError):
            make(bad, "sc", sc)
    with pytest.raises(InputError, match="--labels judge needs --llm-url/--llm-model"):
        make("judge", "sc", sc, {"llm_url": "http://127.0.0.1:9"})


def test_returns_add_discounted_key_points_of_expanded_descendants(tmp_path):
    """f0: c0 finds a, c1 finds nothing but its follow-ups do (f1: c3 finds b and c, c4 finds a again; f2 under
    c3: c5 finds d), c2 finds nothing. returns:γ = own key points + γ × the next level's first finds + γ² × ..."""
    from branchgate.logs_to_dataset.decision_points import run_decisions

    with TraceWriter(tmp_path / "t.jsonl") as w:
        W = lambda type_, **f: w.write(type=type_, run_id="r", **f)  # noqa: E731
        W("run_start", root_query="why do bees collapse")
        W("frame_open", frame_id="f0", frame_query="why do bees collapse")
        for eid, kps in (("e0", ["a"]), ("e1", []), ("e2", []), ("e3", ["b", "c"]), ("e4", ["a"]), ("e5", ["d"])):
            W("evidence", evidence_id=eid, text=f"passage {eid}", tokens=3, labels=kps)
        for k in range(3):
            W("candidate", frame_id="f0", candidate_id=f"c{k}", order=k, query=f"q{k}")
            W("retrieval", candidate_id=f"c{k}", query=f"q{k}", evidence_ids=[f"e{k}"])
        W("frame_open", frame_id="f1", depth=1, frame_query="q1", parent_frame="f0", parent_candidate="c1")
        for k in (3, 4):
            W("candidate", frame_id="f1", candidate_id=f"c{k}", order=k - 3, query=f"q{k}")
            W("retrieval", candidate_id=f"c{k}", query=f"q{k}", evidence_ids=[f"e{k}"])
        W("frame_open", frame_id="f2", depth=2, frame_query="q3", parent_frame="f1", parent_candidate="c3")
        W("candidate", frame_id="f2", candidate_id="c5", order=0, query="q5")
        W("retrieval", candidate_id="c5", query="q5", evidence_ids=["e5"])
        W("run_end")
    run = next(iter(read_runs([tmp_path / "t.jsonl"])))
    rd = run_decisions(run.run_id, run.events)
    assert [f.parent_candidate for f in rd.frames] == [None, "c1", "c3"]
    sc = get("sc")
    own = make("keypoints", "sc", sc).utilities(rd, None, None)
    half = make("returns", "sc", sc)
    assert half.kind == "returns:0.5" and make("returns:0", "sc", sc).kind == "keypoints"
    ret, full = half.utilities(rd, None, None), make("returns:1", "sc", sc).utilities(rd, None, None)
    assert own == {"c0": 1, "c1": 0, "c2": 0, "c3": 2, "c4": 0, "c5": 1}  # f1's context already covers a
    # c1: b, c, a (its own context lacks a: c0 is a sibling, measured against the same C_t) one level down, d two
    assert ret == {"c0": 1, "c1": 0.5 * 3 + 0.25 * 1, "c2": 0, "c3": 2 + 0.5, "c4": 0, "c5": 1}
    assert full["c1"] == 4 and full["c3"] == 3
    for bad in ("returns:2", "returns:x", "returns:-0.1"):
        with pytest.raises(InputError, match="returns:DISCOUNT"):
            make(bad, "sc", sc)


def _write_cited_runs(path: Path) -> None:
    """r-cited: f0 with c0 (brings e1, e2), c1 (brings e3), c2 pruned; f1 with c3 (e1 again + e4); report cites e1,
    e4. r-nocite: a report without cited_ids. r-noreport: no report at all."""
    with TraceWriter(path) as w:
        for run in ("r-cited", "r-nocite", "r-noreport"):
            W = lambda type_, run=run, **f: w.write(type=type_, run_id=run, **f)  # noqa: E731
            W("run_start", root_query="why do bees collapse")
            W("frame_open", frame_id="f0", frame_query="why do bees collapse")
            for k, q in enumerate(("varroa mites", "pesticides", "phones")):
                W("candidate", frame_id="f0", candidate_id=f"c{k}", order=k, query=q)
                W("decision", candidate_id=f"c{k}", action="prune" if k == 2 else "expand")
            for eid in ("e1", "e2", "e3", "e4"):
                W("evidence", evidence_id=eid, text=f"passage {eid} about bees and mites", tokens=6)
            W("retrieval", candidate_id="c0", query="varroa mites", evidence_ids=["e1", "e2"])
            W("retrieval", candidate_id="c1", query="pesticides", evidence_ids=["e3"])
            W("frame_open", frame_id="f1", depth=1, frame_query="varroa mites")
            W("candidate", frame_id="f1", candidate_id="c3", order=0, query="varroa viruses")
            W("retrieval", candidate_id="c3", query="varroa viruses", evidence_ids=["e1", "e4"])
            if run == "r-cited":
                W("report", text="Mites spread viruses.", evidence_ids=["e1", "e2", "e3", "e4"], cited_ids=["e1", "e4"])
            elif run == "r-nocite":
                W("report", text="Mites spread viruses.", evidence_ids=["e1", "e2", "e3", "e4"])
            W("run_end")


def test_citations_source_counts_cited_new_evidence_and_excludes_runs_without_citations(tmp_path, encoder):
    _write_cited_runs(tmp_path / "t.jsonl")
    m = build(
        [tmp_path / "t.jsonl"],
        tmp_path / "o",
        encoder_obj=encoder,
        cache=tmp_path / "c.sqlite",
        progress=False,
        labels="citations",
    )
    df = _frame(tmp_path / "o").set_index(["run_id", "candidate_id"])
    assert (df.utility_kind == "citations").all()
    cited = df.loc["r-cited"]
    assert list(cited.loc[["c0", "c1", "c3"], "utility"]) == [1.0, 0.0, 1.0]  # c3: e1 was already in C_t, e4 new
    assert list(cited.loc[["c0", "c1", "c3"], "label"]) == [1, 0, 1]
    assert cited.loc["c2", "label"] == -1 and np.isnan(cited.loc["c2", "utility"])
    for run in ("r-nocite", "r-noreport"):
        assert (df.loc[run].label == -1).all() and (df.loc[run].label_source == "excluded").all()
        assert df.loc[run].utility.isna().all()
    assert m["label_missing"] == {
        "citations": {"runs": 2, "reasons": {"no report event": 1, "the report records no citations (cited_ids)": 1}}
    }
    assert m["label_kind"] == "citations" and m["label_threshold"] == 1.0
    assert any("2 run(s) have nothing for --labels citations" in w for w in m["warnings"])


def test_keypoints_source_excludes_runs_without_key_points(tmp_path, encoder):
    m = build(
        [FIX / "searcho1_kp"],
        tmp_path / "o",
        encoder_obj=encoder,
        cache=tmp_path / "c.sqlite",
        progress=False,
        labels="keypoints",
    )
    df = _frame(tmp_path / "o")
    assert list(df[df.run_id == "9100001"].label.sort_values()) == [0, 1, 1]
    other = df[df.run_id == "9100002"]
    assert len(other) and (other.label == -1).all() and (other.utility_kind == "keypoints").all()
    assert m["label_missing"] == {"keypoints": {"runs": 1, "reasons": {"no evidence carries key-point labels": 1}}}
    # the same traces labelled by a teacher: nothing is missing, and the key-point run is labelled too
    m2 = build(
        [FIX / "searcho1_kp"],
        tmp_path / "o2",
        encoder_obj=encoder,
        cache=tmp_path / "c.sqlite",
        progress=False,
        labels="teacher:dpp",
    )
    df2 = _frame(tmp_path / "o2")
    assert m2["label_missing"] == {} and set(df2.utility_kind) == {"teacher:dpp"} and m2["teacher"] == "dpp"
    assert (df2[df2.run_id == "9100001"].label_source == "realized").all()


@pytest.fixture(scope="module")
def sample_runs(tmp_path_factory):
    from branchgate.pipeline.config import Config
    from branchgate.pipeline.simulate import simulate

    out = tmp_path_factory.mktemp("sim")
    simulate("sample", Config(depth=2), out, runs=4, progress=False)
    return out


def test_reference_report_cites_the_passages_its_sentences_come_from(sample_runs):
    n_runs = 0
    for run in read_runs([sample_runs]):
        ev = {e.evidence_id: e.text for e in run.events if e.type == "evidence"}
        (report,) = [e for e in run.events if e.type == "report"]
        final = report.evidence_ids
        assert report.cited_ids and set(report.cited_ids) <= set(final) and len(report.cited_ids) < len(final)
        assert report.text == " ".join(s.text for s in report.sentences)
        norm = lambda t: " ".join(t.split()).lower()  # noqa: E731
        for s in report.sentences:  # each sentence is taken from every passage it cites
            assert s.evidence_ids and all(norm(s.text) in norm(ev[i]) for i in s.evidence_ids)
        for i in report.cited_ids:  # and every cited passage contributes a sentence
            assert any(i in s.evidence_ids for s in report.sentences)
        uncited = set(final) - set(report.cited_ids)
        assert not any(norm(s.text) in norm(ev[i]) for s in report.sentences for i in uncited)
        n_runs += 1
    assert n_runs == 4


def test_sample_runs_under_every_offline_source(sample_runs, tmp_path, encoder):
    cache = tmp_path / "c.sqlite"
    rates = {}
    for spec in ("keypoints", "citations", "teacher:sc"):
        m = build(
            [sample_runs],
            tmp_path / spec.replace(":", "_"),
            encoder_obj=encoder,
            cache=cache,
            progress=False,
            labels=spec,
        )
        assert m["label_missing"] == {} and m["label_kind"] == spec
        df = _frame(tmp_path / spec.replace(":", "_"))
        realized = df[df.label_source == "realized"]
        assert len(realized) and set(realized.label) == {0, 1}, spec
        rates[spec] = m["positive_rate"][spec]["train"]
    # teacher:sc's default threshold comes from the train utilities: near the target rate (ties allowed)
    assert abs(rates["teacher:sc"] - 0.1) < 0.1
    fixed = build(
        [sample_runs],
        tmp_path / "fixed",
        encoder_obj=encoder,
        cache=cache,
        progress=False,
        labels="teacher:sc",
        label_threshold=0.05,
    )
    assert fixed["label_threshold_rule"] == "--label-threshold" and fixed["label_threshold"] == 0.05


def test_returns_on_simulated_runs_add_to_branches_with_follow_ups_only(sample_runs):
    """On the reference pipeline's unpruned runs: returns ≥ own key points everywhere, equal where a branch has
    no follow-up frame, larger for some branch that has one."""
    from branchgate.logs_to_dataset.decision_points import run_decisions

    sc = get("sc")
    own_src, ret_src = make("keypoints", "sc", sc), make("returns", "sc", sc)
    grew = 0
    for run in read_runs([sample_runs]):
        rd = run_decisions(run.run_id, run.events)
        parents = {f.parent_candidate for f in rd.frames}
        own, ret = own_src.utilities(rd, None, None), ret_src.utilities(rd, None, None)
        assert own.keys() == ret.keys() and own
        for c, g in own.items():
            assert ret[c] >= g
            if c not in parents:
                assert ret[c] == g
        grew += sum(ret[c] > own[c] for c in own)
    assert grew > 0


def test_gptr_report_citations_map_to_source_evidence():
    report = ReadReport()
    (run,) = read_runs([FIX / "gptr_cited"], report=report)
    (rep,) = [e for e in run.events if e.type == "report"]
    ev = {e.evidence_id for e in run.events if e.type == "evidence"}
    a, b = "https://www.example-bees.org/varroa", "https://journals.example.com/neonic-2023/"
    assert rep.cited_sources == [a, "https://journals.example.com/neonic-2023", "https://blog.example.org/phones"]
    assert rep.cited_ids == [a, b] and set(rep.cited_ids) <= ev  # trailing slash normalised; the blog is no source
    assert "https://www.example-bees.org/forage" in ev  # from content.sources
    w = report.warnings
    assert w["gptr: cited URL that no log names as a source (not mapped)"] == 1
    assert w["gptr: cited source not tied to a branch (sources are not linked to subqueries)"] == 2
    # the standard fixture's report cites by number only: nothing is mapped, and that is counted
    report2 = ReadReport()
    runs = {r.run_id: r for r in read_runs([FIX / "gptr"], report=report2)}
    (rep2,) = [e for e in runs["task_1740910503_5b1e0c9f2a"].events if e.type == "report"]
    assert rep2.cited_ids is None and rep2.cited_sources == []
    assert report2.warnings["gptr: report cites by number ([n]) without URLs (citations not mapped)"] == 1
    assert re.search(r"\[1\]", rep2.text)


class _Skill:
    """The smallest DeepResearchSkill shape: one frame of three queries, each finding one page of its own."""

    def __init__(self):
        self.researcher = type("R", (), {"query": "Why are honeybee colonies collapsing?"})()
        self.breadth, self.depth = 3, 1

    async def generate_search_queries(self, query, num_queries=3):
        return [{"query": f"q{i}", "researchGoal": f"goal {i}"} for i in range(num_queries)]

    async def process_research_results(self, query, context, num_learnings=3):
        return {"learnings": [f"learned {query}"], "followUpQuestions": []}

    async def deep_research(self, query, breadth, depth, **kw):
        for q in await self.generate_search_queries(query, breadth):
            ctx = [{"Content": f"page found by {q['query']}", "url": f"https://example.org/{q['query']}"}]
            await self.process_research_results(query=q["query"], context=ctx)
        return {"learnings": []}

    async def run(self, on_progress=None):
        await self.deep_research("root", self.breadth, self.depth)
        return "context"


def test_gpt_researcher_hook_records_report_citations_that_label_branches(tmp_path, encoder):
    import asyncio

    from branchgate.inference.agents.gpt_researcher import gate_research

    skill = _Skill()
    hook = gate_research(skill, None, tmp_path / "t.jsonl", run_id="hooked")
    asyncio.run(skill.run())
    ids = hook.record_report("Mites matter ([study](https://example.org/q1/)). See https://elsewhere.example/x.")
    hook.close()
    (run,) = read_runs([tmp_path / "t.jsonl"])
    ev = {e.evidence_id: e for e in run.events if e.type == "evidence"}
    (rep,) = [e for e in run.events if e.type == "report"]
    assert rep.cited_ids == ids and len(ids) == 1 and ev[ids[0]].source == "https://example.org/q1"
    assert rep.cited_sources == ["https://example.org/q1/", "https://elsewhere.example/x"]
    assert hook.counts["cited_unmapped"] == 1
    build(
        [tmp_path / "t.jsonl"],
        tmp_path / "o",
        encoder_obj=encoder,
        cache=tmp_path / "c.sqlite",
        progress=False,
        labels="citations",
    )
    df = _frame(tmp_path / "o").set_index("query")
    assert list(df.loc[["q0", "q1", "q2"], "label"]) == [0, 1, 0]
