"""Run budgets and deferral (issue 25): inference/run_gate.py with a real small Gate, the CLI's run_id, the
adapters, traces with defer/budget events through `dataset build`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from export_support import exported

from branchgate.errors import BranchgateError, InputError
from branchgate.export.samples import sample_decisions
from branchgate.inference.gate import Gate
from branchgate.inference.run_gate import Budget, BudgetExceeded, Deferred, RunGate

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402 (after the importorskip above)


@pytest.fixture(scope="module")
def model(encoder) -> str:
    return exported(encoder)["files"]["fp32"]


@pytest.fixture(scope="module")
def gate(model) -> Gate:
    return Gate.load(model, threads=1)


DECISIONS = sample_decisions()


class Shifted:
    """The real Gate's scores squeezed into [lo, hi] (the test controller's p_keep is nearly 0 or 1), so the
    admission price and the deferral band have candidates on both sides. Order and ĝ are the Gate's own."""

    def __init__(self, gate, lo=0.3, hi=0.8):
        self.gate, self.lo, self.hi, self.tau, self.name, self.path = gate, lo, hi, 0.5, "gate", gate.path

    def predict(self, state, texts):
        p, u = self.gate.predict(state, texts)
        return (self.lo + (self.hi - self.lo) * p).astype(np.float32), u


# -- Budget ---------------------------------------------------------------------------------------------
def test_budget_charges_and_refuses():
    b = Budget(nodes=2, tokens=100)
    assert b.remaining() == {"nodes": 2, "tokens": 100} and not b.exhausted and b.can_afford(1, 100)
    b.charge(nodes=1, tokens=60)
    assert b.spent_nodes == 1 and b.spent_tokens == 60 and not b.can_afford(1, 41)
    with pytest.raises(BudgetExceeded):
        b.charge(tokens=41)
    assert b.spent_tokens == 60  # nothing charged by a refused charge
    assert isinstance(BudgetExceeded("x"), BranchgateError)
    b.charge(nodes=1)
    assert b.exhausted and b.remaining()["nodes"] == 0
    assert Budget.from_json(json.loads(json.dumps(b.to_json()))).to_json() == b.to_json()
    assert not Budget().exhausted and Budget().can_afford(10**9, 10**9)
    for bad in (-1, 1.5, "3", True, float("nan")):
        with pytest.raises(InputError, match="budget_nodes"):
            Budget(nodes=bad)


def test_reservations_settle_to_actual_spend():
    b = Budget(tokens=100)
    b.reserve(70)
    assert b.remaining()["tokens"] == 30
    b.settle(70, 20)
    assert b.spent_tokens == 20 and b.reserved_tokens == 0 and b.remaining()["tokens"] == 80 and b.overspent == 0
    b.reserve(80)
    b.settle(80, 120)  # the caller's estimate was wrong: recorded as it happened, never hidden
    assert b.spent_tokens == 140 and b.overspent == 40 and b.exhausted


# -- RunGate.select ---------------------------------------------------------------------------------------
def test_unbudgeted_run_gates_like_the_gate(gate):
    run = gate.run()
    for state, cands in DECISIONS:
        a, b = gate.select(state, cands), run.select(state, cands)
        assert a.kept == b.kept and a.fallback == b.fallback
        assert b.deferred == [] and b.dropped_by_budget == [] and not b.exhausted
    assert "budget" not in gate.select(*DECISIONS[0]).to_json()


def test_node_budget_is_never_exceeded_and_exhaustion_is_plain(gate):
    run = gate.run(budget_nodes=7)
    total = 0
    for state, cands in DECISIONS * 2:
        sel = run.select(state, cands)
        total += len(sel.kept)
        assert total <= 7 and run.budget.spent_nodes == total
        if not sel.exhausted:
            assert sel.kept, "never an empty selection while budget remains"
    assert total == 7 and run.exhausted
    sel = run.select(*DECISIONS[0])
    assert sel.kept == [] and sel.exhausted and sel.dropped_by_budget == list(range(len(DECISIONS[0][1])))
    out = sel.to_json()
    assert out["exhausted"] is True and out["budget"]["remaining"]["nodes"] == 0 and out["kept"] == []


def test_price_rises_as_the_budget_is_spent(gate):
    run = RunGate(Shifted(gate), Budget(nodes=10), price_start=0.4, price_end=1.0, price_exponent=1.0)
    assert run.price() == pytest.approx(0.4)
    run.budget.charge(nodes=5)
    assert run.price() == pytest.approx(0.7)
    run.budget.charge(nodes=5)
    assert run.price() == pytest.approx(1.0)


