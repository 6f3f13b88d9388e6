"""Does `branchgate replay` predict what a controller does when it runs? (issue 52)

A bench (``branchgate bench``) runs each learned gate in the closed loop at a τ sweep (``OUT/<labels>/closed_loop``
for the pre-retrieval gate, ``OUT/read/<labels>/closed_loop`` for the read gate), and runs the eval queries unpruned
(``OUT/closed_loop/seed0/none``). Replay predicts each closed-loop point from the unpruned runs alone, with the
same controller at the same τ (``bench/replay.py``, the rules ``branchgate replay`` uses). This compares the two per
point: mean tokens, KPR and searches a run, and the paired difference per query with a 95% bootstrap interval
over queries (``training.stats.bootstrap_ci``).

    python3 -m research.replay_agreement --bench OUT [--labels keypoints] [--out agreement.json]

``--runs DIR`` takes the runs from DIR instead (the bench's controllers still): DIR/none the unpruned runs and
DIR/gate@tau=T, DIR/read_gate@tau=T, DIR/gate@budget=SHARE the closed loop, each made by ``branchgate simulate``
with the bench's settings on other queries (``--pre gate:OUT/<labels>/export/controller.onnx,tau=T``; ``--read``
for the read gate; ``--pre gate:...,budget_tokens=P%`` with ``--budget-reference`` the unpruned runs' totals for a
budget): the check on queries the replay's rules were not developed on.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from branchgate.bench.replay import ReplayRun, keypoint_value
from branchgate.bench.replay_cli import pre_rule, read_rule
from branchgate.inference.gate import Gate
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.training.stats import bootstrap_ci

POINT = re.compile(r"^(gate|read_gate)(@(tau|budget)=([0-9.]+))?$")


def query_of(run_id: str) -> str:
    return run_id.rsplit(".r", 1)[0]


def closed_loop(traces: Path) -> dict[str, tuple[float, float, float]]:
    """Per query: (tokens, KPR, searches) of the run's ``run_end`` totals."""
    out = {}
    for run in read_runs([traces]):
        t = run.events[-1].totals
        out[query_of(run.run_id)] = (float(t["tokens"]), float(t["kpr"]), float(t["search_calls"]))
    return out


def replayed(runs: list[ReplayRun], gate: Gate, point: dict) -> dict[str, tuple[float, float, float]]:
    """Per query: (tokens, KPR, searches) replayed at ``point`` ({"tau": T} or {"run_budget": share})."""
    out = {}
    for r in runs:
        if "run_budget" in point:
            unpruned = r.replay().tokens
            o = r.replay(budget=gate.run(budget_tokens=max(1, int(point["run_budget"] * unpruned)), charges=False))
        elif gate.stage == "pre":
            o = r.replay(pre_rule(gate, point["tau"]))
        else:
            o = r.replay(read=read_rule(gate, point["tau"], None))
        out[query_of(r.run_id)] = (o.tokens, keypoint_value(r, o), float(o.searches))
    return out


def points(bench: Path, labels: str, runs: Path | None):
    """(stage, folder, controller, point) of every plain gate point of the bench (calibrated and swept), or of
    ``runs``; a point is {"tau": T}, or {"run_budget": share} for a folder gate@budget=SHARE (a budgeted run)."""
    for stage, root in (("pre", bench / labels), ("read", bench / "read" / labels)):
        model = root / "export" / "controller.onnx"
        folder = runs or root / "closed_loop" / "seed0"
        if not model.exists() or not folder.exists():
            continue
        gate = Gate.load(model)
        for sub in sorted(folder.iterdir()):
            m = POINT.match(sub.name)
            if m and (m.group(1) == "gate") == (stage == "pre") and (sub / "traces").is_dir():
                value = float(m.group(4)) if m.group(4) else gate.tau
                yield stage, sub, gate, {"run_budget": value} if m.group(3) == "budget" else {"tau": value}


def compare(sim: dict, rep: dict, boot: int) -> dict:
    qs = sorted(set(sim) & set(rep))
    s = np.array([sim[q] for q in qs])
    r = np.array([rep[q] for q in qs])
    d = r - s
    out = {"queries": len(qs)}
    for i, name in enumerate(("tokens", "kpr", "searches")):
        out[name] = {
            "closed_loop": float(s[:, i].mean()),
            "replay": float(r[:, i].mean()),
            "diff": float(d[:, i].mean()),
            "diff_ci95": bootstrap_ci(np.arange(len(qs)), lambda idx, i=i: d[idx, i].mean(), boot),
        }
    out["tokens"]["rel"] = out["tokens"]["diff"] / out["tokens"]["closed_loop"]
    out["queries_same_tokens"] = int(np.sum(np.abs(d[:, 0]) < 0.5))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, type=Path)
    ap.add_argument("--labels", default="keypoints")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--runs", type=Path, default=None, help="runs made elsewhere (module docstring)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    unpruned = (args.runs / "none" if args.runs else args.bench / "closed_loop" / "seed0" / "none") / "traces"
    runs = [ReplayRun(r) for r in read_runs([unpruned])]
    rows = []
    print(
        "| stage | τ | queries | tokens closed loop → replay (Δ, 95%) | KPR closed loop → replay (Δ, 95%) | searches |"
    )
    print("|---|---|---|---|---|---|")
    for stage, folder, gate, point in points(args.bench, args.labels, args.runs):
        c = compare(closed_loop(folder / "traces"), replayed(runs, gate, point), args.bootstrap)
        rows.append({"stage": stage, "point": folder.name, **point, **c})
        name = f"{point['tau']:.3g}" if "tau" in point else f"budget {point['run_budget']:.0%}"
        t, k, n = c["tokens"], c["kpr"], c["searches"]
        print(
            f"| {stage} | {name} | {c['queries']} | {t['closed_loop']:.0f} → {t['replay']:.0f} ({t['rel']:+.1%}; "
            f"{t['diff_ci95'][0]:+.0f}, {t['diff_ci95'][1]:+.0f}) | {k['closed_loop']:.3f} → {k['replay']:.3f} "
            f"({k['diff']:+.3f}; {k['diff_ci95'][0]:+.3f}, {k['diff_ci95'][1]:+.3f}) | "
            f"{n['closed_loop']:.1f} → {n['replay']:.1f} |"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
