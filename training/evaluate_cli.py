"""``branchgate evaluate``: metrics of a trained controller (controller.safetensors) or of an exported one
(controller.onnx, fp32 or int8: scored through the Gate, as deployed) on a dataset's test split, with baselines."""

from __future__ import annotations

import argparse
from pathlib import Path

from branchgate.errors import InputError
from branchgate.inference.inputs import as_threads
from branchgate.inference.model_file import controller_path
from branchgate.inference.options import chosen_controller, controller_options


def configure(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--checkpoint", default=None, help="trained controller: OUT/controller.safetensors from branchgate train"
    )
    controller_options(parser, group=which)  # or an exported controller, scored by the Gate: --pre / --read PATH
    parser.add_argument("--dataset", required=True, help="decision dataset directory (branchgate dataset build)")
    parser.add_argument(
        "--out",
        default=None,
        help="output directory for metrics.json and plots (default: eval/ next to the controller file)",
    )
    parser.add_argument(
        "--cache",
        default=None,
        help="embedding cache file (default $BRANCHGATE_CACHE/embeddings.sqlite; not used with --pre/--read)",
    )
    parser.add_argument(
        "--recalibrate",
        choices=["f1", "keep_rate"],
        default=None,
        help="recalibrate τ on this dataset's validation split instead of using the controller's τ",
    )
    parser.add_argument("--keep-rate", type=float, default=None, help="target keep rate for --recalibrate keep_rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random baseline")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads, or the Gate's with --pre/--read (0 = the default)"
    )


def run(args) -> int:
    import torch

    from branchgate.training.evaluate import evaluate_checkpoint, evaluate_model, format_table

    threads = as_threads(args.threads or None, "--threads")  # 0: the default; else 1 to 4 per core
    check_keep_rate(args.recalibrate, args.keep_rate)
    controller = controller_path(chosen_controller(args)) if args.model else Path(args.checkpoint)
    out = args.out or str(controller.resolve().parent / "eval")
    options = {"recalibrate": args.recalibrate, "keep_rate": args.keep_rate, "seed": args.seed}
    if args.model:
        metrics = evaluate_model(controller, args.dataset, out, threads=threads, **options)
    else:
        if threads:
            torch.set_num_threads(threads)
        metrics = evaluate_checkpoint(args.checkpoint, args.dataset, out, cache=args.cache, **options)
    print(format_table(metrics))
    print(f"wrote {Path(out) / 'metrics.json'} and plots in {out}")
    return 0


def check_keep_rate(recalibrate: str | None, keep_rate: float | None) -> None:
    """``--keep-rate``: a share in (0, 1], needed by (and only by) ``--recalibrate keep_rate``."""
    if keep_rate is not None and not 0 < keep_rate <= 1:
        raise InputError(f"must be in (0, 1], got {keep_rate}", "--keep-rate")
    if recalibrate == "keep_rate" and keep_rate is None:
        raise InputError("--recalibrate keep_rate needs a target: --keep-rate R", "--keep-rate")
