"""``dataset build --stage read``: one row per new hit of each search's result list (logs_to_dataset/read_rows.py),
its columns and manifest, labels by key points, citations and teachers, the state stored on a decision's first
row, training batches and the controller's ``stage``; the pre stage is unchanged by a trace's read events."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from branchgate.cli import main
from branchgate.data.dataset_schema import DATASET_SCHEMA_VERSION, READ_COLUMNS, columns, dataset_stage
from branchgate.errors import InputError
from branchgate.logs_to_dataset.build import build
from branchgate.logs_to_dataset.traces import TraceWriter
from branchgate.models.teachers import NAMES
from branchgate.texts import hit_text

FIX = Path(__file__).parent / "fixtures"
SPLIT_RUNS = {"run-0": "train", "run-1": "train", "run-4": "validation", "run-16": "test"}  # split_of(run_id)


def _hits(*ids: str) -> list[dict]:
    return [{"hit_id": h, "title": f"Title {h}", "snippet": f"snippet about {h}", "rank": r} for r, h in enumerate(ids)]


def _ev(eid: str, hit: str, labels: list[str] | None) -> tuple[str, dict]:
    return "evidence", {
        "evidence_id": eid,
        "text": f"the full page of {hit}, which says {eid}",
        "hit_id": hit,
        "labels": labels,
    }


# Two searches. The first: d1, d2, d3 (all new; d2 skipped). The second, after d1 and d3 were read: d4, d1 (not
# new: no row), d5 (no evidence: unlabelled), d6. Key points: context of the second = e1, e3 = {k1, k2, k4}.
STEPS = [
    ("run_start", {"root_query": "why do cats purr"}),
    ("frame_open", {"frame_id": "f0", "depth": 0, "frame_query": "why do cats purr"}),
    ("candidate", {"frame_id": "f0", "candidate_id": "c0", "query": "cat purring", "goal": "mechanism"}),
    ("candidate", {"frame_id": "f0", "candidate_id": "c1", "query": "cat sounds"}),
    ("decision", {"candidate_id": "c0", "action": "expand"}),
    ("results", {"candidate_id": "c0", "query": "cat purring", "hits": _hits("d1", "d2", "d3")}),  # seq 5
    ("read", {"candidate_id": "c0", "hit_id": "d1", "action": "read"}),
    ("read", {"candidate_id": "c0", "hit_id": "d2", "action": "skip"}),
    ("read", {"candidate_id": "c0", "hit_id": "d3", "action": "read"}),
    _ev("e1", "d1", ["k1", "k2"]),
    _ev("e2", "d2", ["k2"]),
    _ev("e3", "d3", ["k4"]),
    ("retrieval", {"candidate_id": "c0", "query": "cat purring", "evidence_ids": ["e1", "e3"]}),
    ("frame_open", {"frame_id": "f1", "depth": 1, "parent_candidate": "c0", "frame_query": "cat purring"}),
    ("candidate", {"frame_id": "f1", "candidate_id": "c2", "query": "purring frequency", "goal": "numbers"}),
    ("decision", {"candidate_id": "c2", "action": "expand"}),
    ("results", {"candidate_id": "c2", "query": "purring frequency", "hits": _hits("d4", "d1", "d5", "d6")}),  # 16
    ("read", {"candidate_id": "c2", "hit_id": "d4", "action": "read"}),
    ("read", {"candidate_id": "c2", "hit_id": "d1", "action": "skip"}),
    ("read", {"candidate_id": "c2", "hit_id": "d5", "action": "skip", "actor": "budget"}),
    ("read", {"candidate_id": "c2", "hit_id": "d6", "action": "read"}),
    _ev("e4", "d4", ["k1", "k6"]),
    _ev("e6", "d6", ["k6", "k7"]),
    ("retrieval", {"candidate_id": "c2", "query": "purring frequency", "evidence_ids": ["e4", "e6"]}),
    ("report", {"text": "cats purr", "evidence_ids": ["e1", "e4"], "cited_ids": ["e1", "d6"]}),
    ("run_end", {"status": "ok"}),
]
FIRST, SECOND = "c0@5", "c2@16"


def _write(path: Path, run_ids=tuple(SPLIT_RUNS), steps=STEPS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with TraceWriter(path) as w:
        for run_id in run_ids:
            for etype, fields in steps:
                w.write(type=etype, run_id=run_id, **fields)
    return path


def _frame(out) -> object:
    import pandas as pd
    from datasets import load_from_disk

    ds = load_from_disk(str(out))
    return pd.concat([ds[s].to_pandas().assign(split=s) for s in ds], ignore_index=True)


def _build(tmp_path, traces, name="ds", **options):
    out = tmp_path / name
    manifest = build([traces], out, cache=tmp_path / "emb.sqlite", progress=False, **options)
    return manifest, out


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("read") / "traces" / "runs.jsonl")


@pytest.fixture(scope="module")
def keypoints_build(traces, encoder, tmp_path_factory):
    """The four runs at the read stage with key-point labels."""
    out = tmp_path_factory.mktemp("kp") / "ds"
    cache = out.parent / "emb.sqlite"
    manifest = build([traces], out, encoder_obj=encoder, cache=cache, progress=False, stage="read", labels="keypoints")
    return manifest, out, _frame(out)


def test_manifest_and_columns_of_a_read_dataset(keypoints_build):
    from datasets import load_from_disk

    manifest, out, _ = keypoints_build
    assert manifest["stage"] == "read" and manifest["schema_version"] == DATASET_SCHEMA_VERSION == 2
    assert manifest["columns"] == columns(NAMES, "read") and set(READ_COLUMNS) <= set(manifest["columns"])
    assert set(READ_COLUMNS).isdisjoint(columns(NAMES))  # the pre stage has none of them
    ds = load_from_disk(str(out))
    for split in ds:
        assert ds[split].column_names == list(columns(NAMES, "read"))
    f = ds["train"].features
    assert f["rank"].dtype == "int32" and f["title"].dtype == f["url"].dtype == "string"
    assert manifest["read"] == {
        "runs_without_results": 0,
        "read_points": 8,
        "read_points_with_new_hits": 8,
        "hits": 28,
        "new_hits": 24,
        "unlabelled_hits": 4,
    }
    assert manifest["n_decisions"] == {"train": 12, "validation": 6, "test": 6, "total": 24}
    assert manifest["n_frames"]["total"] == 8 and manifest["run_problems"] == {}
    assert manifest["deferral"]["dropped_by_budget"] == 4  # d5, skipped by actor budget, in each run
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_one_row_per_new_hit_in_rank_order(keypoints_build):
    _, _, df = keypoints_build
    run = df[df.run_id == "run-0"]
    assert list(zip(run.frame_id, run.candidate_id, run.order, run.n_candidates, run["rank"])) == [
        (FIRST, "d1", 0, 3, 0),
        (FIRST, "d2", 1, 3, 1),
        (FIRST, "d3", 2, 3, 2),
        (SECOND, "d4", 0, 3, 0),  # d1 (rank 1) was read before: no row
        (SECOND, "d5", 1, 3, 2),
        (SECOND, "d6", 2, 3, 3),
    ]
    assert list(run["query"]) == [
        hit_text(f"Title {h}", f"snippet about {h}") for h in ("d1", "d2", "d3", "d4", "d5", "d6")
    ]
    assert set(run.goal) == {""} and set(run.url) == {""} and list(run.title)[0] == "Title d1"
    assert list(run.expanded) == [True, False, True, True, False, True]
    assert list(run.frame_query) == ["cat purring"] * 3 + ["purring frequency"] * 3
    assert list(run.parent_goal) == ["mechanism"] * 3 + ["numbers"] * 3
    assert list(run.depth) == [0] * 3 + [1] * 3 and set(run.root_query) == {"why do cats purr"}
    assert dict(zip(df.run_id, df.split)) == SPLIT_RUNS


def test_retained_on_the_first_row_only_and_n_retained_on_every_row(keypoints_build):
    _, _, df = keypoints_build
    run = df[df.run_id == "run-0"]
    read_before = [hit_text("Title d1", "snippet about d1"), hit_text("Title d3", "snippet about d3")]
    assert [list(r) for r in run.retained] == [[], [], [], read_before, [], []]
    assert list(run.n_retained) == [0, 0, 0, 2, 2, 2]


def test_build_decisions_groups_a_read_dataset(keypoints_build):
    from branchgate.data.decision_batches import TextTable, build_decisions, load_decision_dataset
    from branchgate.features import FEATURE_NAMES

    _, out, _ = keypoints_build
    dsd, manifest = load_decision_dataset(out)
    assert dataset_stage(manifest) == "read"
    texts = TextTable()
    dset = build_decisions("train", dsd["train"], texts)
    rows = dsd["train"].to_pandas()
    assert len(dset) == 4 and list(np.diff(dset.cand_ptr)) == [3, 3, 3, 3]  # two runs, two read points each
    # the state comes from each decision's first row: the retained texts of the second search, 2 per run
    assert list(np.diff(dset.ret_ptr)) == [0, 2, 0, 2]
    assert [texts.texts[i] for i in dset.ret_ids[:2]] == list(rows.retained[3])
    # the structured features the batches use equal the stored columns, n_retained included
    stored = rows[list(FEATURE_NAMES)].to_numpy()[dset.row]
    assert np.array_equal(dset.features, stored.astype(np.float32))
    assert [texts.texts[i] for i in dset.cand_ids[:3]] == list(rows["query"][:3])


def test_keypoint_labels(keypoints_build):
    manifest, _, df = keypoints_build
    run = df[df.run_id == "run-0"]
    util = [None if math.isnan(u) else u for u in run.utility]
    assert util == [2.0, 0.0, 1.0, 1.0, None, 1.0]  # d5 has no full text; d6's k6 is covered by d4 above it
    assert list(run.label) == [1, 0, 1, 1, -1, 1]
    assert list(run.label_source) == ["realized"] * 4 + ["excluded", "realized"]
    assert set(df.utility_kind) == {"keypoints"} and manifest["label_threshold"] == 1.0
    assert manifest["labels"]["train"] == {"-1": 2, "0": 2, "1": 8}


def test_unlabelled_hits_take_the_teacher_pre_label_on_request(traces, encoder, tmp_path):
    manifest, out = _build(
        tmp_path, traces, encoder_obj=encoder, stage="read", labels="keypoints", pruned_labels="teacher_pre"
    )
    run = _frame(out).query("run_id == 'run-0'")
    assert list(run.label_source) == ["realized"] * 4 + ["teacher_pre", "realized"]
    assert run.label.iloc[4] in (0, 1) and manifest["read"]["unlabelled_hits"] == 4


def test_citation_labels(traces, encoder, tmp_path):
    manifest, out = _build(tmp_path, traces, encoder_obj=encoder, stage="read", labels="citations")
    run = _frame(out).query("run_id == 'run-0'")
    util = [None if math.isnan(u) else u for u in run.utility]
    # the report cites e1 (d1's evidence) and the hit id d6; d5 has no full text
    assert util == [1.0, 0.0, 0.0, 0.0, None, 1.0] and list(run.label) == [1, 0, 0, 0, -1, 1]
    assert manifest["label_kind"] == "citations" and manifest["label_threshold"] == 1.0
    # a run whose report cites nothing of it is counted and its hits are excluded
    steps = [(t, {**f, "cited_ids": ["elsewhere"]}) if t == "report" else (t, f) for t, f in STEPS]
    manifest, out = _build(
        tmp_path,
        _write(tmp_path / "t2" / "r.jsonl", ["run-0"], steps),
        "ds2",
        encoder_obj=encoder,
        stage="read",
        labels="citations",
    )
    assert manifest["label_missing"]["citations"]["runs"] == 1 and set(_frame(out).label) == {-1}


def _items(encoder, texts, tokens=None):
    from branchgate.models.teachers import Items

    return Items(list(texts), np.asarray(encoder.encode(list(texts)), np.float32), tokens)


def test_teacher_labels_and_columns_are_the_pre_stage_functions(traces, encoder, tmp_path):
    from branchgate.models import teachers as T

    manifest, out = _build(tmp_path, traces, encoder_obj=encoder, stage="read", labels="teacher:sc")
    df = _frame(out)
    run = df[df.run_id == "run-0"]
    sc = T.get("sc")
    page = {
        h: f"the full page of {h}, which says {e}" for h, e in (("d1", "e1"), ("d3", "e3"), ("d4", "e4"), ("d6", "e6"))
    }

    def evidence(hs):
        return _items(encoder, [page[h] for h in hs], np.array([len(page[h].split()) for h in hs], np.float64))

    # the second search: context = d1's and d3's pages; pool = the context and the new hits' pages
    q = _items(encoder, ["why do cats purr"])
    state = T.State(
        q, evidence(["d1", "d3"]), "purring frequency", "numbers", 1, {"pool": evidence(["d1", "d3", "d4", "d6"])}
    )
    second = run[run.frame_id == SECOND]
    for hit in ("d4", "d6"):
        expected = T.set_gain(sc, evidence([hit]), state)
        assert second[second.candidate_id == hit].utility.item() == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert math.isnan(second[second.candidate_id == "d5"].utility.item())
    assert manifest["label_kind"] == "teacher:sc" and manifest["label_threshold_rule"].startswith("positive rate 0.1")
    # teacher_<name>: every teacher's score of the new hits' texts against the read hits' texts, as at the pre stage
    x = _items(encoder, list(second["query"]))
    pre_state = T.State(
        q, _items(encoder, list(second.retained.iloc[0])), "purring frequency", "numbers", 1, {"pool": x}
    )
    for name in NAMES:
        want = np.asarray(T.get(name).score(x, pre_state), np.float64)
        assert np.allclose(second[f"teacher_{name}"].to_numpy(np.float64), want, atol=1e-5), name
    # auto: key points where a run has them, else the teacher
    m_auto, _ = _build(tmp_path, traces, "auto", encoder_obj=encoder, stage="read")
    assert m_auto["label_kinds"] == {"keypoints": 24}
    steps = [(t, {**f, "labels": None}) if t == "evidence" else (t, f) for t, f in STEPS]
    unlabelled = _write(tmp_path / "nokp" / "r.jsonl", ["run-0"], steps)
    m_auto, out = _build(tmp_path, unlabelled, "auto2", encoder_obj=encoder, stage="read")
    assert m_auto["label_kinds"] == {"teacher:sc": 6}
    assert np.allclose(_frame(out).utility.to_numpy(), run.utility.to_numpy(), equal_nan=True)


def test_v1_traces_give_no_read_rows(traces, encoder, tmp_path):
    both = tmp_path / "both"
    shutil.copytree(FIX / "canonical", both / "canonical")  # two version 1 runs
    shutil.copy(traces, both / "v2.jsonl")
    manifest, out = _build(tmp_path, both, encoder_obj=encoder, stage="read", labels="keypoints")
    assert manifest["n_runs"]["total"] == 6 and manifest["read"]["runs_without_results"] == 2
    assert set(_frame(out).run_id) == set(SPLIT_RUNS)
    only_v1, out1 = _build(tmp_path, FIX / "canonical", "v1", encoder_obj=encoder, stage="read")
    assert only_v1["n_decisions"]["total"] == 0 and only_v1["read"]["runs_without_results"] == 2
    assert len(_frame(out1)) == 0


def test_judge_and_returns_are_refused_at_the_read_stage(traces, tmp_path, capsys):
    args = ["dataset", "build", "--traces", str(traces), "--stage", "read", "--no-progress"]
    for spec in ("judge", "returns", "returns:0.3"):
        assert main([*args, "--out", str(tmp_path / spec), "--labels", spec]) == 2
        assert "not available at --stage read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # argparse: not a stage
        main([*args, "--out", str(tmp_path / "x"), "--stage", "post"])
    assert info.value.code == 2 and "invalid choice: 'post'" in capsys.readouterr().err
    with pytest.raises(InputError, match="not available at --stage read"):
        build(
            [traces], tmp_path / "api", stage="read", labels="judge", label_options={"llm_url": "u", "llm_model": "m"}
        )
    with pytest.raises(InputError, match="--stage"):
        build([traces], tmp_path / "api2", stage="post")
    assert not (tmp_path / "judge" / "manifest.json").exists()


def test_pre_stage_rows_ignore_read_events(traces, encoder, tmp_path):
    """A trace's results and read events (and evidence hit ids) leave its pre-stage rows as they were."""
    v1_like = [(t, {k: v for k, v in f.items() if k != "hit_id"}) for t, f in STEPS if t not in ("results", "read")]
    plain = _write(tmp_path / "plain" / "r.jsonl", steps=v1_like)
    m_read, out_read = _build(tmp_path, traces, "with_reads", encoder_obj=encoder)
    m_plain, out_plain = _build(tmp_path, plain, "plain_ds", encoder_obj=encoder)
    assert m_read["stage"] == "pre" and m_read["columns"] == columns(NAMES) and "read" not in m_read
    a, b = _frame(out_read), _frame(out_plain)
    assert len(a) == 12 and list(a.columns) == list(b.columns)  # 3 candidates per run
    assert a.astype(str).equals(b.astype(str))


