"""Other keep rules than the Gate's, replayed on unpruned runs with the gate's own scores (issue 22).

``replay_frontier.py`` asks how good the ranking below the root must be; this asks whether a different way of
keeping, on the same scores, moves the frontier. Each family is a rule with the root frame at its own τ R:

- ``depth:R,T1,T2``     τ by depth: R at the root, T1 at depth 1, T2 deeper (the Gate's rule, one τ more);
- ``relative:R,T,RHO``  below the root keep p ≥ T and p ≥ RHO · the frame's best p;
- ``diverse:R,T,KAPPA`` keep p ≥ T best first, skipping a candidate whose cosine (``--encoder``) to a sibling
                        already kept exceeds KAPPA: learned quality with sibling diversity;
- ``parent:R,T,BETA``   a bound, not a rule: below the root logit(p) + BETA · (+1 if the parent branch itself found
                        a key point, else −1), i.e. the gate told what its parent's retrieval actually found.

Every rule keeps the top-1 of a frame where nothing passes (the Gate's fallback). Without ``--rules`` each family
is swept over its grid and the best point within ``--budget`` of the unpruned tokens and the cheapest reaching
``--target`` of unpruned KPR are printed: run it with ``--split validation`` on the train queries' runs to choose
(OUT/simulate/seed0/traces, OUT/keypoints/dataset/dataset). With ``--rules`` the given rules are replayed as
they are: the way to measure the chosen ones on the eval queries' runs (OUT/closed_loop/seed0/none/traces,
OUT/eval_data/dataset), never to choose there.

    python3 -m research.replay_rules --runs R --dataset D --checkpoint C [--split validation] [--rules SPEC ...]
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

from .common import Tree, logit, paired, unpruned

ROOT_GRID = (0.1, 0.2, 0.3, 0.5, 0.7)
TAU_GRID = (0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3)
GRIDS = {  # each family's third parameter
    "depth": TAU_GRID,
    "relative": (0.0, 0.3, 0.5, 0.7, 0.9),
    "diverse": (1.0, 0.95, 0.9, 0.85, 0.8),
    "parent": (0.0, 0.5, 1.0, 2.0),
}


def parse_rule(spec: str) -> tuple[str, tuple[float, float, float]]:
    """``FAMILY:R,T,X`` → (family, (R, T, X)); errors name the spec."""
    family, _, args = spec.partition(":")
    if family not in GRIDS:
        raise SystemExit(f"--rules {spec!r}: unknown family {family!r} (known: {', '.join(GRIDS)})")
    try:
        values = tuple(float(v) for v in args.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise SystemExit(f"--rules {spec!r}: expected {family}:R,T,X (three numbers)")
    return family, values


class Rules:
    """The rules' keep functions over one set of runs and the gate's scores on them."""

    def __init__(self, trees: list[Tree], scores: dict, embed=None):
        self.trees, self.embed = trees, embed
        self.p = {k: v[0] for k, v in scores.items()}
        self.own = {k: v[1] for k, v in scores.items()}
        self.parent = {
            (t.run_id, x.candidate_id): pc
            for t in trees
            for pc, fid in t.child.items()
            for x in t.frames[fid].candidates
        }
        self.query = {
            (t.run_id, c.candidate_id): c.query for t in trees for f in t.frames.values() for c in f.candidates
        }
        self.base = (np.mean([t.tokens for t in trees]), np.mean([t.kpr for t in trees]))
        self._replayed: dict = {}  # (family, params) → per_run's rows: a rule is replayed once

    def score(self, run_id: str, c: str, family: str, x: float) -> float:
        p = self.p[(run_id, c)]
        if family != "parent" or (run_id, c) not in self.parent:
            return p
        z = logit(p) + x * (1 if self.own[(run_id, self.parent[(run_id, c)])] == 1 else -1)
        return float(1 / (1 + np.exp(-z)))

    def keep_fn(self, run_id: str, family: str, params: tuple[float, float, float]):
        from branchgate.decide import decide

        root_tau, tau, x = params

        def keep(frame, ids):
            s = np.array([self.score(run_id, c, family, x) for c in ids])
            th = root_tau if frame.depth == 0 else (x if family == "depth" and frame.depth >= 2 else tau)
            kept = decide(s, th).kept
            if frame.depth > 0 and family == "relative":
                kept = [i for i in kept if s[i] >= x * s.max()]  # the frame's best always stays
            if frame.depth > 0 and family == "diverse" and x < 1:
                chosen: list[int] = []
                for i in sorted(kept, key=lambda i: -s[i]):
                    if not chosen or max(self._cos(run_id, ids[i], ids[j]) for j in chosen) <= x:
                        chosen.append(i)
                kept = chosen
            return [ids[i] for i in sorted(kept)]

        return keep

    def _cos(self, run_id: str, a: str, b: str) -> float:
        return float(self.embed(self.query[(run_id, a)]) @ self.embed(self.query[(run_id, b)]))

    def per_run(self, family: str, params) -> np.ndarray:
        """(nodes, tokens, KPR) of the rule, one row per run."""
        key = (family, tuple(params))
        if key not in self._replayed:
            self._replayed[key] = np.array(
                [t.replay(self.keep_fn(t.run_id, family, params)) for t in self.trees], dtype=np.float64
            )
        return self._replayed[key]

    def replay(self, family: str, params) -> tuple[float, float, float]:
        """(mean nodes, token share, KPR share) of the rule over the runs, shares of the unpruned runs' means."""
        r = self.per_run(family, params).mean(0)
        return float(r[0]), float(r[1] / self.base[0]), float(r[2] / self.base[1])

    def gate_curve(self, root_tau: float) -> list[tuple[float, dict[str, float]]]:
        """The Gate's rule (``root_tau`` at the root, each τ of ``TAU_GRID`` below it) as (mean tokens, {run id:
        KPR}) points sorted by tokens: the curve ``bench.closed_loop.interpolate`` reads."""
        ids = [t.run_id for t in self.trees]
        curve = []
        for tau in TAU_GRID:
            r = self.per_run("depth", (root_tau, tau, tau))
            curve.append((float(r[:, 1].mean()), dict(zip(ids, r[:, 2]))))
        return sorted(curve, key=lambda c: c[0])

    def versus_gate(self, family: str, params, boot: int = 1000) -> tuple[float, float, float, bool]:
        """The rule's KPR minus the Gate's rule (the same root τ, ``gate_curve``) at the rule's mean tokens,
        interpolated along that sweep and paired by run: ``common.paired``'s (mean, 2.5%, 97.5%) and whether the
        rule's tokens lie outside the sweep."""
        from branchgate.bench.closed_loop import interpolate

        mine = self.per_run(family, params)
        gate, outside = interpolate(self.gate_curve(params[0]), float(mine[:, 1].mean()))
        return (*paired(mine[:, 2] - np.array([gate[t.run_id] for t in self.trees]), boot), outside)


