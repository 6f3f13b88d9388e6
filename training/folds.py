"""``branchgate train --folds K``: K-fold by run, an out-of-fold report, then one final model on every run.

For the small logs users have (hundreds of runs) one validation and one test split are too few to judge a model
by. Here every run of every split of the dataset is assigned to one of K folds (``assign_folds``: runs holding
both a positive and a negative labelled row are dealt round-robin first, in the order of their id's hash, so each
fold gets its share of the runs that can rank anything; then the rest). Fold i's model trains on the other folds
but fold i+1, early-stops and calibrates τ on fold i+1, and scores fold i: no run is scored by a model that
trained on it or was selected on it. ``OUT/folds/<i>/`` holds each fold's dataset and training run.

The out-of-fold report (``OUT/oof.json``, ``OUT/oof.md``) scores the pooled out-of-fold predictions against every
teacher on the same rows: AUROC per row (per hit at the read stage) and per decision (does any of its rows
hold a positive), each with a 95% bootstrap interval over runs and the paired difference model − teacher.

The final model (``OUT/final/``, its controller copied to ``OUT/controller.safetensors``) trains on every run
for the median of the folds' selected epoch counts (no early stopping: there is no run left to stop on), and
takes τ and the probability calibration from the out-of-fold predictions (``calibrate_final``): the folds'
models scored runs they never saw, the final model's own runs would flatter it.

``check_enough`` refuses a dataset too small to judge: K folds need at least 2K runs with both classes.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np

from branchgate.data.dataset_schema import SPLITS, dataset_stage
from branchgate.data.decision_batches import load_decision_dataset
from branchgate.errors import InputError
from branchgate.fileio import atomic_path, atomic_write_text, claim_output_dir, mark_output_dir
from branchgate.training import stats
from branchgate.training.baselines import platt_coefficients
from branchgate.training.metrics import calibrate_tau, clean

MIN_RUNS_PER_FOLD = 2  # runs with both classes each fold needs, on average, for its AUROC to mean anything


def run_labels(dsd) -> dict[str, tuple[int, int]]:
    """``{run_id: (positive rows, negative rows)}`` over every split (unlabelled rows not counted)."""
    out: dict[str, list[int]] = {}
    for split in SPLITS:
        for run, label in zip(dsd[split]["run_id"], dsd[split]["label"]):
            c = out.setdefault(run, [0, 0])
            if label == 1:
                c[0] += 1
            elif label == 0:
                c[1] += 1
    return {r: (p, n) for r, (p, n) in out.items()}


def check_enough(counts: dict[str, tuple[int, int]], k: int, where: str) -> None:
    if k < 3:  # one fold tests, the next validates, the rest train: 3 at least
        raise InputError(f"must be ≥ 3 (or 0: no folds), got {k}", "--folds")
    both = sum(1 for p, n in counts.values() if p and n)
    labelled = sum(1 for p, n in counts.values() if p or n)
    need = MIN_RUNS_PER_FOLD * k
    if both < need:
        raise InputError(
            f"too small to judge with --folds {k}: it has {both} run(s) with both a positive and a negative labelled "
            f"row ({labelled} with any labelled row, {len(counts)} in all); K folds need at least {need} "
            f"({MIN_RUNS_PER_FOLD}K). Add runs or use fewer folds (K ≥ 3)",
            where,
        )


def assign_folds(counts: dict[str, tuple[int, int]], k: int) -> dict[str, int]:
    """``{run_id: fold}``: runs with both classes dealt round-robin first (by their id's sha256), then the rest."""

    def key(r: str) -> str:
        return hashlib.sha256(r.encode("utf-8")).hexdigest()

    both = sorted((r for r, (p, n) in counts.items() if p and n), key=key)
    rest = sorted((r for r, (p, n) in counts.items() if not (p and n)), key=key)
    return {r: i % k for i, r in enumerate(both + rest)}


def write_fold(dsd, manifest: dict, folds: dict[str, int], i: int, k: int, out: Path) -> Path:
    """Fold ``i``'s dataset in ``out``: test = fold i, validation = fold i+1, train = the rest."""
    from datasets import DatasetDict, concatenate_datasets

    every = concatenate_datasets([dsd[s] for s in SPLITS])
    fold = np.array([folds[r] for r in every["run_id"]])
    parts = {"test": fold == i, "validation": fold == (i + 1) % k}
    parts["train"] = ~(parts["test"] | parts["validation"])
    new = DatasetDict({s: every.select(np.flatnonzero(parts[s])) for s in SPLITS})
    if out.exists():
        shutil.rmtree(out)  # a fold dataset this command wrote (OUT is checked as train's own folder first)
    new.save_to_disk(str(out))
    n_runs = {s: len(set(new[s]["run_id"])) for s in SPLITS}
    meta = dict(manifest, n_runs={**n_runs, "total": sum(n_runs.values())}, folds={"k": k, "test": i})
    atomic_write_text(out / "manifest.json", json.dumps(meta, indent=1, default=str))
    return out


def oof_rows(fold_runs: list[tuple[str, str]], cache: str | None = None):
    """The pooled out-of-fold ``training.stats.Rows``: each fold's controller on its fold's test split (embeddings
    from ``cache``, the training's)."""
    parts = [stats.controller_rows(ckpt, data, ("test",), cache) for ckpt, data in fold_runs]
    names = [n for n in parts[0].scorers if all(n in p.scorers for p in parts)]
    return stats.Rows(
        np.concatenate([p.labels for p in parts]),
        np.concatenate([p.utility for p in parts]),
        np.concatenate([p.runs for p in parts]),
        np.concatenate([p.frames for p in parts]),
        np.concatenate([p.depth for p in parts]),
        {n: np.concatenate([p.scorers[n] for p in parts]) for n in names},
        np.concatenate([p.order for p in parts]),
    )


def report(rows, boot: int = 1000) -> dict:
    """Per row and per decision: every scorer's AUROC [95% over runs], ``gate`` − scorer paired."""
    return {
        "per_row": stats.scorer_metrics(rows, boot, ref="gate"),
        "per_decision": stats.scorer_metrics(stats.per_decision(rows), boot, ref="gate"),
        "rows": int(len(rows.labels)),
        "positive": int(rows.labels.sum()),
        "runs": len(rows.by_run),
    }


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def _ci(ci, sign: str = "") -> str:
    return "" if not ci or ci[0] is None else f"[{ci[0]:{sign}.3f}, {ci[1]:{sign}.3f}]"


def table(rep: dict, stage: str) -> str:
    """``oof.md``: the two tables of ``report``, scorers by AUROC."""
    unit = "hit" if stage == "read" else "candidate"
    lines = [
        f"Out of fold: {rep['rows']} labelled rows ({rep['positive']} positive) of {rep['runs']} runs; intervals: "
        "bootstrap over runs, paired for differences.",
    ]
    for key, title in (("per_row", f"per {unit}"), ("per_decision", "per decision (any positive)")):
        lines += ["", f"| scorer | AUROC {title} | 95% | model − scorer | 95% |", "|---|---|---|---|---|"]
        metrics = rep[key]
        for name in sorted(metrics, key=lambda n: -(metrics[n]["auroc"] or 0)):
            m = metrics[name]
            d = m.get("delta_vs_gate") or {}
            label = "**model**" if name == "gate" else name
            lines.append(
                f"| {label} | {_fmt(m['auroc'])} | {_ci(m['ci95_auroc'])} | "
                f"{'' if name == 'gate' else format(d.get('mean') or 0, '+.3f')} | {_ci(d.get('ci95'), '+')} |"
            )
    return "\n".join(lines) + "\n"


def calibrate_final(checkpoint: Path, rows, calib) -> dict:
    """Probability calibration and τ of the final controller from the out-of-fold predictions (module docstring):
    a Platt map fitted on the folds' calibrated logits, composed with the final net's own calibration; τ by
    ``calib`` (``fit.Calibration``) on the mapped out-of-fold probabilities."""
    from branchgate.training.checkpoint import load_controller, save_controller

    net, meta = load_controller(checkpoint)
    p = np.clip(rows.scorers["gate"], 1e-7, 1 - 1e-7)
    z = np.log(p) - np.log1p(-p)
    coef = platt_coefficients(z, rows.labels)
    scale, shift = (1.0, 0.0) if coef is None or not coef[0] > 0 else (float(coef[0]), float(coef[1]))
    p_cal = 1.0 / (1.0 + np.exp(-(scale * z + shift)))
    tau = float(calibrate_tau(p_cal, rows.labels, calib.method, calib.keep_rate, calib.tau))
    net.set_keep_calibration(float(net.keep_scale) * scale, float(net.keep_shift) * scale + shift)
    calibration = dict(meta.get("calibration") or {}, out_of_fold_platt={"scale": scale, "shift": shift})
    calibration["tau_from"] = "out-of-fold predictions"
    save_controller(checkpoint, net, dict(meta, tau=tau, calibration=calibration))
    return {"tau": tau, "platt": {"scale": scale, "shift": shift}}


def best_epoch(metrics: dict) -> int:
    """The epoch count a fold's training selected (from its best checkpoint's name, else its last epoch)."""
    m = re.search(r"best-(\d+)-", str(metrics.get("best_checkpoint") or ""))
    return int(m.group(1)) + 1 if m else int(metrics.get("epochs") or 0) + 1


def run_folds(cli, argv: list[str], train) -> dict:
    """The whole ``--folds K`` command (module docstring); ``cli`` is the parsed TrainCLI, ``argv`` its arguments,
    ``train`` the one training run (``fit.train``: passed in, as ``fit`` calls this module)."""
    from datasets import DatasetDict, concatenate_datasets

    from branchgate.training.checkpoint import CONTROLLER_FILE

    k, dataset, out = int(cli.config["folds"]), str(cli.config["data.dataset"]), Path(cli.config["out"])
    dsd, manifest = load_decision_dataset(dataset)
    counts = run_labels(dsd)
    check_enough(counts, k, dataset)
    folds = assign_folds(counts, k)
    claim_output_dir(out, "train")  # open until mark_output_dir below lists what the folds and the final model wrote
    base = without(argv, "--folds")
    results, fold_runs = [], []
    for i in range(k):
        where = out / "folds" / str(i)
        data = write_fold(dsd, manifest, folds, i, k, out / "folds" / f"{i}.dataset")
        print(f"fold {i + 1}/{k}: test {sum(1 for f in folds.values() if f == i)} runs")
        m = train([*base, "--data.dataset", str(data), "--out", str(where), "--folds", "0"])
        results.append(m)
        fold_runs.append((str(where / CONTROLLER_FILE), str(data)))
    rows = oof_rows(fold_runs, cli.config.get("data.cache"))
    stage = dataset_stage(manifest)
    rep = report(rows)
    epochs = int(np.median([best_epoch(m) for m in results]))
    every = concatenate_datasets([dsd[s] for s in SPLITS])
    final_data = out / "folds" / "final.dataset"
    if final_data.exists():
        shutil.rmtree(final_data)
    DatasetDict({s: every for s in SPLITS}).save_to_disk(str(final_data))
    n = len(counts)
    atomic_write_text(
        final_data / "manifest.json",
        json.dumps(dict(manifest, n_runs={**{s: n for s in SPLITS}, "total": n}, folds={"k": k, "final": True})),
    )
    final = train(
        [
            *base,
            "--data.dataset",
            str(final_data),
            "--out",
            str(out / "final"),
            "--folds",
            "0",
            f"--trainer.max_epochs={epochs}",
            f"--early_stopping.patience={epochs + 1}",
        ]
    )
    controller = out / CONTROLLER_FILE
    with atomic_path(controller) as tmp:
        shutil.copyfile(out / "final" / CONTROLLER_FILE, tmp)
    cal = calibrate_final(controller, rows, cli.config_init["calibration"])
    rep.update(
        folds=k,
        fold_of_run=folds,
        final={"controller": str(controller), "epochs": epochs, **cal, "trained_on_runs": n},
        fold_metrics=[{"out": str(out / "folds" / str(i)), "epochs": best_epoch(m)} for i, m in enumerate(results)],
        stage=stage,
        dataset=dataset,
    )

    atomic_write_text(out / "oof.json", json.dumps(clean(rep), indent=1, allow_nan=False))
    text = table(rep, stage)
    atomic_write_text(out / "oof.md", text)
    print(text)
    print(f"final model: every run, {epochs} epochs; τ {cal['tau']:.4f} from the out-of-fold predictions")
    mark_output_dir(out, "train")
    print(f"wrote {controller}, {out / 'oof.json'} and {out / 'oof.md'}")
    return dict(final, oof=rep)


def without(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag VALUE`` and ``flag=VALUE``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out
