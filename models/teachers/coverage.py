"""Submodular coverage per token: facility location over the candidate pool ``P``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from branchgate.errors import MismatchError
from branchgate.models.teachers.base import Items, State
from branchgate.models.teachers.common import check_range, dim_of, prepare, rows, unit, weight


def pool_rows(x: Items, state: State, dim: int) -> np.ndarray:
    """Unit rows of ``P``: ``state.extra["pool"]`` (Items or an [n, d] array) if given, else ``x ∪ C``."""
    pool = state.extra.get("pool") if state.extra else None
    if pool is None:
        return np.concatenate([unit(x.emb).reshape(-1, dim), rows(state.context, dim, "context")])
    if isinstance(pool, Items):
        return rows(pool, dim, "pool")
    arr = np.asarray(pool, dtype=np.float64)
    if arr.size == 0:
        return np.zeros((0, dim))
    arr = arr.reshape(-1, arr.shape[-1])
    if arr.shape[1] != dim:
        raise MismatchError(f"pool embeddings have dimension {arr.shape[1]}, candidates have {dim}")
    return unit(arr)


BLOCK = 1 << 22  # similarities held at once (32 MB): larger sets are scored in slices, with the same result


def _slices(n: int, width: int):
    step = max(1, BLOCK // max(1, width))
    return (slice(i, i + step) for i in range(0, n, step))


def covered(cu: np.ndarray, wc: np.ndarray, pu: np.ndarray) -> np.ndarray:
    """``max(0, max_{i∈C} w_i sim(e_i, e_j))`` for every pool point ``j`` (0 for empty ``C``)."""
    if len(cu) == 0:
        return np.zeros(len(pu))
    return np.concatenate(
        [np.maximum((wc[:, None] * (cu @ pu[part].T)).max(axis=0), 0.0) for part in _slices(len(pu), len(cu))]
        or [np.zeros(0)]
    )


def cost(tokens: np.ndarray) -> np.ndarray:
    """Token cost, floored at 1 so a zero-token item cannot divide by zero."""
    return np.maximum(np.asarray(tokens, dtype=np.float64), 1.0)


@dataclass
class SubmodularCoverage:
    """``[F(C∪{x}) − F(C)] / cost(x)`` with ``F(S) = Σ_{j∈P} max(0, max_{i∈S} w_i·sim(e_i, e_j))``.

    Coverage of a pool point is floored at 0 (max over the empty set = 0), which keeps ``F`` monotone
    and submodular. ``P`` = ``state.extra["pool"]`` when given, else ``x ∪ C`` (so inside ``select``
    the pool stays the same set while items move from ``x`` to ``C``). ``cost`` = ``x.tokens`` (≥ 1).
    Empty ``C``: ``F(C) = 0``, the gain is ``F({x}) / cost(x)``. Higher = keep; the paper prunes when
    the gain per token is < 0.05.
    """

    threshold: float = 0.05
    name: ClassVar[str] = "sc"
    higher_is_better: ClassVar[bool] = True

    def __post_init__(self):
        check_range("threshold", self.threshold)

    def gains(self, x: Items, state: State) -> np.ndarray:
        """Unnormalised ``F(C∪{x}) − F(C)`` per candidate."""
        xu, cu, q = prepare(x, state)
        pu = pool_rows(x, state, dim_of(x))
        base = covered(cu, weight(cu, q), pu)
        wx = weight(xu, q)
        return np.concatenate(
            [
                np.maximum(wx[part, None] * (xu[part] @ pu.T) - base[None, :], 0.0).sum(axis=1)
                for part in _slices(len(xu), len(pu))
            ]
            or [np.zeros(0)]
        )

    def score(self, x: Items, state: State) -> np.ndarray:
        return self.gains(x, state) / cost(x.tokens)

    def set_gain(self, items: Items, state: State) -> float:
        """Exact ``[F(C∪E) − F(C)] / cost(E)`` for the set ``E = items`` (0 for an empty set)."""
        if len(items) == 0:
            return 0.0
        eu, cu, q = prepare(items, state)
        pu = pool_rows(items, state, dim_of(items))
        before = covered(cu, weight(cu, q), pu)
        after = np.maximum(before, covered(eu, weight(eu, q), pu))
        return float((after - before).sum() / cost(items.tokens).sum())
