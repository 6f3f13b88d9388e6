"""Paired comparison of a trained controller against the teacher baselines on a dataset's test split.

A thin wrapper over ``branchgate.bench.stats`` (what ``branchgate bench`` reports as ``offline`` and
``offline_by_depth``): AUROC with its bootstrap 95% interval over runs, AUPRC, top-1 (all decision points, and the informative ones) for the model and each
``teacher_*`` column, the paired bootstrap interval of model − teacher AUROC, pooled and per depth stratum
(the root frame is easy: most of its candidates are positive).

    python benchmarks/compare_baselines.py --checkpoint RUN/controller.safetensors --dataset DS [--boot 1000]
"""

from __future__ import annotations

import argparse


def _table(title: str, table: dict) -> None:
    print(f"{title}\n{'scorer':<10} {'AUROC [95% CI over runs]':>26} {'AUPRC':>7} {'top1':>7} {'top1-inf':>8}   Δ model − scorer [95% CI]")
    for name, m in table.items():
        lo, hi = m["ci95_auroc"]
        line = f"{name:<10} {m['auroc'] or float('nan'):7.4f} [{lo or float('nan'):.4f}, {hi or float('nan'):.4f}]   " \
               f"{m['auprc'] or float('nan'):7.4f} {m['top1'] or float('nan'):7.4f} {m['top1_informative'] or float('nan'):8.4f}"
        if "delta_vs_gate" in m:
            d = m["delta_vs_gate"]
            lo, hi = d["ci95"]
            line += f"   {d['mean'] or float('nan'):+.4f} [{lo or float('nan'):+.4f}, {hi or float('nan'):+.4f}]"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--boot", type=int, default=1000)
    args = ap.parse_args()
    from branchgate.bench.stats import by_depth, controller_rows, scorer_metrics

    rows = controller_rows(args.checkpoint, args.dataset, ("test",))
    print(f"test: {len(rows.by_run)} runs, {len(rows.labels)} labelled rows ('gate' is the model)")
    _table("all depths", scorer_metrics(rows, args.boot, ref="gate"))
    for stratum, table in by_depth(rows, args.boot, ref="gate").items():
        _table(f"\n{stratum}", table)


if __name__ == "__main__":
    main()
