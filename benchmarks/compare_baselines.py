"""Paired comparison of a trained controller against the teacher baselines on a dataset's test split.

Prints AUROC with its bootstrap 95% interval over runs, AUROC within depth ≥ 1 (the root frame is easy: most
of its candidates are positive), and top-1 accuracy (all decision points, and only the informative ones:
where some candidate has positive utility, so the choice matters) for the model and each `teacher_*`
column, with paired bootstrap 95% intervals over runs for model − teacher.

    python benchmarks/compare_baselines.py --checkpoint RUN/controller.safetensors --dataset DS [--boot 1000]
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--boot", type=int, default=1000)
    args = ap.parse_args()
    from branchgate.data.datamodule import DecisionDataModule
    from branchgate.models.encoder import recorded_spec
    from branchgate.training.checkpoint import load_controller
    from branchgate.training.evaluate import predict
    from branchgate.training.metrics import safe_auroc, top1_hits

    net, meta = load_controller(args.checkpoint)
    dm = DecisionDataModule(args.dataset, encoder=meta["encoder"])
    dm.encoder_spec = recorded_spec(meta["encoder"], meta.get("encoder_path"))
    dm.setup("test")
    test = dm.splits["test"]
    p, _ = predict(net, dm.sets["test"], dm.table)
    labels = np.asarray(test["label"], np.int64)
    utility = np.asarray([np.nan if v is None else v for v in test["utility"]], np.float64)
    runs = np.asarray(test["run_id"])
    deep = np.asarray(test["depth"], np.int64) >= 1
    frames = np.asarray([f"{r}/{f}" for r, f in zip(test["run_id"], test["frame_id"])])
    scorers = {"model": p, **{c[len("teacher_"):]: np.asarray(test[c], np.float64) for c in test.column_names
                               if c.startswith("teacher_")}}
    lab = labels >= 0
    unique_runs = np.unique(runs)
    rng = np.random.default_rng(0)
    boots = [rng.choice(unique_runs, len(unique_runs)) for _ in range(args.boot)]
    run_rows = {r: np.flatnonzero(lab & (runs == r)) for r in unique_runs}
    frame_run = {f: r for f, r in zip(frames, runs)}

    def auroc(s, rows):
        value = safe_auroc(labels[rows], s[rows])
        return np.nan if value is None else value

    def top1_mean(d, run_list):
        by_run = {}
        for f, v in d.items():
            by_run.setdefault(frame_run[f], []).append(v)
        vals = [v for r in run_list for v in by_run.get(r, [])]
        return float(np.mean(vals)) if vals else np.nan

    t1 = {k: top1_hits(s, utility, frames) for k, s in scorers.items()}
    t1i = {k: top1_hits(s, utility, frames, informative=True) for k, s in scorers.items()}
    all_rows = np.flatnonzero(lab)
    print(f"test: {len(unique_runs)} runs, {lab.sum()} labelled rows, {len(t1['model'])} decision points "
          f"({len(t1i['model'])} informative)")
    print(f"{'scorer':<10} {'AUROC [95% CI over runs]':>26} {'depth≥1':>8} {'top1':>7} {'top1-inf':>9}   "
          f"Δ vs model: AUROC [95% CI]        top1-inf [95% CI]")
    boot_rows = [np.concatenate([run_rows[r] for r in b]) for b in boots]
    deep_rows = all_rows[deep[all_rows]]
    for name, s in scorers.items():
        lo, hi = np.nanpercentile([auroc(s, r) for r in boot_rows], [2.5, 97.5])
        line = (f"{name:<10} {auroc(s, all_rows):7.4f} [{lo:.4f}, {hi:.4f}]   {auroc(s, deep_rows):8.4f} "
                f"{top1_mean(t1[name], unique_runs):7.4f} {top1_mean(t1i[name], unique_runs):9.4f}")
        if name != "model":
            da = [auroc(p, r) - auroc(s, r) for r in boot_rows]
            dt = [top1_mean(t1i["model"], b) - top1_mean(t1i[name], b) for b in boots]
            lo_a, hi_a = np.nanpercentile(da, [2.5, 97.5])
            lo_t, hi_t = np.nanpercentile(dt, [2.5, 97.5])
            line += f"   {np.nanmean(da):+.4f} [{lo_a:+.4f}, {hi_a:+.4f}]   {np.nanmean(dt):+.4f} [{lo_t:+.4f}, {hi_t:+.4f}]"
        print(line)


if __name__ == "__main__":
    main()
