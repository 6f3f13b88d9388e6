"""`branchgate bench` end to end on the bundled sample (tiny settings), its step cache, and its query checks."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from branchgate.bench.closed_loop import interpolate
from branchgate.bench.steps import Steps
from branchgate.cli import main
from branchgate.models.teachers import NAMES
from branchgate.pipeline.sample import SAMPLE_DIR
from branchgate.training.stats import bootstrap_ci

SOURCE_STEPS = ("dataset", "train", "export", "closed_loop", "offline", "offline_eval", "real", "real_by_depth")
READ_STEPS = ("dataset", "train", "export", "closed_loop", "offline", "offline_eval", "real")
STEPS = (
    "simulate",
    "closed_loop",
    "real_data",
    "eval_data",
    *(f"keypoints/{s}" for s in SOURCE_STEPS),
    *(f"read/keypoints/{s}" for s in READ_STEPS),
    "budgets",
)
READ_POINTS = {
    f"{fam}{tau}"
    for fam in ("read_gate", "read_gate+floor", "gate+read_gate", "read_gate+gate", "gate+read_gate[pre=0.1]")
    for tau in ("", "@tau=0.1", "@tau=0.5")
}
TINY = """breadth: 2
depth: 2
encoder: packaged
workers: 1
train:
  config: quickstart
  overrides: ["--trainer.max_epochs=2"]
policies:
  teachers: [mmr, grn, cd, dpp, sc, lexical, hybrid]
  teacher_max_items: [1]
  gate_taus: [0.1, 0.5]
  read_gate_taus: [0.1, 0.5]
  shallow_nodes: [3]
  random_rates: [RATES]
  stages: []
  late_teachers: [mmr]
  read_max_items: [1]
  post_max_items: [1]
  read_thresholds: {mmr: [-0.2]}
  post_thresholds: {}
  both_pre_taus: [0.1]
  budget_fractions: [0.3]
