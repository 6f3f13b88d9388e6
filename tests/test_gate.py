"""The torch-free Gate: selection rules, caching, odd input, threads, metadata checks, CLI, protocol."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from export_support import exported, max_abs, relabelled, spy_runs

from branchgate.cli import main
from branchgate.decide import decide
from branchgate.errors import InputError, MismatchError
from branchgate.export.samples import sample_decisions
from branchgate.inference.gate import Gate, Selection
from branchgate.inference.inputs import DecisionState
from branchgate.inference.metadata import check_metadata
from branchgate.inference.model_file import read_metadata

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(encoder) -> str:
    return exported(encoder)["files"]["int8"]


@pytest.fixture(scope="module")
def fp32_model(encoder) -> str:
    """Exact comparisons use fp32: int8's dynamic activation scales depend on what shares the batch."""
    return exported(encoder)["files"]["fp32"]


@pytest.fixture()
def gate(model) -> Gate:
    return Gate.load(model, threads=1)


STATE = {
    "root_query": "Why are honeybee colonies collapsing?",
    "frame_query": "Why are honeybee colonies collapsing?",
    "parent_goal": "",
    "retained": [],
    "depth": 0,
}
CANDS = [
    {"query": "varroa mite treatment efficacy", "goal": "main parasite"},
    {"query": "neonicotinoid field studies", "goal": "pesticides"},
    {"query": "honey prices by country", "goal": ""},
]


def test_empty_input_gives_empty_output(gate):
    sel = gate.select(STATE, [])
    assert sel.kept == [] and len(sel.p_keep) == 0 and sel.fallback is False


def test_one_candidate_is_always_kept(gate):
    for tau in (0.0, 0.5, 1.0):
        sel = gate.select(STATE, CANDS[:1], tau=tau)
        assert sel.kept == [0]
    assert gate.select(STATE, CANDS[:1], tau=1.0).fallback is True


def test_top1_fallback_when_nothing_passes(gate):
    sel = gate.select(STATE, CANDS, tau=1.0)
    assert sel.fallback is True and sel.kept == [int(np.argmax(sel.p_keep))]
    everything = gate.select(STATE, CANDS, tau=0.0)
    assert everything.kept == [0, 1, 2] and everything.fallback is False
    np.testing.assert_allclose(everything.p_keep, sel.p_keep, atol=1e-6)


def test_threshold_and_max_keep_keep_best_in_original_order():
    p = np.array([0.9, 0.2, 0.95, 0.6, 0.7], np.float32)
    u = np.zeros(5, np.float32)
    assert decide(p, 0.5).kept == [0, 2, 3, 4]
    assert decide(p, 0.5, max_keep=2).kept == [0, 2]
    assert decide(p, 0.99).kept == [2] and decide(p, 0.99).fallback
    assert decide(p, 0.99, fallback=False).kept == [] and decide(np.zeros(0), 0.5).kept == []
    assert decide(-p, -0.5, higher_is_better=False).kept == [0, 2, 3, 4]  # lower is better: the same rule mirrored
    d = decide(p, 0.5, max_keep=3)
    sel = Selection(d.kept, p, u, d.fallback, 0.5)
    assert sel.to_json() == {
        "kept": [0, 2, 4],
        "p_keep": pytest.approx(p.tolist()),
        "utility": [0.0] * 5,
        "fallback": False,
    }


def test_default_tau_is_the_models(gate, model):
    assert gate.threshold == gate.tau == float(read_metadata(model)["tau"])
    p = gate.select(STATE, CANDS).p_keep
    assert gate.select(STATE, CANDS).kept == decide(p, gate.tau).kept


def test_a_root_tau_in_the_controller_applies_at_the_root_only(fp32_model, tmp_path):
    from branchgate.decide import threshold_at

    assert (threshold_at(0, 0.2, 0.7), threshold_at(1, 0.2, 0.7), threshold_at(0, 0.2)) == (0.7, 0.2, 0.2)
    assert Gate.load(fp32_model, threads=1).root_tau is None  # exported without one: τ at every depth
    props = dict(read_metadata(fp32_model), root_tau="1.0")
    gate = Gate.load(relabelled(fp32_model, tmp_path, props), threads=1)
    assert (gate.tau, gate.root_tau) == (float(props["tau"]), 1.0)
    root = gate.select(STATE, CANDS)
    assert root.tau == 1.0 and root.fallback and len(root.kept) == 1  # nothing passes 1.0: the top-1
    deep = gate.select(dict(STATE, depth=1), CANDS)
    assert deep.tau == gate.tau and deep.kept == decide(deep.p_keep, gate.tau).kept and len(deep.kept) > 1
    assert gate.select(STATE, CANDS, tau=0.0).kept == [0, 1, 2]  # tau alone applies at every depth
    assert gate.select(STATE, CANDS, root_tau=0.0).kept == [0, 1, 2]  # root_tau alone: the root's
    assert gate.select(dict(STATE, depth=1), CANDS, root_tau=0.0).tau == gate.tau  # ... and the file's τ below
    with pytest.raises(InputError, match="root_tau"):
        gate.select(STATE, CANDS, root_tau=1.5)
    props["root_tau"] = "1.5"
    with pytest.raises(MismatchError, match="metadata root_tau"):
        Gate.load(relabelled(fp32_model, tmp_path, props), threads=1)


