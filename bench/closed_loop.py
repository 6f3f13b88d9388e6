"""The closed loop: every policy point through the reference pipeline on the eval queries, then per-policy
means with bootstrap intervals over queries and the gate's paired KPR difference at each baseline's budget.

Each point runs in OUT/closed_loop/<name>/ (``pipeline.simulate``, resumable) with its own fingerprint in
``point.json``: a changed setting re-runs only the points it touches.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np

from branchgate.bench.steps import fingerprint
from branchgate.bench.sweeps import PolicyPoint
from branchgate.fileio import atomic_write_json, mark_output_dir
from branchgate.models.encoder import Encoder
from branchgate.pipeline import env as envmod
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import OUTPUT_KIND as SIMULATE
from branchgate.pipeline.simulate import read_totals, simulate
from branchgate.training.stats import mean_ci

KEYS = ("nodes", "tokens", "kpr")
SEARCH_KEYS = ("search_calls", "hits_offered", "hits_read")  # a run's search accounting besides LLM tokens


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@=+-]", "_", name)


def per_query(folder: Path) -> dict[str, dict]:
    """{query id: run totals} of a simulate folder's finished traces (first repetition of each query)."""
    out = {}
    for path in sorted((Path(folder) / "traces").glob("*.jsonl")):
        qid, _, rest = path.stem.partition(".r")
        if rest.startswith("0.") and (totals := read_totals(path)):
            out[qid] = totals
    return out


def run_points(
    env: str,
    sim: dict,
    pts: list[PolicyPoint],
    queries_file: str,
    out: Path,
    upstream: dict,
    encoder=None,
    progress: bool = False,
    workers: int = 1,
) -> dict[str, dict[str, dict]]:
    """Simulate every point (reusing folders whose fingerprint matches); {name: {query id: totals}}.

    With ``workers`` > 1 the points run in that many processes, each loading the environment and the encoder
    once (a point's runs stay in one process, so its traces are those of a serial run)."""
    from tqdm.auto import tqdm

    todo = []
    for p in pts:
        folder = out / safe_name(p.name)
        inputs = {
            "sim": sim,
            "pre": p.pre,
            "post": p.post,
            "synth": p.synth,
            **({"read": p.read} if p.read != "none" else {}),  # points without a read stage keep their fingerprints
            "queries": upstream["queries"],
            **({"export": upstream["export"]} if "gate:" in p.spec else {}),
            **({"reference": _file_hash(sim["budget_reference"])} if sim.get("budget_reference") else {}),
        }
        fp = fingerprint(inputs)
        mark = folder / "point.json"
        if folder.exists() and not (mark.is_file() and json.loads(mark.read_text()).get("fingerprint") == fp):
            shutil.rmtree(folder)
        if not mark.is_file():
            todo.append((p, str(folder), fp))
    todo.sort(key=lambda job: job[0].family != "none")  # the unpruned point is the longest: start it first
    bar = tqdm(total=len(todo), desc="policy points", unit="point", disable=not progress)
    try:
        if workers <= 1 or len(todo) <= 1:
            for job in todo:
                _run_point(env, sim, job, queries_file, encoder)
                bar.update(1)
        else:
            from branchgate.pipeline.simulate import spawn_map

            jobs = [(sim, job, queries_file) for job in todo]
            for _ in spawn_map(_point_job, jobs, workers, _init_worker, (env, sim["encoder"])):
                bar.update(1)
    finally:
        bar.close()
    return {p.name: per_query(out / safe_name(p.name)) for p in pts}


