"""`branchgate replay` (``bench/replay.py``, ``replay_cli.py``, ``replay_report.py``): a controller replayed on
unpruned logs. Keeping everything reproduces each run's logged tokens and key-point recall exactly; the replay of
a controller at τ lands near what the same controller does in the closed loop (the reference simulator run with
it); the command writes its report, recommends a τ, and refuses bad input with the option named, losing nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from export_support import exported, exported_read

from branchgate.bench.replay import ReplayRun, citation_value, keypoint_value
from branchgate.cli import main
from branchgate.inference.gate import Gate
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import simulate

pytestmark = pytest.mark.filterwarnings("ignore:.*decision outside the training range")
RUNS = 6
TAU = 0.5


def sim(out: Path, encoder=None, **cfg) -> Path:
    simulate("sample", Config(depth=2, **cfg), out, runs=RUNS, progress=False, encoder=encoder)
    return out / "traces"


def logged(traces: Path) -> dict[str, dict]:
    """Each run's ``run_end`` totals."""
    return {run.run_id: dict(run.events[-1].totals) for run in read_runs([traces])}


@pytest.fixture(scope="module")
def models(encoder) -> dict[str, str]:
    return {"pre": exported(encoder)["files"]["fp32"], "read": exported_read(encoder)["files"]["fp32"]}


@pytest.fixture(scope="module")
def unpruned(tmp_path_factory) -> Path:
    return sim(tmp_path_factory.mktemp("replay") / "none")


@pytest.fixture(scope="module")
def replay_runs(unpruned) -> list[ReplayRun]:
    return [ReplayRun(run) for run in read_runs([unpruned])]


def replay_cli(tmp: Path, *args: str, name: str = "out") -> dict:
    assert main(["replay", *args, "--out", str(tmp / name), "--bootstrap", "50"]) == 0
    return json.loads((tmp / name / "replay.json").read_text())


def mean_of(totals: dict[str, dict], key: str) -> float:
    return float(np.mean([t[key] for t in totals.values()]))


def test_keeping_everything_reproduces_each_logged_run(unpruned, replay_runs):
    totals = logged(unpruned)
    assert len(replay_runs) == RUNS
    for run in replay_runs:
        out = run.replay()
        assert out.tokens == totals[run.run_id]["tokens"], run.run_id
        assert keypoint_value(run, out) == pytest.approx(totals[run.run_id]["kpr"], abs=1e-6), run.run_id
        assert out.searches == totals[run.run_id]["search_calls"]
        assert citation_value(run, out) == 1.0  # every cited source was found
        assert out.hits_read == out.hits_offered > 0


def test_a_policy_that_keeps_less_costs_less_and_keeps_less(replay_runs):
    def top1(frame, state, cands):
        return [0]

    def first_hit(state, hits):
        return [0]

    for run in replay_runs:  # reading less may cost more: a later branch then finds something and makes a call
        full, pre, read = run.replay(), run.replay(pre=top1), run.replay(read=first_hit)
        assert pre.searches < full.searches and pre.tokens < full.tokens
        assert read.hits_read < full.hits_read and keypoint_value(run, read) <= keypoint_value(run, full)
        assert keypoint_value(run, pre) <= keypoint_value(run, full)


def test_the_read_rule_sees_the_search_and_only_hits_not_read_before(replay_runs):
    seen: list[tuple[dict, list]] = []

    def spy(state, hits):
        seen.append((state, [h.hit_id for h in hits]))
        return list(range(len(hits)))

    replay_runs[0].replay(read=spy)
    assert seen and {"root_query", "query", "goal", "read", "read_ids", "depth"} <= set(seen[0][0])
    read_before: set[str] = set()
    for state, ids in seen:
        assert set(state["read_ids"]) == read_before and not read_before & set(ids)
        read_before |= set(ids)


@pytest.mark.parametrize("stage", ["pre", "read"])
def test_replay_lands_near_the_closed_loop(tmp_path, unpruned, models, encoder, stage):
    """The controller at τ 0.5 run in the simulator vs replayed on the unpruned runs (the sample's 6 queries;
    measured on 12 sample runs: pre +0.1% of the tokens, read +0.3%, the same KPR)."""
    closed = logged(sim(tmp_path / "closed", encoder, **{stage: f"gate:{models[stage]},tau={TAU}"}))
    flag = "--pre" if stage == "pre" else "--read"
    report = replay_cli(tmp_path, "--traces", str(unpruned), flag, models[stage], "--taus", str(TAU))
    (point,) = report["points"]
    assert point["tokens"]["mean"] == pytest.approx(mean_of(closed, "tokens"), rel=0.05)
    assert point["value"]["mean"] == pytest.approx(mean_of(closed, "kpr"), abs=0.03)
    assert report["unpruned"]["tokens"] == pytest.approx(report["logged_tokens"])
    assert point["tokens"]["mean"] < report["unpruned"]["tokens"]