def test_old_manifests_read_as_pre_and_unknown_stages_are_refused(keypoints_build, tmp_path):
    from branchgate.data.decision_batches import load_decision_dataset

    assert dataset_stage({"schema_version": 1}) == "pre"
    with pytest.raises(InputError, match="stage"):
        dataset_stage({"stage": "post"})
    _, out, _ = keypoints_build
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "stage": "post"}))
    with pytest.raises(InputError, match="must be one of pre, read"):
        load_decision_dataset(copy)


def _controller(tmp_path, **meta_options):
    from branchgate.models.value_model import ValueNet
    from branchgate.training.checkpoint import make_meta, save_controller

    enc = SimpleNamespace(spec=SimpleNamespace(id="enc", path=None), dim=8, max_length=16)
    path = tmp_path / "c.safetensors"
    save_controller(path, ValueNet(8, hidden=8), make_meta(enc, tau=0.5, **meta_options))
    return path


def _rewrite_meta(path, change) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as f:
        header = json.loads(f.metadata()["branchgate"])
    change(header["meta"])
    save_file(load_file(str(path)), str(path), metadata={"branchgate": json.dumps(header)})


def test_controller_metadata_carries_the_stage(tmp_path):
    pytest.importorskip("torch")
    from branchgate.training.checkpoint import load_controller

    path = _controller(tmp_path, stage="read")
    assert load_controller(path)[1]["stage"] == "read"
    _rewrite_meta(path, lambda m: m.pop("stage"))  # a file written before the read gate
    assert load_controller(path)[1]["stage"] == "pre"
    _rewrite_meta(path, lambda m: m.update(stage="post"))
    with pytest.raises(InputError, match="meta.stage"):
        load_controller(path)
    with pytest.raises(InputError, match="stage"):
        _controller(tmp_path, stage="post")


