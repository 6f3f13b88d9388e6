"""The read gate: one Gate runtime for a pre-retrieval and a read controller (metadata ``stage``), the read
decision's inputs (hits, read state), its keep rule (no top-1 fallback; ``floor="root"``), the CLI, bench-gate and
``evaluate --model``."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from export_support import exported, exported_read, relabelled

from branchgate.cli import main
from branchgate.decide import decide
from branchgate.errors import BranchgateError, InputError, MismatchError
from branchgate.export.onnx_metadata import checkpoint_stage
from branchgate.export.samples import sample_read_decisions
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import DecisionState, as_read_decision
from branchgate.inference.metadata import check_metadata
from branchgate.inference.model_file import read_metadata, read_stage
from branchgate.texts import hit_text

pytestmark = pytest.mark.filterwarnings("ignore:.*decision outside the training range")
STATE, HITS = sample_read_decisions()[0]  # 10 ranked hits with ids, after 3 hits of other searches were read
PRE_STATE = {"root_query": "Why are honeybee colonies collapsing?", "frame_query": "varroa mites", "depth": 0}


@pytest.fixture(scope="module")
def read_model(encoder) -> str:
    return exported_read(encoder)["files"]["fp32"]


@pytest.fixture(scope="module")
def read_gate(read_model) -> Gate:
    return Gate.load(read_model, threads=1)


@pytest.fixture(scope="module")
def pre_gate(encoder) -> Gate:
    return Gate.load(exported(encoder)["files"]["fp32"], threads=1)


def _hits(n: int = 4) -> list[dict]:
    return [dict(h) for h in HITS[:n]]


# -- metadata and card ------------------------------------------------------------------------------------
def test_stage_is_in_the_metadata_the_card_and_the_gate(encoder, read_model, read_gate, pre_gate, tmp_path):
    assert read_metadata(read_model)["stage"] == "read" and read_stage(read_model) == "read"
    assert read_gate.stage == "read" and pre_gate.stage == "pre"
    assert read_metadata(exported(encoder)["files"]["int8"])["stage"] == "pre"
    card = Path(exported_read(encoder)["files"]["card"]).read_text()
    assert "Stage: `read`" in card and "**read controller**" in card and '"hits": [...]' in card
    pre_card = Path(exported(encoder)["files"]["card"]).read_text()
    assert "Stage: `pre`" in pre_card and "**pre-retrieval controller**" in pre_card
    assert "read controller" not in pre_card and '"candidates": [...]' in pre_card
    older = {k: v for k, v in read_metadata(read_model).items() if k != "stage"}  # exported before the read gate
    assert Gate.load(relabelled(read_model, tmp_path, older), threads=1).stage == "pre"


@pytest.mark.parametrize("stage", ["post", "", "READ"])
def test_a_stage_other_than_pre_or_read_is_refused_naming_the_field(read_model, tmp_path, stage):
    props = dict(read_metadata(read_model), stage=stage)
    with pytest.raises(MismatchError, match=f"metadata stage={stage!r} is not a stage"):
        check_metadata(props, "m.onnx")
    with pytest.raises(MismatchError, match="metadata stage="):
        Gate.load(relabelled(read_model, tmp_path, props), threads=1)
    with pytest.raises(MismatchError, match="checkpoint meta: metadata stage="):
        checkpoint_stage({"stage": stage})
    assert checkpoint_stage({}) == checkpoint_stage({"stage": None}) == "pre" and checkpoint_stage({"stage": "read"})


# -- the read decision ------------------------------------------------------------------------------------
def test_hits_are_scored_as_the_graph_sees_a_read_decision(read_gate, pre_gate):
    """The read state maps onto the graph's texts (question, sub-query, goal, texts read) and the hits' texts are
    hit_text(title, snippet): the pre-retrieval path given those texts scores the same."""
    sel = read_gate.select(STATE, HITS)
    texts = [hit_text(h["title"], h["snippet"]) for h in HITS]
    read = [hit_text(h["title"], h["snippet"]) for h in STATE["read"]]
    pre_state = DecisionState(STATE["root_query"], STATE["query"], STATE["goal"], read, STATE["depth"])
    np.testing.assert_allclose(sel.p_keep, pre_gate.select(pre_state, texts).p_keep, atol=1e-6)
    assert len(sel.p_keep) == len(sel.utility) == 10 and np.isfinite(sel.p_keep).all()
    assert "not_new" not in sel.to_json()  # only when a hit was read before
    assert sel.out_of_range == ["order", "n_candidates"]  # 10 hits; the test controller saw lists of at most 8


def test_keep_rule_has_no_top1_fallback_and_may_be_empty(read_gate):
    sel = read_gate.select(STATE, HITS)
    assert sel.kept == decide(sel.p_keep, read_gate.tau, fallback=False).kept
    none = read_gate.select(STATE, HITS, tau=1.0)
    assert none.kept == [] and none.fallback is False and len(none.p_keep) == 10  # the branch ends
    assert read_gate.select(STATE, HITS, tau=0.0).kept == list(range(10))
    best2 = read_gate.select(STATE, HITS, tau=0.0, max_keep=2)
    assert best2.kept == sorted(np.argsort(-sel.p_keep)[:2].tolist())
    assert read_gate.select(STATE, []).kept == []


def test_floor_root_keeps_the_top_hit_at_the_root_only(read_gate, pre_gate):
    root = dict(STATE, depth=0)
    sel = read_gate.select(root, HITS, tau=1.0, floor="root")
    assert sel.kept == [int(np.argmax(sel.p_keep))] and sel.fallback is True
    assert read_gate.select(root, HITS, tau=1.0).kept == []
    assert read_gate.select(dict(STATE, depth=1), HITS, tau=1.0, floor="root").kept == []
    with pytest.raises(InputError, match="^floor: must be None or 'root'"):
        read_gate.select(root, HITS, floor="always")
    with pytest.raises(InputError, match="^floor: applies to a read controller only"):
        pre_gate.select(PRE_STATE, ["varroa mites"], floor="root")


def test_read_hits_are_not_scored_and_indices_follow_the_callers_list(read_gate):
    """Hits are scored in rank order whatever the list order; hits already read (read_ids, or hits given in
    ``read``) are reported as not new, never kept; every index is the caller's."""
    ranked = read_gate.select(STATE, HITS, tau=0.5)
    perm = [7, 2, 9, 0, 5, 1, 8, 3, 6, 4]
    shuffled = read_gate.select(STATE, [HITS[i] for i in perm], tau=0.5)
    np.testing.assert_allclose(shuffled.p_keep, ranked.p_keep[perm], atol=1e-6)
    assert shuffled.kept == sorted(perm.index(i) for i in ranked.kept)
    unranked = [{k: v for k, v in HITS[i].items() if k != "rank"} for i in perm]  # list order is the rank order
    assert not np.allclose(read_gate.select(STATE, unranked).p_keep, ranked.p_keep[perm], atol=1e-6)

    state = dict(STATE, read_ids=[*STATE["read_ids"], HITS[3]["id"]], read=[*STATE["read"], HITS[5]])
    sel = read_gate.select(state, [HITS[i] for i in perm], tau=0.0)
    gone = sorted([perm.index(3), perm.index(5)])
    assert sel.not_new == gone and np.isnan(sel.p_keep[gone]).all() and np.isnan(sel.utility[gone]).all()
    assert sel.kept == [i for i in range(10) if i not in gone]  # τ = 0 keeps every new hit, none of the old
    d = as_read_decision(state, HITS)
    expected, _ = read_gate.predict(d.state, d.texts)  # the 8 new hits, in rank order: order 0..7, K = 8, R = 5
    new = [i for i in range(10) if i not in gone]
    np.testing.assert_allclose(sel.p_keep[new], expected[np.argsort(np.argsort([perm[i] for i in new]))], atol=1e-6)
    answer = sel.to_json()
    assert answer["not_new"] == gone and answer["p_keep"][gone[0]] is None and answer["utility"][gone[1]] is None
    json.dumps(answer, allow_nan=False)  # valid JSON: no NaN