def test_state_forms_agree(gate):
    as_dict = gate.select(STATE, CANDS)
    as_obj = gate.select(DecisionState(STATE["root_query"], STATE["frame_query"]), CANDS)
    as_pairs = gate.select(
        {"root_query": STATE["root_query"], "frame_query": STATE["frame_query"]},
        [(c["query"], c["goal"]) for c in CANDS],
    )
    np.testing.assert_allclose(as_dict.p_keep, as_obj.p_keep, atol=1e-6)
    np.testing.assert_allclose(as_dict.p_keep, as_pairs.p_keep, atol=1e-6)
    with pytest.raises(InputError, match=r"candidates\[1\]"):
        gate.select(STATE, [CANDS[0], {"goal": "no query"}])
    with pytest.raises(InputError, match="state.retained"):
        gate.select(dict(STATE, retained="not a list"), CANDS)
    with pytest.raises(InputError, match="max_keep"):
        gate.select(STATE, CANDS, max_keep=0)


def test_cache_makes_work_proportional_to_new_texts(gate):
    seen = spy_runs(gate)
    retained = ["deformed wing virus\nviral mechanisms"]
    cold = gate.select(dict(STATE, retained=retained), CANDS)
    assert seen[-1][0] == 1 + 1 + 3  # root (= frame query), retained, 3 candidates
    more = CANDS + [{"query": "winter losses survey", "goal": "practices"}]
    gate.select(dict(STATE, retained=retained, depth=1), more)
    assert seen[-1][0] == 1  # only the new candidate is encoded
    again = gate.select(dict(STATE, retained=retained), CANDS)
    assert seen[-1][0] == 0  # all cached: the head alone (the tower part is skipped)
    np.testing.assert_allclose(cold.p_keep, again.p_keep, atol=1e-5)
    gate.clear_cache()
    assert gate.cache_len == 0


def test_cache_is_bounded(fp32_model):
    small = Gate.load(fp32_model, cache_size=3)
    small.select(STATE, CANDS)
    assert small.cache_len == 3
    big = Gate.load(fp32_model)
    np.testing.assert_allclose(small.select(STATE, CANDS).p_keep, big.select(STATE, CANDS).p_keep, atol=1e-5)


def test_long_non_english_and_odd_texts(gate):
    cands = [
        {"query": "word " * 5000, "goal": "very long"},
        {"query": "水土流失的原因是什么？", "goal": "中文"},
        {"query": "Почему пчёлы умирают", "goal": ""},
        {"query": "emoji 🐝🐝 \t\n control \x00\x07 chars", "goal": "\u200b zero width"},
        {"query": "lone surrogate \ud800 here", "goal": None},
        {"query": "", "goal": ""},
        {"query": "   ", "goal": "only a goal"},
    ]
    sel = gate.select(dict(STATE, parent_goal="\ud83d broken", retained=["", "x"]), cands)
    assert len(sel.p_keep) == len(cands) and np.all(np.isfinite(sel.p_keep)) and np.all(np.isfinite(sel.utility))
    assert sel.kept
    ids = gate._tokens(["word " * 5000])["input_ids"]
    assert ids.shape == (1, gate.max_length)


def test_thread_safe_shared_gate(fp32_model):
    decisions = sample_decisions()[:5]
    ref = Gate.load(fp32_model, threads=1)
    expected = [ref.select(s, c).p_keep for s, c in decisions]
    # small cache: eviction races with lookups; two threads: text groups share the Gate's worker pool
    shared = Gate.load(fp32_model, cache_size=5, threads=2)
    assert shared.text_groups == 2
    errors, results = [], {}

    def work(tid):
        try:
            for r in range(2):
                for i in range(len(decisions)):
                    j = (i + tid) % len(decisions)
                    results[(tid, r, j)] = shared.select(*decisions[j]).p_keep
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 4 * 2 * len(decisions)
    for (_, _, j), p in results.items():
        assert max_abs(p, expected[j]) <= 1e-5


