"""``branchgate evaluate``: metrics of a trained controller (controller.safetensors) on a dataset's test split,
with baselines."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint", required=True, help="trained controller: OUT/controller.safetensors from branchgate train"
    )
    parser.add_argument("--dataset", required=True, help="decision dataset directory (branchgate dataset build)")
    parser.add_argument(
        "--out",
        default=None,
        help="output directory for metrics.json and plots (default: eval/ next to the controller file)",
    )
    parser.add_argument(
        "--cache", default=None, help="embedding cache file (default $BRANCHGATE_CACHE/embeddings.sqlite)"
    )
    parser.add_argument(
        "--recalibrate",
        choices=["f1", "keep_rate"],
        default=None,
        help="recalibrate τ on this dataset's validation split instead of using the controller's τ",
    )
    parser.add_argument("--keep-rate", type=float, default=None, help="target keep rate for --recalibrate keep_rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random baseline")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = torch's default)")


def run(args) -> int:
    from pathlib import Path

    import torch

    from branchgate.training.evaluate import evaluate_checkpoint, format_table

    if args.threads:
        torch.set_num_threads(args.threads)

    out = args.out or str(Path(args.checkpoint).resolve().parent / "eval")
    metrics = evaluate_checkpoint(
        args.checkpoint,
        args.dataset,
        out,
        cache=args.cache,
        recalibrate=args.recalibrate,
        keep_rate=args.keep_rate,
        seed=args.seed,
    )
    print(format_table(metrics))
    print(f"wrote {Path(out) / 'metrics.json'} and plots in {out}")
    return 0
