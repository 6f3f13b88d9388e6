"""Environment building: DeepResearchGym and MuSiQue layouts, span labelling, chunking, bad folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from branchgate.cli import main
from branchgate.errors import InputError
from branchgate.logs_to_dataset.spans import normalize
from branchgate.pipeline import env as envmod
from branchgate.pipeline import env_build

SKY_DOC = (
    "Why is the sky blue? It is a question children ask.  Sunlight is scattered by the molecules of the air,\n"
    "and blue light scatters more than red light. The sky looks \u201cblue\u201d because of Rayleigh scattering. "
    "Violet light scatters even more, but our eyes are less sensitive to it. Clouds are white because water "
    "droplets scatter all colours equally. "
    + " ".join(f"Filler sentence number {i} talks about weather." for i in range(12))
)
DISTRACTOR = " ".join(
    f"Honeybees visit flowers and sentence {i} describes nectar collection in hives." for i in range(30)
)


def write_drgym(root: Path) -> Path:
    (root / "queries").mkdir(parents=True)
    (root / "key_point").mkdir()
    (root / "Searcho1_ClueWeb22").mkdir()
    (root / "queries" / "researchy_queries_sample_doc_click.jsonl").write_text(
        '{"id": "q1", "query": "why is the sky blue"}\nnot json\n{"id": "q2", "query": "how do bees make honey"}\n'
        '{"id": "q3", "query": "a query without key points"}\n'
    )
    kp = {
        "question": "why is the sky blue",
        "key_points": {
            "docA": [
                {
                    "point_number": 1,
                    "point_content": "Air molecules scatter blue light more.",
                    "spans": [
                        (
                            "Sunlight is scattered by the molecules of the air, "
                            "and blue light scatters more than red light."
                        )
                    ],
                },
                {
                    "point_number": 2,
                    "point_content": "Rayleigh scattering.",
                    "spans": ['The sky looks "blue" because of Rayleigh scattering.'],
                },
            ],
            "null": [],
            "docB": [
                {
                    "point_number": 1,
                    "point_content": "Sunsets are red.",
                    "spans": ["At sunset light crosses more air, so the reds dominate the evening sky."],
                }
            ],
        },
    }
    agg = {
        "question": "why is the sky blue",
        "key_points": [
            {
                "point_number": 1,
                "point_content": "Scattering by air molecules favours blue light.",
                "original_point_number": [1, 3],
            },
            {"point_number": 2, "point_content": "This is Rayleigh scattering.", "original_point_number": [2]},
            {"point_number": 3, "point_content": "A point with no source.", "original_point_number": []},
        ],
    }
    (root / "key_point" / "q1.json").write_text(json.dumps(kp))
    (root / "key_point" / "q1_aggregated.json").write_text(json.dumps(agg))
    kp2 = {
        "question": "how do bees make honey",
        "key_points": {
            "docC": [
                {
                    "point_number": 1,
                    "point_content": "Bees regurgitate nectar.",
                    "spans": ["Bees regurgitate nectar into the honeycomb cells."],
                }
            ]
        },
    }
    agg2 = {
        "question": "how do bees make honey",
        "key_points": [{"point_number": 1, "point_content": "Nectar is regurgitated.", "original_point_number": [1]}],
    }
    (root / "key_point" / "q2.json").write_text(json.dumps(kp2))
    (root / "key_point" / "q2_aggregated.json").write_text(json.dumps(agg2))
    (root / "Searcho1_ClueWeb22" / "q1.a").write_text(
        "Thinking...\n<|begin_search_query|>sky blue<|end_search_query|>\n<|begin_search_result|>"
        f"Doc 1 (URL: http://a.example, ClueWebID: docA)\n{SKY_DOC}\n"
        f"Doc 2 (URL: http://x.example, ClueWebID: docX)\n{DISTRACTOR}\n<|end_search_result|>\nDone."
    )
    return root


def test_drgym_build_labels_spans_and_reports_unreachable(tmp_path):
    src = write_drgym(tmp_path / "src")
    out = env_build.build_drgym([str(src)], tmp_path / "env", chunk_words=20, progress=False)
    m = json.loads((out / "manifest.json").read_text())
    env = envmod.load(out)
    assert [q.id for q in env.queries] == ["q1", "q2"]  # q3 has no key-point files: skipped, reported
    reasons = " ".join(s["reason"] for s in m["skipped"])
    assert "invalid JSON" in reasons and "q3" in reasons
    assert m["reachable_kpr"]["per_query"] == {"q1": pytest.approx(2 / 3, abs=1e-3), "q2": 1.0}
    assert [u["key_point"] for u in m["unreachable_key_points"]["items"]] == ["q1#3"]
    # every span sits whole inside the passage that carries its key point (never split across passages)
    spans = {
        "q1#1": [
            "Sunlight is scattered by the molecules of the air, and blue light scatters more than red light.",
            "At sunset light crosses more air, so the reds dominate the evening sky.",
        ],
        "q1#2": ['The sky looks "blue" because of Rayleigh scattering.'],
        "q2#1": ["Bees regurgitate nectar into the honeycomb cells."],
    }
    for kp, texts in spans.items():
        for span in texts:
            holders = [i for i, t in enumerate(env.texts) if normalize(span) in normalize(t)]
            assert holders, span
            assert all(kp in env.labels[i] for i in holders)
    labelled = [i for i, lab in enumerate(env.labels) if lab]
    assert all(env.docs[i] in ("docA", "docB", "docC") for i in labelled)
    assert any(env.docs[i] == "docX" for i in range(len(env.ids)))  # distractor passages exist, unlabelled
    assert all(not env.labels[i] for i in range(len(env.ids)) if env.docs[i] == "docX")
    assert m["passage_words"]["relevant"]["n"] == len(labelled)
    assert m["notes"]["spans_located_in_full_text"] == 2 and m["notes"]["spans_from_span_only_docs"] == 2


def test_drgym_bm25_finds_labelled_passage(tmp_path):
    out = env_build.build_drgym([str(write_drgym(tmp_path / "src"))], tmp_path / "env", chunk_words=20, progress=False)
    env = envmod.load(out)
    hits = env.bm25.search("bees regurgitate nectar honeycomb", 3)
    assert hits and "q2#1" in env.labels[hits[0][0]]
    assert env.bm25.search("zzzz qqqq", 3) == []


def test_drgym_several_sources_merge(tmp_path):
    a = write_drgym(tmp_path / "a")
    b = tmp_path / "b"
    (b / "queries").mkdir(parents=True)
    (b / "key_point").mkdir()
    (b / "queries" / "q.jsonl").write_text(
        '{"id": "q9", "query": "what is rust"}\n{"id": "q1", "query": "why is the sky blue"}\n'
    )
    (b / "key_point" / "q9.json").write_text(
        json.dumps(
            {
                "key_points": {
                    "docR": [
                        {"point_number": 1, "point_content": "x", "spans": ["Rust is iron oxide formed by corrosion."]}
                    ]
                }
            }
        )
    )
    (b / "key_point" / "q9_aggregated.json").write_text(
        json.dumps(
            {"key_points": [{"point_number": 1, "point_content": "Rust is iron oxide.", "original_point_number": [1]}]}
        )
    )
    env = envmod.load(env_build.build_drgym([str(a), str(b)], tmp_path / "env", progress=False))
    assert [q.id for q in env.queries] == ["q1", "q2", "q9"]  # the repeated q1 is kept once
    assert any("q9#1" in lab for lab in env.labels)


def test_bad_env_folders_give_clear_errors(tmp_path, capsys):
    with pytest.raises(InputError, match="not a directory"):
        env_build.build_drgym([str(tmp_path / "nope")], tmp_path / "env", progress=False)
    bad = tmp_path / "bad"
    (bad / "queries").mkdir(parents=True)
    with pytest.raises(InputError, match=r"missing key_point/"):
        env_build.build_drgym([str(bad)], tmp_path / "env", progress=False)
    (bad / "key_point").mkdir()
    with pytest.raises(InputError, match=r"queries/ has no \*\.jsonl"):
        env_build.build_drgym([str(bad)], tmp_path / "env", progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="missing manifest.json"):
        envmod.load(empty)
    with pytest.raises(InputError, match="not found"):
        envmod.load(tmp_path / "missing")
    # the CLI turns it into one line naming the folder, exit code 2
    assert main(["env", "build", "--format", "drgym", "--src", str(bad / "queries"), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "branchgate: error:" in err and str(bad / "queries") in err
    assert not (tmp_path / "e").exists()


def test_broken_key_point_file_is_skipped_and_reported(tmp_path):
    src = write_drgym(tmp_path / "src")
    (src / "key_point" / "q2_aggregated.json").write_text("{ not json")
    out = env_build.build_drgym([str(src)], tmp_path / "env", progress=False)
    m = json.loads((out / "manifest.json").read_text())
    assert m["n_queries"] == 1
    assert any(s["file"].endswith("q2_aggregated.json") and "invalid JSON" in s["reason"] for s in m["skipped"])


def test_pack_never_splits_protected_atoms():
    atoms = [
        env_build.Atom("a " * 5),
        env_build.Atom("b " * 30, {"k"}, True),
        env_build.Atom("c " * 5),
        env_build.Atom("d " * 12),
    ]
    chunks = env_build.pack(env_build.split_long(atoms, 10), lambda: 10)
    joined = [c.text for c in chunks]
    assert any(("b " * 30).strip() in t for t in joined)
    assert sum(c.words for c in chunks) == 52
    assert [c.labels for c in chunks if "b" in c.text.split()] == [{"k"}]


def test_musique_build(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    q = json.loads((Path(__file__).parent / "fixtures" / "musique" / "one_question.json").read_text())
    (src / "musique_x.json").write_text(json.dumps([q, {"id": "broken"}]))
    env = envmod.load(env_build.build_musique([str(src)], tmp_path / "env"))
    assert [k["id"] for k in env.queries[0].key_points] == ["2hop_1#1", "2hop_1#2"]
    by_title = {env.docs[i]: env.labels[i] for i in range(len(env.ids))}
    assert by_title == {"Widget": ["2hop_1#1"], "Acme Corp": ["2hop_1#2"], "Other": []}
    m = json.loads((tmp_path / "env" / "manifest.json").read_text())
    assert m["reachable_kpr"]["mean"] == 1.0 and len(m["skipped"]) == 1
    with pytest.raises(InputError, match="manifest.json: expected a JSON list"):
        env_build.build_musique([str(tmp_path / "env")], tmp_path / "env2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no \\*.json file"):
        env_build.build_musique([str(tmp_path / "empty")], tmp_path / "env2")


def test_bundled_sample_loads():
    env = envmod.load("sample")
    m = env.manifest
    assert 30 <= m["n_queries"] <= 60 and m["license"] == "CC BY 4.0"
    assert m["reachable_kpr"]["mean"] == 1.0
    assert sum(p.stat().st_size for p in env.path.rglob("*") if p.is_file()) < 400_000
    assert env.bm25.search(env.queries[0].query, 5)


@pytest.mark.shared
def test_real_drgym_subset_is_reachable_and_length_balanced(tmp_path, shared):
    src = shared("drgym")
    out = env_build.build_drgym([str(src)], tmp_path / "env", max_queries=4, progress=False)
    m = json.loads((out / "manifest.json").read_text())
    assert m["n_queries"] >= 3
    assert m["reachable_kpr"]["mean"] >= 0.99
    rel, oth = m["passage_words"]["relevant"], m["passage_words"]["other"]
    assert abs(rel["median"] - oth["median"]) <= 0.15 * rel["median"]


def test_dense_retriever_over_cached_embeddings(tmp_path, encoder, monkeypatch):
    from branchgate.errors import BranchgateError
    from branchgate.pipeline.config import Config
    from branchgate.pipeline.retrieve import DenseIndex
    from branchgate.pipeline.simulate import simulate

    monkeypatch.setenv("BRANCHGATE_CACHE", str(tmp_path / "cache"))
    out = env_build.build_drgym([str(write_drgym(tmp_path / "src"))], tmp_path / "env", chunk_words=20, progress=False)
    env = envmod.load(out)
    with pytest.raises(BranchgateError, match="no dense embeddings"):
        env.dense(encoder.id)
    DenseIndex.build(out, env.texts, encoder.encode, encoder.id)
    hits = envmod.load(out).dense(encoder.id).search_vector(encoder.encode(["how do bees make honey"])[0], 2)
    assert "q2#1" in env.labels[hits[0][0]] or "q2#1" in env.labels[hits[1][0]]
    s = simulate(
        str(out),
        Config(depth=1, retriever="dense", encoder="packaged"),
        tmp_path / "t",
        runs=2,
        progress=False,
        encoder=encoder,
    )
    assert s["n_runs"] == 2 and s["kpr"]["mean"] > 0
