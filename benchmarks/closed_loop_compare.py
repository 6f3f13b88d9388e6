"""Paired comparison of closed-loop configurations run on the same queries (prints figures).

Reads the run totals of every ``OUT/<config>/traces/*.jsonl`` written by ``benchmarks/closed_loop.sh`` (or
any ``branchgate simulate`` runs sharing queries), pairs runs by query id, and prints each configuration's
means with paired bootstrap 95% intervals (resampling queries) for its difference from a reference one.

    python benchmarks/closed_loop_compare.py OUT [--ref gate-none-none] [--boot 2000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

KEYS = ("kpr", "tokens", "nodes")


def per_query(config_dir: Path) -> dict[str, dict]:
    """{query id: run totals} of a configuration's finished traces (first repetition of each query)."""
    from branchgate.pipeline.simulate import read_totals

    out = {}
    for path in sorted((config_dir / "traces").glob("*.jsonl")):
        qid, _, rest = path.stem.partition(".r")
        if not rest.startswith("0."):
            continue
        totals = read_totals(path)
        if totals:
            out[qid] = totals
    return out


def paired_interval(diff: np.ndarray, boot: int, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of per-query differences, resampling queries."""
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(boot, len(diff)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
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
        means = " ".join(f"{np.mean([runs[q][k] for q in runs]):10.4g}" for k in KEYS)
        line = f"{name:<20} {len(runs):5d} {means}"
        if name != args.ref and common:
            parts = []
            for k in KEYS:
                diff = np.array([ref[q][k] - runs[q][k] for q in common], np.float64)
                lo, hi = paired_interval(diff, args.boot)
                parts.append(f"{diff.mean():+.4g} [{lo:+.4g}, {hi:+.4g}]")
            line += f"   ({len(common)} paired) " + "; ".join(parts)
        print(line)


if __name__ == "__main__":
    main()
