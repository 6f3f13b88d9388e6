"""The bench's real track: learn the read gate from the real logs themselves, judged on them (issue 66).

For one real read dataset (``--real``: its result lists labelled by key points) and the simulator's read gate
(the start), out of fold over its runs (``train --folds K``: no run is scored by a model that trained on it or
was selected on it):

- ``finetuned``: the simulator's gate fine-tuned on the other folds (``train --init-from START``);
- ``real_only``: the same network trained from scratch on the other folds;
- ``sim_only``: the simulator's gate as it is;
- every teacher's snippet score, and ``oracle`` (the label itself: what a perfect reader would read).

Each gets AUROC per hit and per search (does any hit of the search add a key point) with a 95% bootstrap interval
over runs and the paired difference ``finetuned − scorer``; and, when the dataset's traces are at hand, a replay
frontier (``frontier``): each scorer's hits read at a sweep of thresholds, replayed on the unpruned logs with
``bench/replay.py`` (``ReplayRun.replay`` with a read rule), as the share of tokens read against the share of key
points kept. Scores are the rows' out-of-fold scores in the unpruned log (a hit's state is the log's, not the
replay's), the same for every scorer.

``--real-eval`` datasets are judged by the models trained on every run of ``--real`` (the ``--folds`` final
models): the same tables and frontier, on logs none of them trained on.

``track`` runs it; ``markdown`` and ``plot`` render it (``report.md``'s real-track section, ``real_track.png``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from branchgate.fileio import atomic_path, atomic_write_text, mark_output_dir
from branchgate.training.stats import Rows, per_decision, scorer_metrics, split_rows

SPLITS = ("train", "validation", "test")
PLOT = "real_track.png"
FOLDS = 5
SHARES = tuple(np.round(np.linspace(0.05, 1.0, 20), 2))  # score quantiles swept by the frontier
LEARNED = ("finetuned", "real_only", "sim_only", "oracle")  # always on the frontier, with the two best teachers
TARGET_KEEP = 0.95  # the share of key points a frontier point must keep to count (issue 66, target 2)
# The training options of both learned scorers (out of fold, on the dev queries' runs only; docs/research/
# learn-from-real-logs.md): the position in the list as an input, the keep loss only, a patience that a small
# validation fold's noise does not end early.
TRAIN_ARGS = (
    "--config",
    "bench_train",
    "--model.order",
    "true",
    "--model.w_rank",
    "0",
    "--model.w_reg",
    "0",
    "--model.lr",
    "0.003",
    "--early_stopping.patience",
    "20",
    "--trainer.max_epochs",
    "80",
    "--wandb.mode",
    "disabled",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
)


def key(rows: Rows) -> list[tuple]:
    """Row identity across datasets cut from one another: (run, decision, rank, label)."""
    return list(zip(rows.runs, rows.frames, rows.order, rows.labels))


def train_folds(dataset: str, out: Path, start: str | None, folds: int, cache: str | None, extra=()) -> Path:
    """``train --folds`` on ``dataset`` into ``out`` (from ``start`` when given); reused when ``out/oof.json`` exists
    for the same arguments."""
    from branchgate.training.cli import resolve_config_names
    from branchgate.training.fit import train

    argv = resolve_config_names([*TRAIN_ARGS, *extra, "--data.dataset", dataset, "--folds", str(folds)])
    argv += ["--out", str(out)]
    argv += ["--data.encoder", _encoder(dataset)]
    if cache:
        argv += ["--data.cache", cache]
    if start:
        argv += ["--init_from", start]
    done = out / "real_track_args.json"
    if (out / "oof.json").is_file() and done.is_file() and json.loads(done.read_text()) == argv:
        return out
    train(argv)
    atomic_write_text(done, json.dumps(argv))
    mark_output_dir(out, "train")  # the folder is train's output: its record lists the arguments file too
    return out


def _encoder(dataset: str) -> str:
    from branchgate.data.decision_batches import read_manifest

    return str(read_manifest(dataset)["encoder"])


def oof_scores(out: Path, cache: str | None) -> Rows:
    from branchgate.training.folds import oof_rows

    rep = json.loads((out / "oof.json").read_text())
    k = int(rep["folds"])
    return oof_rows(
        [
            (str(out / "folds" / str(i) / "controller.safetensors"), str(out / "folds" / f"{i}.dataset"))
            for i in range(k)
        ],
        cache,
    )


def controller_scores(controller: str, dataset: str, rows: Rows, cache: str | None) -> np.ndarray:
    """A controller (a checkpoint, an .onnx export's weights or pretrained:NAME) scored by the training path on
    every split of ``dataset``, in ``rows``' order."""
    from branchgate.data.datamodule import DecisionDataModule
    from branchgate.models.encoder import recorded_spec
    from branchgate.training.evaluate import predict
    from branchgate.training.init_from import load_start

    net, meta, _ = load_start(controller)
    dm = DecisionDataModule(dataset, cache=cache, show_progress=False)
    dm.encoder_spec = recorded_spec(meta["encoder"])
    dm.setup("predict")
    by_key = {}
    for s in SPLITS:
        p, _ = predict(net, dm.sets[s], dm.table)
        part = dm.splits[s]
        rank = part["rank" if "rank" in part.column_names else "order"]
        for r, f, o, y, v in zip(part["run_id"], part["frame_id"], rank, part["label"], p):
            by_key[(r, f"{r}/{f}", o, y)] = float(v)
    return np.array([by_key[k] for k in key(rows)])


def _teacher_rows(dataset: str) -> Rows:
    from branchgate.data.decision_batches import load_decision_dataset

    dsd, _ = load_decision_dataset(dataset)
    return split_rows((dsd[s], {}) for s in SPLITS)


def aligned(base: Rows, rows: Rows, name: str = "gate") -> np.ndarray:
    pos = {k: i for i, k in enumerate(key(rows))}
    return rows.scorers[name][[pos[k] for k in key(base)]]


def tables(rows: Rows, boot: int, ref: str = "finetuned") -> dict:
    return {
        "per_hit": scorer_metrics(rows, boot, ref=ref),
        "per_search": scorer_metrics(per_decision(rows), boot, ref=ref),
        "rows": int(len(rows.labels)),
        "positive": int(rows.labels.sum()),
        "runs": len(rows.by_run),
    }


def hit_scores(rows: Rows, dataset: str) -> dict[str, dict]:
    """``{scorer: {(run_id, hit id): score}}`` for the replay (a hit is offered once per run: its first list)."""
    from branchgate.data.decision_batches import load_decision_dataset

    dsd, _ = load_decision_dataset(dataset)
    ids = {}
    for s in SPLITS:
        part = dsd[s]
        rank = part["rank" if "rank" in part.column_names else "order"]
        for r, f, o, y, c in zip(part["run_id"], part["frame_id"], rank, part["label"], part["candidate_id"]):
            ids[(r, f"{r}/{f}", o, y)] = (r, c)
    hits = [ids[k] for k in key(rows)]
    out = {}
    for name, v in rows.scorers.items():
        d: dict = {}
        for h, x in zip(hits, v):
            d.setdefault(h, float(np.nan_to_num(x, nan=-np.inf)))
        out[name] = d
    return out


def on_frontier(scores: dict, t: dict) -> dict:
    """The scorers a frontier replays (each costs a sweep of replays): ``LEARNED`` and the two teachers with the
    best AUROC per hit."""
    hit = t["per_hit"]
    teachers = sorted((n for n in hit if n not in LEARNED), key=lambda n: -(hit[n]["auroc"] or 0))[:2]
    return {n: scores[n] for n in (*LEARNED, *teachers) if n in scores}


def frontier(traces: list[str], scores: dict[str, dict], shares=SHARES) -> dict:
    """Per scorer: the replayed logs' share of tokens read and of key points kept at each threshold (the score
    quantiles ``shares`` of its hits: reading about that share of the hits), pooled over runs."""
    from branchgate.bench.replay import ReplayRun, keypoint_value
    from branchgate.logs_to_dataset.readers import read_runs

    scored = {run_id for table in scores.values() for run_id, _ in table}  # the dataset's runs only
    runs = [ReplayRun(r) for r in read_runs(traces) if r.run_id in scored]
    runs = [r for r in runs if r.has_results and r.n_key_points]
    full = [r.replay() for r in runs]
    base_tokens = float(sum(o.tokens for o in full))
    base_kp = float(sum(keypoint_value(r, o) * r.n_key_points for r, o in zip(runs, full)))
    out = {"runs": len(runs), "tokens": base_tokens, "key_points": base_kp, "scorers": {}}
    for name, table in scores.items():
        values = np.array([v for v in table.values() if np.isfinite(v)])
        if not len(values):
            continue
        points = []
        for share in shares:
            tau = float(np.quantile(values, 1.0 - share)) if share < 1.0 else -np.inf
            tokens = kp = 0.0
            for r in runs:

                def rule(state, hits, r=r, tau=tau, table=table):
                    return [i for i, h in enumerate(hits) if table.get((r.run_id, h.hit_id), np.inf) >= tau]

                o = r.replay(read=rule)
                tokens += o.tokens
                kp += keypoint_value(r, o) * r.n_key_points
            points.append(
                {
                    "share": float(share),
                    "tau": tau,
                    "tokens": tokens / base_tokens if base_tokens else None,
                    "key_points": kp / base_kp if base_kp else None,
                }
            )
        out["scorers"][name] = {"points": points, "tokens_at_target": tokens_at(points, TARGET_KEEP)}
    return out


def tokens_at(points: list[dict], keep: float) -> float | None:
    """The least share of tokens at which a frontier keeps ``keep`` of the key points (None: never)."""
    ok = [p["tokens"] for p in points if p["key_points"] is not None and p["key_points"] >= keep - 1e-9]
    return min(ok) if ok else None


def track(
    start: str,
    dataset: str,
    traces: list[str] | None,
    out: Path,
    boot: int = 1000,
    folds: int = FOLDS,
    cache: str | None = None,
    evals: dict[str, tuple[str, list[str] | None]] | None = None,
    train_args: tuple = (),
) -> dict:
    """The real track of one ``--real`` read dataset (module docstring); ``evals``: ``{name: (dataset, traces)}``
    of ``--real-eval``; ``train_args``: more ``train`` options (after ``TRAIN_ARGS``)."""
    out = Path(out)
    ft = train_folds(dataset, out / "finetuned", start, folds, cache, train_args)
    ro = train_folds(dataset, out / "real_only", None, folds, cache, train_args)
    return judge(start, dataset, ft, ro, traces, boot, folds, cache, evals)


def judge(
    start: str,
    dataset: str,
    ft: Path,
    ro: Path,
    traces: list[str] | None,
    boot: int = 1000,
    folds: int = FOLDS,
    cache: str | None = None,
    evals: dict[str, tuple[str, list[str] | None]] | None = None,
) -> dict:
    """``track``'s tables and frontiers from its trained folds ``ft`` (fine-tuned) and ``ro`` (real rows only):
    nothing is trained here (``research/retrack.py`` reruns it after a change to the replay)."""
    base = oof_scores(ft, cache)
    scorers = {"finetuned": base.scorers["gate"], "real_only": aligned(base, oof_scores(ro, cache))}
    scorers["sim_only"] = controller_scores(start, dataset, base, cache)
    scorers.update({k: v for k, v in base.scorers.items() if k != "gate"})
    scorers["oracle"] = base.labels.astype(np.float64)
    rows = Rows(base.labels, base.utility, base.runs, base.frames, base.depth, scorers, base.order)
    result = {"start": start, "dataset": dataset, "folds": folds, "out_of_fold": tables(rows, boot)}
    if traces:
        result["frontier"] = frontier(traces, on_frontier(hit_scores(rows, dataset), result["out_of_fold"]))
    result["eval"] = {}
    for name, (eval_set, eval_traces) in (evals or {}).items():
        erows = _teacher_rows(eval_set)
        sc = {
            "finetuned": controller_scores(str(ft / "controller.safetensors"), eval_set, erows, cache),
            "real_only": controller_scores(str(ro / "controller.safetensors"), eval_set, erows, cache),
            "sim_only": controller_scores(start, eval_set, erows, cache),
            **erows.scorers,
            "oracle": erows.labels.astype(np.float64),
        }
        erows = Rows(erows.labels, erows.utility, erows.runs, erows.frames, erows.depth, sc, erows.order)
        result["eval"][name] = {"dataset": eval_set, **tables(erows, boot)}
        if eval_traces:
            scores = on_frontier(hit_scores(erows, eval_set), result["eval"][name])
            result["eval"][name]["frontier"] = frontier(eval_traces, scores)
    return result


def _m(m: dict) -> str:
    lo, hi = m["ci95_auroc"]
    return "–" if m["auroc"] is None else f"{m['auroc']:.3f} [{lo:.3f}, {hi:.3f}]"


def _d(m: dict) -> str:
    d = m.get("delta_vs_gate")
    if not d or d["mean"] is None:
        return ""
    lo, hi = d["ci95"]
    return f"{d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _table(t: dict) -> list[str]:
    lines = [
        "| scorer | AUROC per hit | finetuned − scorer | AUROC per search | finetuned − scorer |",
        "|---|---|---|---|---|",
    ]
    hit, search = t["per_hit"], t["per_search"]
    for name in sorted(hit, key=lambda n: -(hit[n]["auroc"] or 0)):
        lines.append(f"| {name} | {_m(hit[name])} | {_d(hit[name])} | {_m(search[name])} | {_d(search[name])} |")
    return lines


def _frontier_lines(f: dict) -> list[str]:
    lines = [
        f"Replayed on {f['runs']} logs: the least share of tokens read that keeps ≥ {TARGET_KEEP:.0%} of the key "
        "points, and the key points kept at about 30% and 55% of the tokens.",
        "",
        "| scorer | tokens for 95% of key points | key points at ≤ 30% tokens | key points at ≤ 55% tokens |",
        "|---|---|---|---|",
    ]
    for name, s in f["scorers"].items():
        cells = []
        for cap in (0.30, 0.55):
            ok = [p["key_points"] for p in s["points"] if p["tokens"] is not None and p["tokens"] <= cap + 1e-9]
            cells.append(f"{max(ok):.1%}" if ok else "–")
        t = s["tokens_at_target"]
        lines.append(f"| {name} | {'never' if t is None else f'{t:.1%}'} | {cells[0]} | {cells[1]} |")
    return lines


def markdown(result: dict, h: str = "##", image: str = PLOT) -> list[str]:
    """The report's real-track section."""
    oof = result["out_of_fold"]
    lines = [
        f"{h} Real track: the read gate learned from the real logs ({result['dataset']})",
        "",
        f"Out of fold ({result['folds']} folds by run): {oof['rows']} hits ({oof['positive']} positive) of "
        f"{oof['runs']} runs. `finetuned`: the simulator's gate ({result['start']}) fine-tuned on the other folds; "
        "`real_only`: trained from scratch on them; `sim_only`: the simulator's gate as it is; `oracle`: the label. "
        "Intervals: bootstrap over runs; differences paired.",
        "",
        *_table(oof),
    ]
    if result.get("frontier"):
        lines += ["", *_frontier_lines(result["frontier"])]
    for name, ev in result.get("eval", {}).items():
        lines += ["", f"{h}# Judged on {name} (trained on every run of the real track)", "", *_table(ev)]
        if ev.get("frontier"):
            lines += ["", *_frontier_lines(ev["frontier"])]
    lines += ["", f"![real track]({image})"]
    return lines


def plot(result: dict, path: Path) -> None:
    """Per-hit AUROC with intervals (left) and the replay frontier (right) of the out-of-fold track."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    part = next(iter(result["eval"].values()), None) if result.get("eval") else None
    panels = [("out of fold", result)] + ([("judged on --real-eval", part)] if part else [])
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 4.2 * len(panels)), squeeze=False)
    for (title, res), (ax1, ax2) in zip(panels, axes):
        t = res.get("out_of_fold") or res
        hit = t["per_hit"]
        names = [n for n in sorted(hit, key=lambda n: hit[n]["auroc"] or 0) if n != "oracle"]
        vals = [hit[n]["auroc"] or 0 for n in names]
        err = [
            [v - (hit[n]["ci95_auroc"][0] or v) for n, v in zip(names, vals)],
            [(hit[n]["ci95_auroc"][1] or v) - v for n, v in zip(names, vals)],
        ]
        colors = ["tab:red" if n in ("finetuned", "real_only", "sim_only") else "tab:gray" for n in names]
        ax1.barh(names, vals, xerr=err, color=colors)
        ax1.set_xlim(0.5, 1.0)
        ax1.set_xlabel("AUROC per hit (95% over runs)")
        ax1.set_title(f"real result lists, {title}")
        f = res.get("frontier")
        if f:
            for name, s in f["scorers"].items():
                xs = [p["tokens"] for p in s["points"]]
                ys = [p["key_points"] for p in s["points"]]
                style = "-" if name in ("finetuned", "real_only", "sim_only", "oracle") else ":"
                ax2.plot(xs, ys, style, marker=".", label=name)
            ax2.axhline(TARGET_KEEP, color="k", lw=0.5)
            ax2.set_xlabel("share of tokens read")
            ax2.set_ylabel("share of key points kept")
            ax2.legend(fontsize=7)
            ax2.set_title("replay on the real logs")
        else:
            ax2.axis("off")
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def bench_step(run, source: str, onnx: str, real: list[str], real_sets: dict, real_eval: list[str], progress: bool):
    """The bench's ``real_eval_data`` and ``real_track`` steps (``bench/run_order.py``, with ``--real``): the first
    ``--real`` read dataset's track, started from the read gate of label source ``source`` (its checkpoint, else
    its export ``onnx``), judged also on every ``--real-eval`` read dataset. None without a real read dataset."""
    from branchgate.bench.closed_loop import safe_name
    from branchgate.bench.settings import manifest_hash, real_datasets

    reads = real_sets.get("read_datasets") or {}
    if not reads:
        return None
    name, dataset = next(iter(reads.items()))
    ckpt = run.steps.out / "read" / safe_name(source) / "train" / "run" / "controller.safetensors"
    start = str(ckpt) if ckpt.is_file() else onnx
    evals = run.steps.run(
        "real_eval_data",
        {"real_eval": list(real_eval), "manifests": [manifest_hash(p) for p in real_eval], "encoder": run.enc_id},
        lambda folder: real_datasets(list(real_eval), folder, run.enc, progress, True),
    )
    eval_reads = evals.get("read_datasets") or {}
    inputs = {
        "start": run.steps.fingerprints.get(f"read/{safe_name(source)}/train") or start,
        "real": [str(p) for p in real],
        "real_eval": [str(p) for p in real_eval],
        "datasets": [dataset, *eval_reads.values()],
        "boot": run.cfg["bootstrap"],
    }

    def traces_of(paths: list[str], key: str) -> list[str] | None:
        found = [p for p in paths if Path(p).resolve().name == key and not (Path(p) / "manifest.json").is_file()]
        return found or None

    def step(folder: Path) -> dict:
        evals_in = {k: (v, traces_of(list(real_eval), k)) for k, v in eval_reads.items()}
        result = track(start, dataset, traces_of(list(real), name), folder, run.cfg["bootstrap"], evals=evals_in)
        from branchgate.training.metrics import clean

        return clean(result)

    return run.steps.run("real_track", inputs, step)
