"""How much a model can learn from real decisions themselves: cross-validation over runs on a real dataset.

The learned gate is trained on simulator runs and judged on real agent decisions (issue 22). This probe asks
the question the other way round: a model fitted on the real decisions *themselves* (5 folds over runs,
repeated, so no run is in its own training folds), from the inputs a pre-retrieval gate has — the teachers'
scores, the structured features, the candidate's similarities to the root and to the earlier searches, and
optionally the candidate's embedding. If none of these beats the best teacher out of fold, the real decisions
carry no more signal in these inputs than the teacher already uses, and no gate trained elsewhere can be
expected to beat it on them by much.

    python3 -m research.real_ceiling DATASET [--cache PATH] [--reps 5] [--boot 1000]

DATASET: a decision dataset built from real traces (e.g. `branchgate dataset build --format searcho1`, or a
bench's OUT/real_data/NAME/dataset). Prints AUROC (mean ± sd over repetitions) per model, and for the first
repetition the paired difference to the best teacher with a 95% bootstrap interval over runs.
"""

from __future__ import annotations

import argparse

import numpy as np

from .common import compare, load_real


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--cache", default=None, help="embedding cache (default: the branchgate cache folder's)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--boot", type=int, default=1000)
    args = ap.parse_args()

    y, runs, teachers, scalars, cand, root, _rows, _emb = load_real(args.dataset, args.cache)
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
