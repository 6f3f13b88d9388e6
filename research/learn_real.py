"""Learn from real logs (issue 66): the held-out split, out-of-fold comparisons and held-out scoring.

The 800 dev Search-o1 traces are one run per query (``run_id`` = the query id). ``held_out`` puts a query in the
held-out set by a salted hash of its id, fixed before any result was looked at (``SALT``, one query in
``HELD_OUT_ONE_IN``); every configuration is chosen out of fold on the other queries, never on held-out scores.

    python3 -m research.learn_real split DATASET OUT          # OUT/dev and OUT/heldout: the dataset by query
    python3 -m research.learn_real compare OOF_DIR... [--json F]  # out-of-fold scorers on the same rows
    python3 -m research.learn_real heldout DATASET CONTROLLER... [--names ...] [--json F]
    python3 -m research.learn_real track START DEV HELDOUT TRACES OUT   # bench/real_track.py on the split
    python3 -m research.learn_real capacity DATASET OOF_DIR [--cache F]  # which inputs pay, linear probes

``capacity`` asks which inputs would pay before building them into the graph: logistic regressions, out of fold on
the same folds as a ``train --folds`` run (OOF_DIR/oof.json), over the network's own in-graph scalar features (the
teachers' quantities it computes, the position, the run's progress), then with the snippet teachers the graph
lacks (sc, lexical, hybrid: the stack's inputs), then with the hit's and the question's embeddings (a learned
interaction beyond the frozen towers, as a linear model can learn one), each against DPP with paired intervals.

``compare`` pools several ``train --folds`` outputs that share one dataset (the same rows, the same folds) and adds
``sim_only`` (the start of the first, scored unchanged: ``--start``) and ``stack`` (the logistic stack of
``read_gate_stack``: every teacher's snippet score, log(1 + rank), documents read and list length, fitted out of
fold on the same folds), each against the best teacher with paired intervals over runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
from pathlib import Path

import numpy as np

SALT = "issue66-heldout"  # fixed before looking at any result (the held-out queries never choose anything)
HELD_OUT_ONE_IN = 4  # a quarter of the queries are held out
TEACHERS = ("mmr", "grn", "cd", "dpp", "sc", "lexical", "hybrid")
SPLITS = ("train", "validation", "test")


def held_out(run_id: str) -> bool:
    """Whether the query of ``run_id`` is held out: a Search-o1 run's id is its query id; a simulated run's
    (``QID.r<k>.<hash>``) starts with it, so a simulation of the same queries splits the same way."""
    qid = run_id.split(".")[0]
    return int(hashlib.sha256(f"{SALT}:{qid}".encode()).hexdigest(), 16) % HELD_OUT_ONE_IN == 0


def split(dataset: str, out: str) -> None:
    """``OUT/dev`` (the queries not held out, their splits as built) and ``OUT/heldout`` (the held-out queries)."""
    from datasets import DatasetDict

    from branchgate.data.decision_batches import load_decision_dataset

    dsd, manifest = load_decision_dataset(dataset)
    for name, keep in (("dev", False), ("heldout", True)):
        part = DatasetDict({s: dsd[s].filter(lambda r, k=keep: held_out(r["run_id"]) == k) for s in SPLITS})
        where = Path(out) / name
        part.save_to_disk(str(where))
        n_runs = {s: len(set(part[s]["run_id"])) for s in SPLITS}
        meta = dict(manifest, n_runs={**n_runs, "total": sum(n_runs.values())}, held_out={"salt": SALT, "part": name})
        (where / "manifest.json").write_text(json.dumps(meta, indent=1, default=str))
        print(f"{where}: {sum(len(part[s]) for s in SPLITS)} rows, {sum(n_runs.values())} runs with rows")


def _key(rows) -> list[tuple]:
    return list(zip(rows.runs, rows.frames, rows.order, rows.labels))


def stack_inputs(dataset: str) -> dict:
    """``{(run, frame, rank, label): stack input row}`` over every split of a dataset (labelled rows)."""
    from branchgate.data.decision_batches import load_decision_dataset

    dsd, _ = load_decision_dataset(dataset)
    out = {}
    for s in SPLITS:
        d = dsd[s]
        cols = [np.nan_to_num(np.asarray(d[f"teacher_{t}"], np.float64)) for t in TEACHERS]
        x = np.column_stack(
            cols
            + [np.log1p(np.asarray(d["rank"], np.float64))]
            + [np.asarray(d[k], np.float64) for k in ("n_retained", "n_candidates")]
        )
        for i, (r, f, rank, y) in enumerate(zip(d["run_id"], d["frame_id"], d["rank"], d["label"])):
            if y >= 0:
                out[(r, f"{r}/{f}", rank, y)] = x[i]
    return out


def stack_oof(x: np.ndarray, y: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """Logistic stack (C = 1, standardised; nothing tuned) fitted on the other folds."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    score = np.zeros(len(y))
    for k in np.unique(fold):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=3000))
        model.fit(x[fold != k], y[fold != k])
        score[fold == k] = model.decision_function(x[fold == k])
    return score


