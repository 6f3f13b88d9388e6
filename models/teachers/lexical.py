"""Lexical MMR: MMR with a surface-form similarity (TF-IDF cosine + word-bigram Jaccard), numpy only."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from branchgate.models.teachers.base import Items, State
from branchgate.models.teachers.common import EPS, check_range

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall((text or "").lower())


def shingles(tokens: list[str]) -> set[tuple[str, ...]]:
    """Word bigrams; a one-word text is its own shingle (so identical one-word texts match), none → ∅."""
    if len(tokens) == 1:
        return {(tokens[0],)}
    return set(zip(tokens, tokens[1:]))


def _index(bags: list) -> dict:
    vocab: dict = {}
    for bag in bags:
        for t in bag:
            vocab.setdefault(t, len(vocab))
    return vocab


def tfidf(docs: list[list[str]], fit: list[list[str]] | None = None) -> np.ndarray:
    """L2-normalised TF-IDF rows of ``docs``: raw counts × smooth idf ``ln((1+N)/(1+df)) + 1``.

    The vocabulary and idf are fitted on ``fit`` (default ``docs``); unseen words are ignored.
    """
    fit = docs if fit is None else fit
    vocab = _index(fit)
    width = max(len(vocab), 1)
    df = np.zeros(width)
    for doc in fit:
        for t in set(doc):
            df[vocab[t]] += 1.0
    idf = np.log((1.0 + len(fit)) / (1.0 + df)) + 1.0
    tf = np.zeros((len(docs), width))
    for i, doc in enumerate(docs):
        for t in doc:
            j = vocab.get(t)
            if j is not None:
                tf[i, j] += 1.0
    mat = tf * idf
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    return np.divide(mat, norms, out=np.zeros_like(mat), where=norms > EPS)


def jaccard(a: list[set], b: list[set]) -> np.ndarray:
    """Pairwise Jaccard ``|A∩B| / |A∪B|`` between two lists of sets ([len(a), len(b)]; 0 when both empty)."""
    vocab = _index(a + b)
    width = max(len(vocab), 1)

    def binary(sets):
        m = np.zeros((len(sets), width))
        for i, s in enumerate(sets):
            m[i, [vocab[t] for t in s]] = 1.0
        return m

    ma, mb = binary(a), binary(b)
    inter = ma @ mb.T
    union = ma.sum(1)[:, None] + mb.sum(1)[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def lex_sim(a: list[str], b: list[str], w_tfidf: float = 0.5, fit_on: list[str] | None = None) -> np.ndarray:
    """``LexSim = w_tfidf·cos_tfidf + (1 − w_tfidf)·Jaccard(bigrams)`` for every pair ([len(a), len(b)]), in [0, 1].

    The TF-IDF model is fitted on ``fit_on`` (default: ``a + b``), the texts at hand.
    """
    toks_a, toks_b = [words(t) for t in a], [words(t) for t in b]
    fit = None if fit_on is None else [words(t) for t in fit_on]
    vec = tfidf(toks_a + toks_b, fit)
    cos = vec[: len(a)] @ vec[len(a):].T
    jac = jaccard([shingles(t) for t in toks_a], [shingles(t) for t in toks_b])
    return np.clip(w_tfidf * cos + (1.0 - w_tfidf) * jac, 0.0, 1.0)


@dataclass
class Lexical:
    """Lexical MMR ``λ·LexSim(x, Q) − (1−λ)·max_{y∈C} LexSim(x, y)``; range [−1, 1], higher = keep.

    Needs only texts (embeddings are ignored). TF-IDF is fitted on the texts at hand (x ∪ C ∪ Q) at
    every call. Several query items are joined into one text. Empty ``C``: redundancy 0, score
    ``λ·LexSim(x, Q)``; an empty text has similarity 0 to everything. Paper: λ = 0.6, threshold 0.2.
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
