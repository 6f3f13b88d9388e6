"""The read stage in the reference simulator (``simulate --read SPEC``): which new hits of a search to read.

Runs use the bundled sample environment (``--env sample``) at depth 2, a fraction of a second each.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from branchgate.cli import main
from branchgate.decide import decide
from branchgate.errors import BranchgateError
from branchgate.logs_to_dataset.read_points import evidence_labels, keypoint_gains, run_read_points
from branchgate.logs_to_dataset.trace_schema import SCHEMA_FILE
from branchgate.logs_to_dataset.traces import read_events
from branchgate.models.teachers import Items, State
from branchgate.pipeline import stage_policies
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import simulate

NEW_TYPES = {"results", "read"}
NEW_TOTALS = {"search_calls", "hits_offered", "hits_read"}
VOLATILE_TOTALS = {"wall_s", "wall_by_stage"}
# Recorded on Config(depth=2), runs=3 with the offline generator of issue 65 (fluent candidates, MuSiQue's
# sub-questions as candidates, a tenth of the candidates off-topic: another question's sub-query; the first record,
# before the read stage, was commit 1df46c2's): every event written, as ``old_view`` shows it, and each run's
# (nodes, tokens, KPR). ``--read none`` must give exactly these.
OLD_DIGEST = "bccf713deb18959b1dbe4509299bb35dd0e6217237836bc5d14e2257079b7cc7"
OLD_TOTALS = {
    "2hop__150763_14904.r0.5fa8f60c": (25, 25371, 1.0),
    "2hop__6584_6587.r0.5fa8f60c": (19, 18442, 1.0),
    "4hop1__709382_146811_31223_91015.r0.5fa8f60c": (25, 32796, 1.0),
}


def traces(out: Path) -> dict[str, list[dict]]:
    """Each run's events (validated by the trace schema on reading), as dicts."""
    return {
        p.stem: [e.model_dump() for e in read_events(p, strict=True)] for p in sorted((out / "traces").glob("*.jsonl"))
    }


def of(events: list[dict], etype: str) -> list[dict]:
    return [e for e in events if e["type"] == etype]


def old_view(events: list[dict]) -> list[dict]:
    """The events a run wrote before the read stage: without results/read events, seq, ts, null fields, the
    evidence's hit_id, the new totals and wall times."""
    out = []
    for e in events:
        if e["type"] in NEW_TYPES:
            continue
        e = {k: v for k, v in e.items() if v is not None and k not in ("seq", "ts", "hit_id")}
        if e["type"] == "run_end":
            e["totals"] = {k: v for k, v in e["totals"].items() if k not in VOLATILE_TOTALS | NEW_TOTALS}
        out.append(e)
    return out


def digest(runs: dict[str, list[dict]]) -> str:
    h = hashlib.sha256()
    for run_id in sorted(runs):
        h.update(json.dumps(old_view(runs[run_id]), sort_keys=True).encode())
    return h.hexdigest()


def totals(runs: dict[str, list[dict]]) -> dict[str, dict]:
    return {run_id: evs[-1]["totals"] for run_id, evs in runs.items()}


def sim(tmp: Path, name: str, runs: int = 3, **cfg) -> dict[str, list[dict]]:
    simulate("sample", Config(depth=2, **cfg), tmp / name, runs=runs, progress=False)
    return traces(tmp / name)


@pytest.fixture(scope="module")
def none_runs(tmp_path_factory):
    return sim(tmp_path_factory.mktemp("read"), "none")


@pytest.fixture(scope="module")
def teacher_runs(tmp_path_factory, encoder):
    """``--read sc:max_items=1`` (embeddings cached in a temporary folder)."""
    tmp = tmp_path_factory.mktemp("teacher")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BRANCHGATE_CACHE", str(tmp / "cache"))
        cfg = Config(depth=2, read="sc:max_items=1", encoder="packaged")
        simulate("sample", cfg, tmp / "t", runs=3, progress=False, encoder=encoder)
    return traces(tmp / "t")


