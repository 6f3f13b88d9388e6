"""The bench's steps in order (``run_bench``), each a cached ``Steps.run`` with the inputs it depends on: the
shared steps here (``simulate``, ``closed_loop``, ``real_data``, ``eval_data``), each label source's gate in
``gate_steps.py``, the ``budgets`` step in ``budget_step.py``; then the report assembled."""

from __future__ import annotations

import os
import time
from pathlib import Path

from branchgate.bench import closed_loop, settings
from branchgate.bench.budget_step import budget_step
from branchgate.bench.common_sense import check_model
from branchgate.bench.gate_steps import source_steps
from branchgate.bench.report import findings, write
from branchgate.bench.settings import BenchRun, manifest_hash, real_datasets, sim_settings, write_ids
from branchgate.bench.steps import Steps, keeps_folder
from branchgate.bench.sweeps import (
    BOTH_FAMILY,
    BOTH_REVERSE_FAMILY,
    FLOOR_FAMILY,
    READ_FAMILY,
    VARIANTS,
    baseline_points,
    gate_family,
    looser_families,
    read_family,
    variant_family,
)
from branchgate.fileio import check_output_dir, claim_output_dir, is_output_of, mark_output_dir
from branchgate.logs_to_dataset.build import build
from branchgate.logs_to_dataset.decision_points import check_split_by
from branchgate.models.encoder import resolve
from branchgate.pipeline import env as envmod
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import simulate
from branchgate.training.metrics import clean

OUTPUT_KIND = "bench"  # the command named in the output folder's mark (``fileio.check_output_dir``)


def run_bench(
    env_path: str,
    train_file: str,
    eval_file: str,
    out: str | Path,
    cfg: dict,
    real: list[str] = (),
    progress: bool = False,
    command: str | None = None,
    real_eval: list[str] = (),
):
    """BenchRun (or reuse) every step; returns ``(report, paths, steps)`` (``command``, the invocation, is recorded)."""
    started = time.perf_counter()
    run, real_fp = prepare(env_path, train_file, eval_file, out, cfg, real, progress)
    sim = _simulate(run)
    baselines = baseline_points(run.cfg["policies"])
    cl = run.steps.run(
        "closed_loop",
        {**run.loop_inputs, "points": [(p.name, p.spec) for p in baselines]},
        keeps_folder(lambda folder: run.closed_loop(folder, baselines, "")),
    )
    reads = "read" in run.stages
    real_sets = run.steps.run(
        "real_data",
        {
            "real": [str(p) for p in real],
            "manifests": real_fp,
            "encoder": run.enc_id,
            **({"read": True} if reads else {}),
        },
        lambda folder: real_datasets(real, folder, run.enc, progress, reads),
    )
    eval_set = run.steps.run(
        "eval_data",
        {**run.loop_inputs, "point": ("none", "none"), **({"read": True} if reads else {})},  # the unpruned runs
        lambda folder: _eval_dataset(run.steps.out / "closed_loop", run.seeds, folder, run.enc, progress, reads),
    )
    pts, runs = list(baselines), dict(cl["runs"])
    per_source, per_read = {}, {}
    for i, source in enumerate(run.sources):
        res = source_steps(run, source, gate_family(i, source), sim["traces"], real_sets, eval_set)
        pts += res.pop("points")
        runs.update(res.pop("runs"))
        per_source[source] = res
    first = per_source[run.sources[0]]
    for i, source in enumerate(run.sources if reads else []):
        pre = first["controller"] if i == 0 else None
        res = source_steps(run, source, read_family(i, source), sim["traces"], real_sets, eval_set, "read", pre)
        pts += res.pop("points")
        runs.update(res.pop("runs"))
        per_read[source] = res
    budgets = budget_step(run, first["controller"], first["export_fp"])
    report = _report(run, pts, runs, per_source, budgets, time.perf_counter() - started, per_read)
    if real:  # the simulator against the real logs on the same statistics (bench/calibration.py)
        from branchgate.bench.calibration import bench_table

        loop = run.steps.out / "closed_loop"
        report["calibration"] = bench_table(
            [str(loop / f"seed{s}" / "none" / "traces") for s in run.seeds], eval_set, list(real), real_sets
        )
    if real and per_read:  # the read gate learned from the real logs themselves (bench/real_track.py)
        from branchgate.bench.real_track import bench_step

        src = run.sources[0]
        track = bench_step(run, src, per_read[src]["controller"], list(real), real_sets, list(real_eval), progress)
        if track:
            report["real_track"] = track
    if command:
        report["command"] = command
    paths = write(run.steps.out, report)
    mark_output_dir(run.steps.out, OUTPUT_KIND)
    return report, paths, run.steps