def test_train_on_a_read_dataset_writes_stage_read(keypoints_build, tmp_path):
    """``branchgate train`` takes a read dataset as it is; its controller's metadata says ``stage`` read."""
    from branchgate.training.checkpoint import load_controller

    _, out, _ = keypoints_build
    run = tmp_path / "run"
    argv = [
        "train",
        "--config",
        "quickstart",
        "--data.dataset",
        str(out),
        "--data.cache",
        str(out.parent / "emb.sqlite"),
    ]
    argv += ["--out", str(run), "--wandb.mode", "disabled", "--trainer.max_epochs", "2"]
    argv += ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    assert main(argv) == 0
    _, meta = load_controller(run / "controller.safetensors")
    assert meta["stage"] == "read" and meta["dataset_schema_version"] == 2 and meta["label_kind"] == "keypoints"


@pytest.mark.slow
@pytest.mark.shared
def test_real_searcho1_read_dataset(shared, tmp_path):
    """DeepResearchGym's Search-o1 traces at the read stage with key-point labels: the issue's figures."""
    traces = shared("drgym", "Searcho1_ClueWeb22")
    shared("drgym", "key_point")
    out = tmp_path / "ds"
    m = build([traces], out, cache=tmp_path / "emb.sqlite", progress=False, stage="read", labels="keypoints")
    assert m["read"]["hits"] == 2455 and m["read"]["new_hits"] == 2362 and m["read"]["unlabelled_hits"] == 0
    assert m["read"]["runs_without_results"] == 422 and m["run_problems"] == {}
    assert m["n_decisions"] == {"train": 1871, "validation": 258, "test": 233, "total": 2362}
    assert {s: m["labels"][s].get("1") for s in m["labels"]} == {"train": 298, "validation": 41, "test": 23}
    assert {s: m["labels"][s].get("-1", 0) for s in m["labels"]} == {"train": 0, "validation": 0, "test": 0}