def test_one_decision_cannot_take_a_share_beyond_max_share(gate):
    run = gate.run(budget_nodes=10, max_share=0.3)
    sel = run.select(*DECISIONS[0])
    assert len(sel.kept) == 3 and len(sel.dropped_by_budget) >= 1


def test_token_budget_fits_costs_and_spend_settles(gate):
    run = gate.run(budget_tokens=1000)
    state, cands = DECISIONS[0]
    costs = [400] * len(cands)
    sel = run.select(state, cands, costs=costs)
    assert len(sel.kept) == 2 and run.budget.reserved_tokens == 800 and sel.dropped_by_budget
    run.spend(100)
    run.spend(150)
    assert run.budget.spent_tokens == 250 and run.budget.reserved_tokens == 0 and run.max_spend == 150
    sel = run.select(state, cands)  # default cost estimate: the running max of reported spends (150)
    assert run.estimate() == 150 and 1 <= len(sel.kept) <= 5
    assert run.budget.spent_tokens + run.budget.reserved_tokens <= 1000


def test_cost_aware_ranking_prefers_cheap_candidates(gate):
    run = RunGate(Shifted(gate, 0.6, 0.6), Budget(nodes=100), max_keep=1)
    state, cands = DECISIONS[0]
    costs = [1000] * len(cands)
    costs[3] = 10
    assert run.select(state, cands, costs=costs).kept == [3]


@given(st.data())
def test_budget_never_exceeded_over_random_decision_sequences(gate, data):
    nodes = data.draw(st.one_of(st.none(), st.integers(0, 12)), "nodes")
    tokens = data.draw(st.one_of(st.none(), st.integers(0, 3000)), "tokens")
    defer = data.draw(st.booleans(), "defer")
    lo = data.draw(st.floats(0.0, 0.6), "lo")
    run = RunGate(
        Shifted(gate, lo, lo + 0.4),
        Budget(nodes, tokens),
        defer=defer,
        price_exponent=data.draw(st.floats(0.2, 4.0), "exponent"),
        tokens_per_node=data.draw(st.integers(1, 800), "prior"),
        max_share=data.draw(st.one_of(st.none(), st.floats(0.05, 1.0)), "share"),
    )
    spent_nodes = 0
    for _ in range(data.draw(st.integers(1, 8), "steps")):
        state, cands = DECISIONS[data.draw(st.integers(0, len(DECISIONS) - 1))]
        pick = data.draw(st.lists(st.integers(0, len(cands) - 1), min_size=0, max_size=len(cands), unique=True))
        cands = [cands[i] for i in pick]
        costs = data.draw(st.one_of(st.none(), st.lists(st.integers(0, 900), min_size=len(cands), max_size=len(cands))))
        selecting = data.draw(st.booleans())
        if selecting:
            sel = run.select(
                state,
                cands,
                costs=costs,
                tau=data.draw(st.floats(0.0, 1.0)),
                max_keep=data.draw(st.one_of(st.none(), st.integers(1, 4))),
            )
        else:
            sel = run.revisit(state, max_keep=data.draw(st.one_of(st.none(), st.integers(1, 3))))
        spent_nodes += len(sel.kept)
        for _ in sel.kept:  # the caller reports each expansion's tokens, never above its estimate
            reserved = run.pending[0] if run.pending else 0
            run.spend(data.draw(st.integers(0, reserved)))
        assert run.budget.spent_nodes == spent_nodes
        if nodes is not None:
            assert spent_nodes <= nodes
        if tokens is not None:
            assert run.budget.spent_tokens + run.budget.reserved_tokens <= tokens and run.budget.overspent == 0
        parts = set(sel.kept) | set(sel.deferred) | set(sel.dropped_by_budget)
        assert len(parts) == len(sel.kept) + len(sel.deferred) + len(sel.dropped_by_budget)  # disjoint
        if selecting and cands and not sel.exhausted:
            assert sel.kept, "never an empty selection while budget remains"
        if sel.exhausted:
            assert sel.kept == [] and sel.dropped_by_budget == list(range(len(sel.p_keep)))
    run2 = RunGate.from_json(json.loads(json.dumps(run.to_json())), run.gate)
    assert run2.to_json() == run.to_json()