def test_url_is_the_id_of_a_hit_without_one_and_objects_are_hits(read_gate):
    class Hit:
        def __init__(self, title, url):
            self.title, self.snippet, self.url = title, "", url

    hits = [Hit("Varroa mites and colony losses", "https://a"), Hit("Pesticide field trials", "https://b")]
    sel = read_gate.select({"root_query": "bees", "query": "varroa", "read_ids": ["https://b"]}, hits)
    assert sel.not_new == [1] and np.isfinite(sel.p_keep[0])


@pytest.mark.parametrize(
    "hits,field",
    [
        ([{"title": "", "snippet": "  "}], "hits[0].title"),
        ([{"title": "a", "rank": 0}, {"title": "b"}], "hits[1].rank"),
        ([{"title": "a", "rank": -1}], "hits[0].rank"),
        ([{"title": "a", "rank": True}], "hits[0].rank"),
        ([{"title": "a", "id": 7}], "hits[0].id"),
        ([{"title": "a", "url": ["x"]}], "hits[0].url"),
        ([{"title": 3}], "hits[0].title"),
        ([None], "hits[0]"),
        ("a plain string", "hits"),
        ({"title": "one hit"}, "hits"),
    ],
)
def test_bad_hits_name_their_field(read_gate, hits, field):
    with pytest.raises(InputError) as err:
        read_gate.select(STATE, hits)
    assert err.value.file == field