def check_read_events(evs: list[dict], snippet_words: int = 20) -> None:
    """The read stage's events in one run: per expanded candidate, decision → results → one read per offered hit
    → retrieval (the hits minus the skipped ones); hit ids are evidence ids; totals count them."""
    texts = {e["evidence_id"]: e["text"] for e in of(evs, "evidence")}
    assert all(e["hit_id"] == e["evidence_id"] for e in of(evs, "evidence") if not e.get("protected"))
    order = [(e["type"], e.get("candidate_id")) for e in evs]
    seen = {e["evidence_id"] for e in of(evs, "evidence") if e.get("protected")}  # seen from the start: not offered
    for res in of(evs, "results"):
        cid = res["candidate_id"]
        at = order.index(("results", cid))
        assert order.index(("decision", cid)) < at < order.index(("retrieval", cid))
        hits = res["hits"]
        assert [h["rank"] for h in hits] == list(range(len(hits)))
        for h in hits:
            assert h["title"] == "" and h["url"] is None and h["hit_id"] in texts
            assert h["snippet"] == " ".join(texts[h["hit_id"]].split()[:snippet_words])
            assert len(h["snippet"].split()) <= snippet_words
        reads = [e for e in evs if e["type"] == "read" and e["candidate_id"] == cid]
        offered = [h["hit_id"] for h in hits if h["hit_id"] not in seen]
        assert [e["hit_id"] for e in reads] == offered  # every hit new to the run, in rank order
        skipped = {e["hit_id"] for e in reads if e["action"] == "skip"}
        (retrieval,) = [e for e in evs if e["type"] == "retrieval" and e["candidate_id"] == cid]
        assert retrieval["evidence_ids"] == [h["hit_id"] for h in hits if h["hit_id"] not in skipped]
        seen.update(e["hit_id"] for e in reads if e["action"] == "read")
    t = evs[-1]["totals"]
    assert t["search_calls"] == len(of(evs, "results")) == len(of(evs, "retrieval"))
    assert t["hits_offered"] == len(of(evs, "read"))
    assert t["hits_read"] == sum(e["action"] == "read" for e in of(evs, "read"))


def test_read_none_is_the_old_pipeline_plus_the_read_events(none_runs):
    assert digest(none_runs) == OLD_DIGEST
    assert {k: (t["nodes"], t["tokens"], t["kpr"]) for k, t in totals(none_runs).items()} == OLD_TOTALS
    for evs in none_runs.values():
        check_read_events(evs)
        reads = of(evs, "read")
        assert reads and {(e["action"], e["actor"], e["score"], e["p_keep"]) for e in reads} == {
            ("read", "default", None, None)
        }
        t = evs[-1]["totals"]
        assert t["search_calls"] == t["retrieval_calls"] - 1  # every expansion's search; the plan's is not one


def test_results_and_read_events_match_the_json_schema(none_runs):
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))
    evs = next(iter(none_runs.values()))
    for e in of(evs, "results")[:3] + of(evs, "read")[:10]:
        validator.validate(json.loads(json.dumps(e)))


def test_a_simulated_run_gives_labelled_read_points(none_runs, teacher_runs):
    for runs in (none_runs, teacher_runs):
        for run_id, evs in runs.items():
            points, problems = run_read_points(evs, run_id)
            assert not problems and len(points) == len(of(evs, "results"))
            labels_of = evidence_labels(evs)
            frames = {e["frame_id"]: e["depth"] for e in of(evs, "frame_open")}
            for p in points:
                assert p.depth == frames[p.frame_id]
                gains = keypoint_gains(p, labels_of)
                for h, gain in zip(p.hits, gains, strict=True):
                    if not h["is_new"]:  # read before: never offered again
                        assert h["action"] is None and gain == -1
                    else:  # offered; its full text and labels are in the run, read or not
                        assert h["action"] in (("read",) if runs is none_runs else ("read", "skip")) and gain >= 0
            actions = {h["action"] for p in points for h in p.hits if h["is_new"]}
            assert actions == ({"read"} if runs is none_runs else {"read", "skip"})


