"""Would a little fitting on the user's own logs carry the simulator's read gate over? (issue 50, first target)

The read gate trained on the simulator ties DPP on the real Search-o1 result lists. This probe asks how much a
small model fitted on the real read decisions adds, out of fold over runs (GroupKFold, 5 folds; nothing is fitted
on the rows it scores, and nothing is chosen on them: one fixed logistic regression, C = 1, standardised inputs):

- ``stack``: the gate's score (as a logit) with every teacher's snippet score, the hit's rank, the number of
  documents the run had read and the length of the result list;
- ``stack_no_gate``: the same without the gate (what the real rows give on their own);
- ``gate_plus_read``: the gate's logit with the number of documents read only (a two-input recalibration);
- ``stack_trees``: the ``stack`` inputs into gradient-boosted trees (scikit-learn's defaults), for interactions;
- with ``--sim DATASET`` (the simulator's read dataset the gate was trained on): ``sim_stack``, the stack's inputs
  but the gate fitted on that dataset's train split and scored on the real rows (nothing fitted on them): is the
  gap the model, or what the simulator teaches?

Each is scored like the gate in ``research/read_gate_real.py`` (AUROC per hit and per search, paired bootstrap
over runs against ``stack``).

    python3 -m research.read_gate_stack DATASET CHECKPOINT [--boot 1000] [--folds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from branchgate.bench.gate_steps import real_table, with_rank
from branchgate.training import stats
from research.read_gate_real import SPLITS, show

TEACHERS = ("mmr", "grn", "cd", "dpp", "sc", "lexical", "hybrid")


def sim_inputs(dataset: str, splits=("train",)) -> tuple[np.ndarray, np.ndarray]:
    """Every teacher's score, log(1 + rank), documents read and list length of a read dataset's labelled rows,
    with their labels (the ``stack`` inputs without the gate)."""
    import datasets

    dd = datasets.load_from_disk(dataset)
    xs, ys = [], []
    for split in splits:
        part = dd[split].select_columns(
            [f"teacher_{t}" for t in TEACHERS] + ["rank", "n_retained", "n_candidates", "label"]
        )
        label = np.asarray(part["label"])
        cols = [np.nan_to_num(np.asarray(part[f"teacher_{t}"], np.float64)) for t in TEACHERS]
        cols += [np.log1p(np.asarray(part["rank"], np.float64))]
        cols += [np.asarray(part[k], np.float64) for k in ("n_retained", "n_candidates")]
        xs.append(np.column_stack(cols)[label >= 0])
        ys.append(label[label >= 0])
    return np.concatenate(xs), np.concatenate(ys)


def side_columns(dataset: str) -> dict[str, np.ndarray]:
    """The rows' ``n_retained`` (documents already read) and ``n_candidates`` (hits in the list), in the order
    ``stats.controller_rows`` reads them (every split, labelled rows only)."""
    import datasets

    dd = datasets.load_from_disk(dataset)
    out: dict[str, list] = {"n_read": [], "n_hits": []}
    for split in SPLITS:
        part = dd[split]
        keep = np.asarray(part["label"]) >= 0
        out["n_read"].append(np.asarray(part["n_retained"], np.float64)[keep])
        out["n_hits"].append(np.asarray(part["n_candidates"], np.float64)[keep])
    return {k: np.concatenate(v) for k, v in out.items()}


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def out_of_fold(x: np.ndarray, y: np.ndarray, groups: np.ndarray, folds: int, trees: bool = False) -> np.ndarray:
    """Each row's score from a model fitted on the other folds' runs: a logistic regression, or with ``trees``
    gradient-boosted trees."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    score = np.zeros(len(y))
    for fit, held in GroupKFold(n_splits=folds).split(x, y, groups):
        if trees:
            model = HistGradientBoostingClassifier(random_state=0)
        else:
            model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
        model.fit(x[fit], y[fit])
        score[held] = model.decision_function(x[held])
    return score


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("checkpoint")
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the tables here")
    ap.add_argument("--sim", default=None, help="the simulator's read dataset: also fit the stack there")
    a = ap.parse_args(argv)
    rows = with_rank(stats.controller_rows(a.checkpoint, a.dataset, SPLITS))
    side = side_columns(a.dataset)
    if len(side["n_read"]) != len(rows.labels):
        raise SystemExit(f"{a.dataset}: {len(side['n_read'])} side rows for {len(rows.labels)} scored rows")
    gate = logit(rows.scorers["gate"])
    teachers = [np.nan_to_num(rows.scorers[t]) for t in TEACHERS]
    rank = np.log1p(rows.order.astype(np.float64))
    inputs = {
        "stack": [gate, *teachers, rank, side["n_read"], side["n_hits"]],
        "stack_no_gate": [*teachers, rank, side["n_read"], side["n_hits"]],
        "gate_plus_read": [gate, side["n_read"]],
    }
    for name, cols in inputs.items():
        rows.scorers[name] = out_of_fold(np.column_stack(cols), rows.labels, rows.runs, a.folds)
    x = np.column_stack(inputs["stack"])
    rows.scorers["stack_trees"] = out_of_fold(x, rows.labels, rows.runs, a.folds, trees=True)
    if a.sim:
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        xs, ys = sim_inputs(a.sim)
        model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=3000)).fit(xs, ys)
        rows.scorers["sim_stack"] = model.decision_function(np.column_stack(inputs["stack_no_gate"]))
    t = {
        "per_hit": real_table(stats.scorer_metrics(rows, a.boot, ref="stack")),
        "per_search": real_table(stats.scorer_metrics(stats.per_decision(rows), a.boot, ref="stack")),
        "rows": int(len(rows.labels)),
        "positive": int(rows.labels.sum()),
        "runs": len(rows.by_run),
        "folds": a.folds,
    }
    show(f"{a.checkpoint} (stacked out of fold, reference: stack)", t)
    if a.json:
        Path(a.json).write_text(json.dumps(t, indent=1))


if __name__ == "__main__":
    main()
