"""Shared geometry for the embedding teachers (core-safe: numpy only).

All maths runs in float64 on unit-normalised rows. A zero row (e.g. the embedding of an empty text)
stays zero: its cosine similarity with anything is defined as 0, and a zero row of the retained context
``C`` counts as absent (the learned controller cannot tell it from padding, see ``models/value_model.py``).

These definitions are also computed inside the controller's ONNX graph
(``models/value_model.py::scalar_features``); ``tests/test_feature_parity.py`` holds the two to 1e-5.
"""

from __future__ import annotations

import numpy as np

from branchgate.errors import BranchgateError, MismatchError
from branchgate.models.teachers.base import Items, State

EPS = 1e-12
# Ridge ρ of the projections onto span(C) (GRN, DPP, see ``ridge_residual``): small enough that the result
# is the exact orthogonal projection wherever the Gram matrix of C is well conditioned, large enough that the
# float64 inverse stays accurate when it is singular (duplicated retained texts). The in-graph features
# (models/value_model.py) use this same constant.
RIDGE = 1e-6


def unit(emb: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as float64; zero (or non-finite) rows become zero rows."""
    emb = np.asarray(emb, dtype=np.float64)
    emb = np.where(np.isfinite(emb), emb, 0.0)
    norms = np.linalg.norm(emb, axis=-1, keepdims=True)
    return np.divide(emb, norms, out=np.zeros_like(emb), where=norms > EPS)


def dim_of(x: Items) -> int:
    return int(x.emb.shape[-1]) if np.ndim(x.emb) == 2 else 0


def rows(items: Items | None, dim: int, what: str) -> np.ndarray:
    """Unit rows of ``items`` as an [n, dim] array (empty items of any width give [0, dim])."""
    if items is None or len(items) == 0:
        return np.zeros((0, dim))
    if dim_of(items) != dim:
        raise MismatchError(f"{what} embeddings have dimension {dim_of(items)}, candidates have {dim}")
    return unit(items.emb)


def query_vector(state: State, dim: int) -> np.ndarray:
    """``q``: the unit mean of the query rows (the root query itself for one item; zeros if none)."""
    q = rows(state.query, dim, "query")
    if len(q) == 0:
        return np.zeros(dim)
    return unit(q.mean(axis=0))


def relevance(xu: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``sim(e(x), q)`` for unit rows ``xu``."""
    return xu @ q


def weight(xu: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``w(x) = max(sim(e(x), q), 0)``, the non-negative relevance weight."""
    return np.maximum(relevance(xu, q), 0.0)


def max_sim(xu: np.ndarray, cu: np.ndarray) -> np.ndarray:
    """``max_{c∈C} sim(x, c)`` per row of ``xu`` over the non-zero rows of ``cu``; 0 when there are none."""
    cu = cu[np.any(cu != 0, axis=1)]
    if len(cu) == 0:
        return np.zeros(len(xu))
    return (xu @ cu.T).max(axis=1)


def ridge_residual(c: np.ndarray, x: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """``‖x‖² − kᵀ (G + ρI)⁻¹ k`` per row of ``x``, with ``G = C Cᵀ``, ``k = C x`` (the rows of ``c`` are C).

    The squared residual of ``x`` after projecting it onto span(C), ridge-regularised: with the SVD
    ``C = U Σ Vᵀ`` it is ``‖x‖² − Σ_i σ_i² / (σ_i² + ρ) (v_iᵀ x)²``, so a direction of C with ``σ_i² ≫ ρ``
    is projected out exactly (relative error ``ρ/σ_i²``), one with ``σ_i² ≪ ρ`` (the tiny difference of two
    nearly duplicated rows) is ignored, and only directions with ``σ_i² ≈ ρ`` count in part. Exact
    duplicates and zero rows of C add nothing (a zero row has ``k_i = 0`` and its own diagonal entry ρ).
    Equal to the Schur complement ``det(L_{C∪{x}}) / det(L_C)`` of the Gram kernel ``L`` with ρ added to
    the diagonal of ``L_C``, so GRN (unit rows) and DPP (quality-weighted rows) are both this function.
    Clipped to ``[0, ‖x‖²]``; empty C: ``‖x‖²``. float64.
    """
    x = np.asarray(x, dtype=np.float64)
    sq = np.einsum("ij,ij->i", x, x)
    if len(c) == 0:
        return sq
    c = np.asarray(c, dtype=np.float64)
    k = c @ x.T  # [n, m]
    a = np.linalg.solve(c @ c.T + ridge * np.eye(len(c)), k)  # G + ρI is SPD with eigenvalues ≥ ρ
    return np.clip(sq - np.einsum("ij,ij->j", k, a), 0.0, sq)


def prepare(x: Items, state: State) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unit candidates [m, d], unit context [n, d], unit query [d])."""
    dim = dim_of(x)
    return unit(x.emb), rows(state.context, dim, "context"), query_vector(state, dim)


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    if not np.isfinite(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        raise BranchgateError(f"teacher parameter {name}={value!r} must be a finite number in {span}")