@pytest.mark.parametrize(
    "state,field",
    [
        ({"root_query": "q", "read": "one text"}, "state.read"),
        ({"root_query": "q", "read": [{"query": "a candidate"}]}, "state.read[0]"),
        ({"root_query": "q", "read_ids": [1]}, "state.read_ids[0]"),
        ({"root_query": "q", "depth": -1}, "state.depth"),
        ({"root_query": "q", "goal": 5}, "state.goal"),
        (["q"], "state"),
    ],
)
def test_bad_read_states_name_their_field(read_gate, state, field):
    with pytest.raises(InputError) as err:
        read_gate.select(state, _hits())
    assert err.value.file == field


def test_the_wrong_kind_of_item_says_which_controller_this_is(read_gate, pre_gate):
    for candidates in ([{"query": "varroa mites", "goal": "parasites"}], ["varroa mites"], [("varroa", "mites")]):
        with pytest.raises(InputError, match="not a search hit: this is a read controller") as err:
            read_gate.select(STATE, candidates)
        assert err.value.file == "hits[0]" and "title and/or snippet" in str(err.value)
    with pytest.raises(InputError, match="this is a pre-retrieval controller") as err:
        pre_gate.select(PRE_STATE, [{"query": "varroa"}, {"title": "Varroa", "snippet": "mites", "id": "u"}])
    assert err.value.file == "candidates[1]" and "read controller" in str(err.value)
    with pytest.raises(InputError, match="is a pre-retrieval state .*this is a read controller"):
        read_gate.select(PRE_STATE, _hits())
    with pytest.raises(BranchgateError, match="needs a pre-retrieval controller"):
        read_gate.run(budget_nodes=3)


def test_pre_stage_selection_is_unchanged(pre_gate):
    """A pre-retrieval controller still keeps its top-1, answers with the same keys, and reads candidates only."""
    cands = [{"query": "varroa mite treatment", "goal": "parasites"}, "honey prices by country"]
    sel = pre_gate.select(PRE_STATE, cands, tau=1.0)
    assert sel.kept == [int(np.argmax(sel.p_keep))] and sel.fallback and sel.not_new == []
    assert set(sel.to_json()) == {"kept", "p_keep", "utility", "fallback"}
    again = pre_gate.select(DecisionState("Why are honeybee colonies collapsing?", "varroa mites"), cands, tau=1.0)
    np.testing.assert_allclose(again.p_keep, sel.p_keep, atol=1e-6)
    assert pre_gate.run(budget_nodes=2).select(PRE_STATE, cands).kept


# -- branchgate gate --------------------------------------------------------------------------------------
def _gate_cli(monkeypatch, capsys, model, decision, *flags):
    monkeypatch.setattr(sys, "stdin", io.StringIO(decision if isinstance(decision, str) else json.dumps(decision)))
    rc = main(["gate", "--read" if read_stage(model) == "read" else "--pre", model, *flags])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if rc == 0 else None), out.err