def test_select_never_empty_while_affordable(gate):
    run = RunGate(Shifted(gate, 0.0, 0.1), Budget(nodes=3))  # nothing passes the price
    for state, cands in DECISIONS[:3]:
        sel = run.select(state, cands)
        assert len(sel.kept) == 1 and sel.fallback and sel.kept[0] == int(np.argmax(sel.p_keep))
    sel = run.select(*DECISIONS[3])
    assert sel.exhausted and sel.kept == []


# -- deferral ---------------------------------------------------------------------------------------------
def test_deferral_sets_aside_the_band_and_revisit_expands_the_best(gate):
    shifted = Shifted(gate, 0.3, 0.62)
    run = RunGate(shifted, Budget(nodes=20), defer=True, price_start=0.6, defer_margin=0.35, price_exponent=8.0)
    state, cands = DECISIONS[0]
    sel = run.select(state, cands, keys=[f"c{i}" for i in range(len(cands))])
    p = sel.p_keep
    assert sel.deferred and all(0.25 <= p[i] < 0.6 for i in sel.deferred)
    assert set(sel.deferred).isdisjoint(sel.kept)
    assert [d.index for d in run.deferred] == sel.deferred and run.deferred[0].key == f"c{sel.deferred[0]}"
    assert all(d.decision == 0 for d in run.deferred)
    assert "deferred" in sel.to_json()
    # revisit against a later context: the re-scored best deferred candidate is expanded first
    later = dict(state, retained=[c["query"] for c in cands[:2]])
    pending = list(run.deferred)
    again, _ = shifted.predict(
        __import__("branchgate.inference.inputs", fromlist=["as_state"]).as_state(later), [d.text for d in pending]
    )
    before = run.budget.spent_nodes
    rev = run.revisit(later, max_keep=1)
    assert rev.kept == [int(np.argmax(again))] and rev.revisited[0] is pending[rev.kept[0]]
    assert run.budget.spent_nodes == before + 1 and pending[rev.kept[0]] not in run.deferred
    assert len(run.deferred) == len(pending) - 1
    left = run.drop_deferred()
    assert len(left) == len(pending) - 1 and run.deferred == []


def test_revisit_respects_the_budget_and_the_floor(gate):
    run = RunGate(Shifted(gate, 0.3, 0.62), Budget(nodes=2), defer=True, price_start=0.6, defer_margin=0.35)
    sel = run.select(*DECISIONS[0])
    assert len(sel.kept) == 1 and len(run.deferred) >= 2  # the price rose past the rest: deferred
    assert len(run.revisit(DECISIONS[0][0]).kept) == 1 and run.exhausted
    n = len(run.deferred)
    rev = run.revisit(DECISIONS[0][0])
    assert rev.kept == [] and rev.exhausted and len(rev.dropped_by_budget) == n and len(run.deferred) == n
    assert run.budget.spent_nodes == 2
    run = RunGate(
        Shifted(gate, 0.3, 0.62), Budget(nodes=20), defer=True, price_start=0.6, defer_margin=0.35, revisit_floor=0.99
    )
    run.select(*DECISIONS[0])
    n = len(run.deferred)
    assert n and run.revisit(DECISIONS[0][0]).kept == [] and len(run.deferred) == n


def test_rungate_json_round_trip(gate):
    run = RunGate(
        Shifted(gate, 0.3, 0.62),
        Budget(nodes=20, tokens=5000),
        defer=True,
        run_id="r1",
        price_start=0.6,
        defer_margin=0.35,
        tokens_per_node=300,
    )
    run.select(*DECISIONS[0])
    run.spend(120)
    obj = json.loads(json.dumps(run.to_json()))
    back = RunGate.from_json(obj, run.gate)
    assert back.to_json() == obj and back.run_id == "r1" and back.budget.spent_nodes == run.budget.spent_nodes
    assert [d.text for d in back.deferred] == [d.text for d in run.deferred]
    assert isinstance(back.deferred[0], Deferred) and back.deferred[0].candidate == run.deferred[0].candidate
    a, b = run.select(*DECISIONS[1]), back.select(*DECISIONS[1])
    assert a.to_json() == b.to_json()
    with pytest.raises(InputError, match="version"):
        RunGate.from_json(dict(obj, version=99), gate)
    with pytest.raises(InputError):
        RunGate.from_json([1], gate)


