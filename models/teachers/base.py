"""The one value-model protocol: ``V(x | C, Q)``.

Heuristic teachers and the learned controller implement ``ValueModel``, so every pipeline stage and
every evaluation accepts any of them. Scores are vectorised over the candidates ``x``.

Notation: ``q`` root-query embedding, ``C`` the retained context, ``x`` the candidates
(subqueries at pre-retrieval, evidence items later), ``P`` the candidate pool of the current decision.
All embeddings are unit-normalised float32 rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from branchgate.decide import decide

Embedder = Callable[[list[str]], np.ndarray]


@dataclass
class Items:
    """A batch of texts with their embeddings and token costs."""

    texts: list[str]
    emb: np.ndarray  # [n, d] unit-normalised
    tokens: np.ndarray | None = None  # [n] token cost; defaults to whitespace word count

    def __post_init__(self):
        self.emb = (
            np.asarray(self.emb, dtype=np.float32).reshape(len(self.texts), -1)
            if len(self.texts)
            else np.asarray(self.emb, dtype=np.float32).reshape(0, self.emb.shape[-1] if np.ndim(self.emb) == 2 else 0)
        )
        if self.tokens is None:
            self.tokens = np.array([max(1, len(t.split())) for t in self.texts], dtype=np.float64)
        self.tokens = np.asarray(self.tokens, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.texts)

    @classmethod
    def embed(cls, texts: Sequence[str], embedder: Embedder, tokens: Sequence[int] | None = None) -> Items:
        texts = list(texts)
        return cls(texts, embedder(texts), None if tokens is None else np.asarray(tokens))

    @classmethod
    def empty(cls, dim: int) -> Items:
        return cls([], np.zeros((0, dim), dtype=np.float32))

    def subset(self, idx: Sequence[int]) -> Items:
        idx = list(idx)
        return Items([self.texts[i] for i in idx], self.emb[idx], self.tokens[idx])

    def concat(self, other: Items) -> Items:
        if len(self) == 0:  # an empty batch may carry a [0, 0] matrix: take the other's width
            return Items(list(other.texts), other.emb.copy(), other.tokens.copy())
        if len(other) == 0:
            return Items(list(self.texts), self.emb.copy(), self.tokens.copy())
        return Items(
            self.texts + other.texts, np.concatenate([self.emb, other.emb]), np.concatenate([self.tokens, other.tokens])
        )


@dataclass
class State:
    """What is known at a decision point, before retrieval."""

    query: Items  # root query Q (one item)
    context: Items  # retained context C (may be empty)
    frame_query: str = ""
    parent_goal: str = ""
    depth: int = 0
    extra: dict = field(default_factory=dict)


@runtime_checkable
class ValueModel(Protocol):
    """Scores candidates given the state: higher = more worth keeping.

    ``threshold`` is the operating point of the thresholded gate (keep when score ≥ threshold, or
    ≤ for ``higher_is_better=False``).
    """

    name: str
    threshold: float

    def score(self, x: Items, state: State) -> np.ndarray: ...


def gate(model: ValueModel, x: Items, state: State, fallback_top1: bool = True) -> np.ndarray:
    """Thresholded gate (``branchgate.decide``): indices of kept candidates, scored independently against
    ``state.context``. With ``fallback_top1`` a non-empty input never yields an empty selection."""
    if len(x) == 0:
        return np.zeros(0, dtype=np.int64)
    d = decide(
        model.score(x, state),
        model.threshold,
        higher_is_better=getattr(model, "higher_is_better", True),
        fallback=fallback_top1,
    )
    return np.asarray(d.kept, dtype=np.int64)


def select(
    model: ValueModel,
    x: Items,
    state: State,
    max_items: int | None = None,
    max_tokens: float | None = None,
    use_threshold: bool = True,
) -> list[int]:
    """Greedy budgeted selection: repeatedly add the best-scoring candidate to ``C`` and rescore.

    Stops at the item budget, or (``use_threshold``) when the best remaining score fails the
    threshold. A candidate that would exceed the token budget is skipped and the next best is tried
    (standard budgeted greedy). Always keeps at least one item of a non-empty input.
    """
    chosen: list[int] = []
    remaining = list(range(len(x)))
    context = state.context
    spent = 0.0
    while remaining and (max_items is None or len(chosen) < max_items):
        sub = x.subset(remaining)
        scores = model.score(
            sub, State(state.query, context, state.frame_query, state.parent_goal, state.depth, state.extra)
        )
        best = _best(model, scores)
        i = remaining[best]
        if (
            chosen
            and use_threshold
            and not decide(
                scores[best : best + 1],
                model.threshold,
                fallback=False,
                higher_is_better=getattr(model, "higher_is_better", True),
            ).kept
        ):
            break
        if max_tokens is not None and chosen and spent + x.tokens[i] > max_tokens:
            remaining.pop(best)  # does not fit: try the next best
            continue
        chosen.append(i)
        spent += float(x.tokens[i])
        context = context.concat(x.subset([i]))
        remaining.pop(best)
    return chosen


def _best(model: ValueModel, scores: np.ndarray) -> int:
    return int(np.argmax(scores) if getattr(model, "higher_is_better", True) else np.argmin(scores))


def set_gain(model: ValueModel, items: Items, state: State) -> float:
    """Marginal value of adding the SET ``items`` (E) to ``state.context`` (C): ``V(E | C, Q)``.

    Used for realized labels ``g(c) = V(E(c) | C_t, Q)``. A model with its own ``set_gain`` method
    decides (submodular coverage: the exact ``[F(C∪E) − F(C)] / cost(E)``); for every other model it
    is the sum of sequential marginal scores, adding the items of E to C one by one in the given order:
    ``Σ_k V(e_k | C ∪ {e_1..e_{k−1}}, Q)``. An empty E is worth 0.
    """
    own = getattr(model, "set_gain", None)
    if callable(own):
        return float(own(items, state))
    total = 0.0
    context = state.context
    for k in range(len(items)):
        one = items.subset([k])
        total += float(
            model.score(
                one, State(state.query, context, state.frame_query, state.parent_goal, state.depth, state.extra)
            )[0]
        )
        context = context.concat(one)
    return total
