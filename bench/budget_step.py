"""The bench's ``budgets`` step: run budgets as a policy family, and the check that no run exceeded its budget.

Each query's budget is a fraction of *its own* unpruned tokens: the ``none`` point of the ``closed_loop`` step,
per seed, is written as ``OUT/budgets/seed<S>/reference.json`` ({query id: {nodes, tokens}}) and passed to the
pipeline as ``Config.budget_reference``; the specs say ``budget_tokens=P%`` (``bench/sweeps.budget_points``).
The check recomputes every run's budget from the reference (the same rounding: down) and its tokens from the
trace's own ``llm_call`` events (not from the run's totals), so a run over its budget cannot hide; it also
checks the run's reported total against those events. Summaries: per point nodes/tokens/KPR with intervals
over queries, the share of its budget a run spends, and per fraction each budgeted gate's KPR minus each
baseline's, paired over queries (``training/stats.bootstrap_ci`` through ``mean_ci``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from branchgate.bench import closed_loop
from branchgate.bench.settings import BenchRun, write_ids
from branchgate.bench.steps import keeps_folder
from branchgate.bench.sweeps import BUDGET_FAMILIES, PolicyPoint, budget_family, budget_points
from branchgate.errors import InputError
from branchgate.fileio import atomic_write_json
from branchgate.training.stats import mean_ci

KEYS = ("nodes", "tokens", "kpr")


def budget_step(run: BenchRun, gate_path: str, export_fp: str) -> dict | None:
    """``budgets``: run budgets at ``policies.budget_fractions`` of each query's unpruned tokens — the first label
    source's gate (``gate_path``, its export's fingerprint ``export_fp``) with and without deferral, and
    ``budget_baselines`` given the same budget — on the first ``budget_queries`` eval queries (0 = all). None when
    no fraction is configured."""
    section = run.cfg["policies"]
    pts = budget_points(section, gate_path)
    if not pts:
        return None
    n = int(section.get("budget_queries") or 0)
    ids = run.eval_ids[:n] if n > 0 else list(run.eval_ids)
    references = {seed: _unpruned(run.steps.out / "closed_loop" / f"seed{seed}" / "none", ids) for seed in run.seeds}
    inputs = {
        **run.loop_inputs,
        "queries": ids,
        "points": [(p.name, p.spec) for p in pts],
        "export": export_fp,
        "reference": {s: {q: [t["nodes"], t["tokens"]] for q, t in r.items()} for s, r in references.items()},
    }

    @keeps_folder
    def step(folder: Path) -> dict:
        qf = write_ids(folder, ids)
        by_seed, checks = [], {p.name: [] for p in pts}
        encoder = None
        if run.workers <= 1:
            from branchgate.models.encoder import Encoder

            encoder = Encoder.load(run.enc)
        for seed in run.seeds:
            ref_path = write_reference(references[seed], folder / f"seed{seed}" / "reference.json")
            out = folder / f"seed{seed}"
            by_seed.append(
                closed_loop.run_points(
                    run.env_path,
                    {**run.sim(seed), "budget_reference": ref_path},
                    pts,
                    qf,
                    out,
                    {"queries": ids, "export": export_fp},
                    encoder=encoder,
                    progress=run.progress,
                    workers=run.workers,
                )
            )
            reference = json.loads(Path(ref_path).read_text())
            for p in pts:
                checks[p.name] += check_runs(out / closed_loop.safe_name(p.name), p.budget, reference)
        return summarize(pts, closed_loop.average_seeds(by_seed), checks, run.boot)

    return run.steps.run("budgets", inputs, step)


def _unpruned(none_dir: Path, ids: list[str]) -> dict[str, dict]:
    """The unpruned runs (one seed's ``none`` point of the ``closed_loop`` step) that size each query's budget:
    read, not re-run; every query of ``ids`` needs one."""
    none = closed_loop.per_query(none_dir)
    missing = [q for q in ids if q not in none]
    if missing:
        raise InputError(
            f"{len(missing)} eval queries have no unpruned run to size their budget (e.g. {missing[0]!r})",
            str(none_dir),
        )
    return {q: none[q] for q in ids}


def write_reference(runs: dict[str, dict], path: Path) -> str:
    """{query id: {nodes, tokens}} of the unpruned runs (one seed), written for ``Config.budget_reference``."""
    atomic_write_json(path, {q: {"nodes": t["nodes"], "tokens": t["tokens"]} for q, t in sorted(runs.items())})
    return str(path)


def budget_of(fraction: float, reference_tokens: float) -> int:
    """A run's token budget as the pipeline computes it from the spec's ``P%`` (``BudgetSpec.resolve``: P percent
    of the reference, rounded down)."""
    pct = float(f"{100 * fraction:g}")  # the spec's text (bench/sweeps.budget_points)
    return int(math.floor(pct / 100.0 * max(0.0, float(reference_tokens)) + 1e-9))


def check_runs(folder: Path, fraction: float, reference: dict) -> list[dict]:
    """One row per finished run of a point's folder: query, budget, tokens counted from its ``llm_call`` events,
    the total it reported, and ``over`` (tokens beyond the budget, 0 when within)."""
    rows = []
    for path in sorted((Path(folder) / "traces").glob("*.jsonl")):
        qid, _, rest = path.stem.partition(".r")
        if not rest.startswith("0.") or qid not in reference:
            continue
        counted, reported = 0, None
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if '"llm_call"' not in line and '"run_end"' not in line:
                    continue
                e = json.loads(line)
                if e.get("type") == "llm_call":
                    counted += int(e.get("in_tokens") or 0) + int(e.get("out_tokens") or 0)
                elif e.get("type") == "run_end":
                    reported = (e.get("totals") or {}).get("tokens")
        if reported is None:
            continue  # an unfinished run
        budget = budget_of(fraction, reference[qid]["tokens"])
        rows.append(
            {
                "query": qid,
                "budget": budget,
                "tokens": counted,
                "reported": reported,
                "over": max(0, counted - budget),
                "mismatch": counted != reported,
            }
        )
    return rows


def summarize(
    pts: list[PolicyPoint], runs: dict[str, dict[str, dict]], checks: dict[str, list[dict]], boot: int, seed: int = 0
) -> dict:
    """The report's ``budgets`` entry (keys in ARCHITECTURE.md, "Bench report")."""
    by_point = {}
    for p in pts:
        r = runs.get(p.name) or {}
        qs = sorted(r)
        rows = checks.get(p.name) or []
        share = [row["tokens"] / row["budget"] for row in rows if row["budget"] > 0]
        by_point[p.name] = {
            "spec": p.spec,
            "family": p.family,
            "fraction": p.budget,
            "runs": len(qs),
            **{k: mean_ci([r[q][k] for q in qs], boot, seed) for k in KEYS},
            "budget_tokens": float(np.mean([row["budget"] for row in rows])) if rows else None,
            "budget_share": mean_ci(share, boot, seed),
            "violations": sum(row["over"] > 0 for row in rows),
            "max_over": max((row["over"] for row in rows), default=0),
            "total_mismatches": sum(row["mismatch"] for row in rows),
        }
    vs: dict[str, dict] = {}
    fractions = sorted({p.budget for p in pts})
    for f in fractions:
        at = {p.family: p.name for p in pts if p.budget == f}
        out = {}
        for fam in BUDGET_FAMILIES:
            g = at.get(budget_family(fam))
            if g is None:
                continue
            for fam_b, b in at.items():
                if fam_b in (budget_family(x) for x in BUDGET_FAMILIES):
                    continue
                qs = sorted(set(runs.get(g) or {}) & set(runs.get(b) or {}))
                out[f"{fam} vs {fam_b.partition(':')[2]}"] = {
                    "gate": g,
                    "baseline": b,
                    "queries": len(qs),
                    "kpr_delta": mean_ci([runs[g][q]["kpr"] - runs[b][q]["kpr"] for q in qs], boot, seed),
                }
            nd = at.get(budget_family("gate"))
            if fam == "gate+defer" and nd is not None:  # deferral's own effect, paired
                qs = sorted(set(runs.get(g) or {}) & set(runs.get(nd) or {}))
                out["gate+defer vs gate"] = {
                    "gate": g,
                    "baseline": nd,
                    "queries": len(qs),
                    "kpr_delta": mean_ci([runs[g][q]["kpr"] - runs[nd][q]["kpr"] for q in qs], boot, seed),
                }
        vs[f"{f:g}"] = out
    checked = sum(len(v) for v in checks.values())
    return {
        "fractions": [float(f) for f in fractions],
        "policies": by_point,
        "vs": vs,
        "violations": sum(v["violations"] for v in by_point.values()),
        "checked_runs": checked,
        "total_mismatches": sum(v["total_mismatches"] for v in by_point.values()),
        "queries": max((v["runs"] for v in by_point.values()), default=0),
    }
