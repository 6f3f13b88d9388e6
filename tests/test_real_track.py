"""The bench's real track (``bench/real_track.py``) on small simulated traces standing in for real logs: every scorer
is judged on the same rows out of fold, the oracle bounds them, the replay frontier runs on the logs, and the
report section and picture are written."""

from __future__ import annotations

import numpy as np
import pytest

from branchgate.bench import real_track

pytestmark = pytest.mark.filterwarnings("ignore:.*decision outside the training range")
RUNS = 8
QUICK = ("--trainer.max_epochs", "2", "--early_stopping.patience", "3", "--model.hidden", "16")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    from branchgate.logs_to_dataset.build import build
    from branchgate.pipeline.config import Config
    from branchgate.pipeline.simulate import simulate

    root = tmp_path_factory.mktemp("real_track")
    simulate("sample", Config(depth=2), root / "sim", runs=RUNS, progress=False)
    traces = str(root / "sim" / "traces")
    cache = str(root / "emb.sqlite")
    build([traces], root / "ds", encoder="packaged", labels="keypoints", stage="read", progress=False, cache=cache)
    return root, str(root / "ds"), traces, cache


@pytest.fixture(scope="module")
def result(logs):
    root, ds, traces, cache = logs
    evals = {"again": (ds, [traces])}
    return real_track.track(
        "pretrained:read", ds, [traces], root / "track", boot=30, folds=3, cache=cache, evals=evals, train_args=QUICK
    )


def test_every_scorer_on_the_same_rows_out_of_fold(result, logs):
    from branchgate.data.decision_batches import load_decision_dataset
    from branchgate.training.folds import run_labels

    _, ds, _, _ = logs
    hit = result["out_of_fold"]["per_hit"]
    assert {"finetuned", "real_only", "sim_only", "oracle", "dpp", "mmr"} <= set(hit)
    labelled = sum(p + n for p, n in run_labels(load_decision_dataset(ds)[0]).values())
    assert {m["n_rows"] for m in hit.values()} == {labelled}  # one row each, every labelled hit
    assert hit["oracle"]["auroc"] == pytest.approx(1.0)
    for name, m in hit.items():
        assert m["auroc"] <= 1.0 and (name == "finetuned" or m["delta_vs_gate"]["ci95"][0] is not None)
    assert result["out_of_fold"]["per_search"]["oracle"]["auroc"] == pytest.approx(1.0)


def test_the_frontier_replays_the_logs_and_the_oracle_bounds_it(result):
    f = result["frontier"]
    assert f["runs"] == RUNS and f["tokens"] > 0 and f["key_points"] > 0
    assert {"finetuned", "real_only", "sim_only", "oracle"} <= set(f["scorers"])
    for name, s in f["scorers"].items():
        pts = s["points"]
        assert pts[-1]["tokens"] == pytest.approx(1.0) and pts[-1]["key_points"] == pytest.approx(1.0), name
        tokens = [p["tokens"] for p in pts]
        assert np.all(np.diff(tokens) >= -1e-9), name  # a lower threshold reads at least as much
    few = f["scorers"]["dpp"]["points"][0]  # the top 5% of the hits by DPP: less read, less kept
    assert few["tokens"] < 1.0 and 0.0 < few["key_points"] < 1.0
    assert all(p["key_points"] > 0.0 for p in f["scorers"]["oracle"]["points"])  # it reads every hit that adds one
    assert all(s["tokens_at_target"] is None or 0 < s["tokens_at_target"] <= 1.0 for s in f["scorers"].values())


def test_the_frontier_replays_only_the_scored_runs(logs):
    _, ds, traces, _ = logs
    rows = real_track._teacher_rows(ds)
    scores = real_track.hit_scores(rows, ds)
    keep = sorted({r for r, _ in scores["dpp"]})[:3]
    some = {"dpp": {k: v for k, v in scores["dpp"].items() if k[0] in keep}}
    assert real_track.frontier([traces], some, shares=(0.5, 1.0))["runs"] == 3


def test_eval_logs_are_judged_by_the_final_models_and_the_report_is_written(result, tmp_path):
    ev = result["eval"]["again"]
    assert {"finetuned", "real_only", "sim_only", "oracle"} <= set(ev["per_hit"])
    assert ev["frontier"]["runs"] == RUNS
    md = "\n".join(real_track.markdown(result))
    assert "Real track" in md and "| finetuned |" in md and "Judged on again" in md
    real_track.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 5000
