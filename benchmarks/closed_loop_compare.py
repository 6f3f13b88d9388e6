"""Paired comparison of closed-loop configurations run on the same queries (prints figures).

A thin wrapper over ``branchgate.bench`` (``branchgate bench`` runs the whole experiment and reports this as
``policies`` and ``gate_vs``): reads the run totals of every ``OUT/<config>/traces/*.jsonl`` (any
``branchgate simulate`` runs sharing queries), pairs runs by query id, and prints each configuration's means
with paired bootstrap 95% intervals (resampling queries) for its difference from a reference one.

    python benchmarks/closed_loop_compare.py OUT [--ref gate-none-none] [--boot 2000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

KEYS = ("kpr", "tokens", "nodes")


def main() -> None:
    from branchgate.bench.closed_loop import per_query
    from branchgate.bench.stats import mean_ci

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="folder holding one sub-folder per configuration")
    ap.add_argument("--ref", default="gate-none-none", help="reference configuration (default gate-none-none)")
    ap.add_argument("--boot", type=int, default=2000)
    args = ap.parse_args()
    configs = {d.name: per_query(d) for d in sorted(Path(args.out).iterdir()) if (d / "traces").is_dir()}
    if args.ref not in configs:
        raise SystemExit(f"no configuration {args.ref!r} under {args.out} (found {sorted(configs)})")
    ref = configs[args.ref]
    print(f"{'config':<20} {'runs':>5} " + " ".join(f"{k:>10}" for k in KEYS)
          + f"   Δ ({args.ref} − config) mean [95% CI] for " + ", ".join(KEYS))
    for name, runs in configs.items():
        common = sorted(set(runs) & set(ref))
        line = f"{name:<20} {len(runs):5d} " + " ".join(f"{np.mean([runs[q][k] for q in runs]):10.4g}" for k in KEYS)
        if name != args.ref and common:
            parts = []
            for k in KEYS:
                d = mean_ci([ref[q][k] - runs[q][k] for q in common], args.boot)
                parts.append(f"{d['mean']:+.4g} [{d['ci95'][0]:+.4g}, {d['ci95'][1]:+.4g}]")
            line += f"   ({len(common)} paired) " + "; ".join(parts)
        print(line)


if __name__ == "__main__":
    main()
