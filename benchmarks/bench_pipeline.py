"""Stage-aware pruning benchmark on the reference pipeline (the paper's Tables 1–3, offline).

Runs the same queries with no pruning, then each teacher alone at pre-retrieval (pick the level's breadth
out of the oversampled candidates, greedily), at post-retrieval with the paper's operating point, at
post-retrieval with a threshold calibrated to keep --post-keep of the new items (the paper's post-retrieval
MMR kept ~36%; score scales depend on the encoder, so the paper's bge-small thresholds do not transfer to
the packaged MiniLM), optionally at pre-synthesis (--stages pre,post,synth), plus an equal-budget shallow
search matched to the pre-retrieval node count. Calibration uses the --calib queries that follow the test
queries in the environment (disjoint from them), scored on the unpruned tree.
Every configuration is a resumable `simulate` output folder under --out; the table is written to
OUT/table.md and OUT/results.json and printed.

    python benchmarks/bench_pipeline.py --env /work/envs/drgym --runs 100 --workers 2 --encoder packaged
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Pre-synthesis budgets the paper states (max 10 items for MMR and DPP); others use their thresholds.
SYNTH_EXTRA = {"mmr": "max_items=10", "dpp": "max_items=10"}


def spec(teacher: str, extra: str = "") -> str:
    return f"{teacher}:{extra}" if extra else teacher


class NullWriter:
    def write(self, *a, **k):
        return None


def calibrate(args, teachers: list[str]) -> dict[str, float]:
    """Per teacher, the post-retrieval threshold that keeps ``--post-keep`` of the new items on the
    calibration queries' unpruned trees."""
    import numpy as np

    from branchgate.models.teachers import get
    from branchgate.pipeline import env as envmod
    from branchgate.pipeline.config import Config
    from branchgate.pipeline.simulate import make_runner

    env = envmod.load(args.env)
    calib = env.queries[args.runs : args.runs + args.calib]
    if not calib:
        raise SystemExit(f"no calibration queries left after the first {args.runs}")
    out = {}
    for t in teachers:
        runner = make_runner(env, Config(seed=args.seed, encoder=args.encoder, post=f"{t}:threshold=-1e9"), {})
        runner.score_log = []
        for q in calib:
            runner.run(q, f"calib.{q.id}", NullWriter())
        scores = np.array([v for st, v in runner.score_log if st == "post_retrieval"])
        out[t] = float(np.quantile(scores, 1 - args.post_keep))
        print(
            f"calibrated post {t}: threshold {out[t]:.4g} (paper default {get(t).threshold}; {len(scores)} scores)",
            flush=True,
        )
    return out


def parse_args(argv=None) -> argparse.Namespace:
    from branchgate.models.teachers import NAMES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", required=True, help="environment folder (e.g. a drgym env) or 'sample'")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--out", default="bench_out/pipeline")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--encoder", default="auto")
    ap.add_argument("--teachers", default=",".join(NAMES), help="comma-separated teacher names")
    ap.add_argument("--stages", default="pre,post", help="comma-separated stages to prune at (pre, post, synth)")
    ap.add_argument("--post-keep", type=float, default=0.36, help="calibrated post-retrieval keep rate")
    ap.add_argument("--calib", type=int, default=20, help="calibration queries (after the test queries)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    from branchgate.fileio import atomic_write_json, atomic_write_text

    args = parse_args(argv)
    out = Path(args.out)
    results = []
    progress = sys.stderr.isatty()
    for stage, name, overrides in configurations(args):
        results.append(run_one(args, out, stage, name, overrides, progress))
    pre_rows = [r for r in results if r["stage"] == "pre"]
    if pre_rows:  # equal-budget control: a shallow tree with the pre-retrieval policies' mean node count
        budget = round(sum(r["nodes"] for r in pre_rows) / len(pre_rows))
        results.append(run_one(args, out, "pre", f"shallow:{budget}", {"pre": f"shallow:{budget}"}, progress))
    table = results_table(args, results)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "table.md", table)
    atomic_write_json(out / "results.json", {"args": vars(args), "results": results})
    print()
    print(table)
    return 0


