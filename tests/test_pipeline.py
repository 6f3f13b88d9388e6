"""The reference pipeline on the bundled sample: traces, determinism, accounting, policies, resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from branchgate.cli import main
from branchgate.errors import BranchgateError, MismatchError
from branchgate.logs_to_dataset.traces import read_events
from branchgate.pipeline import stage_policies
from branchgate.pipeline.accounting import count_tokens, kpr
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import simulate

VOLATILE = {"ts"}
VOLATILE_TOTALS = {"wall_s", "wall_by_stage"}


def events_of(out: Path) -> dict[str, list[dict]]:
    runs = {}
    for path in sorted((out / "traces").glob("*.jsonl")):
        runs[path.stem] = [e.model_dump() for e in read_events(path, strict=True)]
    return runs


def stable(events: list[dict]) -> list[dict]:
    out = []
    for e in events:
        e = {k: v for k, v in e.items() if k not in VOLATILE}
        if e["type"] == "run_end":
            e["totals"] = {k: v for k, v in e["totals"].items() if k not in VOLATILE_TOTALS}
        out.append(e)
    return out


@pytest.fixture(scope="module")
def none_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("none")
    simulate("sample", Config(depth=2), out, runs=3, progress=False)
    return out


def test_kpr_hand_made_cases():
    kps = ["q#1", "q#2", "q#3", "q#4"]
    assert kpr([["q#1"], ["q#2", "other#1"], []], kps) == 0.5
    assert kpr([["q#1", "q#1"], ["q#1"]], kps) == 0.25  # duplicates count once
    assert kpr([["other#1", "other#2"]], kps) == 0.0  # another query's key points do not count
    assert kpr([], kps) == 0.0
    assert kpr([["q#1"]], []) == 0.0
    assert kpr([kps], kps + ["q#1"]) == 1.0  # repeated ids in the ground truth count once


def test_tokens_use_a_real_tokenizer():
    assert count_tokens("") == 0
    assert count_tokens("hello world") == 2
    assert count_tokens("unbelievably") > 1  # WordPiece splits, a whitespace count would say 1
    assert count_tokens(["hello", "world"]) == 2


def test_trace_contract_with_no_pruning(none_runs):
    runs = events_of(none_runs)
    assert len(runs) == 3
    for _run_id, evs in runs.items():
        types = [e["type"] for e in evs]
        assert types[0] == "run_start" and types[-1] == "run_end"
        assert [e["seq"] for e in evs] == list(range(len(evs)))
        kp_ids = set()
        frames, cands, decisions, emitted = {}, {}, {}, set()
        for e in evs:
            if e["type"] == "frame_open":
                if e["parent_candidate"] is not None:  # the child frame of an expanded candidate
                    assert decisions[e["parent_candidate"]] == "expand"
                    assert e["parent_goal"] == cands[e["parent_candidate"]]["goal"]
                    assert cands[e["parent_candidate"]]["frame_id"] == e["parent_frame"]
                frames[e["frame_id"]] = e
            elif e["type"] == "candidate":
                cands[e["candidate_id"]] = e
            elif e["type"] == "decision":
                assert e["actor"] == "default" and e["candidate_id"] not in decisions
                decisions[e["candidate_id"]] = e["action"]
            elif e["type"] == "evidence":
                assert e["evidence_id"] not in emitted and e["source"] == e["evidence_id"]
                assert isinstance(e["labels"], list) and e["tokens"] > 0
                emitted.add(e["evidence_id"])
                kp_ids.update(e["labels"])
            elif e["type"] == "retrieval":
                assert decisions[e["candidate_id"]] == "expand"
                assert set(e["evidence_ids"]) <= emitted
        assert set(decisions) == set(cands) and set(decisions.values()) == {"expand"}  # none expands everything
        assert all(k.startswith(evs[0]["config"]["query_id"] + "#") for k in kp_ids)
        totals = evs[-1]["totals"]
        for key in ("nodes", "retrieval_calls", "tokens", "kpr", "wall_s"):
            assert key in totals
        assert totals["nodes"] == 1 + len(cands) and totals["retrieval_calls"] == totals["nodes"]
        assert totals["tokens"] == sum(e["in_tokens"] + e["out_tokens"] for e in evs if e["type"] == "llm_call")
        assert 0 <= totals["kpr"] <= 1


def test_every_decision_gets_a_realized_label(none_runs):
    from branchgate.logs_to_dataset.decision_points import run_decisions
    from branchgate.logs_to_dataset.traces import read_events

    for path in sorted((none_runs / "traces").glob("*.jsonl")):
        evs = list(read_events(path, strict=True))
        rd = run_decisions(path.stem, evs, str(path))
        assert not rd.problems and rd.has_labels
        cands = [c for f in rd.frames for c in f.candidates]
        assert cands and all(c.expanded and c.evidence_ids is not None for c in cands)


def test_same_seed_same_traces(none_runs, tmp_path):
    again = tmp_path / "again"
    simulate("sample", Config(depth=2), again, runs=3, progress=False)
    a, b = events_of(none_runs), events_of(again)
    assert a.keys() == b.keys()
    for run_id in a:
        assert stable(a[run_id]) == stable(b[run_id])
    other = tmp_path / "other"
    simulate("sample", Config(depth=2, seed=1), other, runs=1, progress=False)
    first = sorted(a)[0]
    assert [e.get("query") for e in events_of(other)[sorted(events_of(other))[0]] if e["type"] == "candidate"] != [
        e.get("query") for e in a[first] if e["type"] == "candidate"
    ]


def test_resume_skips_finished_runs_and_refuses_other_config(none_runs, tmp_path):
    out = tmp_path / "r"
    simulate("sample", Config(depth=1), out, runs=2, progress=False)
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "traces").glob("*.jsonl")}
    s = simulate("sample", Config(depth=1), out, runs=3, progress=False)
    after = {p.name: p.stat().st_mtime_ns for p in (out / "traces").glob("*.jsonl")}
    assert s["n_runs"] == 3 and len(after) == 3
    assert all(after[k] == v for k, v in mtimes.items())
    with pytest.raises(MismatchError, match="another configuration"):
        simulate("sample", Config(depth=2), out, runs=1, progress=False)


def test_shallow_levels():
    per_level = [6, 3, 3]
    assert stage_policies.shallow_levels(0, per_level) == []
    assert stage_policies.shallow_levels(1, per_level) == [1]
    assert stage_policies.shallow_levels(9, per_level) == [3, 2]  # 3 + 3·2
    assert stage_policies.shallow_levels(28, per_level) == [4, 2, 2]  # 4 + 8 + 16: GPT-Researcher's tree
    assert stage_policies.shallow_levels(1000, per_level) == [6, 3, 2]  # widest tree: 6, then halving (floor 2)


@pytest.mark.parametrize("budget", [1, 4, 12])
def test_shallow_respects_its_node_budget(tmp_path, budget):
    simulate("sample", Config(pre=f"shallow:{budget}"), tmp_path, runs=2, progress=False)
    for evs in events_of(tmp_path).values():
        totals = evs[-1]["totals"]
        assert totals["nodes"] <= budget
        pruned = [e for e in evs if e["type"] == "decision" and e["action"] == "prune"]
        assert all(e["actor"] == "budget" for e in pruned)
        if budget == 1:
            assert totals["nodes"] == 1 and totals["kpr"] == 0.0


def test_policy_specs_parse_or_fail_clearly():
    p = stage_policies.parse("mmr:threshold=0.4,lam=0.5", "post_retrieval")
    assert p.actor == "teacher:mmr" and p.model.threshold == 0.4 and p.model.lam == 0.5
    assert stage_policies.parse("sc:max_items=10", "pre_synthesis").max_items == 10
    assert stage_policies.parse("random:0.5", "pre_retrieval").rate == 0.5
    assert isinstance(stage_policies.parse(None, "pre_retrieval"), stage_policies.NonePolicy)
    gate = stage_policies.parse("gate:/no/such/controller.onnx", "pre_retrieval")  # loaded lazily, on first use
    assert gate.actor == "controller:gate"
    with pytest.raises(BranchgateError, match="controller"):
        _ = gate.model
    assert gate.tau is None and stage_policies.parse("gate:/x/controller.onnx,tau=0.25", "pre_retrieval").tau == 0.25
    assert stage_policies.parse("gate:/x/controller.onnx,tau=0.25", "pre_retrieval").path == "/x/controller.onnx"
    g = stage_policies.parse("gate:/x/a,b/controller.onnx,tau=0.3,greedy=1", "pre_retrieval")
    assert (g.path, g.tau, g.greedy) == ("/x/a,b/controller.onnx", 0.3, True) and not gate.greedy
    for spec, stage, msg in [
        ("nope", "pre_retrieval", "unknown policy"),
        ("mmr:threshold", "pre_retrieval", "key=value"),
        ("mmr:bogus=1", "pre_retrieval", "bogus"),
        ("random:2", "post_retrieval", r"\[0, 1\]"),
        ("shallow:5", "post_retrieval", "pre-retrieval"),
        ("shallow:x", "pre_retrieval", "integer"),
        ("gate:", "pre_retrieval", "gate:PATH"),
        ("gate:m.onnx,tau=x", "pre_retrieval", "number"),
        ("gate:m.onnx,tau=2", "pre_retrieval", r"\[0, 1\]"),
        ("sc:max_items=0", "pre_synthesis", "positive"),
        ("gate:m.onnx,greedy=yes", "pre_retrieval", "greedy"),
    ]:
        with pytest.raises(BranchgateError, match=msg):
            stage_policies.parse(spec, stage)


def test_greedy_gate_rescores_the_rest_with_each_kept_candidate_in_context():
    from branchgate.models.teachers import Items, State

    first = {"alpha one": 0.9, "alpha two": 0.8, "beta three": 0.6}

    from branchgate.inference.gate import Gate

    class Model:  # p_keep falls to 0.1 for a candidate whose first word a retained text already has
        threshold = tau = 0.5
        root_tau = None
        thresholds = Gate.thresholds  # the Gate's own rule for which τ applies
        seen: list = []

        def predict(self, st, texts):
            self.seen.append(list(st.retained))
            have = {t.split()[0] for t in st.retained}
            return np.array([0.1 if t.split()[0] in have else first[t] for t in texts]), None

        def score(self, x, state):
            return self.predict(state_of(state), list(x.texts))[0]

    def state_of(state):
        from branchgate.inference.inputs import DecisionState

        return DecisionState("root", retained=list(state.context.texts))

    x = Items(list(first), np.zeros((3, 2)))
    state = State(Items(["root"], np.zeros((1, 2))), Items(["gamma zero"], np.zeros((1, 2))))
    plain = stage_policies.GatePolicy(path="m", _gate=Model())
    greedy = stage_policies.GatePolicy(path="m", greedy=True, _gate=Model())
    assert plain.choose(x, state, "pre_retrieval", None).kept == [0, 1, 2]
    Model.seen.clear()
    assert greedy.choose(x, state, "pre_retrieval", None).kept == [
        0,
        2,
    ]  # "alpha two" is redundant once "alpha one" is kept
    assert Model.seen[1:] == [["gamma zero", "alpha one"], ["gamma zero", "alpha one", "beta three"]]
    low = stage_policies.GatePolicy(path="m", greedy=True, tau=0.95, _gate=Model())
    assert low.choose(x, state, "pre_retrieval", None).kept == [0]  # nothing passes: the top-1 fallback
    assert low.choose(x, state, "post_retrieval", None).kept == []  # no fallback after retrieval
    stop = stage_policies.parse("gate:m.onnx,tau=0.95,fallback=root", "pre_retrieval")
    stop._gate = Model()
    deep = State(state.query, state.context, "a sub-question", "", 1)
    assert stop.choose(x, state, "pre_retrieval", None).kept == [0]  # the root keeps its top-1
    assert stop.choose(x, deep, "pre_retrieval", None).kept == []  # below the root the branch stops
    stop.tau = 0.5
    assert stop.choose(x, deep, "pre_retrieval", None).kept == [0, 1, 2]  # what passes τ is kept at any depth
    root = stage_policies.parse("gate:m.onnx,tau=0.5,root_tau=0.85", "pre_retrieval")  # the root frame has its own bar
    root._gate = Model()
    assert (root.root_tau, root.tau) == (0.85, 0.5)
    assert root.choose(x, state, "pre_retrieval", None).kept == [0]  # root: only 0.9 passes 0.85
    assert root.choose(x, deep, "pre_retrieval", None).kept == [0, 1, 2]  # below it: τ 0.5
    stored = Model()
    stored.root_tau = 0.85  # a controller exported with calibration.root_tau
    own = stage_policies.parse("gate:m.onnx", "pre_retrieval")
    own._gate = stored
    assert own.choose(x, state, "pre_retrieval", None).kept == [0]  # the file's root τ at the root
    assert own.choose(x, deep, "pre_retrieval", None).kept == [0, 1, 2]  # its τ below
    flat = stage_policies.parse("gate:m.onnx,tau=0.5", "pre_retrieval")
    flat._gate = stored
    assert flat.choose(x, state, "pre_retrieval", None).kept == [0, 1, 2]  # tau=T alone: T at every depth
    for bad, msg in [
        ("gate:m.onnx,fallback=deep", "all or root"),
        ("gate:m.onnx,fallback=root,budget_nodes=3", "do not combine"),
        ("gate:m.onnx,root_tau=1.5", "root_tau must be in"),
        ("gate:m.onnx,root_tau=0.5,budget_nodes=3", "do not combine"),
    ]:
        with pytest.raises(BranchgateError, match=msg):
            stage_policies.parse(bad, "pre_retrieval")


def test_random_policy_prunes_and_is_seeded(tmp_path):
    simulate("sample", Config(depth=2, pre="random:0.5"), tmp_path / "a", runs=2, progress=False)
    simulate("sample", Config(depth=2, pre="random:0.5"), tmp_path / "b", runs=2, progress=False)
    a, b = events_of(tmp_path / "a"), events_of(tmp_path / "b")
    assert all(stable(a[k]) == stable(b[k]) for k in a)
    actions = [e["action"] for evs in a.values() for e in evs if e["type"] == "decision"]
    assert "prune" in actions and "expand" in actions


def test_teacher_policies_at_each_stage(tmp_path, encoder, monkeypatch):
    monkeypatch.setenv("BRANCHGATE_CACHE", str(tmp_path / "cache"))
    cfg = Config(depth=2, pre="mmr", post="sc:threshold=0.0005", synth="cd", encoder="packaged")
    s = simulate("sample", cfg, tmp_path / "t", runs=1, progress=False, encoder=encoder)
    evs = next(iter(events_of(tmp_path / "t").values()))
    actors = {e["actor"] for e in evs if e["type"] == "decision"}
    assert actors == {"teacher:mmr"}
    frame0 = [e for e in evs if e["type"] == "decision" and e["candidate_id"].startswith("f0.c")]
    assert sum(e["action"] == "expand" for e in frame0) == 4  # breadth 4 chosen out of 6 candidates
    assert all(e["score"] is not None for e in frame0)
    prunes = [e for e in evs if e["type"] == "prune"]
    assert {e["actor"] for e in prunes} <= {"teacher:sc", "teacher:cd"} and prunes
    assert s["n_runs"] == 1 and evs[-1]["totals"]["tokens_by_stage"]["embed"] > 0
    # the same configuration again: identical decisions and scores (embeddings come from the cache)
    simulate("sample", cfg, tmp_path / "t2", runs=1, progress=False, encoder=encoder)
    again = next(iter(events_of(tmp_path / "t2").values()))
    assert stable(evs) == stable(again)


def test_cli_simulate_and_bad_env(tmp_path, capsys):
    assert main(["simulate", "--env", "sample", "--runs", "1", "--depth", "1", "--out", str(tmp_path / "o")]) == 0
    assert "1 runs in" in capsys.readouterr().out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["n_runs"] == 1 and summary["frac_expansions_with_gain"] is not None
    assert main(["simulate", "--env", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    assert "environment folder not found" in capsys.readouterr().err
    assert main(["simulate", "--env", "sample", "--post", "shallow:3", "--out", str(tmp_path / "y")]) == 2


def test_workers_give_the_same_traces(none_runs, tmp_path):
    simulate("sample", Config(depth=2), tmp_path, runs=3, workers=2, progress=False)
    a, b = events_of(none_runs), events_of(tmp_path)
    assert a.keys() == b.keys() and all(stable(a[k]) == stable(b[k]) for k in a)


def test_chain_shape_has_one_candidate_per_decision_and_keeps_tree_run_ids(tmp_path):
    assert "shape" not in Config().record()  # a setting added later: tree run ids (and cached bench steps) stay valid
    assert Config(shape="chain").tag() != Config().tag()
    assert (
        main(
            [
                "simulate",
                "--env",
                "sample",
                "--runs",
                "4",
                "--shape",
                "chain",
                "--depth",
                "4",
                "--no-progress",
                "--out",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )
    frames, depths = {}, []
    for path in sorted((tmp_path / "c" / "traces").glob("*.jsonl")):
        for e in read_events(path, strict=True):
            if e.type == "candidate":
                frames[(path.stem, e.frame_id)] = frames.get((path.stem, e.frame_id), 0) + 1
            elif e.type == "frame_open":
                depths.append(e.depth)
    assert frames and set(frames.values()) == {1}  # one search per decision, as a sequential agent writes them
    assert max(depths) >= 2 and max(depths) <= 3  # a chain, depth-limited, the root's follow-up the next frame
    with pytest.raises(BranchgateError, match="shape"):
        simulate("sample", Config(shape="star"), tmp_path / "bad", runs=1, progress=False)
