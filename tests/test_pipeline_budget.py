"""Run budgets, deferral and protected context in the reference pipeline (issue 25), on the bundled sample, and
the bench's budget family (points, per-query budgets, the violation check)."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

from branchgate.bench.budget_step import budget_of, check_runs, summarize
from branchgate.bench.sweeps import budget_points
from branchgate.errors import BranchgateError
from branchgate.inference.run_gate import Budget, RunGate
from branchgate.logs_to_dataset.traces import read_events
from branchgate.pipeline import stage_policies
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import simulate


class FakeGate:
    """A Gate stand-in with scores fixed by text (the pipeline's ``Gate.load`` is patched to return it):
    ``scores`` maps a candidate text's first words to p_keep, anything else gets ``default``; ``revisit`` maps
    texts to p_keep when a decision has retained branches at depth 0 (the pipeline's revisit state)."""

    name, tau, path = "gate", 0.5, "fake"

    def __init__(self, default=None, scores=None, revisit=None):
        self.default, self.scores, self.revisit = default, scores or {}, revisit
        self.revisit_calls = 0

    def p_of(self, text: str) -> float:
        for k, v in self.scores.items():
            if text.startswith(k):
                return v
        if self.default is not None:
            return self.default
        return int(hashlib.sha256(text.encode()).hexdigest()[:6], 16) / 0xFFFFFF  # deterministic, spread over [0, 1]

    def predict(self, state, texts):
        if (
            self.revisit is not None
            and state.depth == 0
            and len(state.retained)
            and state.frame_query == state.root_query
            and not state.parent_goal
            and all(t not in state.retained for t in texts)
        ):
            self.revisit_calls += 1
            p = [self.revisit(t) for t in texts]
        else:
            p = [self.p_of(t) for t in texts]
        return np.asarray(p, np.float32), np.asarray(p, np.float32)

    def run(self, budget_nodes=None, budget_tokens=None, defer=False, run_id=None, **options):
        return RunGate(self, Budget(budget_nodes, budget_tokens), defer=defer, run_id=run_id, **options)


@pytest.fixture
def fake_gate(monkeypatch):
    def use(gate):
        monkeypatch.setattr(stage_policies, "_shared_gate", lambda path: gate)
        return gate

    return use


def runs_of(out: Path) -> list[list[dict]]:
    return [[e.model_dump() for e in read_events(p, strict=True)] for p in sorted((out / "traces").glob("*.jsonl"))]


def llm_tokens(evs: list[dict]) -> int:
    return sum(e["in_tokens"] + e["out_tokens"] for e in evs if e["type"] == "llm_call")


@pytest.fixture(scope="module")
def unpruned(tmp_path_factory):
    out = tmp_path_factory.mktemp("none")
    simulate("sample", Config(), out, runs=4, progress=False)
    return {evs[0]["config"]["query_id"]: evs[-1]["totals"] for evs in runs_of(out)}


# -- specs ----------------------------------------------------------------------------------------------
def test_budget_specs_parse_or_fail_clearly():
    g = stage_policies.parse(
        "gate:/x/a,b/controller.onnx,tau=0.3,budget_tokens=30%,defer=1,price_exponent=3", "pre_retrieval"
    )
    assert (g.path, g.tau, g.run_options) == ("/x/a,b/controller.onnx", 0.3, {"price_exponent": 3.0})
    assert g.budget == stage_policies.BudgetSpec(tokens_pct=30.0, defer=True)
    assert stage_policies.parse("dpp:max_items=2,budget_tokens=500", "pre_retrieval").budget.tokens == 500
    assert stage_policies.parse("dpp:budget_tokens=500", "pre_retrieval").max_items is None
    sh = stage_policies.parse("shallow:budget_nodes=5", "pre_retrieval")
    assert sh.nodes == stage_policies.SHALLOW_UNLIMITED and sh.budget.nodes == 5
    assert stage_policies.parse("none:budget_tokens=0", "pre_retrieval").budget.tokens == 0
    assert stage_policies.parse("gate:m.onnx,defer=0", "pre_retrieval").budget is None
    assert stage_policies.parse("mmr", "pre_retrieval").budget is None
    spec = stage_policies.BudgetSpec(nodes_pct=50.0, tokens_pct=33.0)
    assert spec.resolve({"nodes": 11, "tokens": 1000}) == (5, 330)  # nodes: half of the 10 expanded subqueries
    for spec, stage, msg in [
        ("dpp:budget_tokens=x", "pre_retrieval", "integer ≥ 0 .* or P%"),
        ("dpp:budget_tokens=-3", "pre_retrieval", "≥ 0"),
        ("dpp:budget_nodes=1.5", "pre_retrieval", "budget_nodes='1.5'"),
        ("dpp:budget_tokens=abc%", "pre_retrieval", "P% with P a number"),
        ("dpp:budget_tokens=1,budget_tokens=2", "pre_retrieval", "given twice"),
        ("sc:budget_tokens=100", "post_retrieval", "pre-retrieval setting"),
        ("cd:budget_nodes=3", "pre_synthesis", "pre-retrieval setting"),
        ("dpp:budget_tokens=100,defer=1", "pre_retrieval", "dpp has none"),
        ("gate:m.onnx,defer=1", "pre_retrieval", "needs a run budget"),
        ("gate:m.onnx,defer=yes,budget_nodes=2", "pre_retrieval", "defer must be 0 or 1"),
        ("gate:m.onnx,greedy=1,budget_nodes=2", "pre_retrieval", "do not combine"),
        ("gate:m.onnx,price_end=0.9", "pre_retrieval", "run-budget setting"),
        ("gate:m.onnx,budget_nodes=2,price_end=2", "pre_retrieval", r"in \[0, 1\]"),
        ("shallow:", "pre_retrieval", "shallow:NODES"),
    ]:
        with pytest.raises(BranchgateError, match=msg):
            stage_policies.parse(spec, stage)
    with pytest.raises(BranchgateError, match="reference run"):
        stage_policies.BudgetSpec(tokens_pct=20.0).resolve(None, "query q1")


def test_percent_budget_needs_a_reference_and_uses_the_querys_own(tmp_path, unpruned):
    with pytest.raises(BranchgateError, match="budget_reference"):
        simulate("sample", Config(pre="none:budget_tokens=30%"), tmp_path / "a", runs=1, progress=False)
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({q: {"nodes": t["nodes"], "tokens": t["tokens"]} for q, t in unpruned.items()}))
    simulate(
        "sample",
        Config(pre="shallow:budget_tokens=30%", budget_reference=str(ref)),
        tmp_path / "b",
        runs=4,
        progress=False,
    )
    for evs in runs_of(tmp_path / "b"):
        q = evs[0]["config"]["query_id"]
        limit = evs[0]["config"]["budget"]["tokens"]
        assert limit == budget_of(0.3, unpruned[q]["tokens"]) == int(0.3 * unpruned[q]["tokens"])
        assert llm_tokens(evs) == evs[-1]["totals"]["tokens"] <= limit
        assert evs[-1]["totals"]["tokens"] > 0.5 * limit  # the budget is used, not left idle


# -- never exceeded -------------------------------------------------------------------------------------
SPECS = [
    "none:budget_tokens={T}",
    "shallow:budget_tokens={T}",
    "random:0.6,budget_tokens={T}",
    "gate:fake,budget_tokens={T}",
    "gate:fake,budget_tokens={T},defer=1",
    "none:budget_nodes={N}",
    "gate:fake,budget_nodes={N},defer=1",
    "gate:fake,budget_nodes={N},budget_tokens={T}",
]


@pytest.mark.parametrize("seed", range(3))
def test_budget_is_never_exceeded(tmp_path, unpruned, fake_gate, seed):
    fake_gate(FakeGate())
    rng = random.Random(seed)
    top = max(t["tokens"] for t in unpruned.values())
    checked = 0
    for k, spec in enumerate(SPECS):
        T, N = rng.randint(0, int(0.7 * top)), rng.randint(0, 12)
        synth = rng.choice(["none", "random:0.5"])
        out = tmp_path / str(k)
        simulate(
            "sample",
            Config(pre=spec.format(T=T, N=N), synth=synth, seed=seed, depth=rng.choice([2, 3])),
            out,
            runs=4,
            progress=False,
        )
        for evs in runs_of(out):
            totals = evs[-1]["totals"]
            assert llm_tokens(evs) == totals["tokens"]
            if "budget_tokens" in spec:
                assert totals["tokens"] <= T, (spec, T, totals["tokens"])
            if "budget_nodes" in spec:
                assert totals["n_expanded"] <= N, (spec, N, totals["n_expanded"])
                assert sum(e["type"] == "retrieval" for e in evs) == totals["n_expanded"]
            b = totals["budget"]
            assert b["tokens"] == (T if "budget_tokens" in spec else None)
            decisions = [e for e in evs if e["type"] == "decision"]
            assert all("spent" in e and "remaining" in e for e in decisions)
            for e in decisions:  # what each decision records: spent and remaining as the pipeline counts them
                assert e["spent"]["tokens"] <= totals["tokens"]
                left = e["remaining"]
                assert left["tokens"] is None or 0 <= left["tokens"] <= T
            checked += 1
    assert checked == 4 * len(SPECS)


def test_exhausted_budget(tmp_path, fake_gate):
    fake_gate(FakeGate())
    simulate("sample", Config(pre="gate:fake,budget_tokens=0"), tmp_path / "zero", runs=2, progress=False)
    for evs in runs_of(tmp_path / "zero"):  # nothing affordable, not even the plan: no call at all
        totals = evs[-1]["totals"]
        assert totals["tokens"] == 0 and totals["n_expanded"] == 0 and totals["budget"]["exhausted"]
        assert not [e for e in evs if e["type"] in ("llm_call", "frame_open")]
        assert [e["source_type"] for e in evs if e["type"] == "raw"] == ["budget:exhausted"]
        assert next(e for e in evs if e["type"] == "report")["text"] == ""
        assert evs[-1]["status"] == "ok"
    # enough for the plan and the synthesis of the plan's context, not for one expansion: the root frame is
    # opened, every candidate is dropped by the budget, the run still ends with a report
    simulate("sample", Config(pre="none:budget_tokens=1300"), tmp_path / "plan", runs=2, progress=False)
    for evs in runs_of(tmp_path / "plan"):
        totals = evs[-1]["totals"]
        plan = next(e for e in evs if e["type"] == "llm_call" and e["purpose"] == "plan")
        if plan["in_tokens"] + plan["out_tokens"] > 1200:
            continue
        decisions = [e for e in evs if e["type"] == "decision"]
        assert decisions and all(e["action"] == "prune" and e["actor"] == "budget" for e in decisions)
        assert totals["budget"]["exhausted"] and totals["n_expanded"] == 0 and totals["tokens"] <= 1300
        assert [e["purpose"] for e in evs if e["type"] == "llm_call"] == ["plan", "synthesis"]
        raw = [e for e in evs if e["type"] == "raw"]
        assert len(raw) == 1 and raw[0]["source_type"] == "budget:exhausted" and raw[0]["seq"] < decisions[0]["seq"]


def test_gate_without_budget_is_unchanged_and_budget_hook_runs_per_run(tmp_path, fake_gate):
    gate = fake_gate(FakeGate())
    p = stage_policies.parse("gate:fake,budget_nodes=3", "pre_retrieval")
    a, b = p.start_run("r1", 3, None), p.start_run("r2", 3, None)
    assert a is not b and a.run_id == "r1" and a.budget.nodes == 3 and a.gate is gate
    assert stage_policies.parse("gate:fake", "pre_retrieval").start_run("r3") is None
    simulate("sample", Config(pre="gate:fake,budget_nodes=4"), tmp_path / "n", runs=3, progress=False)
    for evs in runs_of(tmp_path / "n"):  # a fresh budget every run (the policy object is shared)
        assert evs[-1]["totals"]["n_expanded"] <= 4 and evs[0]["config"]["budget"]["nodes"] == 4


# -- deferral -------------------------------------------------------------------------------------------
def test_deferral_expands_the_best_deferred_candidate(tmp_path, fake_gate):
    from branchgate.pipeline import env as envmod

    env = envmod.load("sample")
    q = env.queries[0]
    # the root frame's candidates in order (the offline generator is deterministic): learn their texts first
    simulate("sample", Config(depth=2), tmp_path / "probe", runs=1, progress=False)
    evs = runs_of(tmp_path / "probe")[0]
    root = [e for e in evs if e["type"] == "candidate" and e["frame_id"] == "f0"]
    from branchgate.texts import candidate_text

    texts = [candidate_text(e["query"], e["goal"]) for e in root]
    # c0 admitted at once, c1..c3 in the deferral band below the price (τ 0.5, margin 0.15), the rest pruned;
    # below the root every candidate scores low (a fallback keeps one per frame)
    scores = {texts[0]: 0.9, texts[1]: 0.45, texts[2]: 0.42, texts[3]: 0.40}
    best = texts[2]  # re-scored at the end against the context then, c2 is the best deferred one
    gate = FakeGate(
        default=0.05, scores=scores, revisit=lambda t: 0.95 if t == best else (0.6 if t == texts[1] else 0.0)
    )
    fake_gate(gate)
    simulate(
        "sample",
        Config(depth=2, pre="gate:fake,budget_tokens=100000,defer=1,revisit_floor=0.5"),
        tmp_path / "d",
        runs=1,
        progress=False,
    )
    evs = runs_of(tmp_path / "d")[0]
    assert evs[0]["config"]["query_id"] == q.id
    dec = [e for e in evs if e["type"] == "decision"]
    first: dict[str, dict] = {}
    for e in dec:
        if e["candidate_id"].startswith("f0.c"):
            first.setdefault(e["candidate_id"], e)
    assert first["f0.c0"]["action"] == "expand"
    assert {c for c, e in first.items() if e["action"] == "defer"} == {"f0.c1", "f0.c2", "f0.c3"}
    later = [e for e in dec if e.get("deferred_from") is not None]
    assert gate.revisit_calls >= 1
    expands = [e for e in later if e["action"] == "expand"]
    # the best re-scored candidate first, then the next above the floor; the one below it is closed as a prune
    assert [e["candidate_id"] for e in expands] == ["f0.c2", "f0.c1"]
    for e in later:
        assert e["deferred_from"] == first[e["candidate_id"]]["seq"]  # names the decision that deferred it
    closing = [e for e in later if e["action"] == "prune"]
    assert [e["candidate_id"] for e in closing] == ["f0.c3"] and closing[0]["actor"] == "controller:gate"
    # the revisited candidates are really expanded (retrieval after the revisit decision), as leaves
    ret = {e["candidate_id"]: e["seq"] for e in evs if e["type"] == "retrieval"}
    assert ret["f0.c2"] > expands[0]["seq"] and ret["f0.c1"] > expands[1]["seq"]
    assert not [e for e in evs if e["type"] == "frame_open" and e["frame_id"] in ("f0.1", "f0.2")]
    totals = evs[-1]["totals"]
    assert totals["budget"]["deferred"] == 3 and totals["budget"]["revisited"] == 2
    # dataset build reads the deferral as written: deferred then expanded (2), deferred and never expanded (1)
    from branchgate.logs_to_dataset.decision_points import run_decisions

    rd = run_decisions(evs[0]["run_id"], list(read_events(next((tmp_path / "d" / "traces").glob("*.jsonl")))))
    assert not rd.problems
    assert rd.deferral == {"deferred": 3, "deferred_expanded": 2, "deferred_never_expanded": 1, "dropped_by_budget": 0}
    assert totals["n_pruned_pre"] == totals["n_candidates"] - totals["n_expanded"]


def test_deferred_candidates_without_budget_left_are_closed_by_the_budget(tmp_path, fake_gate):
    fake_gate(FakeGate(default=0.45, revisit=lambda t: 0.99))  # everything in the band: deferred but a fallback
    simulate("sample", Config(depth=2, pre="gate:fake,budget_nodes=1,defer=1"), tmp_path / "d", runs=2, progress=False)
    for evs in runs_of(tmp_path / "d"):
        dec = [e for e in evs if e["type"] == "decision"]
        closing = [e for e in dec if e.get("deferred_from") is not None]
        assert evs[-1]["totals"]["n_expanded"] == 1
        assert closing and all(e["action"] == "prune" and e["actor"] == "budget" for e in closing)


# -- protected context ----------------------------------------------------------------------------------
def test_protected_items_survive_pruning(tmp_path):
    # post-retrieval pruning drops every new passage, pre-synthesis keeps one at random: without protection the
    # plan search's passages are not in the context at all; with protect=plan they are C_0 and all survive
    cfg = dict(depth=2, post="random:0.0", synth="random:0.0")
    simulate("sample", Config(**cfg, protect="plan"), tmp_path / "p", runs=3, progress=False)
    simulate(
        "sample", Config(**cfg, pre="none:budget_tokens=6000", protect="plan"), tmp_path / "pb", runs=3, progress=False
    )
    for out in ("p", "pb"):
        for evs in runs_of(tmp_path / out):
            prot = [e["evidence_id"] for e in evs if e["type"] == "evidence" and e.get("protected")]
            assert prot
            pruned = {i for e in evs if e["type"] == "prune" for i in e["item_ids"]}
            assert not pruned & set(prot)
            report = next(e for e in evs if e["type"] == "report")
            assert set(prot) <= set(report["evidence_ids"])
            assert evs[-1]["totals"]["n_protected"] == len(prot)
            assert any(e["type"] == "prune" and e["stage"] == "post_retrieval" for e in evs)  # pruning did happen
    with pytest.raises(BranchgateError, match="protect"):
        simulate("sample", Config(protect="everything"), tmp_path / "x", runs=1, progress=False)


# -- the bench's budget family --------------------------------------------------------------------------
def test_bench_budget_points_and_violation_check(tmp_path, unpruned, fake_gate):
    fake_gate(FakeGate())
    pts = budget_points(
        {"budget_fractions": [0.2, 0.4], "budget_baselines": ["shallow"], "budget_gate": {"price_exponent": 3}}, "fake"
    )
    assert [p.name for p in pts] == [
        "gate@budget=0.2",
        "gate+defer@budget=0.2",
        "shallow@budget=0.2",
        "gate@budget=0.4",
        "gate+defer@budget=0.4",
        "shallow@budget=0.4",
    ]
    assert pts[1].spec == "gate:fake,budget_tokens=20%,price_exponent=3,defer=1"
    for p in pts:
        stage_policies.parse(p.pre, "pre_retrieval")
    with pytest.raises(BranchgateError, match="budget baseline"):
        budget_points({"budget_fractions": [0.2], "budget_baselines": ["nope"]}, "fake")
    with pytest.raises(BranchgateError, match=r"\(0, 1\]"):
        budget_points({"budget_fractions": [1.5]}, "fake")
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({q: {"nodes": t["nodes"], "tokens": t["tokens"]} for q, t in unpruned.items()}))
    reference = json.loads(ref.read_text())
    runs, checks = {}, {}
    for p in pts:
        out = tmp_path / p.name
        simulate("sample", Config(pre=p.pre, budget_reference=str(ref)), out, runs=4, progress=False)
        checks[p.name] = check_runs(out, p.budget, reference)
        runs[p.name] = {evs[0]["config"]["query_id"]: evs[-1]["totals"] for evs in runs_of(out)}
        assert len(checks[p.name]) == 4 and not any(r["over"] or r["mismatch"] for r in checks[p.name])
    s = summarize(pts, runs, checks, boot=50)
    assert s["violations"] == 0 and s["checked_runs"] == 24 and s["queries"] == 4
    assert set(s["vs"]) == {"0.2", "0.4"} and set(s["vs"]["0.2"]) == {
        "gate vs shallow",
        "gate+defer vs shallow",
        "gate+defer vs gate",
    }
    assert all(0 < p["budget_share"]["mean"] <= 1 for p in s["policies"].values())
    # a run over its budget is counted (tokens from its llm_call events, not its totals)
    checks["shallow@budget=0.2"][0]["over"] = 5
    assert summarize(pts, runs, checks, boot=10)["violations"] == 1
    from branchgate.bench.report import budget_findings, budget_table

    assert any("Runs over their budget: **0**" in line for line in budget_table(s))
    assert budget_findings(s)[0].startswith("Budgets: no run exceeded its budget")