def test_value_model_protocol(gate):
    from branchgate.models.teachers.base import Items, State, ValueModel
    from branchgate.models.teachers.base import gate as gate_fn
    from branchgate.texts import candidate_text

    assert isinstance(gate, ValueModel) and gate.name == "gate"
    texts = [candidate_text(c["query"], c["goal"]) for c in CANDS]
    dim = gate.dim
    x = Items(texts, np.zeros((3, dim), np.float32))
    state = State(Items([STATE["root_query"]], np.zeros((1, dim))), Items.empty(dim), frame_query=STATE["frame_query"])
    scores = gate.score(x, state)
    np.testing.assert_allclose(scores, gate.select(STATE, CANDS).p_keep, atol=1e-6)
    kept = gate_fn(gate, x, state)
    assert list(kept) == gate.select(STATE, CANDS).kept


# -- metadata ---------------------------------------------------------------------------------------------
GOOD = {
    "branchgate_version": "0.1.0",
    "schema_version": "1",
    "graph_io_version": "1",
    "encoder": "enc",
    "dim": "384",
    "max_length": "256",
    "tau": "0.5",
    "feature_names": '["depth", "order", "n_candidates", "n_retained"]',
    "tokenizer_file": "controller.tokenizer.json",
    "tokenizer_sha256": "0" * 64,
}


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"schema_version": None}, "'schema_version' is missing"),
        ({"encoder": None}, "'encoder' is missing"),
        ({"schema_version": "7"}, "schema_version=7 is newer"),
        ({"schema_version": "one"}, "schema_version='one'"),
        ({"graph_io_version": "9"}, "graph_io_version='9'"),
        ({"branchgate_version": "3.2.0"}, "branchgate_version='3.2.0' is newer"),
        ({"feature_names": '["depth"]'}, "feature_names"),
        ({"feature_names": "not json"}, "feature_names"),
    ],
)
def test_metadata_mismatch_errors_name_the_key(change, needle):
    meta = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(MismatchError, match=needle.replace("[", r"\[")):
        check_metadata(meta, "m.onnx")
    check_metadata(GOOD, "m.onnx")
    with pytest.raises(MismatchError, match="encoder='enc' but 'other' was expected"):
        check_metadata(GOOD, "m.onnx", expected_encoder="other")