def test_the_report_files_and_the_recommendation(tmp_path, unpruned, models):
    report = replay_cli(tmp_path, "--traces", str(unpruned), "--pre", models["pre"], "--taus", "0,0.3,0.9")
    assert {"stage", "models", "labels", "runs", "unpruned", "points", "recommended", "summary", "commit"} <= set(
        report
    )
    assert report["stage"] == "pre" and report["labels"] == "keypoints" and report["runs"] == RUNS
    taus = [p["tau"] for p in report["points"]]
    assert taus == [0.0, 0.3, 0.9]
    assert report["points"][0]["value_share"]["mean"] == pytest.approx(1.0)  # τ 0 keeps everything
    tokens = [p["tokens_share"]["mean"] for p in report["points"]]
    assert tokens == sorted(tokens, reverse=True)
    rec = report["recommended"]
    assert rec["tau"] in taus and rec["value_share"]["mean"] >= report["keep"]
    cheaper = [p for p in report["points"] if p["value_share"]["mean"] >= report["keep"]]
    assert rec["tokens_share"]["mean"] == min(p["tokens_share"]["mean"] for p in cheaper)
    out = tmp_path / "out"
    assert (out / "replay.png").stat().st_size > 1000
    assert "| τ 0.3 |" in (out / "replay.md").read_text()
    budget = replay_cli(
        tmp_path, "--traces", str(unpruned), "--pre", models["pre"], "--taus", "0,0.3,0.9", "--budget", "0.7"
    )  # the same folder again: replay's own output is replaced
    assert budget["recommended"]["tau"] is None or budget["recommended"]["tokens_share"]["mean"] <= 0.7


def test_read_after_the_pre_controller_and_citation_labels(tmp_path, unpruned, models):
    report = replay_cli(
        tmp_path,
        "--traces",
        str(unpruned),
        "--pre",
        models["pre"],
        "--read",
        models["read"],
        "--pre-tau",
        "0.9",
        "--taus",
        "0.5",
        "--labels",
        "citations",
    )
    assert report["stage"] == "read" and report["labels"] == "citations"
    assert report["models"]["pre"]["replayed_tau"] == 0.9
    alone = replay_cli(
        tmp_path,
        "--traces",
        str(unpruned),
        "--read",
        models["read"],
        "--taus",
        "0.5",
        "--labels",
        "citations",
        name="alone",
    )
    assert report["points"][0]["searches"]["mean"] < alone["points"][0]["searches"]["mean"]


def test_dataset_rows_as_the_value(tmp_path, unpruned, models, encoder):
    """``--dataset``: the value kept is the sum of the dataset's row utilities over the kept candidates."""
    from branchgate.logs_to_dataset.build import build

    build([unpruned], tmp_path / "ds", labels="keypoints", encoder_obj=encoder, progress=False, embed="torch")
    report = replay_cli(
        tmp_path,
        "--traces",
        str(unpruned),
        "--pre",
        models["pre"],
        "--dataset",
        str(tmp_path / "ds"),
        "--taus",
        "0,0.9",
    )
    assert report["labels"] == "rows:keypoints"
    assert report["unpruned"]["value"] > 0
    assert report["points"][0]["value"]["mean"] == pytest.approx(report["unpruned"]["value"])
    assert report["points"][1]["value"]["mean"] < report["unpruned"]["value"]
    assert (
        main(
            [
                "replay",
                "--traces",
                str(unpruned),
                "--read",
                models["read"],
                "--dataset",
                str(tmp_path / "ds"),
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 2
    )  # a pre-stage dataset for the read stage


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ([], "--pre"),
        (["--read", "PRE"], "--read"),
        (["--pre", "READ"], "--pre"),
        (["--pre", "PRE", "--taus", "0.1,x"], "--taus"),
        (["--pre", "PRE", "--taus", "2"], "--taus"),
        (["--pre", "PRE", "--keep", "0"], "--keep"),
        (["--pre", "PRE", "--labels", "stars"], "--labels"),
        (["--pre", "PRE", "--labels", "rows"], "--labels"),
        (["--pre", "PRE", "--run-budgets", "0.3,1.5"], "--run-budgets"),
        (["--pre", "PRE", "--read", "READ", "--run-budgets", "0.3"], "--run-budgets"),
        (["--pre", "pretrained:pre", "--run-budgets", "0.3"], "--run-budgets"),
    ],
)
def test_bad_options_name_the_option(tmp_path, unpruned, models, capsys, args, option):
    args = [models["pre"] if a == "PRE" else models["read"] if a == "READ" else a for a in args]
    assert main(["replay", "--traces", str(unpruned), *args, "--out", str(tmp_path / "o")]) == 2
    assert option in capsys.readouterr().err
    assert not (tmp_path / "o" / "replay.json").exists()