def test_teacher_max_items_reads_at_most_one_hit_per_search_and_saves_tokens(none_runs, teacher_runs):
    assert set(teacher_runs) != set(none_runs)  # a read spec is another configuration: other run ids
    skipped_then_offered = 0
    for evs in teacher_runs.values():
        check_read_events(evs)
        per_search: dict[str, int] = {}
        for e in of(evs, "read"):
            per_search[e["candidate_id"]] = per_search.get(e["candidate_id"], 0) + (e["action"] == "read")
            assert e["actor"] == "teacher:sc" and e["score"] is not None
        assert per_search and max(per_search.values()) == 1
        skipped = [e["hit_id"] for e in of(evs, "read") if e["action"] == "skip"]
        skipped_then_offered += len(skipped) - len(set(skipped))  # a skipped hit is offered again later
        # a skipped hit never enters a process call: its text is in no context
        report = of(evs, "report")[0]
        assert set(report["evidence_ids"]) <= {e["hit_id"] for e in of(evs, "read") if e["action"] == "read"}
    assert skipped_then_offered > 0
    none_tokens = sum(t["tokens"] for t in totals(none_runs).values())
    assert sum(t["tokens"] for t in totals(teacher_runs).values()) < none_tokens


def test_a_threshold_that_keeps_none_ends_every_branch(tmp_path, encoder, monkeypatch):
    monkeypatch.setenv("BRANCHGATE_CACHE", str(tmp_path / "cache"))
    cfg = Config(depth=2, read="sc:threshold=1e9", encoder="packaged")
    simulate("sample", cfg, tmp_path / "t", runs=2, progress=False, encoder=encoder)
    for evs in traces(tmp_path / "t").values():
        check_read_events(evs)
        assert {e["action"] for e in of(evs, "read")} == {"skip"}
        assert not of(evs, "followup") and not of(evs, "learning")
        assert {e["purpose"] for e in of(evs, "llm_call")} == {"plan", "synthesis"}  # no process call
        t = evs[-1]["totals"]
        assert t["hits_read"] == 0 and t["nodes"] == 1 + len(of(evs, "candidate")) and t["kpr"] == 0


def test_random_rates_read_nothing_or_everything(tmp_path, none_runs):
    nothing, everything = sim(tmp_path, "r0", read="random:0"), sim(tmp_path, "r1", read="random:1")
    for evs in nothing.values():
        check_read_events(evs)
        assert {e["action"] for e in of(evs, "read")} == {"skip"} and {e["actor"] for e in of(evs, "read")} == {
            "random"
        }
        assert not of(evs, "followup") and evs[-1]["totals"]["hits_read"] == 0
    for evs in everything.values():
        check_read_events(evs)
        assert {e["action"] for e in of(evs, "read")} == {"read"}
    keys = ("nodes", "tokens", "kpr", "hits_offered", "hits_read")
    assert sorted(tuple(t[k] for k in keys) for t in totals(everything).values()) == sorted(
        tuple(t[k] for k in keys) for t in totals(none_runs).values()
    )
    assert sum(t["tokens"] for t in totals(nothing).values()) < sum(t["tokens"] for t in totals(none_runs).values())


def test_protected_passages_are_never_offered(tmp_path):
    for evs in sim(tmp_path, "p", runs=2, protect="plan", read="random:0.5").values():
        check_read_events(evs)
        protected = {e["evidence_id"] for e in of(evs, "evidence") if e.get("protected")}
        listed = {h["hit_id"] for r in of(evs, "results") for h in r["hits"]}
        assert protected & listed  # searches find them again ...
        assert not protected & {e["hit_id"] for e in of(evs, "read")}  # ... but they are already in the context