def test_load_rejects_a_model_with_a_newer_schema_or_other_encoder(model, tmp_path):
    bad = relabelled(model, tmp_path, dict(read_metadata(model), schema_version="99"))
    with pytest.raises(MismatchError, match="schema_version=99"):
        Gate.load(bad)
    with pytest.raises(MismatchError, match="encoder="):
        Gate.load(model, expected_encoder="BAAI/bge-small-en-v1.5")
    with pytest.raises(Exception, match="no such controller"):
        Gate.load(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(Exception, match="not a loadable ONNX model"):
        Gate.load(tmp_path / "junk.onnx")


def test_tokenizer_must_match_the_model(model, tmp_path):
    import shutil

    shutil.copy(model, tmp_path / "controller.int8.onnx")
    tok = json.loads(Path(model).with_name("controller.tokenizer.json").read_text())
    tok["added_tokens"] = tok["added_tokens"][:-1]
    (tmp_path / "controller.tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(MismatchError, match="tokenizer"):
        Gate.load(tmp_path / "controller.int8.onnx")
    (tmp_path / "controller.tokenizer.json").unlink()
    with pytest.raises(Exception, match="tokenizer file missing"):
        Gate.load(tmp_path / "controller.int8.onnx")


# -- CLI ----------------------------------------------------------------------------------------------------
def _gate_cli(monkeypatch, capsys, model, stdin: str, *extra):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = main(["gate", "--pre", model, *extra])
    return rc, capsys.readouterr()


def test_gate_cli_answers_one_decision(monkeypatch, capsys, model):
    rc, out = _gate_cli(monkeypatch, capsys, model, json.dumps({"state": STATE, "candidates": CANDS, "tau": 1.0}))
    assert rc == 0
    ans = json.loads(out.out)
    assert set(ans) == {"kept", "p_keep", "utility", "fallback"}
    assert len(ans["kept"]) == 1 and ans["fallback"] is True and len(ans["p_keep"]) == len(ans["utility"]) == 3
    rc, out = _gate_cli(monkeypatch, capsys, model, json.dumps({"state": STATE, "candidates": []}))
    assert rc == 0 and json.loads(out.out) == {"kept": [], "p_keep": [], "utility": [], "fallback": False}
    lines = "\n".join(json.dumps({"state": STATE, "candidates": CANDS, "max_keep": 1}) for _ in range(3))
    rc, out = _gate_cli(monkeypatch, capsys, model, lines, "--jsonl", "--tau", "0")
    answers = [json.loads(x) for x in out.out.splitlines()]
    assert rc == 0 and len(answers) == 3 and all(len(a["kept"]) == 1 for a in answers)


@pytest.mark.parametrize(
    "stdin,field",
    [
        ("{not json", "invalid JSON"),
        ("", "invalid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"candidates": CANDS}), "'state'"),
        (json.dumps({"state": STATE}), "'candidates'"),
        (json.dumps({"state": {"frame_query": "x"}, "candidates": CANDS}), "'state.root_query'"),
        (json.dumps({"state": dict(STATE, retain=[]), "candidates": CANDS}), "state.retain"),
        (json.dumps({"state": dict(STATE, depth="deep"), "candidates": CANDS}), "'state.depth'"),
        (json.dumps({"state": STATE, "candidates": [{"query": "a"}, {"goal": "b"}]}), "'candidates[1].query'"),
        (json.dumps({"state": STATE, "candidates": "abc"}), "'candidates'"),
        (json.dumps({"state": STATE, "candidates": CANDS, "tau": 2}), "'tau'"),
        (json.dumps({"state": STATE, "candidates": CANDS, "max_keep": 0}), "'max_keep'"),
    ],
)
def test_gate_cli_bad_input_exits_2_naming_the_field(monkeypatch, capsys, model, stdin, field):
    rc, out = _gate_cli(monkeypatch, capsys, model, stdin)
    assert rc == 2
    assert field in out.err and out.out == ""


def test_gate_module_imports_and_runs_without_torch(model):
    code = (
        "import sys, json\n"
        "sys.modules['torch'] = None\n"  # any 'import torch' now fails
        "for name in ('sentence_transformers', 'transformers', 'datasets', 'lightning'):\n"
        "    sys.modules[name] = None\n"
        "import branchgate.inference.gate as g, branchgate.inference.agents.adapters\n"
        "import branchgate.inference.agents.gpt_researcher\n"
        "import branchgate.inference.gate_cli\n"
        "gate = g.Gate.load(sys.argv[1])\n"
        "sel = gate.select({'root_query': 'bees'}, [{'query': 'varroa', 'goal': 'mites'}, 'pesticides'])\n"
        "print(json.dumps(sel.to_json()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(json.loads(proc.stdout)["p_keep"]) == 2


def test_gate_without_cache_still_works(fp32_model):
    nocache = Gate.load(fp32_model, cache_size=0, threads=1)
    a = nocache.select(STATE, CANDS)
    assert nocache.cache_len == 0
    emb = nocache.embed(["varroa", "", "varroa"])
    assert np.all(emb[1] == 0) and np.allclose(emb[0], emb[2]) and abs(np.linalg.norm(emb[0]) - 1) < 1e-5
    np.testing.assert_allclose(a.p_keep, Gate.load(fp32_model, threads=1).select(STATE, CANDS).p_keep, atol=1e-5)


def test_length_bucketing_saves_padding_without_changing_results(fp32_model):
    from branchgate.inference.schedule import length_buckets

    groups = length_buckets(np.array([20, 22, 120, 21, 118]))
    assert [sorted(g.tolist()) for g in groups] == [[0, 1, 3], [2, 4]]
    long_frame = "Previous research goal: " + " ".join(f"aspect{i} of colony collapse" for i in range(40))
    state = dict(STATE, frame_query=long_frame)
    bucketed = Gate.load(fp32_model, threads=1, bucketing=True)
    widths = spy_runs(bucketed)
    a = bucketed.select(state, CANDS)
    assert len(widths) == 2 and widths[0][0] == 4 and widths[0][1] < 20 and widths[1][0] == 1  # short texts first
    b = Gate.load(fp32_model, threads=1, bucketing=False).select(state, CANDS)
    np.testing.assert_allclose(a.p_keep, b.p_keep, atol=1e-5)
    np.testing.assert_allclose(
        bucketed.embed([long_frame, "x", "varroa"]),
        Gate.load(fp32_model, bucketing=False).embed([long_frame, "x", "varroa"]),
        atol=1e-5,
    )
