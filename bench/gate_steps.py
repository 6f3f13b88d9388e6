"""One label source's gate, its bench steps under OUT/<source>/: ``dataset`` → ``train`` → ``export`` →
``closed_loop`` (the gate's points) → ``offline`` (its own test split and labels) → ``offline_eval`` (the eval
queries' unpruned runs, ``eval_data``, by their key points) → ``real`` and ``real_by_depth`` (the ``--real``
decisions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from branchgate.bench.closed_loop import safe_name
from branchgate.bench.settings import BenchRun
from branchgate.bench.steps import keeps_folder
from branchgate.bench.sweeps import gate_points, read_gate_points, variant_taus
from branchgate.logs_to_dataset.build import build
from branchgate.training import stats
from branchgate.training.cli import resolve_config_names


def source_steps(
    run: BenchRun,
    source: str,
    family: str,
    traces: list[str],
    real_sets: dict,
    eval_set: dict,
    stage: str = "pre",
    pre_controller: str | None = None,
) -> dict:
    """Every step of ``source``'s gate at ``stage`` (curve ``family``) trained on the runs in ``traces``; its
    report entry (``by_labels``, or ``read`` for the read stage) plus ``points`` and ``runs`` (its closed-loop
    points and runs) and ``controller`` / ``export_fp`` (its export). A read gate's steps live under
    OUT/read/<source>/; with ``pre_controller`` (the first label source's pre-retrieval gate) its points include
    both learned stages (``sweeps.read_gate_points``)."""
    key = safe_name(source) if stage == "pre" else f"read/{safe_name(source)}"
    fp = run.steps.fingerprints
    ds = _dataset(run, source, key, traces, stage)
    tr = _train(run, key, ds)
    ex = _export(run, key, ds, tr)
    if stage == "pre":
        variants = variant_taus(run.cfg) if family == "gate" else None
        pts = gate_points(run.cfg["policies"], ex["controller"], family, variants=variants)
    else:
        pts = read_gate_points(run.cfg["policies"], ex["controller"], family, pre_controller)
    gl = run.steps.run(
        f"{key}/closed_loop",
        {**run.loop_inputs, "upstream": fp[f"{key}/export"], "points": [(p.name, p.spec) for p in pts]},
        keeps_folder(lambda folder: run.closed_loop(folder, pts, fp[f"{key}/export"])),
    )
    scores = (_scores if stage == "pre" else _read_scores)(
        run, key, tr["checkpoint"], ds["dataset"], real_sets, eval_set
    )
    labels = {
        "source": source,
        "kind": ds.get("label_kind"),
        "threshold": ds.get("label_threshold"),
        "threshold_rule": ds.get("label_threshold_rule"),
        "positive_rate": ds.get("positive_rate"),
        "counts": ds.get("labels"),
    }
    return {
        "family": family,
        "labels": labels,
        "tau": tr.get("tau"),
        "train_auroc": tr.get("auroc"),
        "controller": ex["controller"],
        "export_fp": fp[f"{key}/export"],
        **scores,
        "points": pts,
        "runs": gl["runs"],
    }


def _dataset(run: BenchRun, source: str, key: str, traces: list[str], stage: str = "pre") -> dict:
    """``dataset``: the training runs built into a decision dataset of ``stage`` labelled by ``source``."""
    cfg = run.cfg
    split_by = cfg["split_by"]  # the default leaves the step's fingerprint as it was before the setting existed

    def step(folder: Path) -> dict:
        m = build(
            traces,
            folder / "dataset",
            encoder=run.enc,
            labels=source,
            positive_rate=float(cfg["positive_rate"]),
            label_options=dict(cfg.get("label_options") or {}),
            progress=run.progress,
            split_by=split_by,
            **({"stage": stage} if stage != "pre" else {}),
        )
        return {
            "dataset": str(folder / "dataset"),
            "n_runs": m.get("n_runs"),
            "n_rows": (m.get("n_decisions") or {}).get("total"),
            "label_kind": m.get("label_kind"),
            "label_threshold": m.get("label_threshold"),
            "label_threshold_rule": m.get("label_threshold_rule"),
            "positive_rate": (m.get("positive_rate") or {}).get(m.get("label_kind")),
            "labels": m.get("labels"),
        }

    inputs = {
        "upstream": run.steps.fingerprints["simulate"],
        "labels": source,
        "positive_rate": cfg["positive_rate"],
        "label_options": cfg.get("label_options"),
        "encoder": run.enc_id,
        **({"split_by": split_by} if split_by != "run" else {}),
        **({"stage": stage} if stage != "pre" else {}),
    }
    return run.steps.run(f"{key}/dataset", inputs, step)


def _train(run: BenchRun, key: str, ds: dict) -> dict:
    """``train``: ``branchgate train`` with the config's ``train`` section on the dataset."""
    train = run.cfg["train"]

    def step(folder: Path) -> dict:
        from branchgate.training.fit import train as fit

        argv = [
            "--config",
            train["config"],
            "--data.dataset",
            ds["dataset"],
            "--data.encoder",
            run.enc,
            "--out",
            str(folder / "run"),
            "--wandb.mode",
            "disabled",
            *map(str, train["overrides"] or []),
        ]
        if not run.progress:
            argv.append("--trainer.enable_progress_bar=false")
        m = fit(resolve_config_names(argv))
        return {
            "checkpoint": str(folder / "run" / "controller.safetensors"),
            "tau": m.get("tau"),
            "auroc": m.get("auroc"),
            "epochs": m.get("epochs"),
        }

    return run.steps.run(f"{key}/train", {"upstream": run.steps.fingerprints[f"{key}/dataset"], "train": train}, step)


def _export(run: BenchRun, key: str, ds: dict, tr: dict) -> dict:
    """``export``: the controller as ONNX (fp32), its parity checked on the dataset."""

    def step(folder: Path) -> dict:
        from branchgate.export.controller import export_controller

        onnx = folder / "controller.onnx"
        rep = export_controller(tr["checkpoint"], onnx, int8=False, parity_dataset=ds["dataset"])
        return {"controller": str(onnx), "passed": rep.get("passed") if isinstance(rep, dict) else None}

    return run.steps.run(f"{key}/export", {"upstream": run.steps.fingerprints[f"{key}/train"]}, step)


def _scores(run: BenchRun, key: str, checkpoint: str, dataset: str, real_sets: dict, eval_set: dict) -> dict:
    """The gate and every teacher scored offline: ``offline`` (the dataset's test split), ``offline_eval``
    (``eval_data``, when its runs carry key points), ``real`` and ``real_by_depth`` (each ``--real`` dataset)."""
    boot, fp = run.boot, run.steps.fingerprints
    trained = {"upstream": fp[f"{key}/train"], "bootstrap": boot}

    def offline_step(folder: Path) -> dict:
        rows = stats.controller_rows(checkpoint, dataset, ("test",))
        return {
            "offline": stats.scorer_metrics(rows, boot, ref="gate"),
            "offline_by_depth": stats.by_depth(rows, boot, ref="gate"),
        }

    def offline_eval_step(folder: Path) -> dict:
        rows = stats.controller_rows(checkpoint, eval_set["dataset"], ("train", "validation", "test"))
        return {
            "offline_eval": stats.scorer_metrics(rows, boot, ref="gate"),
            "offline_eval_by_depth": stats.by_depth(rows, boot, ref="gate"),
        }

    def real_rows():
        for name, path in real_sets["datasets"].items():
            yield name, stats.controller_rows(checkpoint, path, ("train", "validation", "test"))

    def real_step(folder: Path) -> dict:
        return {name: real_table(stats.scorer_metrics(rows, boot, ref="gate")) for name, rows in real_rows()}

    def real_by_depth_step(folder: Path) -> dict:
        """The real decisions per depth stratum: depth 0 is a sequential agent's first search (no search state
        yet), where every relevance scorer ranks alike; depth ≥ 1 has earlier searches to judge against."""
        return {
            name: {k: real_table(t) for k, t in stats.by_depth(rows, boot, ref="gate").items()}
            for name, rows in real_rows()
        }

    off = run.steps.run(f"{key}/offline", trained, offline_step)
    oe = (
        {"offline_eval": {}, "offline_eval_by_depth": {}}
        if not eval_set.get("dataset")
        else run.steps.run(f"{key}/offline_eval", {**trained, "eval_data": fp["eval_data"]}, offline_eval_step)
    )
    real_inputs = {"upstream": fp[f"{key}/train"], "real": fp["real_data"], "bootstrap": boot}
    return {
        **off,
        **oe,
        "real": run.steps.run(f"{key}/real", real_inputs, real_step),
        "real_by_depth": run.steps.run(f"{key}/real_by_depth", real_inputs, real_by_depth_step),
    }


def real_table(table: dict) -> dict:
    """A real-decision table as reported: per scorer AUROC, AUPRC, CI and (not the gate) gate − scorer."""
    return {
        k: {
            "auroc": m["auroc"],
            "auprc": m["auprc"],
            "ci95": m["ci95_auroc"],
            "n_rows": m["n_rows"],
            **({"delta_vs_gate": m["delta_vs_gate"]} if "delta_vs_gate" in m else {}),
        }
        for k, m in table.items()
    }


def _read_scores(run: BenchRun, key: str, checkpoint: str, dataset: str, real_sets: dict, eval_set: dict) -> dict:
    """The read gate and every teacher (on the same snippets) scored offline: ``offline`` (its dataset's test
    split), ``offline_eval`` (the eval queries' unpruned runs' read decisions, ``eval_read_data``), and on each
    ``--real`` read dataset per hit (``real_read``) and per search (``real_read_search``: does any hit of the
    search add a key point; a scorer's score of a search is its best hit's), intervals over runs."""
    boot, fp = run.boot, run.steps.fingerprints
    trained = {"upstream": fp[f"{key}/train"], "bootstrap": boot}

    def offline_step(folder: Path) -> dict:
        rows = with_rank(stats.controller_rows(checkpoint, dataset, ("test",)))
        return {"offline": stats.scorer_metrics(rows, boot, ref="gate")}

    def offline_eval_step(folder: Path) -> dict:
        rows = with_rank(stats.controller_rows(checkpoint, eval_set["read_dataset"], ("train", "validation", "test")))
        return {"offline_eval": stats.scorer_metrics(rows, boot, ref="gate")}

    def real_step(folder: Path) -> dict:
        out = {"real_read": {}, "real_read_search": {}}
        for name, path in real_sets.get("read_datasets", {}).items():
            rows = with_rank(stats.controller_rows(checkpoint, path, ("train", "validation", "test")))
            out["real_read"][name] = real_table(stats.scorer_metrics(rows, boot, ref="gate"))
            out["real_read_search"][name] = real_table(stats.scorer_metrics(stats.per_decision(rows), boot, ref="gate"))
        return out

    off = run.steps.run(f"{key}/offline", trained, offline_step)
    oe = (
        {"offline_eval": {}}
        if not eval_set.get("read_dataset")
        else run.steps.run(f"{key}/offline_eval", {**trained, "eval_data": fp["eval_data"]}, offline_eval_step)
    )
    real_inputs = {"upstream": fp[f"{key}/train"], "real": fp["real_data"], "bootstrap": boot}
    return {**off, **oe, **run.steps.run(f"{key}/real", real_inputs, real_step)}


def with_rank(rows: stats.Rows) -> stats.Rows:
    """Read rows with the hit's rank as one more scorer (``rank``: the top hit scores highest), the search
    engine's own order that every read gate must beat."""
    rows.scorers["rank"] = -rows.order.astype(np.float64)
    return rows