def _file_hash(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


_WORKER: dict = {}


def _init_worker(env_path: str, encoder: str) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    _WORKER["env"], _WORKER["encoder"] = envmod.load(env_path), Encoder.load(encoder)


def _point_job(args) -> str:
    sim, job, queries_file = args
    _run_point(_WORKER["env"], sim, job, queries_file, _WORKER["encoder"])
    return job[0].name


def _run_point(env, sim: dict, job, queries_file: str, encoder) -> None:
    p, folder, fp = job
    cfg = Config(**sim, pre=p.pre, read=p.read, post=p.post, synth=p.synth)
    simulate(env, cfg, folder, queries_file=queries_file, progress=False, encoder=encoder)
    atomic_write_json(Path(folder) / "point.json", {"fingerprint": fp, "name": p.name, "spec": p.spec})
    mark_output_dir(folder, SIMULATE)  # the point's folder is simulate's output: its record lists point.json too


def summarize(pts: list[PolicyPoint], runs: dict[str, dict[str, dict]], boot: int, seed: int = 0) -> dict:
    """``{NAME: {"spec", "stages", "family", "budget", "runs", "nodes", "tokens", "kpr", ...}}`` with ``{"mean",
    "ci95"}`` each of ``KEYS`` and of the search accounting (``SEARCH_KEYS``) when the runs carry it."""
    out = {}
    for p in pts:
        r = runs[p.name]
        qs = sorted(r)
        out[p.name] = {
            "spec": p.spec,
            "stages": p.stages,
            "family": p.family,
            "budget": p.budget,
            "runs": len(qs),
            **{k: mean_ci([r[q][k] for q in qs], boot, seed) for k in KEYS},
            **{k: mean_ci([r[q][k] for q in qs], boot, seed) for k in SEARCH_KEYS if qs and all(k in r[q] for q in qs)},
        }
    return out


def gate_curve(pts: list[PolicyPoint], runs: dict, family: str = "gate") -> list[tuple[float, dict[str, float]]]:
    """One gate's τ points (those of curve ``family``) as (mean tokens, {query: kpr}), sorted by tokens."""
    curve = []
    for p in pts:
        if p.family == family:
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


def gate_vs(pts: list[PolicyPoint], runs: dict, boot: int, seed: int = 0, family: str = "gate") -> dict:
    """``{BASELINE: {"tokens", "kpr_delta": {"mean", "ci95"}, "extrapolated", "outside", "queries"}}``: the KPR
    of gate ``family`` at each baseline's mean token budget (interpolated along its τ sweep) minus the
    baseline's, paired by query. Baselines are the points that do not use a gate. Outside the sweep the gate's
    nearest end is used (``extrapolated``); ``outside`` says which way: ``cheaper`` (the baseline spends less
    than the gate's cheapest point, so the gate spends more: not a fair comparison) or ``dearer`` (the gate
    spends less)."""
    curve = gate_curve(pts, runs, family)
    out = {}
    for p in pts:
        if "gate:" in p.spec or not curve:
            continue
        out[p.name] = paired_at(curve, runs[p.name], boot, seed)
    return out


def paired_at(curve, r: dict, boot: int, seed: int = 0) -> dict:
    """``curve`` (``gate_curve``) at the mean tokens of the runs ``r`` ({query: totals}) minus their KPR, paired
    by query: ``{"tokens", "kpr_delta", "extrapolated", "outside", "queries"}`` (``gate_vs`` says what they mean)."""
    tokens = float(np.mean([t["tokens"] for t in r.values()])) if r else float("nan")
    g, clamped = interpolate(curve, tokens)
    qs = sorted(set(g) & set(r))
    return {
        "tokens": tokens,
        "kpr_delta": mean_ci([g[q] - r[q]["kpr"] for q in qs], boot, seed),
        "extrapolated": clamped,
        "outside": None if not clamped else ("cheaper" if tokens < curve[0][0] else "dearer"),
        "queries": len(qs),
    }


def average_seeds(by_seed: list[dict[str, dict[str, dict]]]) -> dict[str, dict[str, dict]]:
    """{name: {query: totals}} with each numeric total averaged over the seeds that ran the query."""
    out: dict[str, dict[str, dict]] = {}
    for name in by_seed[0]:
        qs = set.intersection(*(set(s[name]) for s in by_seed))
        keys = [k for k in (*KEYS, *SEARCH_KEYS) if all(k in s[name][q] for s in by_seed for q in qs)]
        out[name] = {q: {k: float(np.mean([s[name][q][k] for s in by_seed])) for k in keys} for q in sorted(qs)}
    return out


def curve_vs(pts: list[PolicyPoint], runs: dict, family: str, other: str, boot: int, seed: int = 0) -> dict:
    """``{POINT: {"tokens", "kpr_delta", "extrapolated", "outside", "queries"}}``: curve ``family``'s KPR at each
    point of curve ``other``'s mean tokens (interpolated as in ``gate_vs``) minus that point's, paired by query —
    e.g. both learned stages against the pre-retrieval gate alone at equal tokens."""
    curve = gate_curve(pts, runs, family)
    out = {}
    for p in pts:
        if p.family == other and curve:
            out[p.name] = paired_at(curve, runs[p.name], boot, seed)
    return out
