"""Train on simulator runs plus real agent decisions, judged out of fold over the real runs (issue 22).

The bench's gate is trained on simulator runs only and judged on real decisions. This probe adds the real
decisions themselves to training: the real runs are split into folds (by run, so no run is in train and test);
for each fold a gate is trained on the simulator dataset's train split plus every other fold's real decisions
(each repeated ``--real-weight`` times, as copies with their own run ids), early-stopped on the simulator's
validation split, and scores the held-out fold. The pooled out-of-fold scores are compared with every teacher
and, with ``--sim-checkpoint``, with the gate trained on the simulator alone, paired over runs.

    python3 -m research.sim_plus_real --sim SIM_DATASET --real REAL_DATASET --out DIR
        [--sim-checkpoint controller.safetensors] [--folds 5] [--real-weight 10] [--config bench_train]
        [--override --model.towers=interaction ...] [--boot 1000]

SIM_DATASET, REAL_DATASET: decision datasets of the same encoder (e.g. a bench's OUT/keypoints/dataset/dataset
and OUT/real_data/NAME/dataset). Prints one line per scorer: AUROC [95% CI over runs], and the out-of-fold
gate minus it [paired 95% CI]; writes DIR/report.json.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np


def fold_dataset(sim, real, test_runs: set, weight: int, manifest: dict, dest: Path) -> Path:
    """A dataset: sim train + the real rows outside ``test_runs`` × ``weight`` (train), sim validation
    (validation), the real rows of ``test_runs`` (test)."""
    from datasets import DatasetDict, concatenate_datasets

    from branchgate.fileio import atomic_write_json

    rows = concatenate_datasets([real[s] for s in real])
    held = rows.filter(lambda r: r["run_id"] in test_runs)
    rest = rows.filter(lambda r: r["run_id"] not in test_runs)
    copies = [rest.map(lambda r, j=j: {"run_id": f"{r['run_id']}#copy{j}"}) for j in range(weight)]
    train = concatenate_datasets([sim["train"], *copies]).cast(sim["train"].features)
    if dest.exists():
        shutil.rmtree(dest)
    DatasetDict(
        {"train": train, "validation": sim["validation"], "test": held.cast(sim["train"].features)}
    ).save_to_disk(str(dest))
    atomic_write_json(dest / "manifest.json", {**manifest, "created_by": "research/sim_plus_real.py"})
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", required=True)
    ap.add_argument("--real", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sim-checkpoint", default=None, help="the gate trained on --sim alone (compared as gate_sim)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--real-weight", type=int, default=10, help="copies of each real training decision")
    ap.add_argument("--config", default="bench_train")
    ap.add_argument("--override", action="append", default=[], help="an extra `branchgate train` argument")
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0, help="the fold assignment's seed")
    args = ap.parse_args()

    from branchgate.data.decision_batches import load_decision_dataset
    from branchgate.fileio import atomic_write_json
    from branchgate.training import stats
    from branchgate.training.cli import resolve_config_names
    from branchgate.training.fit import train

    sim, manifest = load_decision_dataset(args.sim)
    real, real_manifest = load_decision_dataset(args.real)
    if real_manifest["encoder"] != manifest["encoder"]:
        raise SystemExit(f"--sim encodes with {manifest['encoder']}, --real with {real_manifest['encoder']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = sorted({r for s in real for r in real[s]["run_id"]})
    folds = np.array_split(np.random.default_rng(args.seed).permutation(runs), args.folds)
    parts = []
    for k, fold in enumerate(folds):
        ds = fold_dataset(sim, real, set(fold), args.real_weight, manifest, out / f"fold{k}" / "dataset")
        argv = [
            "--config",
            args.config,
            "--data.dataset",
            str(ds),
            "--out",
            str(out / f"fold{k}" / "run"),
            "--wandb.mode",
            "disabled",
            "--trainer.enable_progress_bar=false",
            *args.override,
        ]
        m = train(resolve_config_names(argv))
        rows = stats.controller_rows(out / f"fold{k}" / "run" / "controller.safetensors", ds, ("test",))
        if args.sim_checkpoint:
            rows.scorers["gate_sim"] = stats.controller_rows(args.sim_checkpoint, ds, ("test",)).scorers["gate"]
        parts.append(rows)
        print(
            f"fold {k}: {len(fold)} runs held out, {len(rows.labels)} labelled decisions, "
            f"fold AUROC {rows.auroc('gate', np.arange(len(rows.labels))):.3f}, epochs {m.get('epochs')}",
            flush=True,
        )
    cat = stats.Rows(
        np.concatenate([p.labels for p in parts]),
        np.concatenate([p.utility for p in parts]),
        np.concatenate([p.runs for p in parts]),
        np.concatenate([p.frames for p in parts]),
        np.concatenate([p.depth for p in parts]),
        {k: np.concatenate([p.scorers[k] for p in parts]) for k in parts[0].scorers},
    )
    table = stats.scorer_metrics(cat, args.boot, ref="gate")
    for name, m in sorted(table.items(), key=lambda kv: -(kv[1]["auroc"] or 0)):
        d = m.get("delta_vs_gate")
        extra = f"  gate − it {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" if d else ""
        print(f"{name:10s} {m['auroc']:.3f} [{m['ci95_auroc'][0]:.3f}, {m['ci95_auroc'][1]:.3f}]{extra}")
    atomic_write_json(out / "report.json", {"args": vars(args), "n_runs": len(runs), "metrics": table})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