def prepare(
    env_path: str, train_file: str, eval_file: str, out: str | Path, cfg: dict, real: list[str], progress: bool
) -> tuple[BenchRun, list[str]]:
    """Check every setting and input before any work, then claim ``out`` (``fileio.check_output_dir``): the
    ``BenchRun`` and the ``--real`` inputs' fingerprints."""
    out = Path(out).resolve()  # the steps' cached results name files by path: absolute, so any cwd can reuse them
    env_path = str(Path(env_path).resolve()) if Path(env_path).exists() else env_path  # (or the name "sample")
    sources = settings.label_sources(cfg["labels"])
    trees = settings.train_trees(cfg)
    seeds, train_seeds = settings.seed_lists(cfg)
    cfg = {**cfg, "split_by": check_split_by(str(cfg.get("split_by") or "run"))}
    env = envmod.load(env_path)
    train_ids, eval_ids = settings.read_ids(env, train_file), settings.read_ids(env, eval_file)
    settings.check_disjoint(train_file, train_ids, eval_file, eval_ids)
    real_fp = [manifest_hash(p) for p in real]  # a missing --real path fails before any work
    out = check_output_dir(
        out, [env.path, train_file, eval_file, *_outside_own_output(real, out)], OUTPUT_KIND, in_place=True
    )
    claim_output_dir(out, OUTPUT_KIND)  # closed (mark_output_dir) once the report is written
    run = BenchRun(
        env_path=env_path,
        cfg=cfg,
        steps=Steps(out),
        sources=sources,
        stages=settings.gate_stages(cfg),
        train_ids=train_ids,
        eval_ids=eval_ids,
        seeds=seeds,
        train_seeds=train_seeds,
        trees=trees,
        enc_id=resolve(cfg["encoder"]).id,
        env_fp=env.fingerprint(),
        progress=progress,
    )
    return run, real_fp


def _simulate(run: BenchRun) -> dict:
    """``simulate``: the train queries, unpruned, for every train seed: ``seed<N>/``, and with
    ``experimental.train_trees`` one ``tree<i>/seed<N>/`` per listed tree."""

    def step(folder: Path) -> dict:
        qf = write_ids(folder, run.train_ids)
        # (folder, settings over the top-level ones) of each kind of training run: the tree, then train_trees
        kinds = [(folder, {})] + [(folder / f"tree{i}", tree) for i, tree in enumerate(run.trees)]
        runs, traces = 0, []
        for sub, extra in kinds:
            for seed in run.train_seeds:
                s = simulate(
                    run.env_path,
                    Config(**{**run.sim(seed), **extra}, pre="none"),
                    sub / f"seed{seed}",
                    queries_file=qf,
                    progress=run.progress,
                    workers=run.workers,
                )
                runs += s["n_runs"]
                traces.append(str(sub / f"seed{seed}" / "traces"))
        return {"runs": runs, "traces": traces}

    inputs = {
        **run.base,
        "sim": sim_settings(run.cfg),
        "seeds": run.train_seeds,
        "queries": run.train_ids,
        **({"trees": run.trees} if run.trees else {}),
    }
    return run.steps.run("simulate", inputs, step)


def _report(
    run: BenchRun, pts: list, runs: dict, per_source: dict, budgets: dict | None, seconds: float, per_read: dict
) -> dict:
    """``report.json`` (keys: docs/bench.md): the first label source's gate as the headline, every source under
    ``by_labels`` with its variants' comparisons, each source's read gate under ``read`` (with both learned
    stages' comparisons), the policies' summaries, ``budgets`` and the findings."""
    boot = run.boot
    per_source = {k: dict(v) for k, v in per_source.items()}  # the caller's own (controller paths) stay whole
    per_read = {k: dict(v) for k, v in per_read.items()}
    for res in [*per_source.values(), *per_read.values()]:
        res["common_sense"] = common_sense(res.pop("controller", None))
        res.pop("export_fp", None)
        res["gate_vs"] = closed_loop.gate_vs(pts, runs, boot, family=res["family"])
    for res in per_read.values():
        if res["family"] == READ_FAMILY:
            res.update(read_comparisons(pts, runs, boot))
    for res in per_source.values():
        for variant in VARIANTS:
            curve = variant_family(res["family"], variant)
            if any(p.family == curve for p in pts):
                res[variant] = {"family": curve, "gate_vs": closed_loop.gate_vs(pts, runs, boot, family=curve)}
    first = per_source[run.sources[0]]
    report = {
        "policies": closed_loop.summarize(pts, runs, boot),
        "gate_vs": first["gate_vs"],
        "offline": first["offline"],
        "offline_by_depth": first["offline_by_depth"],
        "offline_eval_by_depth": first["offline_eval_by_depth"],
        "real": first["real"],
        "real_by_depth": first["real_by_depth"],
        "labels": first["labels"],
        "by_labels": per_source,
        "encoder": run.enc_id,
        "timings": {**run.steps.timings, "total": round(seconds, 2)},
        "queries": {"train": len(run.train_ids), "eval": len(run.eval_ids)},
        "tau": first["tau"],
        "steps_run": list(run.steps.ran),
        "fingerprints": dict(run.steps.fingerprints),
    }
    if per_read:
        from branchgate.bench.read_report import targets

        report["read"] = per_read
        report["read_targets"] = targets(report["policies"])
    if budgets is not None:
        report["budgets"] = budgets
    report = clean(report)
    report["findings"] = findings(report)
    return report