def test_gate_cli_answers_a_read_decision(monkeypatch, capsys, read_model, read_gate):
    state = dict(STATE, read_ids=[*STATE["read_ids"], HITS[1]["id"]])
    rc, ans, _ = _gate_cli(monkeypatch, capsys, read_model, {"state": state, "hits": HITS})
    expected = read_gate.select(state, HITS).to_json()
    assert rc == 0 and ans["stage"] == "read" and ans["not_new"] == [1] and ans["p_keep"][1] is None
    assert ans["kept"] == expected["kept"] and ans["p_keep"][0] == pytest.approx(expected["p_keep"][0], abs=1e-5)
    rc, ans, _ = _gate_cli(monkeypatch, capsys, read_model, {"state": STATE, "items": HITS, "tau": 1.0})
    assert rc == 0 and ans["kept"] == [] and ans["fallback"] is False and "not_new" not in ans
    root = {"state": dict(STATE, depth=0), "hits": HITS, "tau": 1.0}
    rc, ans, _ = _gate_cli(monkeypatch, capsys, read_model, root, "--floor", "root")
    assert rc == 0 and len(ans["kept"]) == 1 and ans["fallback"] is True
    rc, ans, _ = _gate_cli(monkeypatch, capsys, read_model, dict(root, floor="root"))
    assert rc == 0 and len(ans["kept"]) == 1


@pytest.mark.parametrize(
    "decision,message",
    [
        ({"state": STATE, "candidates": [{"query": "q"}]}, "field 'candidates': this is a read controller"),
        ({"state": STATE, "hits": [{"query": "q"}]}, "field 'hits[0]': is a candidate sub-query"),
        ({"state": STATE, "items": [{"title": "a", "rank": "1"}]}, "field 'items[0].rank': must be an integer"),
        ({"state": STATE}, "missing field 'hits'"),
        ({"state": dict(STATE, frame_query="x"), "hits": HITS}, "unknown field(s) state.frame_query"),
        ({"state": STATE, "hits": HITS, "run_id": "r"}, "field 'run_id': budgeted runs need a pre-retrieval"),
        ({"state": STATE, "hits": HITS, "floor": "top"}, "field 'floor': must be None or 'root'"),
        ({"state": STATE, "hits": HITS, "tau": 3}, "field 'tau'"),
    ],
)
def test_gate_cli_refuses_bad_read_decisions_naming_the_field(monkeypatch, capsys, read_model, decision, message):
    rc, _, err = _gate_cli(monkeypatch, capsys, read_model, decision)
    assert rc == 2 and message in err


def test_gate_cli_pre_controller_refuses_hits_and_floor(monkeypatch, capsys, encoder):
    model = exported(encoder)["files"]["fp32"]
    rc, _, err = _gate_cli(monkeypatch, capsys, model, {"state": PRE_STATE, "hits": HITS})
    assert rc == 2 and "field 'hits': this is a pre-retrieval controller" in err
    rc, _, err = _gate_cli(monkeypatch, capsys, model, {"state": PRE_STATE, "candidates": ["a"]}, "--floor", "root")
    assert rc == 2 and "--floor: applies to a read controller only" in err
    rc, ans, _ = _gate_cli(monkeypatch, capsys, model, {"state": PRE_STATE, "candidates": ["a", "b"]})
    assert rc == 0 and set(ans) == {"kept", "p_keep", "utility", "fallback"}  # the pre answer as before


