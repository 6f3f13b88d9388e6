"""How good must the gate's ranking below the root be? Replay threshold policies on unpruned runs (issue 22).

In an unpruned run every branch was expanded, so any pre-retrieval policy can be replayed on it offline: walk
the tree from the root frame, keep what the policy keeps, follow the kept branches' child frames
(``frame_open.parent_candidate``), and add up what the kept branches cost and found. Costs are the run's own
LLM calls: the plan, each kept branch's process call and, when it has follow-ups, its follow-ups call, and
the synthesis call's input as its fixed part plus the tokens of the kept evidence. KPR is the share of the
query's key points the kept evidence covers. Keeping everything reproduces the run exactly (printed).

The gate's scores (``--checkpoint`` on ``--dataset``, the decision dataset of the same runs, e.g. a bench's
OUT/eval_data/dataset) are then mixed with the truth below the root, logit(p) + β·(2y − 1), y = the candidate's
own key-point label (``own``) or "its subtree finds a key point" (``subtree``), for each β of ``--mix``: how
far the frontier moves as the depth ≥ 1 AUROC rises. Two rules: the Gate's (keep p ≥ τ, else the top-1) and
``fallback=root`` (the top-1 at the root only). For each: the best KPR share within ``--budget`` of the
unpruned tokens and the least token share reaching ``--target`` of unpruned KPR, over the τ grid.

    python3 -m research.replay_frontier --runs OUT/closed_loop/seed0/none/traces --dataset OUT/eval_data/dataset
        --checkpoint OUT/keypoints/train/run/controller.safetensors [--mix 0,0.5,1,2] [--plot FILE.png]

``--two-tau`` instead replays the gate's own scores with one τ at the root frame and another below it (the
``root_tau`` gate option), on the runs of ``--split`` only: the way to choose ``policies.root_tau`` on the
training queries' held-out validation runs (OUT/simulate/seed0/traces with OUT/keypoints/dataset/dataset,
``--split validation``), never on the eval queries. To ship the pair it chooses (R at the root, T below), train
with ``--calibration.method fixed --calibration.tau T --calibration.root_tau R``: the controller stores both and
the Gate applies R at depth 0 (``Gate.thresholds``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .common import Tree, unpruned

TAUS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 0.9)


def gate_rule(score: dict, run_id: str, root_tau: float, tau: float, root_only: bool = False):
    """The Gate's keep rule (``decide``) for one run's frames: ``root_tau`` at the root, ``tau`` below it, the
    top-1 fallback everywhere, or at the root only (``root_only``, the ``fallback=root`` option)."""
    from branchgate.decide import decide, threshold_at

    def keep(frame, ids):
        s = [score[(run_id, c)] for c in ids]
        kept = decide(s, threshold_at(frame.depth, tau, root_tau), fallback=frame.depth == 0 or not root_only).kept
        return [ids[i] for i in kept]

    return keep


def subtree_positive(tree: Tree, labels: dict) -> dict:
    """candidate id → whether it or any branch below it has a positive own label."""
    out: dict[str, bool] = {}

    def visit(c):
        if c not in out:
            below = tree.frames[tree.child[c]].candidates if c in tree.child else []
            out[c] = labels.get(c, 0) == 1 or any([visit(k.candidate_id) for k in below])
        return out[c]

    for f in tree.frames.values():
        for c in f.candidates:
            visit(c.candidate_id)
    return out


def frontier(trees, score, root_only: bool) -> list[tuple[float, float]]:
    """(token share, KPR share) of the unpruned runs' means, per τ."""
    base_t, base_k = np.mean([t.tokens for t in trees]), np.mean([t.kpr for t in trees])
    pts = []
    for tau in TAUS:
        r = np.array([t.replay(gate_rule(score, t.run_id, tau, tau, root_only)) for t in trees]).mean(0)
        pts.append((r[1] / base_t, r[2] / base_k))
    return pts


