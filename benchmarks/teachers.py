"""Teacher figures on real MuSiQue data (needs ../shared/data): score ranges, keep rates, AUC, speed.

Post-retrieval setting per question: C = the first supporting paragraph, x = the other paragraphs
(supporting = positives, distractors = negatives), Q = the question. Pre-retrieval setting: the gold
sub-questions, C = the first one. Prints, per teacher: score quantiles, keep rate at its threshold,
ROC-AUC of "supporting vs distractor", and milliseconds per score() call.

    python benchmarks/teachers.py [--questions 50]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    allv = np.concatenate([pos, neg])
    ranks = np.argsort(np.argsort(allv, kind="mergesort"), kind="mergesort") + 1.0
    # average ties
    for v in np.unique(allv):
        m = allv == v
        ranks[m] = ranks[m].mean()
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/musique/musique_train.json")
    )
    ap.add_argument("--questions", type=int, default=50)
    args = ap.parse_args()

    from branchgate.models import teachers as T
    from branchgate.models.encoder import Encoder
    from branchgate.models.teachers import Items, State

    enc = Encoder.load("packaged")
    rows = json.loads(Path(args.data).read_text())[: args.questions]
    post = {n: ([], [], []) for n in T.NAMES}  # positives, negatives, seconds
    pre = {n: [] for n in T.NAMES}
    for row in rows:
        paras = [p["paragraph_text"] for p in row["paragraphs"]]
        sup = [p["is_supporting"] for p in row["paragraphs"]]
        emb = enc.encode(paras + [row["question"]])
        first = sup.index(True)
        rest = [i for i in range(len(paras)) if i != first]
        q = Items([row["question"]], emb[-1:])
        st = State(q, Items([paras[first]], emb[first : first + 1]))
        x = Items([paras[i] for i in rest], emb[rest])
        label = np.array([sup[i] for i in rest])
        for n in T.NAMES:
            t0 = time.perf_counter()
            s = T.get(n).score(x, st)
            post[n][2].append(time.perf_counter() - t0)
            post[n][0].extend(s[label])
            post[n][1].extend(s[~label])
        subs = [d["question"] for d in row.get("question_decomposition", [])]
        if len(subs) >= 2:
            se = enc.encode(subs)
            st2 = State(q, Items(subs[:1], se[:1]))
            for n in T.NAMES:
                pre[n].extend(T.get(n).score(Items(subs[1:], se[1:]), st2))
    print(f"MuSiQue, {len(rows)} questions; post-retrieval: C = first supporting paragraph, x = the other paragraphs")
    print(
        f"{'teacher':8} {'thr':>6} {'p10':>7} {'p50':>7} {'p90':>7} {'keep%':>6} {'AUC':>5} {'ms/call':>7} "
        "| pre-retrieval p50, keep%"
    )
    for n in T.NAMES:
        m = T.get(n)
        pos, neg, secs = (np.asarray(v) for v in post[n])
        allv = np.concatenate([pos, neg])
        p10, p50, p90 = np.quantile(allv, [0.1, 0.5, 0.9])
        keep = 100 * np.mean(allv >= m.threshold)
        pv = np.asarray(pre[n])
        print(
            f"{n:8} {m.threshold:6.2f} {p10:7.3f} {p50:7.3f} {p90:7.3f} {keep:6.1f} {auc(pos, neg):5.2f} "
            f"{1000 * secs.mean():7.2f} | {np.median(pv):7.3f} {100 * np.mean(pv >= m.threshold):5.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
