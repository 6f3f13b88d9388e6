"""`branchgate replay`'s report: per τ, the means over runs and the shares of the unpruned replay with 95% intervals
over runs; the recommended τ; ``replay.json``, ``replay.md`` and ``replay.png`` (value kept against tokens)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

from branchgate import __version__
from branchgate.fileio import atomic_write_json, atomic_write_text, mark_output_dir
from branchgate.limits import MAX_CANDIDATES, MAX_HITS
from branchgate.provenance import source_commit
from branchgate.training.stats import bootstrap_ci, mean_ci

log = logging.getLogger(__name__)
FIELDS = ("searches", "hits_read", "tokens", "value")


def summarise(rows: list[dict], runs, args, labels: str, sweep, skipped: list | None = None) -> dict:
    """The report: ``unpruned`` (means), ``points`` (per τ: means with intervals, shares of unpruned with
    intervals, what was saved), ``recommended``, what the replay ``left_out`` and the log records ``skipped``
    (``{file, line, reason}``, the first 100)."""
    base = np.array(rows[0]["per_run"], np.float64)
    points = []
    for row in rows[1:]:
        x = np.array(row["per_run"], np.float64)
        point = {k: row[k] for k in ("tau", "run_budget") if k in row}
        point.update({f: mean_ci(x[:, i], args.bootstrap) for i, f in enumerate(FIELDS)})
        point["name"] = point_name(point)
        for i, f in enumerate(FIELDS):
            point[f"{f}_share"] = share(x[:, i], base[:, i], args.bootstrap, bootstrap_ci)
        points.append(point)
    report = {
        "command": "branchgate " + " ".join(sys.argv[1:]),
        "branchgate": __version__,
        "commit": source_commit(),
        "stage": sweep.stage,
        "models": models(sweep),
        "labels": labels,
        "runs": len(runs),
        "runs_with_results": sum(r.has_results for r in runs),
        "decision_points": decision_points(runs),
        "left_out": left_out(runs),
        "skipped": {"records": len(skipped or []), "first": (skipped or [])[:100]},
        "unpruned": {f: float(base[:, i].mean()) for i, f in enumerate(FIELDS)},
        "logged_tokens": logged_tokens(runs),
        "points": points,
        "keep": args.keep,
        "budget": args.budget,
    }
    report["recommended"] = recommend(points, args.keep, args.budget)
    report["summary"] = summary_line(report)
    return report


def point_name(point: dict) -> str:
    """``τ 0.3`` or ``run budget 30%``: how the report names a point of the sweep."""
    if point.get("run_budget") is not None:
        return f"run budget {point['run_budget']:.0%}"
    return f"τ {point['tau']:g}"


def decision_points(runs) -> dict:
    """How many frames the runs hold and how many offer a single candidate (the Gate always keeps one)."""
    frames = [f for r in runs for f in r.frames.values()]
    return {"frames": len(frames), "single_candidate": sum(len(f.candidates) == 1 for f in frames)}


def left_out(runs) -> dict:
    """What the replay left out of the logs (``ReplayRun.left_out``), summed over runs, with the caps and the runs
    concerned: candidates past a frame's first ``MAX_CANDIDATES``, hits past a search's first ``MAX_HITS``, hits with
    neither title nor snippet."""
    keys = ("candidates", "hits", "hits_without_text")
    out = {k: int(sum(r.left_out[k] for r in runs)) for k in keys}
    out["runs"] = sum(any(r.left_out[k] for k in keys) for r in runs)
    out["caps"] = {"candidates": MAX_CANDIDATES, "hits": MAX_HITS}
    return out


def left_out_line(report: dict) -> str:
    """The summary's sentence on what the replay left out ("" when nothing was)."""
    lo = report.get("left_out") or {}
    caps = lo.get("caps", {})
    said = {
        "candidates": f"candidates past the first {caps.get('candidates')} of their frame",
        "hits": f"hits past the first {caps.get('hits')} of their search",
        "hits_without_text": "hits with neither title nor snippet",
    }
    parts = [f"{lo[k]} {text}" for k, text in said.items() if lo.get(k)]
    if not parts:
        return ""
    return f". Left out of the replay, in {lo['runs']} runs (replay.json's left_out): {'; '.join(parts)}"