def start_scores(start: str, dataset: str, rows, cache: str | None) -> np.ndarray:
    """The start controller (``--init-from`` source) scored unchanged on ``rows`` of ``dataset``, by the training
    path: the simulator-only gate (the bench's real track scores it the same way)."""
    from branchgate.bench.real_track import controller_scores

    return controller_scores(start, dataset, rows, cache)


def compare(dirs: list[str], names: list[str], start: str | None, boot: int, cache: str | None) -> dict:
    """Every ``train --folds`` output's pooled out-of-fold model score on the same rows, the teachers, the stack
    and (``start``) the unchanged start; AUROC per hit and per search, each − the best teacher (paired)."""
    from branchgate.training import stats
    from branchgate.training.folds import oof_rows

    runs = []
    for d in dirs:
        rep = json.loads((Path(d) / "oof.json").read_text())
        k = int(rep["folds"])
        folds = [(f"{d}/folds/{i}/controller.safetensors", f"{d}/folds/{i}.dataset") for i in range(k)]
        runs.append((rep, oof_rows(folds, cache)))
    base = runs[0][1]
    keys = _key(base)
    scorers = {t: base.scorers[t] for t in TEACHERS}
    for name, (_, rows) in zip(names, runs):
        pos = {k: i for i, k in enumerate(_key(rows))}
        scorers[name] = rows.scorers["gate"][[pos[k] for k in keys]]
    rep0 = runs[0][0]
    fold = np.array([rep0["fold_of_run"][r] for r in base.runs])
    inputs = stack_inputs(rep0["dataset"])
    scorers["stack"] = stack_oof(np.array([inputs[k] for k in keys]), base.labels, fold)
    if start:
        scorers["sim_only"] = start_scores(start, rep0["dataset"], base, cache)
    best = max(TEACHERS, key=lambda t: base.auroc(t, np.arange(len(keys))))
    out = {"best_teacher": best, "rows": len(keys), "positive": int(base.labels.sum()), "runs": len(base.by_run)}
    r = stats.Rows(base.labels, base.utility, base.runs, base.frames, base.depth, scorers, base.order)
    out["per_hit"] = stats.scorer_metrics(r, boot, ref=best)
    out["per_search"] = stats.scorer_metrics(stats.per_decision(r), boot, ref=best)
    show(out)
    return out


def show(out: dict) -> None:
    best = out["best_teacher"]
    print(f"{out['rows']} rows ({out['positive']} positive), {out['runs']} runs; reference: {best}")
    for unit in ("per_hit", "per_search"):
        m = out[unit]
        print(f"\n{unit}: scorer | AUROC [95%] | scorer − {best} [95%, paired over runs]")
        for name in sorted(m, key=lambda n: -(m[n]["auroc"] or 0)):
            ci = m[name]["ci95_auroc"]
            d = m[name].get("delta_vs_gate")
            line = f"  {name:16s} {m[name]['auroc']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
            if d and d["mean"] is not None:  # delta_vs_gate is ref − scorer: flip to scorer − ref
                lo, hi = d["ci95"]
                line += f"   {-d['mean']:+.3f} [{-hi:+.3f}, {-lo:+.3f}]"
            print(line)


