"""What several research probes share: unpruned runs replayed offline (``Tree``) with the gate's scores on them
(``gate_scores``, ``unpruned``); a real decision dataset read once (``load_real``) and models fitted on it out of
fold (``out_of_fold``, ``compare``); text vectors (``lazy_embed``, ``top``), passages new to a run and result
snippets (``new_passages``, ``opening``); the logit and the paired bootstrap (``logit``, ``paired``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SNIPPET_WORDS = 30


def logit(p) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), 1e-6, 1 - 1e-6)
    return np.log(p) - np.log1p(-p)


def paired(d: np.ndarray, boot: int = 1000) -> tuple[float, float, float]:
    """Mean of per-run differences and its 95% interval (``training.stats.mean_ci``, the one bootstrap)."""
    from branchgate.training.stats import mean_ci

    m = mean_ci(d, boot)
    return m["mean"], *m["ci95"]


class Tree:
    """One unpruned run: its frames (by id: depth, candidate ids), child frames, per-branch costs and evidence."""

    def __init__(self, run):
        from branchgate.logs_to_dataset.decision_points import run_decisions

        rd = run_decisions(run.run_id, run.events)
        self.run_id, self.evidence = run.run_id, rd.evidence
        self.frames = {f.frame_id: f for f in rd.frames}
        self.root = next(f.frame_id for f in rd.frames if f.parent_candidate is None)
        self.child = {f.parent_candidate: f.frame_id for f in rd.frames if f.parent_candidate is not None}
        self.ev = {c.candidate_id: list(c.evidence_ids or []) for f in rd.frames for c in f.candidates}
        self.process, self.followups, self.plan, synth_in, synth_out, last = {}, {}, 0, 0, 0, None
        for e in sorted(run.events, key=lambda e: e.seq):
            if e.type == "retrieval":
                last = e.candidate_id
            elif e.type == "llm_call":
                tokens = e.in_tokens + e.out_tokens
                if e.purpose == "plan":
                    self.plan += tokens
                elif e.purpose in ("process", "followups") and last is not None:
                    book = self.process if e.purpose == "process" else self.followups
                    book[last] = book.get(last, 0) + tokens
                elif e.purpose == "synthesis":
                    synth_in, synth_out = e.in_tokens, e.out_tokens
            elif e.type == "run_end":
                self.n_key_points = int(e.totals.get("n_key_points") or 0)
                self.tokens, self.kpr = float(e.totals.get("tokens") or 0), float(e.totals.get("kpr") or 0)
        every = {i for ids in self.ev.values() for i in ids}
        self.synth_fixed = synth_in + synth_out - sum(self.evidence[i].tokens for i in every)

    def replay(self, keep) -> tuple[int, float, float]:
        """``keep(frame, candidate_ids) → kept ids``: (nodes, tokens, KPR) of the replayed run."""
        nodes, found, tokens, todo = 0, set(), self.plan + self.synth_fixed, [self.root]
        while todo:
            frame = self.frames[todo.pop(0)]
            for c in keep(frame, [x.candidate_id for x in frame.candidates]):
                nodes += 1
                found.update(self.ev[c])
                tokens += self.process.get(c, 0)
                if c in self.child:
                    tokens += self.followups.get(c, 0)
                    todo.append(self.child[c])
        tokens += sum(self.evidence[i].tokens for i in found)
        kps = {k for i in found for k in (self.evidence[i].labels or [])}
        return nodes, tokens, len(kps) / self.n_key_points if self.n_key_points else 0.0


def gate_scores(checkpoint: str, dataset: str) -> dict:
    """``{(run_id, candidate_id): (p_keep, label, depth)}`` over every split of the dataset."""
    from branchgate.training.stats import controller_predictions

    return {
        (r, c): (float(x), int(y), int(d))
        for _, part, p in controller_predictions(checkpoint, dataset, ("train", "validation", "test"))
        for r, c, x, y, d in zip(part["run_id"], part["candidate_id"], p, part["label"], part["depth"])
    }


def unpruned(
    runs_path: str, dataset: str, checkpoint: str, split: str | None = None, max_runs: int = 0
) -> tuple[list, list[Tree], dict]:
    """The runs of ``runs_path`` (only those of ``split``, the first ``max_runs`` when > 0), their ``Tree`` and
    the gate's scores on ``dataset``, the decision dataset built from them; every candidate must have a row."""
    from branchgate.data.dataset_schema import split_of
    from branchgate.logs_to_dataset.readers import read_runs

    runs = [r for r in read_runs([runs_path]) if split is None or split_of(r.run_id) == split][: max_runs or None]
    if not runs:
        raise SystemExit(f"no runs in {runs_path}" + (f" of split {split}" if split else ""))
    trees, scores = [Tree(r) for r in runs], gate_scores(checkpoint, dataset)
    missing = sum((t.run_id, c) not in scores for t in trees for c in t.ev)
    if missing:
        raise SystemExit(f"{missing} candidates of --runs have no row in --dataset (built from other runs?)")
    return runs, trees, scores