bootstrap: 50
"""


def _ids():
    return [json.loads(line)["id"] for line in (SAMPLE_DIR / "queries.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    ids = _ids()
    (d / "train.txt").write_text("\n".join(ids[:12]) + "\n")
    (d / "eval.jsonl").write_text("".join(json.dumps({"id": q}) + "\n" for q in ids[30:34]))
    (d / "tiny.yaml").write_text(TINY.replace("RATES", "0.5"))
    argv = [
        "bench",
        "--env",
        "sample",
        "--train-queries",
        str(d / "train.txt"),
        "--eval-queries",
        str(d / "eval.jsonl"),
        "--out",
        str(d / "out"),
        "--config",
        str(d / "tiny.yaml"),
        "--no-progress",
    ]
    assert main(argv) == 0
    # the bench's own dataset and traces stand in for a real agent's (--real takes decision datasets or traces)
    assert main(argv + _real(d)) == 0
    return d, argv, json.loads((d / "out" / "report.json").read_text())


def _real(d):
    return [
        "--real",
        str(d / "out" / "keypoints" / "dataset" / "dataset"),
        str(d / "out" / "simulate" / "seed0" / "traces"),
    ]


def _contains(d):
    lo, hi = d["ci95"]
    return lo - 1e-9 <= d["mean"] <= hi + 1e-9


@pytest.mark.slow
def test_small_bench_runs_with_an_eval_set_missing_a_split(tmp_path, capsys):
    """Issue 48 item 14, the issue's 30 / 10 bundled-sample bench: the eval queries' runs fill no validation split,
    which an eval-only dataset does not need."""
    from branchgate.data.dataset_schema import split_of
    from branchgate.pipeline.config import Config
    from branchgate.pipeline.simulate import run_id_of

    ids = _ids()
    random.Random(0).shuffle(ids)
    cfg = Config(breadth=2, depth=2, oversample=1.5, top_k=10, seed=0, encoder="packaged", pre="none")
    ev = [q for q in ids if split_of(run_id_of(q, 0, cfg)) != "validation"][:10]
    train = [q for q in ids if q not in ev][:12]
    (tmp_path / "train.txt").write_text("\n".join(train) + "\n")
    (tmp_path / "eval.txt").write_text("\n".join(ev) + "\n")
    (tmp_path / "small.yaml").write_text(
        TINY.replace("RATES", "0.5").replace("budget_fractions: [0.3]", "budget_fractions: []")
    )
    out = tmp_path / "out"
    rc = main(
        [
            "bench",
            "--env",
            "sample",
            "--train-queries",
            str(tmp_path / "train.txt"),
            "--eval-queries",
            str(tmp_path / "eval.txt"),
            "--out",
            str(out),
            "--config",
            str(tmp_path / "small.yaml"),
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err[-3000:]
    manifest = json.loads((out / "eval_data" / "dataset" / "manifest.json").read_text())
    assert manifest["n_runs"]["validation"] == 0 and manifest["n_runs"]["total"] == 10
    report = json.loads((out / "report.json").read_text())
    assert report["offline_eval_by_depth"] and report["queries"] == {"train": 12, "eval": 10}


@pytest.mark.slow
def test_report_has_every_policy_and_plausible_values(bench):
    d, _, rep = bench
    # --real: the simulator against the real logs (bench/calibration.py), in report.json and report.md
    cal = rep["calibration"]
    assert cal["sim"]["shape"]["runs"] and any("AUROC" in c["what"] for c in cal["checks"])
    assert "The simulator against the real logs" in (d / "out" / "report.md").read_text()
    assert {
        "policies",
        "gate_vs",
        "offline",
        "offline_by_depth",
        "real",
        "labels",
        "by_labels",
        "encoder",
        "timings",
    } <= set(rep)
    assert list(rep["by_labels"]) == ["keypoints"] and rep["by_labels"]["keypoints"]["gate_vs"] == rep["gate_vs"]
    pol = rep["policies"]
    expected = {"none", "gate", "gate@tau=0.1", "gate@tau=0.5", "shallow@3", "random@0.5", "mmr@read1", "mmr@post1"}
    expected |= {"mmr@read_threshold=-0.2"}
    expected |= {f"{t}@1" for t in NAMES}
    assert set(pol) == expected | READ_POINTS
    for name, p in pol.items():
        assert p["runs"] == 4, name
        assert 0.0 <= p["kpr"]["mean"] <= 1.0, name
        for k in ("nodes", "tokens", "kpr"):
            assert _contains(p[k]), (name, k, p[k])
    assert pol["none"]["tokens"]["mean"] >= max(p["tokens"]["mean"] for p in pol.values()) - 1e-6  # spends the most
    assert pol["mmr@read1"]["hits_read"]["mean"] < pol["none"]["hits_read"]["mean"]  # one hit of each list read
    assert pol["read_gate@tau=0.1"]["stages"]["read"].endswith("tau=0.1") and pol["gate"]["stages"]["read"] == "none"
    read = rep["read"]["keypoints"]  # the read gate: trained on the same runs' read decisions, judged on the same runs
    assert read["family"] == "read_gate" and set(read["gate_vs"]) == set(rep["gate_vs"])
    assert {"gate", "rank", *NAMES} <= set(read["offline"]) and set(read["real_read"]) == {"traces"}
    assert {"read_vs_pre", "both_vs_pre", "both_vs_read", "floor_vs_read"} <= set(read)
    pre_points = {"gate", "gate@tau=0.1", "gate@tau=0.5"}
    assert set(read["read_vs_pre"]) == set(read["both_vs_pre"]) == pre_points
    assert read["real_read_search"]["traces"]["gate"]["n_rows"] < read["real_read"]["traces"]["gate"]["n_rows"]
    assert rep["read_targets"]["token_share"] == 0.3 and "gate+read_gate" in rep["read_targets"]
    assert "gate+read_gate[pre=0.1]" in rep["read_targets"]  # both stages with the pre gate at a looser τ
    looser = read["both_pre"]["gate+read_gate[pre=0.1]"]
    assert set(looser["vs_pre"]) == pre_points and set(looser["gate_vs"]) == set(rep["gate_vs"])
    assert pol["gate+read_gate[pre=0.1]@tau=0.1"]["stages"]["pre"].endswith("tau=0.1")
    assert pol["mmr@read_threshold=-0.2"]["stages"]["read"] == "mmr:threshold=-0.2"
    assert pol["gate@tau=0.5"]["tokens"]["mean"] < pol["gate@tau=0.1"]["tokens"]["mean"]  # higher τ prunes more
    assert set(rep["gate_vs"]) == expected - {"gate", "gate@tau=0.1", "gate@tau=0.5"}  # every baseline
    for g in rep["gate_vs"].values():
        assert _contains(g["kpr_delta"]) and -1 <= g["kpr_delta"]["mean"] <= 1
    assert set(rep["offline"]) == {"gate", *NAMES}
    assert {"depth0", "depth1+"} <= set(rep["offline_by_depth"])
    assert (
        sum(m["n_rows"] for m in (rep["offline_by_depth"][s]["gate"] for s in ("depth0", "depth1+")))
        == rep["offline"]["gate"]["n_rows"]
    )
    for m in rep["offline"].values():
        assert 0 <= m["auroc"] <= 1 and 0 <= m["auprc"] <= 1 and 0 <= m["top1_informative"] <= 1
    ev = rep["offline_eval_by_depth"]  # the eval queries' unpruned runs: 4 queries, every candidate labelled
    assert set(ev) == {"depth0", "depth1+"} and set(ev["depth1+"]) == {"gate", *NAMES}
    assert ev["depth1+"]["gate"]["n_rows"] > rep["offline_by_depth"]["depth1+"]["gate"]["n_rows"] / 10
    assert all(_contains(m["delta_vs_gate"]) for k, m in ev["depth1+"].items() if k != "gate")
    real = rep["real"]["dataset"]
    assert set(real) == {"gate", *NAMES} and "delta_vs_gate" not in real["gate"]
    assert all(_contains(m["delta_vs_gate"]) for k, m in real.items() if k != "gate")
    assert rep["real"]["traces"] == real  # the traces, built into a dataset, give the same decisions
    strata = rep["real_by_depth"]["dataset"]  # the same decisions by depth: rows add up, each stratum its own AUROC
    assert set(strata) == {"depth0", "depth1+"} and set(strata["depth0"]) == {"gate", *NAMES}
    assert sum(t["gate"]["n_rows"] for t in strata.values()) == real["gate"]["n_rows"]
    assert all(
        _contains(m["delta_vs_gate"])
        for t in strata.values()
        for k, m in t.items()
        if k != "gate" and m["delta_vs_gate"]["mean"] is not None
    )
    assert (d / "out" / "real_auroc.png").read_bytes()[:4] == b"\x89PNG"
    assert rep["labels"]["source"] == "keypoints" and rep["encoder"].endswith("all-MiniLM-L6-v2")
    assert set(STEPS) | {"total"} == set(rep["timings"]) and rep["timings"]["total"] > 0
    md = (d / "out" / "report.md").read_text()
    assert "## Real decisions: dataset, depth0" in md
    assert (
        "| gate@tau=0.5 |" in md
        and "## Offline" in md
        and "## Offline on the eval queries' unpruned runs, depth1+" in md
    )
    assert any(f.startswith("Within depth ≥ 1 on the eval queries' unpruned runs") for f in rep["findings"])
    b = rep["budgets"]  # run budgets at 30% of each query's unpruned tokens: never exceeded
    assert set(b["policies"]) == {"gate@budget=0.3", "gate+defer@budget=0.3", "dpp@budget=0.3", "shallow@budget=0.3"}
    assert b["violations"] == 0 and b["checked_runs"] == 16 and b["queries"] == 4
    assert all(p["runs"] == 4 and 0 < p["budget_share"]["mean"] <= 1 for p in b["policies"].values())
    assert set(b["vs"]["0.3"]) == {
        "gate vs dpp",
        "gate vs shallow",
        "gate+defer vs dpp",
        "gate+defer vs shallow",
        "gate+defer vs gate",
    }
    assert "## Budgets" in md and any(f.startswith("Budgets: no run exceeded its budget") for f in rep["findings"])
    assert (d / "out" / "kpr_vs_tokens.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_rerun_reuses_every_step_and_a_changed_setting_reruns_only_the_closed_loop(bench, capsys, monkeypatch):
    d, argv, first = bench
    out = d / "out"
    argv = argv + _real(d)
    mtimes = {s: (out / s / "done.json").stat().st_mtime_ns for s in STEPS}
    capsys.readouterr()
    monkeypatch.chdir(d)  # the same output named relative to another working directory: still all cached
    assert main([a if a != str(out) else "out" for a in argv]) == 0
    assert "steps run: none (all cached)" in capsys.readouterr().out
    monkeypatch.undo()
    assert {s: (out / s / "done.json").stat().st_mtime_ns for s in STEPS} == mtimes
    assert json.loads((out / "report.json").read_text())["policies"] == first["policies"]
    points = {p.parent.name: p.stat().st_mtime_ns for p in (out / "closed_loop").glob("seed0/*/point.json")}
    (d / "tiny.yaml").write_text(TINY.replace("RATES", "0.5, 0.9"))  # one closed-loop setting changes
    assert main(argv) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["steps_run"] == ["closed_loop"]  # the baselines' closed loop; the gate's points are untouched
    assert {s: (out / s / "done.json").stat().st_mtime_ns for s in STEPS if s != "closed_loop"} == {
        s: t for s, t in mtimes.items() if s != "closed_loop"
    }
    assert "random@0.9" in rep["policies"]
    after = {p.parent.name: p.stat().st_mtime_ns for p in (out / "closed_loop").glob("seed0/*/point.json")}
    assert {k: after[k] for k in points} == points  # only the new point was simulated


@pytest.mark.slow
def test_a_second_label_source_adds_its_own_gate_and_reuses_everything_else(bench):
    d, argv, first = bench
    out = d / "out"
    (d / "tiny2.yaml").write_text(
        TINY.replace("RATES", "0.5, 0.9").replace("  gate_taus:", "  root_taus: [0.1]\n  root_tau: 0.6\n  gate_taus:")
        + "experimental:\n  stop_taus: [0.5]\n  greedy_root_taus: [0.1]\n"
    )
    argv = [a if a != str(d / "tiny.yaml") else str(d / "tiny2.yaml") for a in argv]
    argv = argv + _real(d) + ["--labels", "keypoints,citations", "--workers", "2"]
    assert main(argv) == 0
    rep = json.loads((out / "report.json").read_text())
    # simulation and baselines reused; the first gate only adds its variants' points (root, and the experimental ones)
    assert rep["steps_run"] == ["keypoints/closed_loop"] + [f"citations/{s}" for s in SOURCE_STEPS] + [
        f"read/citations/{s}" for s in READ_STEPS
    ]
    assert "gate+stop@tau=0.5" in set(rep["policies"]) and not any("]+" in k for k in rep["policies"])
    assert rep["by_labels"]["keypoints"]["stop"]["family"] == "gate+stop"
    assert set(rep["by_labels"]["keypoints"]["stop"]["gate_vs"]) == set(rep["gate_vs"])
    assert rep["policies"]["gate+stop@tau=0.5"]["spec"].endswith(",tau=0.5,fallback=root")
    assert rep["policies"]["gate+root@tau=0.1"]["spec"].endswith(",tau=0.1,root_tau=0.6")
    assert rep["by_labels"]["keypoints"]["root"]["family"] == "gate+root"
    assert rep["policies"]["gate+greedy_root@tau=0.1"]["spec"].endswith(",tau=0.1,greedy=1,root_tau=0.6")
    assert rep["by_labels"]["keypoints"]["greedy_root"]["family"] == "gate+greedy_root"
    assert list(rep["by_labels"]) == ["keypoints", "citations"]
    cit = rep["by_labels"]["citations"]
    assert cit["family"] == "gate[citations]" and cit["labels"]["kind"] == "citations"
    assert {"gate[citations]", "gate[citations]@tau=0.1", "gate[citations]@tau=0.5"} <= set(rep["policies"])
    assert rep["policies"]["gate[citations]"]["runs"] == 4  # ran in the worker pool, read back like any point
    assert set(cit["gate_vs"]) == set(rep["gate_vs"])  # both gates against the same baselines
    assert not any(k.startswith(("gate", "read_gate")) for k in rep["gate_vs"])
    assert (
        rep["read"]["citations"]["family"] == "read_gate[citations]" and "both_vs_pre" not in rep["read"]["citations"]
    )
    assert rep["labels"]["source"] == "keypoints"  # the first source stays the report's headline gate
    assert set(cit["real"]["dataset"]) == {"gate", *NAMES}
    md = (out / "report.md").read_text()
    assert "## Label sources compared" in md and "| gate[citations] |" in md and "| gate+stop |" in md
    assert any("`gate+greedy_root` (labels `keypoints`)" in f for f in rep["findings"])
    assert "AUROC on dataset" in md


@pytest.mark.slow
def test_train_seeds_add_training_runs_and_leave_the_eval_steps_cached(bench, tmp_path, capsys):
    import shutil

    d, argv, _ = bench
    out = tmp_path / "out"
    shutil.copytree(d / "out", out)
    (tmp_path / "seeds.yaml").write_text(TINY.replace("RATES", "0.5") + "experimental:\n  train_seeds: [0, 1]\n")
    argv = [
        str(tmp_path / "seeds.yaml") if a == str(d / "tiny.yaml") else str(out) if a == str(d / "out") else a
        for a in argv
    ]
    assert main(argv) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["steps_run"][0] == "simulate" and "keypoints/train" in rep["steps_run"]
    assert "eval_data" not in rep["steps_run"]  # the eval queries' unpruned runs are untouched
    assert json.loads((out / "closed_loop" / "done.json").read_text())["inputs"]["seeds"] == [0]
    assert len(list((out / "simulate" / "seed1" / "traces").glob("*.jsonl"))) == 12  # seed 1's run of each train query
    assert json.loads((out / "simulate" / "done.json").read_text())["result"]["runs"] == 24
    (tmp_path / "none.yaml").write_text(TINY.replace("RATES", "0.5") + "experimental:\n  train_seeds: []\n")
    argv = [str(tmp_path / "none.yaml") if a == str(tmp_path / "seeds.yaml") else a for a in argv]
    capsys.readouterr()
    assert main(argv) == 2 and "train_seeds" in capsys.readouterr().err


def test_overlapping_or_unknown_query_ids_exit_2(tmp_path, capsys):
    ids = _ids()
    (tmp_path / "a.txt").write_text("\n".join(ids[:3]) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(ids[2:5]) + "\n")
    (tmp_path / "c.txt").write_text(f"{ids[6]}\nno-such-query\n")
    base = ["bench", "--env", "sample", "--out", str(tmp_path / "out"), "--train-queries", str(tmp_path / "a.txt")]
    assert main(base + ["--eval-queries", str(tmp_path / "b.txt")]) == 2
    err = capsys.readouterr().err
    assert "a.txt" in err and "b.txt" in err and ids[2] in err
    assert main(base + ["--eval-queries", str(tmp_path / "c.txt")]) == 2
    assert "c.txt:2" in capsys.readouterr().err
    assert not (tmp_path / "out" / "simulate").exists()


def test_bootstrap_ci_and_interpolation():
    v = np.array([0.0, 1.0, 0.0, 1.0, 1.0])
    lo, hi = bootstrap_ci(np.arange(5), lambda idx: float(v[idx].mean()), boot=200)
    assert 0.0 <= lo < 0.6 < hi <= 1.0
    assert bootstrap_ci([], lambda idx: 0.0) == [None, None]
    curve = [(100.0, {"q": 0.2}), (300.0, {"q": 0.6})]
    assert interpolate(curve, 200.0) == ({"q": pytest.approx(0.4)}, False)
    assert interpolate(curve, 500.0) == ({"q": 0.6}, True)  # beyond the sweep: clamped, flagged


def test_steps_resume_an_interrupted_step_and_rerun_a_changed_one(tmp_path):
    steps = Steps(tmp_path)

    def interrupted(folder):
        (folder / "partial").write_text("x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        steps.run("s", {"a": 1}, interrupted)
    seen = []
    steps.run("s", {"a": 1}, lambda f: seen.append((f / "partial").exists()) or {"n": 1})  # same inputs: resumes
    steps.run("s", {"a": 2}, lambda f: seen.append((f / "partial").exists()) or {"n": 2})  # changed: starts afresh
    assert seen == [True, False]
    again = Steps(tmp_path)
    assert again.run("s", {"a": 2}, lambda f: 1 / 0) == {"n": 2} and again.ran == []  # finished: reused


def test_plot_gives_every_curve_a_colour_however_many_gates(tmp_path):
    """More gate curves than the strong palette holds (several label sources and variants) must still plot."""
    from branchgate.bench.report import plot

    def point(fam, t, k):
        return {"family": fam, "tokens": {"mean": t}, "kpr": {"mean": k, "ci95": [k - 0.01, k + 0.01]}}

    fams = [f"gate[s{i}]" for i in range(12)] + [f"t{i}" for i in range(20)]
    policies = {f"{f}@{j}": point(f, 1000 * (j + 1), 0.1 * (j + 1)) for f in fams for j in range(2)}
    policies["none"] = point("none", 5000, 0.5)
    report = {"policies": policies, "labels": {"source": "keypoints"}, "queries": {"eval": 3}}
    plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def _own_bench(bench, tmp_path, config: str):
    """A copy of the shared bench's output run once with the tiny config at ``tmp_path/config``: the default state
    a test starts from (other tests change the shared bench's). Returns ``(out, argv)``."""
    import shutil

    d, argv, _ = bench
    out = tmp_path / "out"
    shutil.copytree(d / "out", out)
    (tmp_path / config).write_text(TINY.replace("RATES", "0.5"))
    argv = [
        str(tmp_path / config) if a == str(d / "tiny.yaml") else str(out) if a == str(d / "out") else a for a in argv
    ]
    assert main(argv) == 0
    return out, argv


def _rerun_with_more_training_runs(out, argv, config, extra: str, sub: str) -> None:
    """Rerun ``_own_bench``'s bench with ``extra`` config lines that add a kind of training run: its 12 runs land in
    ``simulate/SUB`` beside the 12 tree runs, the training steps rerun and the eval steps stay cached."""
    config.write_text(TINY.replace("RATES", "0.5") + extra)
    assert main(argv) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["steps_run"][0] == "simulate" and "keypoints/train" in rep["steps_run"]
    assert "closed_loop" not in rep["steps_run"] and "eval_data" not in rep["steps_run"]
    assert len(list((out / "simulate" / sub / "seed0" / "traces").glob("*.jsonl"))) == 12
    assert json.loads((out / "simulate" / "done.json").read_text())["result"]["runs"] == 24


def test_train_trees_are_checked_before_any_work():
    from branchgate.bench.settings import train_trees
    from branchgate.errors import InputError

    def trees(value):
        return train_trees({"experimental": {"train_trees": value}})

    assert train_trees({}) == [] and trees([]) == []
    assert trees([{"breadth": 8, "depth": "2"}, {"breadth": 2, "oversample": 1}]) == [
        {"breadth": 8, "depth": 2},
        {"breadth": 2, "oversample": 1.0},
    ]
    for bad, at in (
        (["wide"], "[0]"),
        ([{"width": 3}], "[0]"),
        ([{"breadth": 2}, {"breadth": 0}], "[1]"),
        ([{"depth": "x"}], "[0]"),
        ([{"breadth": 2}, {"breadth": 2}], ""),
        ({"breadth": 2}, ""),
    ):
        field = "experimental.train_trees" + at
        with pytest.raises(InputError) as e:
            trees(bad)
        assert e.value.file == field and str(e.value).startswith(field + ": "), bad


def test_experimental_options_are_off_by_default_and_misplaced_or_removed_ones_are_named(tmp_path):
    """Issue 49: the options that measured no gain sit in the config's ``experimental`` section, off by default;
    one given where it used to be (``policies.stop_taus``) or a removed one (``train_shapes``) is an error naming
    it, not silently ignored."""
    from branchgate.bench.settings import load_config, seed_lists, train_trees
    from branchgate.bench.sweeps import variant_taus
    from branchgate.errors import InputError

    cfg = load_config("bench")
    assert set(cfg["experimental"]) == {"train_seeds", "train_trees", "stop_taus", "greedy_root_taus"}
    assert variant_taus(cfg) == {"stop": [], "root": [], "greedy_root": []}
    assert train_trees(cfg) == [] and seed_lists(cfg) == ([0], [0])
    (tmp_path / "mine.yaml").write_text("experimental:\n  stop_taus: [0.5]\n  train_seeds: [0, 1]\n")
    mine = load_config(str(tmp_path / "mine.yaml"))
    assert variant_taus(mine)["stop"] == [0.5] and seed_lists(mine) == ([0], [0, 1])
    assert mine["experimental"]["greedy_root_taus"] == [] and mine["policies"] == cfg["policies"]
    for text, key in (
        ("policies:\n  stop_taus: [0.5]\n", "stop_taus"),
        ("train_shapes: [tree, chain]\n", "train_shapes"),
        ("policies:\n  greedy_taus: [0.5]\n", "greedy_taus"),
        ("experimental: [1]\n", "experimental"),
    ):
        (tmp_path / "old.yaml").write_text(text)
        with pytest.raises(InputError) as e:
            load_config(str(tmp_path / "old.yaml"))
        assert key in str(e.value) and "old.yaml" in e.value.file, text
        assert "experimental" in str(e.value), text


@pytest.mark.slow
def test_train_trees_add_wider_training_runs_and_leave_the_eval_steps_cached(bench, tmp_path):
    out, argv = _own_bench(bench, tmp_path, "trees.yaml")
    rows = json.loads((out / "keypoints" / "dataset" / "done.json").read_text())["result"]["n_rows"]
    _rerun_with_more_training_runs(
        out, argv, tmp_path / "trees.yaml", "experimental:\n  train_trees: [{breadth: 4, depth: 1}]\n", "tree0"
    )
    wide = json.loads((out / "keypoints" / "dataset" / "done.json").read_text())["result"]["n_rows"]
    assert wide == rows + 12 * 6  # each one-level run adds one frame of ceil(4 × 1.5) = 6 candidates


def test_the_default_config_runs_the_strongest_baselines_and_bench_full_every_family():
    """Issue 63: the default answers the main question in about an hour (the learned stages against the strongest
    baseline of each family, each over its own knob); ``--config bench_full`` keeps the full sweep."""
    from branchgate.bench import sweeps
    from branchgate.bench.settings import load_config

    def points(cfg):
        pol = cfg["policies"]
        base = sweeps.baseline_points(pol)
        learned = sweeps.gate_points(pol, "pre.onnx") + sweeps.read_gate_points(
            pol, "read.onnx", sweeps.READ_FAMILY, "pre.onnx"
        )
        budgets = sweeps.budget_points(pol, "pre.onnx") if pol["budget_fractions"] else []
        return base, learned + budgets

    base, learned = points(load_config("bench"))
    families = {p.family for p in base}
    assert families == {"none", "dpp", "shallow", "dpp@read_threshold", "hybrid@read_threshold"} | {
        "dpp@post_threshold",
        "hybrid@post_threshold",
    }
    assert all(sum(p.family == f for p in base) >= 3 for f in families - {"none"})  # each swept over its knob
    assert len(base) == 19 and len(base) + len(learned) == 55
    full_base, full_learned = points(load_config("bench_full"))
    assert len(full_base) == 115 and len(full_base) + len(full_learned) == 197
    assert {p.name for p in base} <= {p.name for p in full_base}