# -- CLI ----------------------------------------------------------------------------------------------------
def _cli(monkeypatch, capsys, model, request, *extra):
    import io
    import sys

    from branchgate.cli import main

    text = "\n".join(json.dumps(r) for r in request) if isinstance(request, list) else json.dumps(request)
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    rc = main(["gate", "--pre", model, *extra, *(["--jsonl"] if isinstance(request, list) else [])])
    out = capsys.readouterr()
    return rc, [json.loads(x) for x in out.out.splitlines()], out.err


def test_cli_run_id_keeps_the_budget_across_calls(monkeypatch, capsys, model, tmp_path):
    state, cands = DECISIONS[0]
    statefile = str(tmp_path / "runs.json")
    first = {"run_id": "r1", "budget_nodes": 4, "state": state, "candidates": cands}
    rc, [a], _ = _cli(monkeypatch, capsys, model, first, "--state", statefile)
    assert rc == 0 and a["run_id"] == "r1" and a["budget"]["limit"]["nodes"] == 4
    spent = len(a["kept"])
    stored = json.loads((tmp_path / "runs.json").read_text())["runs"]["r1"]
    assert stored["budget"]["spent_nodes"] == spent
    total = spent
    for _ in range(4):  # later calls in new processes' worth of state: the budget carries over
        rc, [b], _ = _cli(
            monkeypatch, capsys, model, {"run_id": "r1", "state": state, "candidates": cands}, "--state", statefile
        )
        total += len(b["kept"])
        assert rc == 0 and total <= 4 and b["budget"]["spent_nodes"] == total
    assert total == 4 and b["exhausted"] is True and b["kept"] == [] and len(b["dropped_by_budget"]) == len(cands)
    # a run's budget is set by its first call; budget fields without a run_id are refused
    rc, _, err = _cli(monkeypatch, capsys, model, dict(first, budget_nodes=9), "--state", statefile)
    assert rc == 2 and "budget_nodes" in err
    rc, _, err = _cli(monkeypatch, capsys, model, {"budget_nodes": 3, "state": state, "candidates": cands})
    assert rc == 2 and "run_id" in err
    # end_run forgets it; the next call with the same id starts afresh
    rc, [c], _ = _cli(
        monkeypatch,
        capsys,
        model,
        {"run_id": "r1", "state": state, "candidates": [], "end_run": True},
        "--state",
        statefile,
    )
    assert rc == 0 and "r1" not in json.loads((tmp_path / "runs.json").read_text())["runs"]


def test_cli_defer_revisit_and_default_state_folder(monkeypatch, capsys, model, tmp_path):
    monkeypatch.setenv("BRANCHGATE_CACHE", str(tmp_path / "cache"))
    state, cands = DECISIONS[0]
    reqs = [
        {
            "run_id": "d1",
            "budget_nodes": 20,
            "budget_tokens": 10_000,
            "defer": True,
            "tau": 1.0,
            "state": state,
            "candidates": cands,
            "costs": [100] * len(cands),
        },
        {"run_id": "d1", "spend": [80], "revisit": True, "state": dict(state, retained=["x"]), "max_keep": 1},
    ]
    rc, (a, b), _ = _cli(monkeypatch, capsys, model, reqs)
    assert rc == 0 and a["kept"] and a["budget"]["reserved_tokens"] == 100 * len(a["kept"])
    files = list((tmp_path / "cache" / "gate_runs").glob("*.json"))
    assert len(files) == 1 and "d1" in json.loads(files[0].read_text())["runs"]
    assert a["fallback"] and len(a["kept"]) == 1 and a["deferred"]  # τ = 1: the top-1 kept, the near ones deferred
    assert len(b["kept"]) == 1 and all(r["decision"] == 0 for r in b["revisited"])
    assert [r["index"] for r in b["revisited"]] == [a["deferred"][i] for i in b["kept"]]
    assert b["budget"]["spent_tokens"] == 80


# -- adapters -------------------------------------------------------------------------------------------
def test_gated_wrapper_shares_one_budget_and_revisits(gate):
    from branchgate.inference.agents.adapters import gated

    state, cands = DECISIONS[0]
    calls = []
    plan = gated(lambda q: list(cands), gate, budget_nodes=5, on_decision=calls.append)
    got = [plan(state["root_query"]) for _ in range(4)]
    assert sum(map(len, got)) == 5 and all(x in cands for g in got for x in g)
    assert got[-1] == [] and plan.exhausted and calls[-1].selection.exhausted
    plan.reset()  # a new run: a fresh budget
    assert not plan.exhausted and plan(state["root_query"])
    # a RunGate as the gate, with deferral: revisit hands back the caller's own objects
    run = RunGate(Shifted(gate, 0.3, 0.62), Budget(nodes=10), defer=True, price_start=0.6, defer_margin=0.35)
    objs = [dict(c, n=i) for i, c in enumerate(cands)]
    plan = gated(lambda q: objs, run)
    first = plan(state["root_query"])
    assert first and run.deferred and all(d.candidate in objs for d in run.deferred)
    back = plan.revisit(state["root_query"], max_keep=2)
    assert 1 <= len(back) <= 2 and all(b in objs and b not in first for b in back)
    assert gated(lambda q: [], gate, budget_nodes=0)("q") == []