def top(m: np.ndarray, v: np.ndarray) -> float:
    """The largest cosine of unit vector ``v`` to the rows of ``m`` (0 when there are none)."""
    return float((m @ v).max()) if len(m) else 0.0


def lazy_embed(name: str):
    """texts → unit vectors (rows), each text encoded once, when first asked for."""
    from branchgate.models.encoder import Encoder

    encoder, cache = Encoder.load(name), {}

    def embed(texts: list[str]) -> np.ndarray:
        todo = [x for x in dict.fromkeys(texts) if x not in cache]
        for x, v in zip(todo, encoder.encode(todo, batch_size=128) if todo else []):
            cache[x] = v / max(float(np.linalg.norm(v)), 1e-9)
        return np.array([cache[x] for x in texts]).reshape(len(texts), encoder.dim)

    return embed


def new_passages(run, tree: Tree) -> dict[str, list[str]]:
    """candidate id → its passages not retrieved before it in the run (retrieval order)."""
    seen: set[str] = set()
    new: dict[str, list[str]] = {}
    for e in sorted(run.events, key=lambda e: e.seq):
        if e.type == "retrieval" and e.candidate_id in tree.ev:
            new[e.candidate_id] = [i for i in tree.ev[e.candidate_id] if i not in seen]
            seen.update(tree.ev[e.candidate_id])
    return new


def opening(text: str) -> str:
    """A result's snippet: its first ``SNIPPET_WORDS`` words."""
    return " ".join(text.split()[:SNIPPET_WORDS])


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


def load_real(dataset: str, cache: str | None) -> Real:
    from datasets import concatenate_datasets

    from branchgate.data.decision_batches import load_decision_dataset
    from branchgate.data.embedding_cache import EmbeddingCache
    from branchgate.models import teachers as T
    from branchgate.models.encoder import LazyEncoder, recorded_spec
    from branchgate.texts import candidate_text

    dd, manifest = load_decision_dataset(dataset)
    rows = concatenate_datasets([dd[s] for s in dd]).filter(lambda r: r["label"] >= 0)
    emb = EmbeddingCache(LazyEncoder(recorded_spec(manifest["encoder"])), path=cache)
    cand = emb.get([candidate_text(r["query"], r["goal"]) for r in rows])
    root = emb.get(list(rows["root_query"]))
    retained_max = np.array(
        [float((emb.get(list(r["retained"])) @ cand[i]).max()) if r["retained"] else 0.0 for i, r in enumerate(rows)]
    )
    teachers = {n: np.asarray(rows[f"teacher_{n}"], np.float64) for n in T.NAMES if f"teacher_{n}" in rows.column_names}
    n_ret = np.asarray(rows["n_retained"], np.float64)
    scalars = np.column_stack(
        [*teachers.values(), (cand * root).sum(1), retained_max, np.log1p(n_ret), np.asarray(rows["depth"], np.float64)]
    )
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
    from branchgate.training.metrics import safe_auroc
    from branchgate.training.stats import bootstrap_ci

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
        print(
            f"{name:44s} {np.mean(aurocs):.3f} ± {np.std(aurocs):.3f}{'':16s} {delta(list(by_run)):+.3f} "
            f"[{lo:+.3f}, {hi:+.3f}]"
        )
