"""What would a gate that decides after the search call, before reading, gain? (issue 22; an offline probe)

The pre-retrieval gate ranks the candidates below the root at about 0.74 AUROC, and ``replay_frontier.py`` says
the 35%-of-tokens target needs about 0.93: the missing information is what a candidate's own search returns.
Most of a branch's cost is reading that (the process and follow-ups LLM calls and the evidence in the
synthesis), not the search itself. So this probe asks what the result list, as a search API returns it before
any page is read, adds: for each candidate below the root, how many of its passages are new to the run (known
from the result ids) and the opening words of each passage (a snippet: ``common.opening``), their cosine to the
question and to the query.

Honest protocol: a logistic regression on the gate's logit, the depth and these inputs is fitted on one set of
unpruned runs (``--fit-runs``/``--fit-dataset``, the train queries' ``--fit-split``, never the eval queries) and
scores the candidates below the root of the eval runs (``--runs``/``--dataset``). Printed: AUROC below the root
per input and together; then the Gate's rule replayed on the eval runs (root τ 0.5 on the gate's own scores,
each τ of ``replay_rules.TAU_GRID`` below it on the regression's): its best KPR within 35% of the unpruned
tokens, the tokens it needs for 95% of unpruned KPR, and its KPR minus the gate's at equal tokens, paired by run.
"Passages new to the run" counts against the unpruned run's earlier retrievals (a pruned run has seen fewer).

    python3 -m research.result_inputs --runs OUT/closed_loop/seed0/none/traces --dataset OUT/eval_data/dataset \\
        --fit-runs OUT/simulate/seed0/traces --fit-dataset OUT/keypoints/dataset/dataset \\
        --checkpoint OUT/keypoints/train/run/controller.safetensors [--encoder auto]
"""

from __future__ import annotations

import argparse

import numpy as np

from .common import Tree, lazy_embed, logit, new_passages, opening, top, unpruned
from .replay_rules import TAU_GRID, Rules, frontier_change, summary

ROOT_TAU = 0.5
INPUTS = (
    "passages new to the run",
    "openings · question (max)",
    "openings · question (mean)",
    "new passages' openings · question (max)",
    "query · openings (max)",
)


def rows_of(runs, trees: list[Tree], scores: dict, embed) -> tuple[np.ndarray, list]:
    """One row per labelled candidate below the root: run index, depth, label, p_keep, INPUTS; and the rows'
    (run id, candidate id)."""
    out, keys = [], []
    for k, (run, t) in enumerate(zip(runs, trees)):
        text = {e.evidence_id: e.text for e in run.events if e.type == "evidence"}
        root_query = next(e.root_query for e in run.events if e.type == "run_start")
        queries = [c.query for f in t.frames.values() for c in f.candidates]
        every = [root_query, *queries, *(opening(x) for x in text.values())]
        vec = dict(zip(every, embed(every)))  # one batch a run
        question, snip = vec[root_query], {i: vec[opening(x)] for i, x in text.items()}
        new = new_passages(run, t)
        for f in t.frames.values():
            if f.depth == 0:
                continue
            for c in f.candidates:
                p, y, depth = scores[(t.run_id, c.candidate_id)]
                if y < 0:
                    continue
                ids = [i for i in t.ev.get(c.candidate_id, []) if i in text]
                fresh = set(new.get(c.candidate_id, []))
                snips = np.array([snip[i] for i in ids]).reshape(len(ids), len(question))
                fresh_snips = snips[np.array([i in fresh for i in ids], bool)]
                me = vec[c.query]
                keys.append((t.run_id, c.candidate_id))
                out.append(
                    (
                        k,
                        depth,
                        y,
                        p,
                        len(fresh),
                        top(snips, question),
                        float((snips @ question).mean()) if len(snips) else 0.0,
                        top(fresh_snips, question),
                        top(snips, me),
                    )
                )
    return np.array(out, dtype=np.float64), keys


def load(runs_path: str, dataset: str, checkpoint: str, embed, split: str | None = None):
    runs, trees, scores = unpruned(runs_path, dataset, checkpoint, split)
    a, keys = rows_of(runs, trees, scores, embed)
    if not len(a):
        raise SystemExit(
            f"no labelled candidate below the root in {runs_path}" + (f" ({split} split)" if split else "")
        )
    return trees, scores, a, keys


def design(a: np.ndarray, inputs: list[int]) -> np.ndarray:
    return np.c_[logit(a[:, 3]), a[:, 1], a[:, 4:][:, inputs]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True, help="the eval queries' unpruned runs (a file or folder)")
    ap.add_argument("--dataset", required=True, help="the decision dataset built from those runs")
    ap.add_argument("--fit-runs", required=True, help="unpruned runs of other queries to fit on")
    ap.add_argument("--fit-dataset", required=True, help="the decision dataset built from --fit-runs")
    ap.add_argument(
        "--fit-split",
        default="validation",
        choices=("train", "validation", "test"),
        help="the --fit-runs split to fit on (default validation: runs the gate never trained on)",
    )
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--encoder", default="auto")
    ap.add_argument("--budget", type=float, default=0.35)
    ap.add_argument("--target", type=float, default=0.95)
    args = ap.parse_args()

    from sklearn.linear_model import LogisticRegression

    from branchgate.training.metrics import safe_auroc

    embed = lazy_embed(args.encoder)
    _, _, fit, _ = load(args.fit_runs, args.fit_dataset, args.checkpoint, embed, args.fit_split)
    trees, scores, a, keys = load(args.runs, args.dataset, args.checkpoint, embed)
    print(
        f"fit: {len(fit)} candidates below the root ({int(fit[:, 2].sum())} positive) in the {args.fit_split} "
        f"split of {args.fit_runs}; eval: {len(a)} ({int(a[:, 2].sum())} positive) in {len(trees)} runs"
    )

    def fitted(inputs: list[int]) -> np.ndarray:
        x_fit, x = design(fit, inputs), design(a, inputs)
        mu, sd = x_fit.mean(0), x_fit.std(0) + 1e-9
        model = LogisticRegression(max_iter=2000).fit((x_fit - mu) / sd, fit[:, 2])
        return model.predict_proba((x - mu) / sd)[:, 1]

    y = a[:, 2]
    print(
        f"below the root on the eval runs: gate {safe_auroc(y, a[:, 3]):.3f}; "
        f"regression on its logit and depth {safe_auroc(y, fitted([])):.3f}"
    )
    for i, name in enumerate(INPUTS):
        print(f"  {name}: alone {safe_auroc(y, a[:, 4 + i]):.3f}; + the gate {safe_auroc(y, fitted([i])):.3f}")
    together = fitted(list(range(len(INPUTS))))
    print(f"  all of them + the gate: {safe_auroc(y, together):.3f}")

    new = dict(scores)
    for key, q in zip(keys, together):
        new[key] = (float(q), *scores[key][1:])
    for name, table in (("gate", scores), ("gate + result list", new)):
        rules = Rules(trees, table)
        points = [((ROOT_TAU, tau), *rules.replay("depth", (ROOT_TAU, tau, tau))) for tau in TAU_GRID]
        print(f"{name} (root τ {ROOT_TAU}): {summary(points, args.budget, args.target)}")
    print("gate + result list minus the gate, KPR at the gate's tokens (paired by run):")
    for share, mean, lo, hi, outside in frontier_change(trees, scores, keys, together, ROOT_TAU):
        print(
            f"  at {share:.1%} of tokens: {mean:+.4f} [{lo:+.4f}, {hi:+.4f}]"
            + (" (outside the new sweep)" if outside else ""),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
