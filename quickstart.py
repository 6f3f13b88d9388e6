"""``branchgate quickstart``: the whole chain on the bundled sample, with the same commands a user runs.

simulate (reference pipeline, no pruning, bundled MuSiQue sample) → dataset build (realized key-point
labels, split by run) → train (configs/quickstart.yaml) → evaluate on test vs every baseline →
export controller.onnx (+ int8 twin, model card) with the parity check.
Leaves DIR/traces, DIR/dataset, DIR/run (controller.safetensors, logs, plots), DIR/metrics.json, DIR/controller.onnx.
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from branchgate.cli import main
from branchgate.errors import BranchgateError
from branchgate.fileio import atomic_path, check_output_dir, claim_output_dir, mark_output_dir

OUTPUT_KIND = "quickstart"  # the command named in the output folder's mark (``fileio.check_output_dir``)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="quickstart", help="output folder (default ./quickstart)")
    parser.add_argument("--runs", type=int, default=None, help="simulated runs (default: every sample query once)")
    parser.add_argument(
        "--encoder",
        default="packaged",
        help="encoder for teachers and the model (default packaged: offline all-MiniLM-L6-v2)",
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="override trainer.max_epochs of configs/quickstart.yaml"
    )
    parser.add_argument("--workers", type=int, default=1, help="simulation workers (default 1)")
    parser.add_argument("--no-export", action="store_true", help="stop after training and evaluation")


def _step(title: str, argv: list[str]) -> None:
    print(f"\n== {title}: branchgate {' '.join(argv)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    rc = main(argv)
    if rc:
        raise BranchgateError(f"quickstart step '{title}' failed (exit {rc}); see the messages above")
    print(f"== {title}: done in {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)


def run(args) -> int:
    encoder_dir = args.encoder if Path(args.encoder).exists() else None  # a local encoder folder is an input
    out = check_output_dir(args.out, [encoder_dir], OUTPUT_KIND, in_place=True)
    claim_output_dir(out, OUTPUT_KIND)  # closed (mark_output_dir) once every step is done
    start = time.perf_counter()
    sim = [
        "simulate",
        "--env",
        "sample",
        "--out",
        str(out / "traces"),
        "--encoder",
        args.encoder,
        "--seed",
        "0",
        "--workers",
        str(args.workers),
    ]
    if args.runs:
        sim += ["--runs", str(args.runs)]
    _step("simulate", sim)
    _step(
        "dataset",
        [
            "dataset",
            "build",
            "--traces",
            str(out / "traces" / "traces"),
            "--out",
            str(out / "dataset"),
            "--encoder",
            args.encoder,
        ],
    )
    train = [
        "train",
        "--config",
        "quickstart",
        "--data.dataset",
        str(out / "dataset"),
        "--data.encoder",
        args.encoder,
        "--out",
        str(out / "run"),
    ]
    if args.epochs:
        train.append(f"--trainer.max_epochs={args.epochs}")
    _step("train", train)
    controller = out / "run" / "controller.safetensors"
    with atomic_path(out / "metrics.json") as tmp:
        shutil.copyfile(out / "run" / "metrics.json", tmp)
    if not args.no_export:
        _step(
            "export",
            [
                "export",
                "--checkpoint",
                str(controller),
                "--out",
                str(out / "controller.onnx"),
                "--int8",
                "--dataset",
                str(out / "dataset"),
            ],
        )
    mark_output_dir(out, OUTPUT_KIND)
    metrics = json.loads((out / "metrics.json").read_text())
    print(
        f"\nquickstart finished in {time.perf_counter() - start:.0f}s: {out / 'metrics.json'}"
        + ("" if args.no_export else f", {out / 'controller.onnx'}")
    )
    print(
        f"model AUROC {metrics.get('auroc', float('nan')):.3f}, "
        f"top-1 {metrics.get('top1_accuracy', float('nan')):.3f}, "
        f"keep rate {metrics.get('keep_rate', float('nan')):.2f} at tau {metrics.get('tau', float('nan')):.2f}"
    )
    if not args.no_export:  # the exported controller on hand-written decisions (bench/common_sense.py)
        from branchgate.bench.common_sense import check_model, line

        print(line(check_model(out / "controller.onnx", threads=1)))
    return 0
