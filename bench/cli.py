"""``branchgate bench``: the whole held-out experiment in one command, every step cached under OUT.

    branchgate bench --env DIR --train-queries FILE --eval-queries FILE --out DIR [--config bench]
                     [--labels SOURCE[,SOURCE...]] [--real DIR ...] [--real-eval DIR ...] [--workers N]

Steps (reused when their fingerprint matches, see ``bench/steps.py``): ``simulate`` (no pruning, train
queries) → ``closed_loop`` (every policy of ``bench/sweeps.py`` that needs no gate, on the eval queries) →
``real_data`` (``--real`` trace folders built into decision datasets) → ``eval_data`` (the eval queries'
unpruned runs as a decision dataset labelled by their key points); then per label source, under
OUT/<source>/: ``dataset`` (``dataset build --labels``) → ``train`` → ``export`` → ``closed_loop`` (the gate's
τ sweep) → ``offline`` (its test split) → ``offline_eval`` (``eval_data``, by depth) → ``real`` (each
``--real`` dataset) → ``real_by_depth`` (the same decisions by depth: first searches, later ones); then
``budgets`` (run budgets at ``policies.budget_fractions`` of each query's unpruned tokens: the first source's
gate with and without deferral, ``budget_baselines`` given the same budget, and the check that no run
exceeded its budget). Writes OUT/report.json, OUT/report.md, OUT/kpr_vs_tokens.png and, with ``--real``,
OUT/real_auroc.png.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from branchgate.bench.common_sense import line as common_sense_line
from branchgate.bench.run_order import run_bench
from branchgate.bench.settings import load_config

OPTIONS = ("breadth", "depth", "encoder", "labels", "bootstrap", "workers")  # command-line overrides of config keys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", required=True, help="environment folder (branchgate env build), or 'sample'")
    parser.add_argument(
        "--train-queries",
        required=True,
        metavar="FILE",
        help="query ids to train on (one per line or JSON lines with 'id')",
    )
    parser.add_argument(
        "--eval-queries", required=True, metavar="FILE", help="held-out query ids for the closed loop (no overlap)"
    )
    parser.add_argument("--out", required=True, help="output folder (one sub-folder per step; reruns reuse them)")
    parser.add_argument("--config", default="bench", help="bench YAML (default: the packaged configs/bench.yaml)")
    parser.add_argument(
        "--labels",
        default=None,
        metavar="SOURCE[,SOURCE...]",
        help="dataset label source(s): keypoints, citations, judge, teacher:NAME; several "
        "(comma-separated) train one gate each, compared in one report (default: the config's)",
    )
    parser.add_argument(
        "--real",
        nargs="*",
        default=[],
        metavar="DIR",
        help="real agents' decision datasets or trace folders (built with --labels auto) to score; with a read "
        "stage the first one's read decisions also train the read gate out of fold over its runs (the real track, "
        "bench/real_track.py: the simulator's gate fine-tuned, trained from scratch, as it is, every teacher, an "
        "oracle; AUROC per hit and per search, a replay frontier)",
    )
    parser.add_argument(
        "--real-eval",
        nargs="*",
        default=[],
        metavar="DIR",
        help="other real logs (read datasets or trace folders) the real track judges with the gates trained on every "
        "run of the first --real",
    )
    parser.add_argument("--breadth", type=int, default=None, help="override the config's breadth")
    parser.add_argument("--depth", type=int, default=None, help="override the config's depth")
    parser.add_argument("--encoder", default=None, help="override the config's encoder")
    parser.add_argument("--bootstrap", type=int, default=None, help="override the config's bootstrap resamples")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes for simulation and the closed loop (default: the config's; 0 = one per core)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    cfg = load_config(args.config)
    for key in OPTIONS:
        if getattr(args, key, None) is not None:
            cfg[key] = getattr(args, key)

    report, paths, steps = run_bench(
        args.env,
        args.train_queries,
        args.eval_queries,
        args.out,
        cfg,
        args.real,
        progress=not args.no_progress and sys.stderr.isatty(),
        command=shlex.join(["branchgate", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else None,
        real_eval=args.real_eval,
    )
    pol = report["policies"]
    print(f"{'policy':<22} {'tokens':>9} {'KPR':>7}  [95% CI]")
    for name, p in pol.items():
        lo, hi = p["kpr"]["ci95"]
        print(f"{name:<22} {p['tokens']['mean']:9.0f} {p['kpr']['mean']:7.3f}  [{lo:.3f}, {hi:.3f}]")
    g = report["offline"].get("gate", {})
    print(
        f"offline gate AUROC {g.get('auroc') or float('nan'):.3f}; "
        f"steps run: {', '.join(steps.ran) or 'none (all cached)'}"
    )
    for line in report.get("findings", []):
        print(f"- {line}")

    for where, per in (("pre", report.get("by_labels", {})), ("read", report.get("read", {}))):
        for source, res in per.items():
            if res.get("common_sense"):
                print(f"{where} gate ({source}): {common_sense_line(res['common_sense'])}")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