def heldout(
    dataset: str, controllers: list[str], names: list[str], boot: int, start: str | None, cache: str | None
) -> dict:
    """Controllers trained on the dev queries, scored on every split of the held-out queries' dataset."""
    from branchgate.training import stats

    base = None
    scorers = {}
    for c, n in zip(controllers, names):
        rows = stats.controller_rows(c, dataset, SPLITS, cache)
        if base is None:
            base = rows
            scorers.update({t: rows.scorers[t] for t in TEACHERS})
        assert _key(rows) == _key(base)
        scorers[n] = rows.scorers["gate"]
    if start:
        scorers["sim_only"] = start_scores(start, dataset, base, cache)
    best = max(TEACHERS, key=lambda t: base.auroc(t, np.arange(len(base.labels))))
    out = {"best_teacher": best, "rows": int(len(base.labels)), "positive": int(base.labels.sum())}
    out["runs"] = len(base.by_run)
    r = stats.Rows(base.labels, base.utility, base.runs, base.frames, base.depth, scorers, base.order)
    out["per_hit"] = stats.scorer_metrics(r, boot, ref=best)
    out["per_search"] = stats.scorer_metrics(stats.per_decision(r), boot, ref=best)
    show(out)
    return out


def capacity(dataset: str, oof_dir: str, cache: str | None, start: str, boot: int) -> dict:
    """The linear probes of the module docstring."""
    import torch

    from branchgate.data.datamodule import DecisionDataModule
    from branchgate.models.encoder import recorded_spec
    from branchgate.texts import candidate_text
    from branchgate.training.init_from import load_start, switch_order_on
    from branchgate.training.metrics import safe_auroc
    from branchgate.training.module import split_scalars
    from branchgate.training.stats import bootstrap_ci

    torch.set_num_threads(1)
    net, meta, _ = load_start(start)
    dm = DecisionDataModule(dataset, cache=cache, show_progress=False)
    dm.encoder_spec = recorded_spec(meta["encoder"])
    dm.setup("predict")
    switch_order_on(net, dm.sets["train"].features)
    folds = json.loads((Path(oof_dir) / "oof.json").read_text())["fold_of_run"]
    xs, ys, runs, teach, texts = [], [], [], [], []
    for s in SPLITS:
        d = dm.splits[s]
        xs.append(split_scalars(net, dm.sets[s], dm.table).numpy())
        ys.append(np.asarray(d["label"]))
        runs.append(np.asarray(d["run_id"]))
        teach.append(np.column_stack([np.nan_to_num(np.asarray(d[f"teacher_{t}"], np.float64)) for t in TEACHERS]))
        texts += [(candidate_text(q, g), r) for q, g, r in zip(d["query"], d["goal"], d["root_query"])]
    keep = np.concatenate(ys) >= 0
    x, y, r, t = (np.concatenate(v)[keep] for v in (xs, ys, runs, teach))
    texts = [tx for tx, k in zip(texts, keep) if k]
    from branchgate.data.embedding_cache import EmbeddingCache
    from branchgate.models.encoder import LazyEncoder

    emb = EmbeddingCache(LazyEncoder(recorded_spec(meta["encoder"])), path=cache)
    cand, root = emb.get([c for c, _ in texts]), emb.get([q for _, q in texts])
    fold = np.array([folds[k] for k in r])
    dpp = t[:, TEACHERS.index("dpp")]
    snippet = t[:, [TEACHERS.index(n) for n in ("sc", "lexical", "hybrid")]]
    models = {
        "in-graph scalars (the network's own inputs)": (x, 1.0),
        "+ sc, lexical, hybrid snippet scores": (np.column_stack([x, snippet]), 1.0),
        "+ hit embedding (C = 0.003)": (np.column_stack([x, snippet, cand]), 0.003),
        "+ hit × question embedding (C = 0.003)": (np.column_stack([x, snippet, cand * root]), 0.003),
    }
    by = {k: np.flatnonzero(r == k) for k in np.unique(r)}
    out = {"rows": int(len(y)), "runs": len(by), "dpp": safe_auroc(y, dpp), "probes": {}}
    for name, (feats, c) in models.items():
        p = stack_oof_c(feats, y, fold, c)

        def delta(ids, p=p):
            i = np.concatenate([by[k] for k in ids])
            return safe_auroc(y[i], p[i]) - safe_auroc(y[i], dpp[i])

        a = safe_auroc(y, p)
        out["probes"][name] = {"auroc": a, "minus_dpp": a - out["dpp"], "ci95": bootstrap_ci(list(by), delta, boot)}
        lo, hi = out["probes"][name]["ci95"]
        print(f"{name:48s} {a:.3f}  − dpp {a - out['dpp']:+.3f} [{lo:+.3f}, {hi:+.3f}]", flush=True)
    return out