def _dict_run(extra: list[dict]) -> list[dict]:
    head = [
        {"type": "run_start", "root_query": "q"},
        {"type": "frame_open", "frame_id": "f0", "depth": 0},
        {"type": "candidate", "frame_id": "f0", "candidate_id": "c0", "query": "a"},
    ]
    return [{"run_id": "r", "seq": i, **e} for i, e in enumerate(head + extra)]


def test_read_point_retained_texts_first_shown_newest_kept():
    from branchgate.logs_to_dataset.decision_points import MAX_RETAINED
    from branchgate.logs_to_dataset.read_points import run_read_points

    def results(hits):
        return {"type": "results", "candidate_id": "c0", "query": "a", "hits": hits}

    def read(h):
        return {"type": "read", "candidate_id": "c0", "hit_id": h, "action": "read"}

    ids = [f"h{i}" for i in range(MAX_RETAINED + 22)]
    hit = [{"hit_id": h, "title": f"T {h}", "snippet": f"s {h}", "rank": 0} for h in ids]
    extra = [results([{**hit[0], "title": "first"}]), read("h0"), read("ghost")]  # ghost: no results showed it
    extra += [results([{**hit[0], "title": "second"}])]
    for i in range(1, len(ids), 50):
        chunk = [{**h, "rank": r} for r, h in enumerate(hit[i : i + 50])]
        extra += [results(chunk), *(read(h["hit_id"]) for h in chunk)]
    extra += [results([{"hit_id": "last", "title": "L", "snippet": "", "rank": 0}])]
    points, problems = run_read_points(_dict_run(extra))
    assert points[0].retained == [] and points[1].retained == [hit_text("first", "s h0")]  # the first title shown
    assert points[-1].retained == [hit_text(f"T {h}", f"s {h}") for h in ids[-MAX_RETAINED:]]  # newest, oldest first
    assert problems == {"retained_over_cap": 1, "read_without_results": 1}
