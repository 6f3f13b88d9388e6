"""How much a model can learn from real decisions themselves: cross-validation over runs on a real dataset.

The learned gate is trained on simulator runs and judged on real agent decisions (issue 22). This probe asks
the question the other way round: a model fitted on the real decisions *themselves* (5 folds over runs,
repeated, so no run is in its own training folds), from the inputs a pre-retrieval gate has — the teachers'
scores, the structured features, the candidate's similarities to the root and to the earlier searches, and
optionally the candidate's embedding. If none of these beats the best teacher out of fold, the real decisions
carry no more signal in these inputs than the teacher already uses, and no gate trained elsewhere can be
expected to beat it on them by much.

    python benchmarks/real_ceiling.py DATASET [--cache PATH] [--reps 5] [--boot 1000]

DATASET: a decision dataset built from real traces (e.g. `branchgate dataset build --format searcho1`, or a
bench's OUT/real_data/NAME/dataset). Prints AUROC (mean ± sd over repetitions) per model, and for the first
repetition the paired difference to the best teacher with a 95% bootstrap interval over runs.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import numpy as np


class Real(NamedTuple):
    """A real decision dataset's labelled rows, read once: labels, run ids, teacher scores, the scalar features,
    the candidates' and roots' embeddings, the rows themselves and the embedding cache that made them."""

    y: np.ndarray
    runs: np.ndarray
    teachers: dict
    scalars: np.ndarray
    cand: np.ndarray
    root: np.ndarray
    rows: object
    emb: object


def load(dataset: str, cache: str | None) -> Real:
    from datasets import concatenate_datasets

    from branchgate.data.decisions import load_decision_dataset
    from branchgate.data.embedding_cache import EmbeddingCache, LazyEncoder
    from branchgate.models import teachers as T
    from branchgate.models.encoder import recorded_spec
    from branchgate.texts import candidate_text

    dd, manifest = load_decision_dataset(dataset)
    rows = concatenate_datasets([dd[s] for s in dd]).filter(lambda r: r["label"] >= 0)
    emb = EmbeddingCache(LazyEncoder(recorded_spec(manifest["encoder"])), path=cache)
    cand = emb.get([candidate_text(r["query"], r["goal"]) for r in rows])
    root = emb.get(list(rows["root_query"]))
    retained_max = np.array([float((emb.get(list(r["retained"])) @ cand[i]).max()) if r["retained"] else 0.0
                             for i, r in enumerate(rows)])
    teachers = {n: np.asarray(rows[f"teacher_{n}"], np.float64) for n in T.NAMES if f"teacher_{n}" in rows.column_names}
    n_ret = np.asarray(rows["n_retained"], np.float64)
    scalars = np.column_stack([*teachers.values(), (cand * root).sum(1), retained_max, np.log1p(n_ret),
                               np.asarray(rows["depth"], np.float64)])
    return Real(np.asarray(rows["label"]), np.asarray(rows["run_id"]), teachers, scalars, cand, root, rows, emb)


def out_of_fold(x, y, runs, seed: int, c: float, scaled: int | None = None) -> np.ndarray:
    """Out-of-fold P(y) of a logistic regression, 5 folds over runs. The first ``scaled`` columns (all when
    None) are standardised on the training folds; the rest (e.g. binary word columns) are used as they are."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(seed)
    pred = np.zeros(len(y))
    for fold in np.array_split(rng.permutation(np.unique(runs)), 5):
        test = np.isin(runs, fold)
        mu, sd = x[~test].mean(0), x[~test].std(0) + 1e-9
        if scaled is not None:
            mu[scaled:], sd[scaled:] = 0.0, 1.0
        model = LogisticRegression(C=c, max_iter=5000).fit((x[~test] - mu) / sd, y[~test])
        pred[test] = model.predict_proba((x[test] - mu) / sd)[:, 1]
    return pred


def compare(models: dict, y, runs, teachers: dict, reps: int = 5, boot: int = 1000) -> None:
    """Print each model's out-of-fold AUROC (mean ± sd over ``reps`` fold draws) and, for the first draw, its
    difference to the best teacher with a 95% bootstrap interval over runs. ``models``: ``{name: (x, C)}``
    or ``{name: (x, C, scaled)}`` (``out_of_fold``'s ``scaled``)."""
    from branchgate.bench.stats import bootstrap_ci
    from branchgate.training.metrics import safe_auroc

    print(f"{len(y)} labelled decisions from {len(np.unique(runs))} runs, {y.mean():.1%} positive")
    best = max(teachers, key=lambda n: safe_auroc(y, teachers[n]))
    print(f"best teacher: {best} (AUROC {safe_auroc(y, teachers[best]):.3f}, no fitting)")
    by_run = {r: np.flatnonzero(runs == r) for r in np.unique(runs)}
    print(f"{'model':44s} {'AUROC (mean ± sd over reps)':28s} − {best} [95% CI over runs]")
    for name, (x, c, *scaled) in models.items():
        preds = [out_of_fold(x, y, runs, seed, c, *scaled) for seed in range(reps)]
        aurocs = [safe_auroc(y, p) for p in preds]

        def delta(ids, p=preds[0]):
            idx = np.concatenate([by_run[r] for r in ids])
            return safe_auroc(y[idx], p[idx]) - safe_auroc(y[idx], teachers[best][idx])

        lo, hi = bootstrap_ci(list(by_run), delta, boot=boot)
        print(f"{name:44s} {np.mean(aurocs):.3f} ± {np.std(aurocs):.3f}{'':16s} {delta(list(by_run)):+.3f} "
              f"[{lo:+.3f}, {hi:+.3f}]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--cache", default=None, help="embedding cache (default: the branchgate cache folder's)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--boot", type=int, default=1000)
    args = ap.parse_args()

    y, runs, teachers, scalars, cand, root, _rows, _emb = load(args.dataset, args.cache)
    models = {
        "LR teachers": (np.column_stack(list(teachers.values())), 1.0),
        "LR teachers + scalars": (scalars, 1.0),
        "LR scalars + candidate embedding (C=0.01)": (np.column_stack([scalars, cand]), 0.01),
        "LR scalars + candidate x root (C=0.01)": (np.column_stack([scalars, cand * root]), 0.01),
    }
    compare(models, y, runs, teachers, args.reps, args.boot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
