"""Lexical MMR: MMR with a surface-form similarity (TF-IDF cosine + word-bigram Jaccard), numpy only."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from branchgate.models.teachers.base import Items, State
from branchgate.models.teachers.common import EPS, check_range

_WORD = re.compile(r"\w+")
MAX_CHARS = (
    10_000  # characters of a text the teacher reads: a query or goal is far shorter; keeps a huge text's cost bounded
)


def words(text: str) -> list[str]:
    """The lower-cased words of ``text``'s first ``MAX_CHARS`` characters."""
    return _WORD.findall((text or "")[:MAX_CHARS].lower())


def shingles(tokens: list[str]) -> set[tuple[str, ...]]:
    """Word bigrams; a one-word text is its own shingle (so identical one-word texts match), none → ∅."""
    if len(tokens) == 1:
        return {(tokens[0],)}
    return set(zip(tokens, tokens[1:]))


BLOCK = 1 << 22  # term matches joined at once in ``pair_sums``: bounds its memory (about 100 MB) whatever the texts


def _terms(bags: list) -> dict:
    vocab: dict = {}
    for bag in bags:
        for t in bag:
            vocab.setdefault(t, len(vocab))
    return vocab


def _sparse(rows: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, term id, value) arrays of rows given as ``{term id: value}``."""
    r = np.fromiter((i for i, row in enumerate(rows) for _ in row), np.int64)
    t = np.fromiter((k for row in rows for k in row), np.int64)
    v = np.fromiter((x for row in rows for x in row.values()), np.float64)
    return r, t, v


def pair_sums(a: list[dict], b: list[dict]) -> np.ndarray:
    """``[Σ_t a_i[t]·b_j[t]]`` ([len(a), len(b)]) for sparse rows ``{term id: value}``: a join on the terms both rows
    hold, so time and memory follow the matching terms, never ``rows × vocabulary``."""
    out = np.zeros(len(a) * len(b))
    ra, ta, va = _sparse(a)
    rb, tb, vb = _sparse(b)
    order = np.argsort(tb, kind="stable")
    rb, tb, vb = rb[order], tb[order], vb[order]
    lo, hi = np.searchsorted(tb, ta, "left"), np.searchsorted(tb, ta, "right")
    ends = np.cumsum(hi - lo)
    start = 0
    while start < len(ta):  # a-terms in blocks of about BLOCK matches
        stop = max(start + 1, int(np.searchsorted(ends, (ends[start - 1] if start else 0) + BLOCK, "right")))
        n = hi[start:stop] - lo[start:stop]
        ia = np.repeat(np.arange(start, stop), n)
        ib = np.repeat(lo[start:stop] - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
        out += np.bincount(ra[ia] * len(b) + rb[ib], weights=va[ia] * vb[ib], minlength=len(out))
        start = stop
    return out.reshape(len(a), len(b))


def tfidf(docs: list[list[str]], fit: list[list[str]] | None = None) -> list[dict]:
    """L2-normalised TF-IDF rows of ``docs`` as ``{term id: weight}``: raw counts × smooth idf ``ln((1+N)/(1+df)) + 1``.

    The vocabulary and idf are fitted on ``fit`` (default ``docs``); unseen words are ignored.
    """
    fit = docs if fit is None else fit
    vocab = _terms(fit)
    df = np.zeros(max(len(vocab), 1))
    for doc in fit:
        for t in set(doc):
            df[vocab[t]] += 1.0
    idf = np.log((1.0 + len(fit)) / (1.0 + df)) + 1.0
    rows = []
    for doc in docs:
        tf: dict[int, float] = {}
        for t in doc:
            j = vocab.get(t)
            if j is not None:
                tf[j] = tf.get(j, 0.0) + 1.0
        w = {j: c * idf[j] for j, c in tf.items()}
        norm = float(np.sqrt(sum(x * x for x in w.values())))
        rows.append({j: x / norm for j, x in w.items()} if norm > EPS else {})
    return rows


def jaccard(a: list[set], b: list[set]) -> np.ndarray:
    """Pairwise Jaccard ``|A∩B| / |A∪B|`` between two lists of sets ([len(a), len(b)]; 0 when both empty)."""
    vocab = _terms(a + b)
    inter = pair_sums(
        [dict.fromkeys((vocab[t] for t in s), 1.0) for s in a], [dict.fromkeys((vocab[t] for t in s), 1.0) for s in b]
    )
    union = np.array([len(s) for s in a], float)[:, None] + np.array([len(s) for s in b], float)[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def lex_sim(a: list[str], b: list[str], w_tfidf: float = 0.5, fit_on: list[str] | None = None) -> np.ndarray:
    """``LexSim = w_tfidf·cos_tfidf + (1 − w_tfidf)·Jaccard(bigrams)`` for every pair ([len(a), len(b)]), in [0, 1].

    The TF-IDF model is fitted on ``fit_on`` (default: ``a + b``), the texts at hand.
    """
    toks_a, toks_b = [words(t) for t in a], [words(t) for t in b]
    fit = None if fit_on is None else [words(t) for t in fit_on]
    vec = tfidf(toks_a + toks_b, fit)
    cos = pair_sums(vec[: len(a)], vec[len(a) :])
    jac = jaccard([shingles(t) for t in toks_a], [shingles(t) for t in toks_b])
    return np.clip(w_tfidf * cos + (1.0 - w_tfidf) * jac, 0.0, 1.0)


@dataclass
class Lexical:
    """Lexical MMR ``λ·LexSim(x, Q) − (1−λ)·max_{y∈C} LexSim(x, y)``; range [−1, 1], higher = keep.

    Needs only texts (embeddings are ignored), each read up to ``MAX_CHARS`` characters. TF-IDF is fitted on
    the texts at hand (x ∪ C ∪ Q) at every call. Several query items are joined into one text. Empty ``C``:
    redundancy 0, score ``λ·LexSim(x, Q)``; an empty text has similarity 0 to everything. Paper: λ = 0.6,
    threshold 0.2.
    ``w_tfidf`` (default 0.5) weighs TF-IDF cosine against bigram Jaccard (``w_jac = 1 − w_tfidf``).
    """

    lam: float = 0.6
    threshold: float = 0.2
    w_tfidf: float = 0.5
    name: ClassVar[str] = "lexical"
    higher_is_better: ClassVar[bool] = True

    def __post_init__(self):
        check_range("lam", self.lam, 0.0, 1.0)
        check_range("threshold", self.threshold)
        check_range("w_tfidf", self.w_tfidf, 0.0, 1.0)

    def score(self, x: Items, state: State) -> np.ndarray:
        if len(x) == 0:
            return np.zeros(0)
        query = " ".join(state.query.texts) if state.query is not None else ""
        ctx = list(state.context.texts) if state.context is not None else []
        fit = list(x.texts) + ctx + [query]
        sim = lex_sim(list(x.texts), [query] + ctx, self.w_tfidf, fit_on=fit)
        redundancy = sim[:, 1:].max(axis=1) if ctx else np.zeros(len(x))
        return self.lam * sim[:, 0] - (1.0 - self.lam) * redundancy
