"""`branchgate export`: a controller checkpoint → controller.onnx (+ int8 twin, tokenizer, model card),
parity-checked."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from branchgate.errors import InputError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        "--ckpt",
        dest="checkpoint",
        required=True,
        help="trained controller: controller.safetensors from branchgate train",
    )
    parser.add_argument("--out", required=True, help="output model path, e.g. out/controller.onnx")
    parser.add_argument(
        "--int8", action="store_true", help="also write the dynamically quantised int8 twin (<out>.int8.onnx)"
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help="decision dataset (save_to_disk dir) whose test split is the parity set; default: built-in samples",
    )
    parser.add_argument("--split", default="test", help="dataset split for the parity check (default test)")
    parser.add_argument("--max-decisions", type=int, default=200, help="parity decisions at most (default 200)")
    parser.add_argument("--tol", type=float, default=1e-4, help="max |Δp_keep| fp32 ONNX vs torch (default 1e-4)")
    parser.add_argument("--auroc-tol", type=float, default=0.01, help="max |ΔAUROC| int8 vs fp32 (default 0.01)")
    parser.add_argument("--force", action="store_true", help="write the model even when a parity check fails")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")


def check_args(args) -> None:
    """Every option checked before any work (``InputError`` naming it)."""
    from branchgate.export.controller import checked_paths

    if not 1 <= args.max_decisions <= MAX_DECISIONS:
        raise InputError(f"must be from 1 to {MAX_DECISIONS:,}, got {args.max_decisions}", "--max-decisions")
    for name, value in (("--tol", args.tol), ("--auroc-tol", args.auroc_tol)):
        if not math.isfinite(value):  # NaN would pass every check (a negative value fails every one)
            raise InputError(f"must be a finite number, got {value}", name)
    if args.dataset is not None and not Path(args.dataset).is_dir():
        raise InputError("no such dataset folder (a saved decision dataset: branchgate dataset build)", args.dataset)
    if not Path(args.checkpoint).is_file():
        raise InputError("no such checkpoint file", args.checkpoint)
    checked_paths(args.out)


MAX_DECISIONS = 100_000  # parity decisions at most: each is scored by torch and by both graphs


def run(args) -> int:
    from branchgate.export.controller import ParityError, export_controller

    check_args(args)
    try:
        report = export_controller(
            args.checkpoint,
            args.out,
            int8=args.int8,
            parity_dataset=args.dataset,
            force=args.force,
            split=args.split,
            max_decisions=args.max_decisions,
            tol=args.tol,
            auroc_tol=args.auroc_tol,
        )
    except ParityError as exc:
        if args.json:
            print(json.dumps(exc.report, indent=2, default=str))
        print(f"branchgate: export: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        par = report["parity"]
        print(f"wrote {', '.join(report['files'].values())}")
        line = f"parity on {par['decisions']} decisions: fp32 max|Δp_keep| {par['fp32_max_abs_diff_p_keep']:.2e}"
        if "int8_auroc" in par:
            delta = par["int8_auroc_delta"]
            line += (
                f"; int8 |ΔAUROC| {'n/a' if delta is None else f'{delta:.4f}'}, "
                f"max|Δp_keep| {par['int8_max_abs_diff_p_keep']:.3f}"
            )
            if par.get("int8_same_keep_at_tau") is not None:
                line += f", same keep decision at tau {100 * par['int8_same_keep_at_tau']:.1f}%"
        print(line)
        for note in report["notes"]:
            print(f"note: {note}")
        if report["forced"]:
            print("WARNING: written despite failed parity: " + "; ".join(report["failures"]), file=sys.stderr)
    return 0