def common_sense(controller: str | None) -> dict | None:
    """The exported controller's figures on the hand-written common-sense suite (``bench/common_sense.py``)."""
    if not controller:
        return None

    return check_model(controller, threads=1)


def read_comparisons(pts: list, runs: dict, boot: int) -> dict:
    """The read gate alone and both learned stages against each single stage at equal tokens
    (``closed_loop.curve_vs``), and the read gate with the floor against the read gate alone: ``{"read_vs_pre": …,
    "both_vs_pre": …, "both_vs_read": …, "reverse_vs_pre": …, "floor_vs_read": …}``, each ``{POINT: {"tokens",
    "kpr_delta", …}}`` at the other curve's points; plus each of the read gate's other curves against every
    baseline (``gate_vs`` of ``both``, ``reverse``, ``floor``)."""
    pairs = {
        "read_vs_pre": (READ_FAMILY, "gate"),
        "both_vs_pre": (BOTH_FAMILY, "gate"),
        "both_vs_read": (BOTH_FAMILY, READ_FAMILY),
        "reverse_vs_pre": (BOTH_REVERSE_FAMILY, "gate"),
        "floor_vs_read": (FLOOR_FAMILY, READ_FAMILY),
    }
    out = {k: closed_loop.curve_vs(pts, runs, a, b, boot) for k, (a, b) in pairs.items()}
    for name, family in (("both", BOTH_FAMILY), ("reverse", BOTH_REVERSE_FAMILY), ("floor", FLOOR_FAMILY)):
        if any(p.family == family for p in pts):
            out[name] = {"family": family, "gate_vs": closed_loop.gate_vs(pts, runs, boot, family=family)}
    looser = looser_families(p.family for p in pts)
    if looser:  # policies.both_pre_taus: the pre gate at a looser τ, the read τ swept
        out["both_pre"] = {
            family: {
                "vs_pre": closed_loop.curve_vs(pts, runs, family, "gate", boot),
                "vs_read": closed_loop.curve_vs(pts, runs, family, READ_FAMILY, boot),
                "gate_vs": closed_loop.gate_vs(pts, runs, boot, family=family),
            }
            for family in looser
        }
    return out


def _eval_dataset(
    loop_folder: Path, seeds: list[int], folder: Path, enc: str, progress: bool, reads: bool = False
) -> dict:
    """``eval_data``: the eval queries' unpruned closed-loop runs (policy ``none``, every seed) as a decision
    dataset labelled by their key points: held-out queries, every branch expanded, so every candidate has a
    label. ``{"dataset": None}`` when those runs carry no key points (an environment without them). With
    ``reads`` also ``"read_dataset"``: the same runs' read decisions (every hit read, so every new hit labelled)."""
    traces = [str(loop_folder / f"seed{s}" / "none" / "traces") for s in seeds]
    out = {}
    for key, stage in (("dataset", "pre"), ("read_dataset", "read"))[: 2 if reads else 1]:
        dest = folder / key
        kw = {"stage": stage} if stage != "pre" else {}
        m = build(traces, dest, encoder=enc, labels="keypoints", progress=progress, **kw)
        labelled = sum(v for s in m["labels"].values() for k, v in s.items() if k in ("0", "1"))
        out[key] = str(dest) if labelled else None
        if stage == "pre":
            out.update(runs=m["n_runs"]["total"], labelled=labelled)
    return out


def _outside_own_output(real: list[str], out: str | Path) -> list[str]:
    """The ``--real`` paths that are inputs to keep apart from ``out``: all but those inside an earlier bench
    output at ``out`` (its own dataset or traces scored as real decisions, which the bench made)."""
    if not (Path(out).is_dir() and is_output_of(out, OUTPUT_KIND)):
        return list(real)
    root = Path(os.path.realpath(out))
    return [p for p in real if root not in Path(os.path.realpath(p)).parents]