# -- bench-gate -------------------------------------------------------------------------------------------
def test_bench_gate_times_a_ten_hit_read_decision(encoder, capsys, tmp_path):
    from branchgate.export.latency import predict_inputs

    defaults = predict_inputs("read", None)  # what bench-gate times by default for a read controller
    assert len(defaults) == 8 and {len(texts) for _, texts in defaults} == {10}
    assert [len(s.retained) for s, _ in defaults] == [3, 5] * 4
    titles = [len(h["title"].split()) for _, hits in sample_read_decisions() for h in hits]
    snippets = [len(h["snippet"].split()) for _, hits in sample_read_decisions() for h in hits]
    assert 8 <= np.mean(titles) <= 12 and 17 <= np.mean(snippets) <= 25
    jobs = tmp_path / "reads.jsonl"  # two of them, to keep the test short
    jobs.write_text("".join(json.dumps({"state": s, "hits": h}) + "\n" for s, h in sample_read_decisions()[:2]))
    report = exported_read(encoder)
    argv = ["bench-gate", "--read", report["files"]["fp32"], "--checkpoint", report["checkpoint"]]
    assert main([*argv, "--decisions", str(jobs), "--reps", "1", "--threads", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["stage"] == "read" and res["decisions"] == 2
    assert res["candidates_per_decision"] == 10.0 and res["read_texts_per_decision"] == 4.0
    assert res["onnx_fp32_ms_p50"] > 0 and res["warm_onnx_fp32_ms_p50"] > 0 and "onnx_int8_ms_p50" not in res
    assert res["onnx_fp32_max_abs_diff_p_keep"] < 1e-4  # the graph scores the read decisions as torch does
    argv[-1] = exported(encoder)["checkpoint"]  # the pre-retrieval checkpoint against the read model
    assert main([*argv, "--reps", "1", "--threads", "1", "--json"]) == 2
    assert "'pre'-stage controller but" in capsys.readouterr().err


# -- evaluate --model -------------------------------------------------------------------------------------
def _evaluate(tmp_path, name: str, *argv) -> tuple[int, dict | None]:
    out = tmp_path / name
    rc = main(["evaluate", *argv, "--out", str(out), "--cache", str(tmp_path / "cache.sqlite")])
    return rc, (json.loads((out / "metrics.json").read_text()) if rc == 0 else None)


def test_evaluate_model_scores_what_evaluate_checkpoint_scores(encoder, tmp_path):
    report = exported(encoder)
    rc, ckpt = _evaluate(tmp_path, "ckpt", "--checkpoint", report["checkpoint"], "--dataset", report["dataset"])
    assert rc == 0
    rc, onnx = _evaluate(tmp_path, "onnx", "--pre", report["files"]["fp32"], "--dataset", report["dataset"])
    assert rc == 0 and onnx["stage"] == "pre" and onnx["precision"] == "fp32" and onnx["tau_source"] == "model"
    assert onnx["auroc"] == pytest.approx(ckpt["auroc"], abs=1e-5)
    for key in ("keep_rate", "f1", "top1_accuracy", "tau"):
        assert onnx[key] == pytest.approx(ckpt[key], abs=1e-5), key
    assert onnx["n_rows"] == ckpt["n_rows"] and set(onnx["baselines"]) == set(ckpt["baselines"])
    rc, q = _evaluate(tmp_path, "int8", "--pre", report["files"]["int8"], "--dataset", report["dataset"])
    assert rc == 0 and q["precision"] == "int8" and q["auroc"] == pytest.approx(ckpt["auroc"], abs=0.02)


def _read_dataset(src: str, dst: Path) -> tuple[Path, dict]:
    """The pre dataset ``src`` relabelled as a read dataset (manifest ``stage`` read, the read columns: the
    candidate text as the hit's title, its order as its rank); the Gate scores its rows alike."""
    import datasets

    def hits(split):
        n = len(split)
        split = split.add_column("title", split["query"]).add_column("snippet", [""] * n)
        return split.add_column("rank", split["order"]).add_column("url", [""] * n)

    datasets.DatasetDict({k: hits(v) for k, v in datasets.load_from_disk(src).items()}).save_to_disk(str(dst))
    manifest = dict(json.loads((Path(src) / "manifest.json").read_text()), stage="read")
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst, manifest


def test_evaluate_model_checks_the_datasets_stage_and_encoder(encoder, tmp_path, capsys):
    pre, read = exported(encoder), exported_read(encoder)
    rc, _ = _evaluate(tmp_path, "a", "--read", read["files"]["fp32"], "--dataset", pre["dataset"])
    err = capsys.readouterr().err
    assert rc == 2 and "holds 'pre'-stage decisions" in err and "'read'-stage controller" in err
    read_ds, manifest = _read_dataset(pre["dataset"], tmp_path / "read_ds")
    rc, metrics = _evaluate(tmp_path, "b", "--read", read["files"]["fp32"], "--dataset", str(read_ds))
    assert rc == 0 and metrics["stage"] == "read" and metrics["auroc"] is not None
    rc, _ = _evaluate(tmp_path, "c", "--pre", pre["files"]["fp32"], "--dataset", str(read_ds))
    assert rc == 2 and "holds 'read'-stage decisions" in capsys.readouterr().err
    (read_ds / "manifest.json").write_text(json.dumps(dict(manifest, stage="read", encoder="other/encoder")))
    rc, _ = _evaluate(tmp_path, "d", "--read", read["files"]["fp32"], "--dataset", str(read_ds))
    assert rc == 2 and "other/encoder" in capsys.readouterr().err
