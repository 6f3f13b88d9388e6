"""`branchgate bench-gate`: latency of the ONNX Gate (fp32, int8) vs the torch model on identical decisions (a read
controller's: read decisions of 10 hits)."""

from __future__ import annotations

import argparse
import json
import sys

from branchgate.export.latency import measure_latency
from branchgate.inference.gate_cli import read_decisions
from branchgate.inference.model_file import read_stage
from branchgate.inference.options import chosen_controller, controller_options


def configure(parser: argparse.ArgumentParser) -> None:
    controller_options(parser)  # --pre PATH or --read PATH; its .int8.onnx twin is used when present
    parser.add_argument(
        "--checkpoint", required=True, help="the controller.safetensors the model was exported from (torch side)"
    )
    parser.add_argument(
        "--int8-model", default=None, help="int8 model (default: the .int8.onnx sibling of the controller)"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="CPU threads for torch and each ONNX Gate alike (default 2)"
    )
    parser.add_argument("--reps", type=int, default=10, help="rounds over the decisions (default 10)")
    parser.add_argument(
        "--decisions",
        default=None,
        help="JSON Lines of decisions {state, candidates}, for a read controller {state, hits} (default: 8 built-in "
        "decisions, 8 candidates each; read: 8 of 10 hits each after 3 or 5 texts read)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")


def run(args) -> int:
    args.model = chosen_controller(args)
    decisions = None
    if args.decisions:
        stage = read_stage(args.model)
        items = "hits" if stage == "read" else "candidates"
        decisions = [(d["state"], d[items]) for d in read_decisions(args.decisions, stage=stage)]
    res = measure_latency(
        args.model,
        args.checkpoint,
        int8_model=args.int8_model,
        threads=args.threads,
        reps=args.reps,
        decisions=decisions,
        progress=not args.json,
    )
    if args.json:
        print(json.dumps(res))
        return 0
    what = f"{res['candidates_per_decision']:.1f} candidates each"
    if res.get("stage") == "read":
        what = (
            f"read decisions of {res['candidates_per_decision']:.1f} hits each after "
            f"{res['read_texts_per_decision']:.1f} texts read (read controller; warm = the state texts cached)"
        )
    print(
        f"{res['decisions']} decisions x {res['reps']} reps, {what}, "
        f"{res['threads']} threads, encoder {res['encoder']}; machine load (1-min average) "
        f"{res['load_avg_1min_start']:.2f} at the start, {res['load_avg_1min']:.2f} at the end"
    )
    print(f"{'state':6} {'method':10} {'p50 ms':>9} {'p95 ms':>9} {'speedup':>8}  (95% interval over rounds)")
    for state, prefix in (("cold", ""), ("warm", "warm_")):
        for name in ("torch", "onnx_fp32", "onnx_int8"):
            if f"{prefix}{name}_ms_p50" not in res:
                continue
            sp, ci = 1.0, ""
            if name != "torch":
                key = f"{prefix}speedup_{name.split('_', 1)[1]}"
                sp, (lo, hi) = res[key], res[key + "_ci95"]
                ci = f"  ({lo:.2f}-{hi:.2f}x)"
            print(
                f"{state:6} {name:10} {res[f'{prefix}{name}_ms_p50']:9.2f} "
                f"{res[f'{prefix}{name}_ms_p95']:9.2f} {sp:7.2f}x{ci}"
            )
    for key in [k for k in res if k.endswith("max_abs_diff_p_keep")]:
        print(f"{key}: {res[key]:.2e}", file=sys.stdout)
    return 0