# -- the GPT-Researcher hook (its fake deep-research skill) and traces through dataset build ----------------
def _Skill(**kw):
    """tests/test_adapters.py's fake DeepResearchSkill, except that an empty query list researches nothing and
    returns (as the real 0.15.1 skill does) instead of raising."""
    import asyncio

    from test_adapters import FakeDeepResearchSkill

    class Skill(FakeDeepResearchSkill):
        async def deep_research(self, query, breadth, depth, learnings=None, **rest):
            serp = await self.generate_search_queries(query, num_queries=breadth)
            all_learnings = list(learnings or [])
            for q in serp:
                context = f"passage on {q['query']}\nmore text"
                result = await self.process_research_results(query=q["query"], context=context)
                all_learnings.extend(result["learnings"])
                if depth > 1:
                    nxt = f"Previous research goal: {q['researchGoal']}\nFollow-up questions: x\n"
                    all_learnings = (
                        await self.deep_research(nxt, max(2, breadth // 2), depth - 1, learnings=all_learnings)
                    )["learnings"]
            await asyncio.sleep(0)
            return {"learnings": all_learnings}

    return Skill(**kw)


def test_gptr_hook_stops_expanding_when_the_budget_is_exhausted(gate, tmp_path):
    import asyncio

    from branchgate.inference.agents.gpt_researcher import gate_research
    from branchgate.logs_to_dataset.traces import read_events

    skill = _Skill(breadth=4, depth=3)
    trace = tmp_path / "gptr.jsonl"
    hook = gate_research(skill, gate, trace, run_id="b1", budget_nodes=4)
    asyncio.run(skill.run())  # no crash although the budget runs out mid-tree
    hook.close()
    events = list(read_events(trace, strict=True))
    assert events[0].config["budget"]["budget_nodes"] == 4 and events[-1].status == "ok"
    decisions = [e for e in events if e.type == "decision"]
    expands = [d for d in decisions if d.action == "expand"]
    assert len(expands) == 4 and hook.counts["expanded"] == 4
    budget = [d for d in decisions if d.actor == "budget"]
    assert budget and all(d.action == "prune" for d in budget) and hook.counts["dropped_by_budget"] == len(budget)
    assert all(d.spent["nodes"] <= 4 and d.remaining["nodes"] >= 0 for d in decisions)
    raw = [e for e in events if e.type == "raw" and e.source_type == "budget:exhausted"]
    assert len(raw) == 1 and hook.counts["exhausted"] >= 1


def _budget_trace(gate, path):
    """A run recorded through TraceRecorder with a RunGate: two frames, deferrals, a revisit that expands the
    best deferred candidate, a budget drop; evidence carries key-point labels."""
    from branchgate.inference.agents.recorder import TraceRecorder
    from branchgate.inference.inputs import DecisionState

    run = RunGate(
        Shifted(gate, 0.3, 0.62), Budget(nodes=3), defer=True, price_start=0.6, defer_margin=0.35, run_id="defer-run"
    )
    rec = TraceRecorder(run, path, run_id="defer-run", system="test", root_query=DECISIONS[0][0]["root_query"])
    rec._start()

    def frame(f, state, cands):
        fid = f"f{f}"
        rec._write("frame_open", frame_id=fid, depth=f, frame_query=state["frame_query"], parent_goal="")
        ids = [f"{fid}.c{i}" for i in range(len(cands))]
        for i, (c, cid) in enumerate(zip(cands, ids)):
            rec._write("candidate", frame_id=fid, candidate_id=cid, order=i, query=c["query"], goal=c["goal"])
        s = DecisionState(rec.root_query, state["frame_query"], "", list(rec.retained), f)
        sel = rec._gate_select(s, [(c["query"], c["goal"]) for c in cands], ids)
        rec._decisions(ids, sel.kept, "controller:gate", [float(p) for p in sel.p_keep], sel)
        for i in sel.kept:
            eid = rec._evidence_id(f"evidence for {cands[i]['query']}")
            rec._retrieval(ids[i], cands[i]["query"], [eid])
            rec.retained.append(f"{cands[i]['query']}")

    for f, (state, cands) in enumerate(DECISIONS[:2]):
        frame(f, state, cands)
    chosen = rec._revisit(
        DecisionState(rec.root_query, rec.root_query, "", list(rec.retained), 0), "controller:gate", max_keep=1
    )
    for d in chosen:
        rec._retrieval(d.key, d.text, [rec._evidence_id(f"evidence for deferred {d.text}")])
    frame(2, *DECISIONS[2])  # the budget is spent: every candidate pruned by actor "budget"
    rec._end("ok")
    rec._close_writer()
    # key-point labels on the evidence: rewrite the evidence lines with labels
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for e in lines:
        if e["type"] == "evidence":
            e["labels"] = ["kp-deferred"] if "deferred" in e["text"] else ["kp1"]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    return rec, chosen


def test_traces_with_defer_and_budget_round_trip_through_dataset_build(gate, encoder, tmp_path):
    from branchgate.logs_to_dataset.build import build
    from branchgate.logs_to_dataset.decision_points import run_decisions

    trace = tmp_path / "traces" / "run.jsonl"
    trace.parent.mkdir()
    rec, chosen = _budget_trace(gate, trace)
    assert len(chosen) == 1
    events = [json.loads(x) for x in trace.read_text().splitlines()]
    decisions = [e for e in events if e["type"] == "decision"]
    defers = {e["candidate_id"]: e["seq"] for e in decisions if e["action"] == "defer"}
    late = [e for e in decisions if e.get("deferred_from") is not None]
    assert len(late) == 1 and late[0]["action"] == "expand" and late[0]["candidate_id"] == chosen[0].key
    assert late[0]["deferred_from"] == defers[chosen[0].key]
    assert all("spent" in e and "remaining" in e for e in decisions)
    assert any(e["actor"] == "budget" for e in decisions)
    assert events[0]["config"]["budget"]["defer"] is True
    assert sum(e["action"] == "expand" for e in decisions) == 3 and rec.counts["revisited"] == 1
    from branchgate.logs_to_dataset.traces import read_events

    rd = run_decisions("defer-run", list(read_events(trace, strict=True)))
    assert rd.problems == []
    by_id = {c.candidate_id: c for f in rd.frames for c in f.candidates}
    revisited = by_id[chosen[0].key]
    assert revisited.deferred and revisited.expanded
    assert rd.deferral["deferred_expanded"] == 1 and rd.deferral["deferred_never_expanded"] == len(defers) - 1
    assert rd.deferral["dropped_by_budget"] >= 1

    out = tmp_path / "ds"
    manifest = build([trace], out, encoder_obj=encoder, cache=tmp_path / "cache", progress=False, labels="keypoints")
    import datasets

    rows = [r for split in datasets.load_from_disk(str(out)).values() for r in split]
    row = {r["candidate_id"]: r for r in rows}
    first_frame = chosen[0].key.split(".")[0]
    r = row[chosen[0].key]
    assert r["frame_id"] == first_frame and r["expanded"] and r["label_source"] == "realized" and r["label"] == 1
    never = [cid for cid in defers if cid != chosen[0].key]
    assert never and all(
        not row[c]["expanded"] and row[c]["label_source"] == "excluded" and row[c]["label"] == -1 for c in never
    )
    assert len(rows) == sum(len(f.candidates) for f in rd.frames)
    assert manifest["n_expanded"] == sum(c.expanded for c in by_id.values())
    assert manifest["deferral"] == rd.deferral  # the build counts the run's deferrals


def test_revisit_with_costs_prefers_the_cheap_deferred_candidate(gate):
    run = RunGate(
        Shifted(gate, 0.6, 0.6), Budget(nodes=10, tokens=10_000), defer=True, price_start=0.65, defer_margin=0.1
    )
    state, cands = DECISIONS[0]
    sel = run.select(state, cands, costs=[100] * len(cands))
    assert sel.fallback and len(sel.kept) == 1 and len(run.deferred) == len(cands) - 1
    costs = [5000] * len(run.deferred)
    costs[2] = 50
    rev = run.revisit(state, max_keep=1, costs=costs)
    assert rev.kept == [2] and run.budget.reserved_tokens == 100 + 50
    with pytest.raises(InputError, match="costs"):
        run.revisit(state, costs=[1])