def stack_oof_c(x: np.ndarray, y: np.ndarray, fold: np.ndarray, c: float) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    score = np.zeros(len(y))
    for k in np.unique(fold):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=5000))
        model.fit(x[fold != k], y[fold != k])
        score[fold == k] = model.decision_function(x[fold == k])
    return score


def run_track(a) -> None:
    """The bench's real track on the dev queries (out of fold) and judged on the held-out ones: OUT/track.json,
    OUT/track.md, OUT/real_track.png."""
    from branchgate.bench import real_track

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = real_track.track(
        a.start,
        a.dev,
        [a.traces],
        out,
        a.boot,
        cache=a.cache,
        evals={"held-out queries": (a.heldout, [a.traces])},
        train_args=tuple(shlex.split(a.train_args or "")),
    )
    write_track(res, out)


def write_track(res: dict, out: Path) -> None:
    """A real track's ``res`` as OUT/track.json, OUT/track.md (printed too) and OUT/real_track.png."""
    from branchgate.bench import real_track
    from branchgate.training.metrics import clean

    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(real_track.markdown(res))
    (out / "track.json").write_text(json.dumps(clean(res), indent=1))
    (out / "track.md").write_text(text + "\n")
    real_track.plot(res, out / real_track.PLOT)
    print(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("dataset")
    s.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("dirs", nargs="+")
    c.add_argument("--names", nargs="+")
    c.add_argument("--start", default=None, help="the --init-from source: also score it unchanged (sim_only)")
    c.add_argument("--boot", type=int, default=1000)
    c.add_argument("--json", default=None)
    h = sub.add_parser("heldout")
    h.add_argument("dataset")
    h.add_argument("controllers", nargs="+")
    h.add_argument("--names", nargs="+")
    h.add_argument("--start", default=None)
    h.add_argument("--boot", type=int, default=1000)
    h.add_argument("--json", default=None)
    cp = sub.add_parser("capacity")
    cp.add_argument("dataset")
    cp.add_argument("oof_dir")
    cp.add_argument("--start", default="pretrained:read")
    cp.add_argument("--cache", default=None)
    cp.add_argument("--boot", type=int, default=1000)
    cp.add_argument("--json", default=None)
    t = sub.add_parser("track")
    for name in ("start", "dev", "heldout", "traces", "out"):
        t.add_argument(name)
    t.add_argument("--cache", default=None)
    t.add_argument("--train-args", default=None, help='more train options in one string, e.g. "--freeze mlp"')
    t.add_argument("--boot", type=int, default=1000)
    for p in (c, h):
        p.add_argument("--cache", default=None, help="the embedding cache the datasets were built with")
    a = ap.parse_args(argv)
    if a.cmd == "split":
        split(a.dataset, a.out)
        return
    if a.cmd == "track":
        run_track(a)
        return
    if a.cmd == "capacity":
        out = capacity(a.dataset, a.oof_dir, a.cache, a.start, a.boot)
        if a.json:
            from branchgate.training.metrics import clean

            Path(a.json).write_text(json.dumps(clean(out), indent=1))
        return
    names = a.names or [Path(d).name for d in (a.dirs if a.cmd == "compare" else a.controllers)]
    if a.cmd == "compare":
        out = compare(a.dirs, names, a.start, a.boot, a.cache)
    else:
        out = heldout(a.dataset, a.controllers, names, a.boot, a.start, a.cache)
    if a.json:
        from branchgate.training.metrics import clean

        Path(a.json).write_text(json.dumps(clean(out), indent=1))


if __name__ == "__main__":
    main()
