"""Trace → decision points → decision dataset (rows, labels, split by run, manifest, CLI outcomes)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from branchgate.cli import main
from branchgate.data.dataset_schema import columns, split_of
from branchgate.errors import InputError
from branchgate.logs_to_dataset.build import NothingParsed, build
from branchgate.logs_to_dataset.decision_points import run_decisions
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.logs_to_dataset.trace_schema import SchemaVersionError
from branchgate.logs_to_dataset.traces import TraceWriter
from branchgate.models.teachers import NAMES

FIX = Path(__file__).parent / "fixtures"
CONTRACT = [
    "run_id",
    "frame_id",
    "candidate_id",
    "root_query",
    "frame_query",
    "parent_goal",
    "retained",
    "query",
    "goal",
    "depth",
    "order",
    "n_candidates",
    "n_retained",
    "expanded",
    "utility",
    "label",
    "label_source",
    "utility_kind",
] + [f"teacher_{n}" for n in NAMES]
SPLIT_RUNS = {
    "run-0": "train",
    "run-1": "train",
    "run-4": "validation",
    "run-18": "validation",
    "run-16": "test",
    "run-21": "test",
}


def _run(run_id, path=FIX / "canonical"):
    return next(r for r in read_runs([path]) if r.run_id == run_id)


def _write_split_traces(path: Path, question: str | None = None) -> None:
    """Small runs whose ids land in all three splits (train/validation/test); with ``question``, all of them
    runs of that one root question."""
    with TraceWriter(path) as w:
        for run_id in SPLIT_RUNS:
            w.write(type="run_start", run_id=run_id, root_query=question or f"question {run_id}")
            w.write(type="frame_open", run_id=run_id, frame_id="f0", frame_query=f"question {run_id}")
            for k in range(2):
                w.write(
                    type="candidate",
                    run_id=run_id,
                    frame_id="f0",
                    candidate_id=f"c{k}",
                    order=k,
                    query=f"subquery {k} of {run_id}",
                )
                w.write(type="decision", run_id=run_id, candidate_id=f"c{k}", action="expand")
                w.write(
                    type="evidence",
                    run_id=run_id,
                    evidence_id=f"{run_id}-e{k}",
                    text=f"evidence passage {k} about {run_id}",
                    tokens=6,
                )
                w.write(
                    type="retrieval",
                    run_id=run_id,
                    candidate_id=f"c{k}",
                    query=f"subquery {k}",
                    evidence_ids=[f"{run_id}-e{k}"],
                )
            w.write(type="run_end", run_id=run_id)


# --- decision points ---------------------------------------------------------------------------------


def test_split_is_by_run_hash_and_stable():
    for run_id in ["a", "caffeine-01", "9000001", *SPLIT_RUNS]:
        bucket = int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % 100
        assert split_of(run_id) == ("train" if bucket < 80 else "validation" if bucket < 90 else "test")
    assert {r: split_of(r) for r in SPLIT_RUNS} == SPLIT_RUNS


def test_retained_branches_and_context_follow_seq_order():
    run = _run("caffeine-01")
    rd = run_decisions(run.run_id, run.events)
    f0, f1 = rd.frames
    assert [c.candidate_id for c in f0.candidates] == ["f0.c0", "f0.c1", "f0.c2"]
    assert f0.retained == [] and f0.context_ids == []
    assert f1.retained == [
        (
            "caffeine half-life and sleep onset latency\n"
            "Find how long caffeine stays active and whether it delays falling asleep."
        ),
        "caffeine intake timing before bed deep sleep\nMeasure the effect of evening caffeine on slow-wave sleep.",
    ]
    assert f1.context_ids == ["p101", "p102", "p201"]  # p202 removed by the post-retrieval prune
    pruned = f0.candidates[2]
    assert not pruned.expanded and pruned.evidence_ids is None
    assert f0.candidates[1].evidence_ids == ["p201", "p202", "p101"]
    assert rd.has_labels


def test_evidence_retrieved_again_after_a_prune_is_back_in_context(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as w:
        w.write(type="run_start", run_id="r", root_query="q")
        for fid, eids, prune in (("f0", ["e1", "e2"], ["e1"]), ("f1", ["e1"], []), ("f2", [], [])):
            w.write(type="frame_open", run_id="r", frame_id=fid)
            w.write(type="candidate", run_id="r", frame_id=fid, candidate_id=f"{fid}c", query=fid)
            if eids:
                for e in eids:
                    w.write(type="evidence", run_id="r", evidence_id=e, text=e)
                w.write(type="retrieval", run_id="r", candidate_id=f"{fid}c", query=fid, evidence_ids=eids)
            if prune:
                w.write(type="prune", run_id="r", stage="post_retrieval", item_ids=prune)
        w.write(type="retrieval", run_id="r", candidate_id="ghost", query="x", evidence_ids=["e9"])
    run = _run("r", path)
    rd = run_decisions("r", run.events)
    assert [f.context_ids for f in rd.frames] == [[], ["e2"], ["e2", "e1"]]
    assert rd.frames[1].retained == ["f0"]  # a retrieval counts as expanded
    assert rd.problems == ["retrieval for unknown candidate 'ghost' (ignored)"]


def test_orders_are_renumbered_to_positions_for_rows_and_training(tmp_path):
    """A trace's own orders (gaps, any start, a log lacking them) become positions 0..K-1 in the frame, as the Gate
    numbers candidates; training batches take them from features.structured_features whatever the stored column."""
    import datasets

    from branchgate.data.dataset_schema import DECISION_COLUMNS
    from branchgate.data.decision_batches import TextTable, build_decisions

    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as w:
        w.write(type="run_start", run_id="r", root_query="q")
        w.write(type="frame_open", run_id="r", frame_id="f0")
        for cid, order in (("a", 10), ("b", 3), ("c", 7)):
            w.write(type="candidate", run_id="r", frame_id="f0", candidate_id=cid, query=cid, order=order)
    rd = run_decisions("r", _run("r", path).events)
    assert [(c.candidate_id, c.order) for c in rd.frames[0].candidates] == [("b", 0), ("c", 1), ("a", 2)]
    rows = {name: [] for name in DECISION_COLUMNS}
    for i, (order, depth) in enumerate(((40, 2), (5, 2), (17, 2))):  # stored orders from elsewhere: not positions
        row = {
            "run_id": "r",
            "frame_id": "f",
            "root_query": "q",
            "frame_query": "",
            "parent_goal": "",
            "retained": ["x"],
            "query": f"c{i}",
            "goal": "",
            "depth": depth,
            "order": order,
            "label": 1,
            "utility": 1.0,
        }
        for name in DECISION_COLUMNS:
            rows[name].append(row[name])
    dset = build_decisions("test", datasets.Dataset.from_dict(rows), TextTable())
    assert dset.features[:, 1].tolist() == [0.0, 1.0, 2.0]  # order = position, so order / (K - 1) ≤ 1
    assert dset.features[:, [0, 2, 3]].tolist() == [[2.0, 3.0, 1.0]] * 3  # depth, K, R
    assert dset.row.tolist() == [1, 2, 0]  # sorted by the stored order


def test_run_without_run_start_is_rejected(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as w:
        w.write(type="frame_open", run_id="r", frame_id="f0")
    with pytest.raises(InputError, match="no run_start"):
        run_decisions("r", _run("r", path).events, str(path))


# --- the dataset ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    for sub in ("canonical", "searcho1", "gptr"):
        shutil.copytree(FIX / sub, d / sub)
    _write_split_traces(d / "canonical" / "splits.jsonl")
    return d


@pytest.fixture(scope="module")
def built(traces, encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("ds") / "out"
    cache = tmp_path_factory.mktemp("cache") / "emb.sqlite"
    manifest = build([traces], out, encoder_obj=encoder, cache=cache, progress=False)
    from datasets import load_from_disk

    return manifest, load_from_disk(str(out)), out, cache


def test_training_finds_every_text_it_reads_in_the_build_cache(built):
    """The build embeds every text the towers read (root, frame, goal, retained, candidates), so training
    embeds nothing new."""
    from branchgate.data.datamodule import DecisionDataModule

    manifest, _, out, cache = built
    dm = DecisionDataModule(str(out), encoder="packaged", cache=str(cache), show_progress=False)
    dm.setup("fit")
    assert dm.cache_stats["distinct_texts"] > 0
    assert dm.cache_stats["misses"] == 0 and dm.cache_stats["hits"] == dm.cache_stats["distinct_texts"]


def _frame(ds) -> object:
    import pandas as pd

    return pd.concat([ds[s].to_pandas().assign(split=s) for s in ds], ignore_index=True)


def test_rows_columns_and_types_follow_the_contract(built):
    manifest, ds, out, _ = built
    assert set(ds) == {"train", "validation", "test"}
    for split in ds:
        assert ds[split].column_names == CONTRACT
    f = ds["train"].features
    assert f["utility"].dtype == "float32" and f["label"].dtype == "int8" and f["expanded"].dtype == "bool"
    assert f["depth"].dtype == "int32" and f["retained"].feature.dtype == "string"
    assert all(f[f"teacher_{n}"].dtype == "float32" for n in NAMES)
    assert manifest["columns"] == columns(NAMES)
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_split_by_question_keeps_every_run_of_a_question_in_one_split(tmp_path, encoder):
    from branchgate.logs_to_dataset.decision_points import split_key

    assert split_key("r1", "Why  is the sky blue?") == "r1"
    assert split_key("r1", "Why  is the sky blue?", "question") == split_key("r2", "why is the sky BLUE?", "question")
    with pytest.raises(InputError, match="--split-by"):
        split_key("r1", "q", "query")
    (tmp_path / "t").mkdir()
    _write_split_traces(tmp_path / "t" / "splits.jsonl", question="one question asked again and again")
    by_run = build([tmp_path / "t"], tmp_path / "a", encoder_obj=encoder, cache=tmp_path / "c.sqlite", progress=False)
    by_question = build(
        [tmp_path / "t"],
        tmp_path / "b",
        encoder_obj=encoder,
        cache=tmp_path / "c.sqlite",
        progress=False,
        split_by="question",
    )
    assert by_run["split_by"] == "run" and min(by_run["n_runs"][s] for s in ("train", "validation", "test")) > 0
    assert by_question["split_by"] == "question"
    assert sorted(by_question["n_runs"][s] for s in ("train", "validation", "test")) == [0, 0, len(SPLIT_RUNS)]
    with pytest.raises(InputError, match="--split-by"):
        build([tmp_path / "t"], tmp_path / "c", encoder_obj=encoder, progress=False, split_by="query")
    assert not (tmp_path / "c").exists()


def test_no_run_in_two_splits_and_split_matches_hash(built):
    manifest, ds, _, _ = built
    df = _frame(ds)
    runs_per_split = {s: set(df[df.split == s].run_id) for s in ds}
    assert runs_per_split["validation"] and runs_per_split["test"]
    for a in runs_per_split:
        for b in runs_per_split:
            assert a == b or not (runs_per_split[a] & runs_per_split[b])
    assert all(split_of(r) == s for s, runs in runs_per_split.items() for r in runs)
    assert manifest["n_runs"] == {"train": 9, "validation": 2, "test": 2, "total": 13}
    assert manifest["n_decisions"] == {s: len(ds[s]) for s in ds} | {"total": 21 + 12}
    assert manifest["n_frames"]["total"] == 10 + 6


def test_labels_realized_excluded_and_teacher_scores(built):
    manifest, ds, _, _ = built
    df = _frame(ds).set_index(["run_id", "candidate_id"])
    kp = df.loc["caffeine-01"]
    assert (kp.utility_kind == "keypoints").all()
    assert list(kp.loc[["f0.c0", "f0.c1", "f1.c0"], "utility"]) == [2.0, 3.0, 1.0]  # new key points beyond C_t
    assert list(kp.loc[["f0.c0", "f0.c1", "f1.c0"], "label"]) == [1, 1, 1]
    assert kp.loc["f0.c2", "label"] == -1 and kp.loc["f0.c2", "label_source"] == "excluded"
    assert math.isnan(kp.loc["f0.c2", "utility"]) and not kp.loc["f0.c2", "expanded"]
    assert kp.loc["f1.c0", "n_retained"] == 2 and kp.loc["f1.c0", "depth"] == 1
    so1 = df.loc["9000001"]
    assert (so1.utility_kind == "teacher:sc").all() and (so1.label_source == "realized").all()
    thr = manifest["label_thresholds"]["teacher:sc"]
    assert (so1.utility > 0).all() and (so1.label == (so1.utility >= thr)).all()
    assert "9000002" not in df.index.get_level_values(0)  # no search: a run with zero decisions
    gptr = df.loc["task_1740910503_5b1e0c9f2a"]  # expanded, but which sources it found is not logged
    assert gptr.expanded.all() and gptr.utility.isna().sum() == 3 and (gptr.label == -1).sum() == 3
    assert gptr.loc["f0.c2", "utility"] == 0.0 and gptr.loc["f0.c2", "label"] == 0  # "No content found"
    teacher_cols = df[[f"teacher_{n}" for n in NAMES]].to_numpy()
    assert np.isfinite(teacher_cols).all() and teacher_cols.std(axis=0).min() > 0


def test_manifest_reports_inputs_encoder_and_cache(built, traces, encoder):
    manifest, _, _, cache = built
    for key in (
        "schema_version",
        "n_runs",
        "n_decisions",
        "n_frames",
        "n_files",
        "skipped",
        "teacher",
        "label_threshold",
        "label_kind",
        "encoder",
        "source_sha256",
        "teachers",
        "created_by",
    ):
        assert key in manifest
    assert manifest["encoder"] == encoder.id and manifest["teachers"] == list(NAMES) and manifest["teacher"] == "sc"
    assert manifest["label_kind"] == "mixed" and manifest["label_thresholds"]["keypoints"] == 1.0
    rules = manifest["label_threshold_rules"]
    assert rules["keypoints"] == "the source's default (keypoints)" and rules["teacher:sc"].startswith(
        "positive rate 0.1 "
    )
    assert manifest["label_thresholds"]["teacher:sc"] != 0.05 and manifest["label_spec"] == "auto"
    assert set(manifest["positive_rate"]["teacher:sc"]) == {"train", "validation", "test"}
    assert manifest["label_missing"] == {}
    assert manifest["n_files"] == 2 + 6 + 2 and manifest["skipped"] == []
    h = hashlib.sha256()
    for p in sorted(Path(traces).rglob("*")):
        if p.is_file():
            h.update(p.read_bytes())
    assert manifest["source_sha256"] == h.hexdigest()
    assert manifest["embedding_cache"]["misses"] > 0 and manifest["embedding_cache"]["path"] == str(cache)
    assert set(manifest["timings"]) >= {"parse_s", "embed_s", "teacher_s", "write_s"}


def test_rebuild_hits_the_cache_and_teacher_pre_option(built, traces, encoder, tmp_path):
    manifest, ds, _, cache = built
    m2 = build(
        [traces],
        tmp_path / "o2",
        encoder_obj=encoder,
        cache=cache,
        progress=False,
        pruned_labels="teacher_pre",
        label_threshold=0.01,
    )
    assert m2["embedding_cache"]["misses"] == 0 and m2["embedding_cache"]["hits"] > 0
    assert m2["source_sha256"] == manifest["source_sha256"] and m2["label_threshold"] is None  # mixed kinds
    from datasets import load_from_disk

    df, base = _frame(load_from_disk(str(tmp_path / "o2"))), _frame(ds)
    assert (df.label != -1).all()
    pre = df[df.label_source == "teacher_pre"]
    assert len(pre) == (base.label_source == "excluded").sum()
    assert (pre.label == (pre.teacher_sc >= 0.05)).all()
    kp = df[df.utility_kind == "keypoints"]
    assert (kp[kp.label_source == "realized"].label == 1).all()
    so1 = df[(df.utility_kind == "teacher:sc") & (df.label_source == "realized")]
    assert (so1.label == (so1.utility >= 0.01)).all()
    assert np.allclose(df.teacher_mmr, base.teacher_mmr)


def test_bad_records_are_skipped_and_listed_or_fail_under_strict(tmp_path, encoder):
    d = tmp_path / "in"
    shutil.copytree(FIX / "canonical_broken", d)
    (d / "future_version.jsonl").unlink()
    shutil.copy(FIX / "canonical" / "two_runs.jsonl", d / "x.jsonl")
    shutil.copy(FIX / "canonical" / "two_runs.jsonl", d / "y.jsonl")  # the same runs again
    out, cache = tmp_path / "out", tmp_path / "c.sqlite"
    m = build([d], out, encoder_obj=encoder, cache=cache, progress=False)
    reasons = [(Path(s["file"]).name, s["line"], s["reason"]) for s in m["skipped"]]
    assert ("truncated.jsonl", 3, "truncated last line") in reasons
    assert ("garbage.jsonl", None, "binary data (NUL bytes), not a JSON Lines trace") in reasons
    assert ("empty.jsonl", None, "empty file (no events)") in reasons
    assert sum(1 for r in reasons if r[0] == "y.jsonl" and "already read from" in r[2]) == 2
    # t1 appears in several broken files: the first copy is used, later ones are reported
    assert m["n_runs"]["total"] == 3 and m["n_decisions"]["total"] == 7
    before = (out / "manifest.json").read_text()
    with pytest.raises(InputError, match="bad_middle.jsonl:2"):
        build([d], out, encoder_obj=encoder, cache=cache, progress=False, strict=True)
    assert (out / "manifest.json").read_text() == before  # old output untouched


def test_nothing_parsed_and_future_version(tmp_path, encoder):
    with pytest.raises(NothingParsed):
        build(
            [FIX / "gptr_broken" / "task_1740920002_empty.json"],
            tmp_path / "o",
            encoder_obj=encoder,
            cache=tmp_path / "c.sqlite",
            progress=False,
        )
    # no dataset, but the manifest says what was read and why nothing parsed (issue 24)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [".branchgate.json", "manifest.json"]
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["skipped"][0]["reason"] == "empty file"
    with pytest.raises(SchemaVersionError):
        build(
            [FIX / "canonical_broken" / "future_version.jsonl"],
            tmp_path / "o",
            encoder_obj=encoder,
            cache=tmp_path / "c.sqlite",
            progress=False,
        )


@pytest.fixture
def cli_encoder(monkeypatch, encoder):
    from branchgate.models.encoder import Encoder

    monkeypatch.setattr(Encoder, "load", classmethod(lambda cls, name="auto", **kw: encoder))


def test_cli_exit_codes(cli_encoder, tmp_path, capsys):
    out = tmp_path / "ds"
    args = [
        "dataset",
        "build",
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "c.sqlite"),
        "--encoder",
        "packaged",
        "--no-progress",
    ]
    assert main([*args, "--traces", str(FIX / "searcho1"), "--label-threshold", "0.05"]) == 0
    err = capsys.readouterr().err
    assert "3 runs from 6 files → 4 decisions" in err and "warning: all 3 realized teacher:sc labels are 0" in err
    assert json.loads((out / "manifest.json").read_text())["n_runs"]["total"] == 3
    # the default threshold (positive rate 0.1 of the train utilities) gives both classes where 0.05 gives one
    assert main([*args, "--traces", str(FIX / "searcho1")]) == 0
    assert "warning" not in capsys.readouterr().err
    m = json.loads((out / "manifest.json").read_text())
    assert m["labels"]["train"] == {"-1": 1, "0": 2, "1": 1} and m["positive_rate"]["teacher:sc"]["train"] == 0.3333
    assert m["label_threshold"] < 0.05 and m["label_threshold_rule"].startswith("positive rate 0.1 of the train split")
    assert main([*args, "--traces", str(FIX / "searcho1"), "--labels", "judge"]) == 2
    assert "--labels judge needs --llm-url/--llm-model" in capsys.readouterr().err
    assert main([*args, "--traces", str(FIX / "searcho1"), "--labels", "nope"]) == 2
    assert main([*args, "--traces", str(FIX / "searcho1"), "--labels", "teacher:nope"]) == 2
    assert "unknown teacher 'nope' in --labels" in capsys.readouterr().err
    assert main([*args, "--traces", str(FIX / "gptr_broken" / "task_1740920002_empty.json")]) == 1
    assert "no run could be read" in capsys.readouterr().err
    assert main([*args, "--traces", str(FIX / "searcho1_broken"), "--strict"]) == 2
    assert "9100001.a: missing question file" in capsys.readouterr().err
    assert main([*args, "--traces", str(FIX / "canonical_broken" / "future_version.jsonl")]) == 2
    assert main([*args, "--traces", str(FIX / "searcho1"), "--teacher", "nope"]) == 2
    assert "unknown teacher 'nope'" in capsys.readouterr().err


@pytest.mark.shared
def test_real_searcho1_dataset_splits(shared):
    """The real traces → decision points; only the structure (embedding 2k+ documents is the benchmark's job)."""
    d = shared("drgym", "Searcho1_ClueWeb22")
    seen, decisions = {}, 0
    for run in read_runs([d]):
        rd = run_decisions(run.run_id, run.events, run.file)
        seen[rd.run_id] = split_of(rd.run_id)
        decisions += rd.n_decisions
    assert len(seen) == 800 and 400 < decisions < 800
    assert set(seen.values()) == {"train", "validation", "test"}


def test_searcho1_keypoint_labels_make_keypoint_utilities(tmp_path, encoder):
    """Key points beside the traces → utility = NEW key points covered; a query without them → the teacher."""
    cache = tmp_path / "emb.sqlite"
    m = build([FIX / "searcho1_kp"], tmp_path / "o", encoder_obj=encoder, cache=cache, progress=False)
    from datasets import load_from_disk

    df = _frame(load_from_disk(str(tmp_path / "o"))).sort_values(["run_id", "frame_id"])
    kp = df[df.run_id == "9100001"]
    assert list(kp.utility_kind) == ["keypoints"] * 3
    assert list(kp.utility) == [3.0, 0.0, 1.0]  # kp1+kp4+kp2; A again + unlabelled doc; kp5 (kp4 already covered)
    assert list(kp.label) == [1, 0, 1]
    assert list(df[df.run_id == "9100002"].utility_kind) == ["teacher:sc"]
    assert m["label_kind"] == "mixed" and m["label_kinds"] == {"keypoints": 3, "teacher:sc": 1}
    assert m["keypoints"] == {
        "source": "auto",
        "runs_with_ground_truth": 1,
        "runs_without_ground_truth": 1,
        "runs_with_labelled_evidence": 1,
        "evidence": 4,
        "evidence_labelled": 3,
        "labelled_by_id": 2,
        "labelled_by_span_only": 1,
        "key_points": 5,
        "key_points_reachable": 4,
        "bad_links": 1,
    }
    m2 = build(
        [FIX / "searcho1_kp"], tmp_path / "o2", encoder_obj=encoder, cache=cache, progress=False, keypoints="none"
    )
    assert m2["label_kind"] == "teacher:sc" and m2["keypoints"]["runs_with_ground_truth"] == 0
    assert m2["source_sha256"] != m["source_sha256"]  # the key-point files are inputs too


def test_cli_keypoints_option(cli_encoder, tmp_path, capsys):
    traces = tmp_path / "so1"
    shutil.copytree(FIX / "searcho1_kp" / "Searcho1_ClueWeb22", traces)
    args = [
        "dataset",
        "build",
        "--traces",
        str(traces),
        "--out",
        str(tmp_path / "ds"),
        "--cache",
        str(tmp_path / "c.sqlite"),
        "--no-progress",
    ]
    assert main([*args, "--keypoints", str(FIX / "searcho1_kp" / "key_point")]) == 0
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["label_kinds"]["keypoints"] == 3 and manifest["keypoints"]["evidence_labelled"] == 3
    assert main([*args, "--keypoints", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