def share(x: np.ndarray, base: np.ndarray, boot: int, bootstrap_ci) -> dict:
    """``mean(x) / mean(base)`` and its 95% interval, resampling runs (paired)."""
    total = float(base.mean())
    if total == 0:
        return {"mean": None, "ci95": [None, None]}
    ci = bootstrap_ci(np.arange(len(x)), lambda idx: x[idx].mean() / max(base[idx].mean(), 1e-12), boot)
    return {"mean": float(x.mean()) / total, "ci95": ci}


def recommend(points: list[dict], keep: float, budget: float | None) -> dict:
    """With ``budget``: the point with the most value within that token share; else the point with the fewest
    tokens keeping ``keep`` of the value (None when no τ does), by the point estimates."""
    if budget is not None:
        ok = [p for p in points if p["tokens_share"]["mean"] is not None and p["tokens_share"]["mean"] <= budget]
        best = max(ok, key=lambda p: p["value_share"]["mean"] or 0.0, default=None)
        rule = f"most value within {budget:.0%} of the unpruned tokens"
    else:
        ok = [p for p in points if (p["value_share"]["mean"] or 0.0) >= keep and p["tokens_share"]["mean"] is not None]
        best = min(ok, key=lambda p: p["tokens_share"]["mean"], default=None)
        rule = f"fewest tokens keeping {keep:.0%} of the value"
    if best is None:
        return {"rule": rule, "tau": None, "point": None}
    return {
        "rule": rule,
        "point": best["name"],
        "tau": best.get("tau"),
        "run_budget": best.get("run_budget"),
        "tokens_share": best["tokens_share"],
        "value_share": best["value_share"],
        "value_share_low_clears": keep <= (best["value_share"]["ci95"][0] or 0.0) if budget is None else None,
    }


def models(sweep) -> dict:
    out = {}
    for name, gate in (("pre", sweep.pre), ("read", sweep.read)):
        if gate is not None:
            out[name] = {"path": str(gate.path), "tau": gate.tau, "encoder": gate.encoder}
    if sweep.stage == "read" and sweep.pre is not None:
        out["pre"]["replayed_tau"] = sweep.pre_tau
    return out


def logged_tokens(runs) -> float | None:
    """The runs' mean ``run_end`` total tokens when they record it (the unpruned replay should equal it)."""
    got = [float(r.totals["tokens"]) for r in runs if r.totals.get("tokens") is not None]
    return float(np.mean(got)) if len(got) == len(runs) else None


def summary_line(report: dict) -> str:
    rec = report["recommended"]
    if rec["point"] is None:
        most = max(report["points"], key=lambda p: p["value_share"]["mean"] or 0.0)
        return (
            f"{report['runs']} runs replayed; no point of the sweep meets the rule ({rec['rule']}); the most value: "
            f"{most['name']}, {_share(most['value_share'])} at {_share(most['tokens_share'])} of "
            f"the tokens (sweep {'higher' if report['budget'] is not None else 'lower'} τ with --taus)"
            + left_out_line(report)
        )
    line = (
        f"{report['runs']} runs replayed; recommended {report['stage']} {rec['point']} ({rec['rule']}): "
        f"{rec['value_share']['mean']:.1%} of the value at {rec['tokens_share']['mean']:.1%} of the tokens"
    )
    dp = report["decision_points"]
    if report["stage"] == "pre" and all(p["tokens_share"]["mean"] == 1.0 for p in report["points"]):
        line += (
            f". No point prunes anything: {dp['single_candidate']} of the {dp['frames']} decision points offer a "
            "single candidate, which the pre-retrieval controller always keeps (chain-shaped logs: try --read)"
        )
    return line + left_out_line(report)


