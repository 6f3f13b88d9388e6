"""Run `branchgate bench-gate --json` several times, each in a fresh process, and summarise the speed ratios.

    python benchmarks/bench_gate_runs.py --model quickstart/controller.onnx \
        --checkpoint quickstart/run/controller.safetensors --runs 8

One run's ratio moves with the machine's speed at the time (see docs/research/gate-latency.md), so a single run
cannot say how often a target holds. This prints every run's p50s and ratios with their 95% intervals over
rounds, then the median, range and how many runs reach each target. ``--out FILE`` also keeps each run's
JSON object, one per line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="controller.onnx (its .int8.onnx twin is used when present)")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--reps", type=int, default=10, help="rounds per run (bench-gate's default: 10)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target-int8", type=float, default=4.0)
    parser.add_argument("--target-fp32", type=float, default=1.5)
    parser.add_argument("--out", default=None, help="JSON Lines file for every run's figures")
    args = parser.parse_args()
    if args.runs < 1 or args.reps < 1:
        parser.error("--runs and --reps must be at least 1")

    from branchgate.fileio import atomic_write_text

    cmd = [
        sys.executable,
        "-m",
        "branchgate.cli",
        "bench-gate",
        "--pre",
        args.model,
        "--checkpoint",
        args.checkpoint,
        "--reps",
        str(args.reps),
        "--threads",
        str(args.threads),
        "--json",
    ]
    results, failed = [], False
    print(
        "| run | torch p50 ms | fp32 p50 ms | int8 p50 ms | fp32 ratio [95%] | int8 ratio [95%] "
        "| fp32 parity (max abs Δp_keep) |"
    )
    print("|---|---|---|---|---|---|---|")
    for i in range(1, args.runs + 1):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"run {i}: bench-gate failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}", file=sys.stderr)
            failed = True  # the runs so far are still written and summarised
            break
        res = json.loads(proc.stdout)
        results.append(res)
        if args.out:  # rewritten after every run, so an interrupted series keeps its finished runs
            atomic_write_text(args.out, "".join(json.dumps(r) + "\n" for r in results))
        print(
            f"| {i} | {res['torch_ms_p50']:.1f} | {res['onnx_fp32_ms_p50']:.1f} "
            f"| {res.get('onnx_int8_ms_p50', float('nan')):.1f} "
            f"| {_ratio(res, 'fp32')} | {_ratio(res, 'int8')} | {res['onnx_fp32_max_abs_diff_p_keep']:.1e} |",
            flush=True,
        )
    print()
    for name, target in (("fp32", args.target_fp32), ("int8", args.target_int8)):
        ratios = [r[f"speedup_{name}"] for r in results if f"speedup_{name}" in r]
        if ratios:
            hits = sum(x >= target for x in ratios)
            print(
                f"{name}: median {statistics.median(ratios):.2f}x, range {min(ratios):.2f}x-{max(ratios):.2f}x, "
                f"{hits} of {len(ratios)} runs at {target:g}x or more"
            )
    return 1 if failed else 0


def _ratio(res: dict, name: str) -> str:
    key = f"speedup_{name}"
    if key not in res:
        return "-"
    lo, hi = res[f"{key}_ci95"]
    return f"{res[key]:.2f}x [{lo:.2f}, {hi:.2f}]"


if __name__ == "__main__":
    sys.exit(main())
