"""Compare `branchgate bench` reports side by side: one row per report (an ablation, a seed), the figures the
issue-22 targets name.

    python3 scripts/compare_reports.py NAME=OUT/report.json [NAME=OUT/report.json ...] [--baseline dpp@2]

Columns: the gate's AUROC on each real dataset and its paired difference to the best teacher there (95%
interval over runs); AUROC within depth ≥ 1 of the simulator test split minus the best teacher there; the
gate's KPR minus the baseline's at the baseline's tokens (paired over eval queries); and the cheapest point of
the τ sweep reaching 95% of unpruned KPR (share of the unpruned tokens), if any. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _ci(d: dict) -> str:
    lo, hi = d["ci95"]
    return f"{d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _best_teacher(table: dict) -> str:
    return max((k for k in table if k != "gate"), key=lambda k: table[k]["auroc"])


def row(name: str, report: dict, baseline: str) -> list[str]:
    cells = [name]
    for _ds, table in sorted(report.get("real", {}).items()):
        best = _best_teacher(table)
        cells.append(
            f"{table['gate']['auroc']:.3f} ({best} {table[best]['auroc']:.3f}; {_ci(table[best]['delta_vs_gate'])})"
        )
    deep = report["offline_by_depth"]["depth1+"]
    best = _best_teacher(deep)
    cells.append(f"{deep['gate']['auroc']:.3f} ({best}: {_ci(deep[best]['delta_vs_gate'])})")
    cells.append(_ci(report["gate_vs"][baseline]["kpr_delta"]))
    none = report["policies"]["none"]
    reach = sorted(
        p["tokens"]["mean"] / none["tokens"]["mean"]
        for p in report["policies"].values()
        if p["family"] == "gate" and p["kpr"]["mean"] >= 0.95 * none["kpr"]["mean"]
    )
    cells.append(f"{reach[0]:.0%}" if reach else "never")
    return cells


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", metavar="NAME=PATH")
    ap.add_argument("--baseline", default="dpp@2")
    args = ap.parse_args()
    rows = []
    for spec in args.reports:
        name, _, path = spec.rpartition("=")
        report = json.loads(Path(path).read_text())
        rows.append(row(name or path, report, args.baseline))
        real = sorted(report.get("real", {}))
    head = [
        "run",
        *[f"real {ds}: gate (best teacher; gate − it)" for ds in real],
        "depth ≥ 1: gate (best teacher: gate − it)",
        f"KPR − {args.baseline} at its tokens",
        "95% KPR at",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