def _share(m: dict) -> str:
    return "–" if m["mean"] is None else f"{m['mean']:.1%}"


def _pct(m: dict) -> str:
    lo, hi = m["ci95"]
    if m["mean"] is None:
        return "–"
    return f"{m['mean']:.1%} [{lo:.1%}, {hi:.1%}]" if lo is not None else f"{m['mean']:.1%}"


def markdown(report: dict) -> str:
    u = report["unpruned"]
    lines = [
        f"# Replay: the {report['stage']} controller on {report['runs']} runs",
        "",
        f"Value kept: `{report['labels']}`. Unpruned: {u['searches']:.1f} searches, {u['hits_read']:.1f} hits read, "
        f"{u['tokens']:.0f} tokens, value {u['value']:.3f} a run (means). Intervals: 95%, bootstrap over runs.",
        "",
        f"**{report['summary']}**",
        "",
        "| point | searches | hits read | tokens | token share | value | value share |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in report["points"]:
        lines.append(
            f"| {p['name']} | {p['searches']['mean']:.1f} | {p['hits_read']['mean']:.1f} | {p['tokens']['mean']:.0f} "
            f"| {_pct(p['tokens_share'])} | {p['value']['mean']:.3f} | {_pct(p['value_share'])} |"
        )
    lines += ["", f"Command: `{report['command']}` (branchgate {report['branchgate']}, commit {report['commit']})", ""]
    return "\n".join(lines)


def _or(value, default):
    return default if value is None else value


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for kind, label in (("tau", "τ swept"), ("run_budget", "run budget swept")):
        pts = [
            p
            for p in report["points"]
            if p.get(kind) is not None and None not in (p["tokens_share"]["mean"], p["value_share"]["mean"])
        ]
        if not pts:
            continue
        x = np.array([100 * p["tokens_share"]["mean"] for p in pts])
        y = np.array([100 * p["value_share"]["mean"] for p in pts])
        lo = np.array([100 * _or(p["value_share"]["ci95"][0], p["value_share"]["mean"]) for p in pts])
        hi = np.array([100 * _or(p["value_share"]["ci95"][1], p["value_share"]["mean"]) for p in pts])
        err = np.clip(np.stack([y - lo, hi - y]), 0, None)  # a percentile interval of few runs may miss the mean
        ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=2, label=f"{report['stage']} controller, {label}")
        for p, xi, yi in zip(pts, x, y):
            text = f"{p['tau']:g}" if kind == "tau" else f"{p['run_budget']:.0%}"
            ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(4, -10), fontsize=7)
    rec = report["recommended"]
    if rec["point"] is not None:
        ax.scatter(
            [100 * rec["tokens_share"]["mean"]],
            [100 * rec["value_share"]["mean"]],
            s=120,
            facecolors="none",
            edgecolors="red",
            label=f"recommended: {rec['point']}",
        )
    ax.axhline(100 * report["keep"], color="grey", ls="--", lw=1)
    ax.set_xlabel("LLM tokens, % of the unpruned replay")
    ax.set_ylabel(f"value kept ({report['labels']}), % of unpruned")
    ax.set_title(f"replay on {report['runs']} of your runs (95% intervals over runs)", fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # nothing drawn when the logs record no tokens
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(out: Path, report: dict, kind: str) -> list[str]:
    """Writes the report's files; returns the names of those written (no picture without tokens or matplotlib)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "replay.json", report)
    atomic_write_text(out / "replay.md", markdown(report))
    written = ["replay.json", "replay.md"]
    try:
        if report["unpruned"]["tokens"]:  # without token counts there is nothing to draw
            plot(report, out / "replay.png")
            written.append("replay.png")
    except ModuleNotFoundError as exc:  # the core install: the table and JSON only
        log.warning("replay.png not drawn: %s is not installed (pip install 'branchgate[replay]')", exc.name)
    mark_output_dir(out, kind)  # its manifest lists every file written above
    return written
