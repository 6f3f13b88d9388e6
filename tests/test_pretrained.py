"""The pretrained controllers (``branchgate.pretrained``): packaged, loadable by name, answering decisions."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest

from branchgate.cli import main
from branchgate.errors import InputError
from branchgate.inference.gate import Gate
from branchgate.inference.teacher_gate import TeacherGate
from branchgate.pretrained import MODEL_FILE, NAMES, STAGES, choice, folder

SIZE_LIMIT_MB = 60  # every packaged pretrained file together (two int8 controllers, their tokenizer, cards)
PRE_STATE = {"root_query": "Why are honeybee colonies collapsing?", "frame_query": "", "parent_goal": "",
             "retained": ["varroa mites\nparasites"], "depth": 1}  # fmt: skip
PRE_CANDS = [{"query": "neonicotinoid field studies", "goal": "pesticides"}, {"query": "honey prices by country"},
             {"query": "蜜蜂 病毒"}]  # fmt: skip
READ_STATE = {"root_query": "Why are honeybee colonies collapsing?", "query": "varroa mite bee deaths", "goal": "",
              "read": [{"title": "Varroa destructor", "snippet": "a parasitic mite of honey bees", "id": "u0"}],
              "depth": 1}  # fmt: skip
HITS = [
    {"title": "Varroa destructor", "snippet": "a parasitic mite of honey bees", "id": "u0", "rank": 0},
    {"title": "Colony collapse disorder", "snippet": "worker bees disappear from a hive", "id": "u1", "rank": 1},
    {"title": "Honey prices 2020", "snippet": "wholesale prices by country", "id": "u2", "rank": 2},
]


def _never(gate) -> float:
    """A τ no candidate passes: p_keep is below 1.0 for a model; a teacher's scores are below 1e9."""
    return 1e9 if isinstance(gate, TeacherGate) else 1.0


@pytest.fixture(scope="module")
def gates():
    return {n: Gate.load(f"pretrained:{n}", threads=1) for n in NAMES}


def test_packaged_files_are_int8_only_and_small():
    root = folder("pre").parent
    files = [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    onnx = sorted(p.relative_to(root).as_posix() for p in files if p.suffix == ".onnx")
    assert onnx == [f"{s}/{MODEL_FILE}" for s in STAGES]  # no fp32 twin shipped
    for stage in STAGES:
        for name in ("card.md", "choice.json"):
            assert (folder(stage) / name).is_file(), (stage, name)
    total = sum(p.stat().st_size for p in files) / 2**20
    assert total < SIZE_LIMIT_MB, f"packaged pretrained files {total:.1f} MB > {SIZE_LIMIT_MB} MB"


@pytest.mark.parametrize("stage", STAGES)
def test_stage_metadata_and_default_follow_choice(gates, stage):
    c = choice(stage)
    assert c["default"] in ("model", "teacher") and c["teacher"] in c["teacher_taus"]
    assert isinstance(gates[f"{stage}-model"], Gate) and gates[f"{stage}-model"].stage == stage
    assert gates[f"{stage}-model"].meta["precision"] == "int8"
    assert isinstance(gates[f"{stage}-teacher"], TeacherGate) and gates[f"{stage}-teacher"].stage == stage
    assert gates[f"{stage}-teacher"].tau == pytest.approx(c["teacher_taus"][c["teacher"]])
    want = Gate if c["default"] == "model" else TeacherGate
    assert type(gates[stage]) is want and gates[stage].stage == stage


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("pre")])
def test_pre_select(gates, name):
    sel = gates[name].select(PRE_STATE, PRE_CANDS)
    assert sel.kept and all(0 <= i < 3 for i in sel.kept) and len(sel.p_keep) == 3 and np.isfinite(sel.p_keep).all()
    assert gates[name].select(PRE_STATE, PRE_CANDS, tau=_never(gates[name])).fallback


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("read")])
def test_read_select(gates, name):
    sel = gates[name].select(READ_STATE, HITS)
    assert sel.not_new == [0] and 0 not in sel.kept and np.isnan(sel.p_keep[0]) and np.isfinite(sel.p_keep[1:]).all()
    none = gates[name].select(READ_STATE, HITS, tau=_never(gates[name]))
    assert none.kept == [] and not none.fallback  # a read decision may read nothing
    root = gates[name].select({**READ_STATE, "depth": 0}, HITS, tau=_never(gates[name]), floor="root")
    assert len(root.kept) == 1 and root.fallback


def test_teacher_gate_scores_are_the_teachers_on_the_towers_embeddings(gates):
    from branchgate.models.teachers import Items, State, get

    tg = gates["pre-teacher"]
    texts = ["neonicotinoid field studies\npesticides", "honey prices by country"]
    sel = tg.select(PRE_STATE, [{"query": "neonicotinoid field studies", "goal": "pesticides"}, texts[1]])
    emb = tg.gate.embed([PRE_STATE["root_query"], PRE_STATE["retained"][0], *texts])
    x = Items(texts, emb[2:])
    state = State(Items([PRE_STATE["root_query"]], emb[:1]), Items(PRE_STATE["retained"], emb[1:2]), "", "", 1,
                  {"pool": x})  # fmt: skip
    np.testing.assert_allclose(sel.p_keep, get(tg.teacher.name).score(x, state), atol=1e-5)
    keep = [i for i, s in enumerate(sel.p_keep) if s >= tg.tau]
    assert sel.kept == (keep or [int(np.argmax(sel.p_keep))])


def test_unknown_name_lists_the_names():
    with pytest.raises(InputError) as err:
        Gate.load("pretrained:post")
    assert all(n in str(err.value) for n in NAMES)


def test_gate_cli_pretrained_read(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"state": READ_STATE, "hits": HITS})))
    assert main(["gate", "--read", "pretrained:read"]) == 0
    ans = json.loads(capsys.readouterr().out)
    assert ans["stage"] == "read" and ans["not_new"] == [0] and ans["p_keep"][0] is None and 0 not in ans["kept"]
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"state": PRE_STATE, "candidates": PRE_CANDS})))
    assert main(["gate", "--pre", "pretrained:nope"]) == 2
    assert "pre-model" in capsys.readouterr().err  # an unknown name: exit 2, the names listed