def frontier_change(
    trees: list[Tree], scores: dict, keys: list, p_new: np.ndarray, root_tau: float = 0.5
) -> list[tuple]:
    """Replay the Gate's rule (``root_tau`` at the root, each τ of ``TAU_GRID`` below it) with the gate's scores
    and with ``p_new`` in place of them below the root (rows ``keys``): at each gate point, the new scores' KPR
    (interpolated to the same tokens, paired by run) minus the gate's: ``(token share, mean, 2.5%, 97.5%, whether
    the tokens lie outside the new scores' sweep)`` per gate point (``common.paired``)."""
    from branchgate.bench.closed_loop import interpolate

    new = dict(scores)
    for key, q in zip(keys, p_new):
        new[key] = (float(q), *scores[key][1:])
    gate_curve, new_curve = (Rules(trees, table).gate_curve(root_tau) for table in (scores, new))
    base = np.mean([t.tokens for t in trees])
    out = []
    for tokens, gate in gate_curve:
        mine, outside = interpolate(new_curve, tokens)
        out.append((tokens / base, *paired(np.array([mine[t.run_id] - gate[t.run_id] for t in trees])), outside))
    return out


def summary(points, budget: float, target: float) -> str:
    """Best KPR share within ``budget`` and the cheapest point reaching ``target`` of ``(params, n, t, k)``."""
    best = max([p for p in points if p[2] <= budget], key=lambda p: p[3], default=None)
    need = min([p for p in points if p[3] >= target], key=lambda p: p[2], default=None)
    fmt = lambda p: f"{p[3]:.1%} KPR at {p[2]:.1%} tokens ({','.join(f'{v:g}' for v in p[0])})"  # noqa: E731
    return f"best within {budget:.0%} of tokens: {fmt(best) if best else 'none'}; {target:.0%} of KPR: " + (
        fmt(need) if need else "never"
    )


def encoder_embed(name: str, texts: list[str]):
    """text → unit vector, every text encoded once."""
    from branchgate.models.encoder import Encoder

    vectors = Encoder.load(name).encode(texts, batch_size=128)
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-9)
    table = dict(zip(texts, vectors))
    return table.__getitem__


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True, help="traces of unpruned runs (a file or folder)")
    ap.add_argument("--dataset", required=True, help="the decision dataset built from those traces")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument(
        "--split",
        default=None,
        choices=("train", "validation", "test"),
        help="only the runs of this split (data.dataset_schema.split_of)",
    )
    ap.add_argument(
        "--rules", nargs="*", default=None, help="fixed rules FAMILY:R,T,X (see above); default: every grid"
    )
    ap.add_argument("--encoder", default="auto", help="for diverse: the encoder of the cosines")
    ap.add_argument("--budget", type=float, default=0.35)
    ap.add_argument("--target", type=float, default=0.95)
    args = ap.parse_args()
    fixed = [parse_rule(s) for s in args.rules] if args.rules is not None else None

    _, trees, scores = unpruned(args.runs, args.dataset, args.checkpoint, args.split)
    families = [f for f, _ in fixed] if fixed is not None else list(GRIDS)
    embed = None
    if "diverse" in families:
        texts = {c.query for t in trees for f in t.frames.values() for c in f.candidates}
        embed = encoder_embed(args.encoder, sorted(texts))
    rules = Rules(trees, scores, embed)
    print(f"{len(trees)} runs; unpruned: {rules.base[0]:.0f} tokens, KPR {rules.base[1]:.4f}", flush=True)
    if fixed is not None:
        for family, params in fixed:
            n, t, k = rules.replay(family, params)
            m, lo, hi, outside = rules.versus_gate(family, params)
            print(
                f"{family}:{','.join(f'{v:g}' for v in params)}: {n:.1f} nodes, {t:.1%} of tokens, {k:.1%} of KPR; "
                f"KPR minus the Gate's rule at these tokens {m:+.4f} [{lo:+.4f}, {hi:+.4f}]"
                + (" (outside its sweep: its nearest end)" if outside else ""),
                flush=True,
            )
        return 0
    one = [((r, t, t), *rules.replay("depth", (r, t, t))) for r, t in itertools.product(ROOT_GRID, TAU_GRID)]
    print(f"the Gate's rule (root τ, one τ below): {summary(one, args.budget, args.target)}", flush=True)
    for family, grid in GRIDS.items():
        pts = [(params, *rules.replay(family, params)) for params in itertools.product(ROOT_GRID, TAU_GRID, grid)]
        print(f"{family}: {summary(pts, args.budget, args.target)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