def two_tau(trees, scores, budget: float, target: float) -> None:
    """Per root τ, the frontier over the τ below the root (Gate rule, top-1 fallback); the best point within
    ``budget`` of the unpruned tokens, against the best with one τ everywhere."""
    base_t, base_k = np.mean([t.tokens for t in trees]), np.mean([t.kpr for t in trees])
    p_keep = {k: v[0] for k, v in scores.items()}
    points = []
    for root_tau in TAUS:
        for tau in TAUS:
            r = np.array([t.replay(gate_rule(p_keep, t.run_id, root_tau, tau)) for t in trees]).mean(0)
            points.append((root_tau, tau, r[1] / base_t, r[2] / base_k))
        row = sorted([p for p in points if p[0] == root_tau], key=lambda p: p[2])
        print(f"root τ {root_tau:<6g}" + " ".join(f"{100 * s:.0f}%/{100 * k:.1f}%" for _, _, s, k in row), flush=True)
    for name, pts in (("one τ", [p for p in points if p[0] == p[1]]), ("root τ + τ", points)):
        best = max([p for p in pts if p[2] <= budget], key=lambda p: p[3], default=None)
        need = min([p[2] for p in pts if p[3] >= target], default=float("nan"))
        print(
            f"{name}: best within {budget:.0%} of tokens: "
            + (f"{best[3]:.1%} (root τ {best[0]:g}, τ {best[1]:g}, {best[2]:.1%} tokens)" if best else "none")
            + f"; {target:.0%} of KPR at {need:.1%} of tokens"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True, help="traces of unpruned runs (a file or folder)")
    ap.add_argument("--dataset", required=True, help="the decision dataset built from those traces")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--mix", default="0,0.5,1,2", help="β values: logit(p) + β·(2y − 1) below the root")
    ap.add_argument("--budget", type=float, default=0.35)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--plot", default=None, help="write the frontiers (subtree truth) to this PNG")
    ap.add_argument("--two-tau", action="store_true", help="replay a root τ and a deeper τ (see above)")
    ap.add_argument(
        "--split",
        default=None,
        choices=("train", "validation", "test"),
        help="only the runs of this split (data.dataset_schema.split_of)",
    )
    args = ap.parse_args()

    from branchgate.training.metrics import safe_auroc

    _, trees, scores = unpruned(args.runs, args.dataset, args.checkpoint, args.split)
    keep_all = np.array([t.replay(lambda f, ids: ids) for t in trees]).mean(0)
    print(
        f"{len(trees)} runs; keeping everything replays {keep_all[1]:.0f} tokens, KPR {keep_all[2]:.4f} "
        f"(the runs: {np.mean([t.tokens for t in trees]):.0f}, {np.mean([t.kpr for t in trees]):.4f})"
    )
    if args.two_tau:
        two_tau(trees, scores, args.budget, args.target)
        return 0
    curves = {}
    for truth in ("own", "subtree"):
        for beta in [float(b) for b in args.mix.split(",")]:
            score, ys, ps = {}, [], []
            for t in trees:
                own = {c: scores[(t.run_id, c)][1] for c in t.ev}
                y = own if truth == "own" else {c: int(v) for c, v in subtree_positive(t, own).items()}
                for c in t.ev:
                    p, label, depth = scores[(t.run_id, c)]
                    z = np.log(max(p, 1e-6) / max(1 - p, 1e-6)) + beta * (2 * y[c] - 1) * (depth > 0)
                    score[(t.run_id, c)] = 1 / (1 + np.exp(-z))
                    if depth > 0 and label >= 0:
                        ys.append(label)
                        ps.append(score[(t.run_id, c)])
            auroc = safe_auroc(np.array(ys), np.array(ps))
            parts = []
            for root_only in (False, True):
                pts = frontier(trees, score, root_only)
                best = max([k for s, k in pts if s <= args.budget], default=float("nan"))
                need = min([s for s, k in pts if k >= args.target], default=float("nan"))
                parts.append(
                    f"{'fallback=root' if root_only else 'top-1 fallback'}: KPR ≤{args.budget:.0%} tokens "
                    f"{best:.1%}, {args.target:.0%} KPR at {need:.1%} tokens"
                )
                if truth == "subtree" and not root_only:
                    curves[beta] = (auroc, pts)
            print(f"{truth:7s} β={beta:<4g} depth≥1 AUROC {auroc:.3f} | " + " | ".join(parts), flush=True)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for beta, (auroc, pts) in curves.items():
            ax.plot(
                [100 * s for s, _ in pts],
                [100 * k for _, k in pts],
                marker="o",
                ms=3,
                label=f"β={beta:g} (depth ≥ 1 AUROC {auroc:.3f})" + (" — the gate" if beta == 0 else ""),
            )
        ax.axvline(100 * args.budget, color="grey", ls="--", lw=1)
        ax.axhline(100 * args.target, color="grey", ls="--", lw=1)
        ax.set_xlabel("tokens, % of unpruned")
        ax.set_ylabel("key-point recall, % of unpruned")
        ax.set_title("replayed on unpruned eval runs: gate scores mixed with the subtree truth below the root")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