def configurations(args) -> list[tuple[str, str, dict]]:
    """(stage, policy, Config overrides) to run: no pruning, then each teacher per stage asked for (and at
    post-retrieval also with a calibrated threshold: ``calibrate``, run here)."""
    teachers = [t for t in args.teachers.split(",") if t]
    stages = [s for s in args.stages.split(",") if s]
    configs = [("none", "none", {})]
    for stage in ("pre", "post", "synth"):
        if stage in stages:
            for t in teachers:
                s = spec(t, SYNTH_EXTRA.get(t, "")) if stage == "synth" else t
                configs.append((stage, s, {stage: s}))
            if stage == "post":
                thresholds = calibrate(args, teachers)
                for t in teachers:
                    s = f"{t}:threshold={thresholds[t]:.6g}"
                    configs.append(("post", s, {"post": s}))
    return configs


def run_one(args, out: Path, stage: str, name: str, overrides: dict, progress: bool) -> dict:
    """One configuration as a resumable ``simulate`` folder under ``out``; its row of the table."""
    from branchgate.pipeline.config import Config
    from branchgate.pipeline.simulate import simulate

    folder = out / f"{stage}-{name.replace(':', '_').replace('=', '').replace(',', '_')}"
    cfg = Config(seed=args.seed, encoder=args.encoder, **overrides)
    t0 = time.perf_counter()
    s = simulate(args.env, cfg, folder, runs=args.runs, workers=args.workers, progress=progress)
    row = {"stage": stage, "policy": name, "n_runs": s["n_runs"], "elapsed_s": round(time.perf_counter() - t0, 1)}
    for k in ("nodes", "retrieval_calls", "tokens", "kpr", "kpr_before_synthesis", "wall_s", "n_final"):
        row[k] = s[k]["mean"]
        row[k + "_se"] = s[k]["se"]
    row["frac_expansions_with_gain"] = s["frac_expansions_with_gain"]
    row["tokens_by_stage"] = s["tokens_by_stage"]
    print(
        f"{stage:6s} {name:22s} nodes {row['nodes']:6.2f} tokens {row['tokens'] / 1e3:7.1f}k "
        f"KPR {row['kpr']:.3f} ({row['elapsed_s']}s)",
        flush=True,
    )
    return row


def results_table(args, results: list[dict]) -> str:
    """The Markdown table of ``results`` (the first row: no pruning) and the mean token saving by stage."""
    base = results[0]
    lines = [
        f"Reference pipeline, {base['n_runs']} queries of {args.env}, breadth 4 / depth 3, oversample 1.5, "
        f"top-10 BM25, encoder {args.encoder}. Mean per query (± standard error); Δ = change vs no pruning.",
        "",
        "| stage | policy | nodes | retrieval calls | tokens (k) | Δ tokens | KPR | KPR before synth | wall s/run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d = (r["tokens"] - base["tokens"]) / base["tokens"] if base["tokens"] else 0.0
        lines.append(
            f"| {r['stage']} | {r['policy']} | {r['nodes']:.2f} ± {r['nodes_se']:.2f} | "
            f"{r['retrieval_calls']:.2f} | {r['tokens'] / 1e3:.1f} ± {r['tokens_se'] / 1e3:.1f} | {d:+.1%} | "
            f"{r['kpr']:.3f} ± {r['kpr_se']:.3f} | {r['kpr_before_synthesis']:.3f} | {r['wall_s']:.2f} |"
        )
    by_stage = {}
    for r in results[1:]:
        if not r["policy"].startswith("shallow"):
            key = r["stage"] + (" (calibrated)" if "threshold=" in r["policy"] else "")
            by_stage.setdefault(key, []).append(1 - r["tokens"] / base["tokens"])
    lines += ["", "Mean token saving by stage: " + ", ".join(f"{k} {sum(v) / len(v):.1%}" for k, v in by_stage.items())]
    lines += [f"Fraction of expansions adding ≥ 1 key point (no pruning): {base['frac_expansions_with_gain']:.1%}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
