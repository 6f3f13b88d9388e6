"""Does a read gate trained on the simulator carry over to real result lists? (issue 50, first target)

Scores read controllers (checkpoints, by the training path) on a read decision dataset built from real traces
(`branchgate dataset build --stage read`), every split: AUROC per hit and per search (does any hit of the search
add a key point), beside every teacher on the same snippets and the search engine's rank, with each scorer's
paired difference to the gate (bootstrap over runs). The same tables `branchgate bench --real` writes as
`real_read` / `real_read_search`, for controllers trained outside a bench.

    python3 -m research.read_gate_real DATASET CHECKPOINT [CHECKPOINT ...] [--boot 1000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from branchgate.bench.gate_steps import real_table, with_rank
from branchgate.training import stats

SPLITS = ("train", "validation", "test")


def tables(checkpoint: str, dataset: str, boot: int) -> dict:
    rows = with_rank(stats.controller_rows(checkpoint, dataset, SPLITS))
    return {
        "per_hit": real_table(stats.scorer_metrics(rows, boot, ref="gate")),
        "per_search": real_table(stats.scorer_metrics(stats.per_decision(rows), boot, ref="gate")),
        "rows": int(len(rows.labels)),
        "positive": int(rows.labels.sum()),
        "runs": len(rows.by_run),
    }


def show(name: str, t: dict) -> None:
    print(f"\n{name}: {t['rows']} hits ({t['positive']} add a key point) in {t['runs']} runs")
    for unit in ("per_hit", "per_search"):
        print(f"  {unit}:  scorer  AUROC [95%]  gate − scorer [95%]")
        ranked = sorted(t[unit].items(), key=lambda kv: -(kv[1]["auroc"] or 0))
        for scorer, m in ranked:
            lo, hi = m["ci95"]
            d = m.get("delta_vs_gate")
            dd = "" if d is None else f"  {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
            print(f"    {scorer:<10} {m['auroc']:.3f} [{lo:.3f}, {hi:.3f}]{dd}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--json", default=None, help="write every table here")
    a = ap.parse_args(argv)
    out = {}
    for ckpt in a.checkpoints:
        out[ckpt] = tables(ckpt, a.dataset, a.boot)
        show(ckpt, out[ckpt])
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