def test_a_foreign_folder_is_never_replaced_and_empty_logs_are_an_error(tmp_path, unpruned, models, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["replay", "--traces", str(unpruned), "--pre", models["pre"], "--out", str(mine)]) == 2
    assert (mine / "notes.txt").read_text() == "keep me" and not (mine / "replay.json").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    code = main(["replay", "--traces", str(empty), "--pre", models["pre"], "--out", str(tmp_path / "o")])
    assert code != 0
    assert str(empty) in capsys.readouterr().err


def test_runs_without_key_points_refuse_keypoint_labels(tmp_path, models, capsys):
    """A log with no evidence labels: --labels keypoints is refused, naming the option."""
    run_id = "r1"
    events = [
        {"type": "run_start", "root_query": "q"},
        {"type": "frame_open", "frame_id": "f0", "depth": 0, "frame_query": "q"},
        {"type": "candidate", "frame_id": "f0", "candidate_id": "c0", "order": 0, "query": "a"},
        {"type": "candidate", "frame_id": "f0", "candidate_id": "c1", "order": 1, "query": "b"},
        {"type": "retrieval", "candidate_id": "c0", "query": "a", "evidence_ids": ["e0"]},
        {"type": "evidence", "evidence_id": "e0", "text": "alpha", "tokens": 5},
        {"type": "retrieval", "candidate_id": "c1", "query": "b", "evidence_ids": ["e1"]},
        {"type": "evidence", "evidence_id": "e1", "text": "beta", "tokens": 7},
        {"type": "run_end", "totals": {}},
    ]
    path = tmp_path / "logs" / "r1.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"v": 2, "run_id": run_id, "seq": i, **e}) + "\n" for i, e in enumerate(events)))
    (run,) = [ReplayRun(r) for r in read_runs([path.parent])]
    assert run.replay().tokens == 12  # no llm_call events: what reading the evidence costs
    assert run.replay(pre=lambda f, s, c: [1]).tokens == 7
    assert (
        main(
            [
                "replay",
                "--traces",
                str(path.parent),
                "--pre",
                models["pre"],
                "--labels",
                "keypoints",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "--labels" in capsys.readouterr().err
    read_out = str(tmp_path / "r")
    assert main(["replay", "--traces", str(path.parent), "--read", models["read"], "--out", read_out]) == 2
    assert "result lists" in capsys.readouterr().err  # no results events: nothing for a read controller to replay


def test_teacher_labels_build_their_dataset_in_the_output_folder(tmp_path, unpruned, models):
    """``--labels teacher:dpp`` without ``--dataset``: OUT/dataset is built from the logs with that label source."""
    report = replay_cli(
        tmp_path, "--traces", str(unpruned), "--read", models["read"], "--labels", "teacher:dpp", "--taus", "0.5"
    )
    assert report["labels"] == "rows:teacher:dpp" and report["stage"] == "read"
    manifest = json.loads((tmp_path / "out" / "dataset" / "manifest.json").read_text())
    assert manifest["stage"] == "read" and manifest["label_kind"] == "teacher:dpp"
    assert report["unpruned"]["value"] > 0
    assert report["points"][0]["value"]["mean"] <= report["unpruned"]["value"] + 1e-9


def test_run_budgets_replay_the_pre_controllers_run_gate(tmp_path, unpruned, models):
    """``--run-budgets``: each run's ``RunGate`` with that share of the run's unpruned tokens; a larger budget
    searches at least as much, and every point costs less than the unpruned replay."""
    report = replay_cli(tmp_path, "--traces", str(unpruned), "--pre", models["pre"], "--run-budgets", "0.2,0.6")
    assert [p.get("run_budget") for p in report["points"]] == [0.2, 0.6]
    assert [p["name"] for p in report["points"]] == ["run budget 20%", "run budget 60%"]
    small, large = report["points"]
    assert small["searches"]["mean"] <= large["searches"]["mean"]
    assert large["tokens"]["mean"] < report["unpruned"]["tokens"]
    assert "| run budget 20% |" in (tmp_path / "out" / "replay.md").read_text()


@pytest.mark.parametrize("share", [0.15, 0.3, 0.6])
def test_a_replayed_run_budget_is_never_exceeded(replay_runs, models, share):
    """As in the reference pipeline, a replayed budget holds the synthesis call's share from the start and checks
    each branch's cost before searching it: no run spends more than its budget (when the plan and the synthesis
    call alone fit it)."""
    gate = Gate.load(models["pre"])
    for run in replay_runs:
        unpruned = run.replay()
        limit = int(share * unpruned.tokens)
        out = run.replay(budget=gate.run(budget_tokens=limit, charges=False))
        if run.plan + run.synthesis_fixed <= limit:
            assert out.tokens <= limit, run.run_id
        assert out.searches <= unpruned.searches and set(out.kept) <= set(unpruned.kept)
    with pytest.raises(ValueError, match="charges=False"):
        replay_runs[0].replay(budget=gate.run(budget_tokens=1000))


def test_judge_labels_against_a_stub_llm(tmp_path, models, chat_stub, monkeypatch):
    """``--labels judge``: OUT/dataset is built with an LLM judge (a stub OpenAI-compatible server on 127.0.0.1)
    and the value kept is the sum of its utilities over the kept candidates."""
    from test_judge import EXPECTED, good, make_run

    monkeypatch.setenv("BRANCHGATE_CACHE", str(tmp_path / "cache"))
    make_run(tmp_path)
    stub = chat_stub(good)
    report = replay_cli(
        tmp_path,
        "--traces",
        str(tmp_path / "run.jsonl"),
        "--pre",
        models["pre"],
        "--labels",
        "judge",
        "--llm-url",
        stub.url,
        "--llm-model",
        "m",
        "--taus",
        "0,0.99",
    )
    assert report["labels"] == "rows:judge" and stub.requests
    assert report["unpruned"]["value"] == pytest.approx(sum(EXPECTED.values()))
    assert report["points"][0]["value"]["mean"] == pytest.approx(sum(EXPECTED.values()))
    assert report["points"][1]["value"]["mean"] < sum(EXPECTED.values())
    assert report["unpruned"]["tokens"] == 0 and report["recommended"]["point"] is None  # the run records no tokens


def test_progress_bars_and_no_progress(tmp_path, unpruned, models, capsys):
    args = ["replay", "--traces", str(unpruned), "--pre", models["pre"], "--taus", "0.5", "--bootstrap", "10"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert "replaying" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "replaying" not in err and "reading runs" not in err and "runs replayed" in err


def test_chain_shaped_logs_say_why_nothing_is_pruned(tmp_path, models, capsys):
    """One candidate per decision (a sequential agent): the pre controller always keeps it; the summary says so."""
    simulate("sample", Config(depth=2, shape="chain"), tmp_path / "chain", runs=2, progress=False)
    report = replay_cli(tmp_path, "--traces", str(tmp_path / "chain" / "traces"), "--pre", models["pre"])
    dp = report["decision_points"]
    assert dp["frames"] == dp["single_candidate"] > 0
    assert all(p["tokens_share"]["mean"] == 1.0 for p in report["points"])
    assert "single candidate" in report["summary"] and "--read" in report["summary"]


def test_a_chain_agent_searches_again_after_a_search_it_read_nothing_of():
    """The Search-o1 reader declares ``follow_ups: always`` (each search is the next step of one chain): a read
    rule that reads nothing still reaches the second search; the reference pipeline's rule (no such declaration)
    stops at a branch that read nothing new."""
    fixture = Path(__file__).parent / "fixtures" / "searcho1"
    run = next(r for r in read_runs([fixture]) if r.run_id == "9000001")
    start = next(e for e in run.events if e.type == "run_start")
    assert start.config["follow_ups"] == "always"
    chain = ReplayRun(run)
    assert chain.follows_always and chain.replay().searches == 2
    assert chain.replay(read=lambda state, hits: []).searches == 2
    chain.follows_always = False
    assert chain.replay(read=lambda state, hits: []).searches == 1
