"""The closed loop: every policy point through the reference pipeline on the eval queries, then per-policy
means with bootstrap intervals over queries and the gate's paired KPR difference at each baseline's budget.

Each point runs in OUT/closed_loop/<name>/ (``pipeline.simulate``, resumable) with its own fingerprint in
``point.json``: a changed setting re-runs only the points it touches.
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__"):  # the repository root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import json
import re
import shutil
from pathlib import Path

import numpy as np

from branchgate.bench.policies import PolicyPoint
from branchgate.bench.stats import mean_ci
from branchgate.bench.steps import fingerprint
from branchgate.fileio import atomic_write_json

KEYS = ("nodes", "tokens", "kpr")


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@=+-]", "_", name)


def per_query(folder: Path) -> dict[str, dict]:
    """{query id: run totals} of a simulate folder's finished traces (first repetition of each query)."""
    from branchgate.pipeline.simulate import read_totals

    out = {}
    for path in sorted((Path(folder) / "traces").glob("*.jsonl")):
        qid, _, rest = path.stem.partition(".r")
        if rest.startswith("0.") and (totals := read_totals(path)):
            out[qid] = totals
    return out


def run_points(env: str, sim: dict, pts: list[PolicyPoint], queries_file: str, out: Path, upstream: dict,
               encoder=None, progress: bool = False) -> dict[str, dict[str, dict]]:
    """Simulate every point (reusing folders whose fingerprint matches); {name: {query id: totals}}."""
    from branchgate.pipeline.run import Config
    from branchgate.pipeline.simulate import simulate

    result = {}
    for p in pts:
        folder = out / safe_name(p.name)
        inputs = {"sim": sim, "pre": p.pre, "post": p.post, "synth": p.synth, "queries": upstream["queries"],
                  **({"export": upstream["export"]} if "gate:" in p.spec else {})}
        fp = fingerprint(inputs)
        mark = folder / "point.json"
        if folder.exists() and not (mark.is_file() and json.loads(mark.read_text()).get("fingerprint") == fp):
            shutil.rmtree(folder)
        if not mark.is_file():
            cfg = Config(**sim, pre=p.pre, post=p.post, synth=p.synth)
            simulate(env, cfg, folder, queries_file=queries_file, progress=progress, encoder=encoder)
            atomic_write_json(mark, {"fingerprint": fp, "name": p.name, "spec": p.spec})
        result[p.name] = per_query(folder)
    return result


def summarize(pts: list[PolicyPoint], runs: dict[str, dict[str, dict]], boot: int, seed: int = 0) -> dict:
    """``{NAME: {"spec", "family", "budget", "runs", "nodes", "tokens", "kpr"}}`` with ``{"mean", "ci95"}`` each."""
    out = {}
    for p in pts:
        r = runs[p.name]
        qs = sorted(r)
        out[p.name] = {"spec": p.spec, "family": p.family, "budget": p.budget, "runs": len(qs),
                       **{k: mean_ci([r[q][k] for q in qs], boot, seed) for k in KEYS}}
    return out


def gate_curve(pts: list[PolicyPoint], runs: dict) -> list[tuple[float, dict[str, float]]]:
    """The gate's τ points as (mean tokens, {query: kpr}), sorted by tokens."""
    curve = []
    for p in pts:
        if p.family == "gate":
            r = runs[p.name]
            curve.append((float(np.mean([t["tokens"] for t in r.values()])), {q: t["kpr"] for q, t in r.items()}))
    return sorted(curve, key=lambda c: c[0])


def interpolate(curve, tokens: float) -> tuple[dict[str, float], bool]:
    """Per-query gate KPR at a mean token budget, linear between the two bracketing τ points (clamped to the
    ends: the flag says so)."""
    xs = [c[0] for c in curve]
    if tokens <= xs[0] or tokens >= xs[-1]:
        end = curve[0] if tokens <= xs[0] else curve[-1]
        return dict(end[1]), not np.isclose(tokens, end[0])
    j = int(np.searchsorted(xs, tokens))
    (x0, a), (x1, b) = curve[j - 1], curve[j]
    w = 0.0 if x1 == x0 else (tokens - x0) / (x1 - x0)
    return {q: (1 - w) * a[q] + w * b[q] for q in a if q in b}, False


def gate_vs(pts: list[PolicyPoint], runs: dict, boot: int, seed: int = 0) -> dict:
    """``{BASELINE: {"tokens", "kpr_delta": {"mean", "ci95"}, "extrapolated", "queries"}}``: the gate's KPR at
    the baseline's mean token budget (interpolated along its τ sweep) minus the baseline's, paired by query."""
    curve = gate_curve(pts, runs)
    out = {}
    for p in pts:
        if p.family == "gate" or not curve:
            continue
        r = runs[p.name]
        tokens = float(np.mean([t["tokens"] for t in r.values()])) if r else float("nan")
        g, clamped = interpolate(curve, tokens)
        qs = sorted(set(g) & set(r))
        out[p.name] = {"tokens": tokens, "kpr_delta": mean_ci([g[q] - r[q]["kpr"] for q in qs], boot, seed),
                       "extrapolated": clamped, "queries": len(qs)}
    return out


def average_seeds(by_seed: list[dict[str, dict[str, dict]]]) -> dict[str, dict[str, dict]]:
    """{name: {query: totals}} with each numeric total averaged over the seeds that ran the query."""
    out: dict[str, dict[str, dict]] = {}
    for name in by_seed[0]:
        qs = set.intersection(*(set(s[name]) for s in by_seed))
        out[name] = {q: {k: float(np.mean([s[name][q][k] for s in by_seed])) for k in KEYS} for q in sorted(qs)}
    return out
