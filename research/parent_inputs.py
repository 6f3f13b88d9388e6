"""Does what a branch's parent retrieved tell the gate anything about the branch? (issue 22; an offline probe)

A candidate below the root is decided after its parent branch was searched and read, so the parent's passages
and learnings are known then, while the candidate's own are not. On unpruned runs (every branch expanded) this
prints, for the candidates below the root: their positive rate by whether the parent itself found a key point
(the truth, which no run-time input has), the AUROC of inputs that can be seen (the parent's count of passages
new to the run, its passages' and learnings' cosine to the question, the candidate's cosine to them), and
whether they add to the gate: 5-fold logistic regression over runs on the gate's logit and depth, with and
without each input; then how far the frontier moves when the gate's scores below the root are replaced by the
regression's out-of-fold scores with every input (fitted on these runs themselves: a generous probe).

    python3 -m research.parent_inputs --runs OUT/closed_loop/seed0/none/traces --dataset OUT/eval_data/dataset
        --checkpoint OUT/keypoints/train/run/controller.safetensors [--encoder auto] [--max-runs N]
"""

from __future__ import annotations

import argparse

import numpy as np

from .common import Tree, lazy_embed, logit, new_passages, top, unpruned
from .replay_rules import frontier_change

INPUTS = (
    "parent's new passages",
    "parent passages · question (mean)",
    "parent passages · question (max)",
    "parent learnings · question (max)",
    "candidate · parent passages (max)",
    "candidate · parent learnings (max)",
)


def rows_of(runs, trees: list[Tree], scores: dict, embed) -> tuple[np.ndarray, list]:
    """One row per labelled candidate below the root: run index, depth, label, p_keep, parent found one, INPUTS;
    and the rows' (run id, candidate id). ``trees``: ``Tree(run)`` of each run."""
    out, keys = [], []
    for k, (run, t) in enumerate(zip(runs, trees)):
        text = {e.evidence_id: e.text for e in run.events if e.type == "evidence"}
        learned: dict[str, list[str]] = {}
        for e in run.events:
            if e.type == "learning" and e.candidate_id:
                learned.setdefault(e.candidate_id, []).append(e.text)
        question = embed([next(e.root_query for e in run.events if e.type == "run_start")])[0]
        query = {c.candidate_id: c.query for f in t.frames.values() for c in f.candidates}
        new = {c: len(ids) for c, ids in new_passages(run, t).items()}
        for parent, frame in t.child.items():
            passages = embed([text[i] for i in t.ev.get(parent, []) if i in text])
            learnings = embed(learned.get(parent, []))
            for c in t.frames[frame].candidates:
                p, y, depth = scores[(t.run_id, c.candidate_id)]
                if y < 0:
                    continue
                me = embed([query[c.candidate_id]])[0]
                keys.append((t.run_id, c.candidate_id))
                out.append(
                    (
                        k,
                        depth,
                        y,
                        p,
                        scores[(t.run_id, parent)][1] == 1,
                        new.get(parent, 0),
                        float((passages @ question).mean()) if len(passages) else 0.0,
                        top(passages, question),
                        top(learnings, question),
                        top(passages, me),
                        top(learnings, me),
                    )
                )
    return np.array(out, dtype=np.float64), keys


def out_of_fold(x: np.ndarray, y: np.ndarray, groups: np.ndarray, folds: int = 5) -> np.ndarray:
    """Out-of-fold logistic-regression probabilities, folds by run."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold

    z = np.zeros(len(y))
    for fit, held in GroupKFold(folds).split(x, y, groups):
        z[held] = LogisticRegression(max_iter=2000).fit(x[fit], y[fit]).predict_proba(x[held])[:, 1]
    return z


def cv_auroc(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> float:
    from branchgate.training.metrics import safe_auroc

    return safe_auroc(y, out_of_fold(x, y, groups))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True, help="traces of unpruned runs (a file or folder)")
    ap.add_argument("--dataset", required=True, help="the decision dataset built from those traces")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--encoder", default="auto")
    ap.add_argument("--max-runs", type=int, default=0, help="only the first N runs (0 = all)")
    args = ap.parse_args()

    from branchgate.training.metrics import safe_auroc

    runs, trees, scores = unpruned(args.runs, args.dataset, args.checkpoint, max_runs=args.max_runs)
    embed = lazy_embed(args.encoder)
    a, keys = rows_of(runs, trees, scores, embed)
    if not len(a):
        raise SystemExit(f"no labelled candidate below the root in {args.runs}")
    run, depth, y, p, parent_found, inputs = a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], a[:, 5:]
    print(f"{len(runs)} runs, {len(y)} labelled candidates below the root")
    for d in sorted(set(depth.astype(int))):
        m = depth == d
        rates = [f"{y[m & (parent_found == f)].mean():.3f} ({int((m & (parent_found == f)).sum())})" for f in (1, 0)]
        print(
            f"depth {d}: positive rate when the parent found a key point {rates[0]}, when it did not {rates[1]}; "
            f"AUROC gate {safe_auroc(y[m], p[m]):.3f}, "
            + ", ".join(f"{n} {safe_auroc(y[m], inputs[m, i]):.3f}" for i, n in enumerate(INPUTS))
        )
    base = np.c_[logit(p), depth]
    print(f"pooled: gate {safe_auroc(y, p):.3f}; regression on the gate's logit and depth {cv_auroc(base, y, run):.3f}")
    for i, n in enumerate(INPUTS):
        print(f"  + {n}: {cv_auroc(np.c_[base, inputs[:, i]], y, run):.3f}")
    together = out_of_fold(np.c_[base, inputs], y, run)
    print(f"  + all of them: {safe_auroc(y, together):.3f}")
    print("Replayed with those out-of-fold scores below the root, minus the gate (Gate's rule, root τ 0.5):")
    for share, mean, lo, hi, outside in frontier_change(trees, scores, keys, together):
        print(
            f"  at {share:.1%} of tokens: {mean:+.4f} [{lo:+.4f}, {hi:+.4f}]"
            + (" (outside the new sweep)" if outside else ""),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