def test_cli_read_and_snippet_words(tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["simulate", "--env", "sample", "--runs", "2", "--depth", "2", "--no-progress"]
    assert main([*args, "--read", "random:0.5", "--snippet-words", "5", "--out", str(out)]) == 0
    assert "hits read" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["config"]["read"] == "random:0.5" and summary["config"]["config"]["snippet_words"] == 5
    for key in ("search_calls", "hits_offered", "hits_read"):
        assert key in summary
    for evs in traces(out).values():
        check_read_events(evs, snippet_words=5)
        assert {e["action"] for e in of(evs, "read")} == {"read", "skip"}
        assert evs[0]["config"]["read"] == "random:0.5"
    assert "read" not in Config().record() and "snippet_words" not in Config().record()  # older run ids stay
    assert Config(read="random:0.5").tag() != Config().tag() != Config(snippet_words=5).tag()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--read", "shallow:3", "pre-retrieval policy"),
        ("--read", "none:budget_nodes=3", "run budgets are a pre-retrieval setting"),
        ("--read", "random:2", "RATE must be in"),
        ("--read", "sc:max_items=0", "max_items must be a positive integer"),
        ("--read", "nope", "unknown policy"),
        ("--read", "gate:", "expected gate:PATH"),
        ("--read", "gate:m.onnx,greedy=1", "not a read-stage setting"),
        ("--read", "gate:m.onnx,floor=all", "floor must be root"),
        ("--read", "gate:m.onnx,tau=2", "tau must be in"),
        ("--pre", "gate:m.onnx,floor=root", "read-stage setting"),
        ("--snippet-words", "0", "--snippet-words must be an integer"),
    ],
)
def test_bad_read_settings_are_clear_errors(tmp_path, capsys, option, value, message):
    argv = ["simulate", "--env", "sample", "--runs", "1", "--out", str(tmp_path / "o"), option, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and (option in err or option == "--snippet-words")


def test_teacher_threshold_and_max_items_are_two_knobs():
    """At the read stage ``max_items=K`` alone keeps the top K whatever the threshold; ``threshold`` alone thresholds;
    both keep the best K of those passing; no fallback (a list may be read not at all)."""
    scores = np.array([0.1, 0.9, 0.5, 0.3])

    def kept(spec: str) -> list[int]:
        policy = stage_policies.parse(spec, "read")
        policy.model = SimpleNamespace(name="grn", threshold=policy.model.threshold, score=lambda x, s: scores)
        x = Items(["a", "b", "c", "d"], np.zeros((4, 1)))
        return policy.choose(x, State(Items.empty(1), Items.empty(1)), "read", None).kept

    assert kept("grn:max_items=2") == [1, 2]  # grn's own threshold (0.85) would keep [1] only
    assert kept("grn") == [1]
    assert kept("grn:threshold=0.4") == [1, 2]
    assert kept("grn:threshold=0.4,max_items=1") == [1]
    assert kept("grn:threshold=0.95") == []
    assert kept("grn:threshold=0.95,max_items=3") == []
    assert stage_policies.parse("grn", "read").mode is None  # gate mode by default at the read stage


class StubReadGate:
    """A read controller's stand-in (the pipeline's ``_shared_gate`` is patched to return it): p_keep = 1/(1+rank),
    kept by ``decide`` at τ (default 0.3) without the top-1 fallback, with it at depth 0 when floor is "root"."""

    def __init__(self, stage: str | None = "read"):
        if stage is not None:
            self.stage = stage
        self.calls: list[tuple[dict, list[dict], float | None, str | None]] = []

    def select(self, state, hits, tau=None, floor=None):
        self.calls.append((dict(state), list(hits), tau, floor))
        p = np.array([1.0 / (1 + h["rank"]) for h in hits])
        d = decide(p, 0.3 if tau is None else tau, fallback=floor == "root" and state["depth"] == 0)
        return SimpleNamespace(kept=d.kept, p_keep=p)


def test_gate_read_policy_gets_the_read_state_and_hits(tmp_path, monkeypatch, capsys):
    gate = StubReadGate()
    monkeypatch.setattr(stage_policies, "_shared_gate", lambda path: gate)
    runs = sim(tmp_path, "g", runs=2, read="gate:stub.onnx,tau=0.4,floor=root")
    assert gate.calls
    by_run = iter(runs.values())
    evs = next(by_run)
    frames = {e["frame_id"]: e["depth"] for e in of(evs, "frame_open")}
    cands = {e["candidate_id"]: e for e in of(evs, "candidate")}
    results = of(evs, "results")
    offered = [r for r in results if any(e["candidate_id"] == r["candidate_id"] for e in of(evs, "read"))]
    assert len(offered) < len(gate.calls)  # the gate is asked once per list that offers a hit, the second run's too
    read_before: list[str] = []
    for (state, hits, tau, floor), res in zip(gate.calls, offered):  # the first run's calls come first
        cand = cands[res["candidate_id"]]
        assert set(state) == {"root_query", "query", "goal", "read", "read_ids", "depth"}
        assert (state["root_query"], state["query"], state["goal"]) == (
            evs[0]["root_query"],
            cand["query"],
            cand["goal"],
        )
        assert state["depth"] == frames[cand["frame_id"]]  # the candidate's frame's depth (0 at the root frame)
        assert state["read_ids"] == read_before
        snippets = {h["hit_id"]: h["snippet"] for r in results for h in r["hits"]}
        assert state["read"] == [snippets[i] for i in read_before]  # hit_text of title "" and the snippet
        assert (tau, floor) == (0.4, "root")
        assert all(set(h) == {"id", "title", "snippet", "rank"} and h["title"] == "" for h in hits)
        reads = [e for e in evs if e["type"] == "read" and e["candidate_id"] == res["candidate_id"]]
        assert [h["id"] for h in hits] == [e["hit_id"] for e in reads]
        assert [e["p_keep"] for e in reads] == pytest.approx([1.0 / (1 + h["rank"]) for h in hits])
        assert {e["actor"] for e in reads} == {"controller:gate"}
        read_before += [e["hit_id"] for e in reads if e["action"] == "read"]
    check_read_events(evs)
    # a pre-retrieval controller given to --read, a read controller given to --pre: exit 2 naming the option
    for stub, option in ((StubReadGate(stage="pre"), "--read"), (StubReadGate(stage=None), "--read"), (gate, "--pre")):
        monkeypatch.setattr(stage_policies, "_shared_gate", lambda path, stub=stub: stub)
        out = tmp_path / f"bad{option}{id(stub)}"
        argv = ["simulate", "--env", "sample", "--runs", "1", "--out", str(out), option, "gate:stub.onnx"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert option in err and "read controller" in err
        assert not out.exists()  # refused before anything was written


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*outside the training range")
def test_gate_read_with_a_real_read_controller(tmp_path, encoder, capsys):
    """The exported test controller relabelled as a read controller (the same graph, metadata ``stage`` read)."""
    from export_support import exported, relabelled

    from branchgate.inference.gate import Gate
    from branchgate.inference.model_file import read_metadata

    pre = exported(encoder)["files"]["fp32"]
    if not hasattr(Gate.load(pre), "stage"):
        pytest.skip("this Gate has no stage attribute (no read controllers yet)")
    (tmp_path / "read").mkdir()
    path = relabelled(pre, tmp_path / "read", {**read_metadata(pre), "stage": "read"})
    runs = sim(tmp_path, "g", runs=2, read=f"gate:{path},tau=0.5")
    for evs in runs.values():
        check_read_events(evs)
        p = [e["p_keep"] for e in of(evs, "read")]
        assert p and all(0.0 <= v <= 1.0 for v in p)
        assert all((e["action"] == "read") == (e["p_keep"] >= 0.5) for e in of(evs, "read"))
    args = ["simulate", "--env", "sample", "--runs", "1", "--depth", "1"]
    assert main([*args, "--read", f"gate:{pre}", "--out", str(tmp_path / "a")]) == 2
    assert "--read" in capsys.readouterr().err
    assert main([*args, "--pre", f"gate:{path}", "--out", str(tmp_path / "b")]) == 2
    assert "--pre" in capsys.readouterr().err


def test_read_specs_parse():
    assert isinstance(stage_policies.parse(None, "read"), stage_policies.NonePolicy)
    assert stage_policies.parse("random:0.25", "read").rate == 0.25
    g = stage_policies.parse("gate:/x/a,b/controller.onnx,tau=0.3,floor=root", "read")
    assert isinstance(g, stage_policies.ReadGatePolicy)
    assert (g.path, g.tau, g.floor) == ("/x/a,b/controller.onnx", 0.3, "root")
    with pytest.raises(BranchgateError, match="--read"):
        stage_policies.parse("gate:m,root_tau=0.2", "read")
