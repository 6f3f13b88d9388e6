"""How far can the gate's pooled AUROC on real decisions rise when only the deeper decisions improve? (issue 22)

A sequential agent's real decisions (Search-o1: one search per decision) are mostly first searches, made
before there is any search state; there every relevance scorer ranks alike. This probe scores a controller on
a real decision dataset and prints, per depth stratum (``training.stats.DEPTH_STRATA``), the gate's and each
teacher's AUROC, and two bounds on the pooled AUROC with the gate's depth-0 ranking kept:

- *shift*: the best constant added to the gate's logit below the root (what any recalibration between the
  strata can give);
- *perfect below the root*: the deeper decisions ranked perfectly (their own score values reassigned so
  every positive is above every negative), with and without the best shift.

    python3 -m research.real_strata --checkpoint OUT/keypoints/train/run/controller.safetensors \\
        --dataset OUT/real_data/NAME/dataset

The bench's ``real_by_depth`` step reports the per-stratum tables with paired intervals; this adds the bounds.
"""

from __future__ import annotations

import argparse

import numpy as np

from .common import logit

SHIFTS = np.linspace(-5.0, 5.0, 201)


def best_shift(labels: np.ndarray, score: np.ndarray, deep: np.ndarray) -> tuple[float, float]:
    """``(pooled AUROC, shift)`` maximised over a constant added to ``score`` where ``deep``."""
    from branchgate.training.metrics import safe_auroc

    return max((float(safe_auroc(labels, score + s * deep)), float(s)) for s in SHIFTS)


def perfect_below_root(labels: np.ndarray, score: np.ndarray, deep: np.ndarray) -> np.ndarray:
    """``score`` with the deep rows' values reassigned: the highest values to the positives."""
    out = score.copy()
    idx = np.flatnonzero(deep)
    values = np.sort(score[idx])[::-1]
    out[idx[np.argsort(-labels[idx], kind="stable")]] = values
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="controller.safetensors")
    ap.add_argument("--dataset", required=True, help="a real decision dataset (all its splits are scored)")
    args = ap.parse_args()

    from branchgate.training.metrics import safe_auroc
    from branchgate.training.stats import DEPTH_STRATA, controller_rows

    rows = controller_rows(args.checkpoint, args.dataset, ("train", "validation", "test"))
    labels, gate = rows.labels, logit(rows.scorers["gate"])
    deep = (rows.depth >= 1).astype(np.float64)
    names = ["gate"] + sorted(k for k in rows.scorers if k != "gate")
    print(f"{len(labels)} labelled decisions in {len(rows.by_run)} runs")
    for stratum, test in DEPTH_STRATA.items():
        m = test(rows.depth)
        cells = " ".join(f"{k} {safe_auroc(labels[m], rows.scorers[k][m]) or float('nan'):.3f}" for k in names)
        print(f"{stratum}: {int(m.sum())} decisions, positive rate {labels[m].mean():.3f}; {cells}")
    print(
        f"pooled: gate {safe_auroc(labels, gate):.3f}; best shift below the root: {{:.3f}} (shift {{:+.2f}})".format(
            *best_shift(labels, gate, deep)
        )
    )
    perfect = perfect_below_root(labels, gate, deep)
    print(
        f"perfect below the root: pooled {safe_auroc(labels, perfect):.3f}; with the best shift "
        "{:.3f} (shift {:+.2f})".format(*best_shift(labels, perfect, deep))
    )


if __name__ == "__main__":
    main()
