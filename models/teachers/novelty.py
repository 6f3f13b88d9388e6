"""Novelty teachers: geometric residual novelty (GRN) and centroid drift (CD)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from branchgate.models.teachers.base import Items, State
from branchgate.models.teachers.common import RIDGE, check_range, prepare, ridge_residual, unit


def residual_novelty(xu: np.ndarray, cu: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """GRN per unit row of ``xu``: ``‖x‖² − kᵀ (G + ρI)⁻¹ k``, ``G = C Cᵀ``, ``k = C x`` (``ridge_residual``).

    This is ``‖x − P_C x‖²``, ``P_C`` the orthogonal projection onto span(C), wherever the Gram matrix of
    the unit context rows is well conditioned (its eigenvalues ≫ ρ = 1e-6; distinct texts: the error is
    below ρ/σ²_min). It differs from the exact projection only for nearly duplicated retained rows:
    a direction of span(C) whose eigenvalue σ² is ≲ ρ (two rows with cos ≳ 1 − 1e-6) counts only with
    weight σ²/(σ²+ρ), so near-singular C is stable and exact duplicates or zero rows add nothing.
    Clipped to [0, 1].
    """
    return np.clip(ridge_residual(cu, xu, ridge), 0.0, 1.0)


@dataclass
class GRN:
    """Geometric residual novelty ``‖e(x) − P_C(e(x))‖²`` on unit embeddings, in [0, 1].

    Canonical definition: ``‖x‖² − kᵀ (G + ρI)⁻¹ k`` with ``G = C Cᵀ``, ``k = C x`` and ``ρ = ridge``
    (``residual_novelty``): the exact projection except for nearly duplicated retained rows, whose tiny
    difference direction is ignored. The controller's ``residual_novelty`` feature is the same number.
    1 = a direction absent from ``C``; 0 = inside span(C) (e.g. a duplicate). Higher = more worth
    keeping. Empty ``C``: 1 (the whole vector is new). A zero vector (empty text) scores 0.
    Paper operating point τ = 0.85.
    """

    threshold: float = 0.85
    ridge: float = RIDGE
    name: ClassVar[str] = "grn"
    higher_is_better: ClassVar[bool] = True

    def __post_init__(self):
        check_range("threshold", self.threshold)
        check_range("ridge", self.ridge, 1e-15, 1.0)

    def score(self, x: Items, state: State) -> np.ndarray:
        xu, cu, _ = prepare(x, state)
        return residual_novelty(xu, cu, self.ridge)


@dataclass
class CentroidDrift:
    """Centroid drift ``1 − sim(μ_C, μ_{C∪{x}})``, μ the mean of unit embeddings; range [0, 2].

    Higher = ``x`` moves the centre of the retained context more = more worth keeping.
    Empty ``C`` (or a zero centroid, e.g. only empty texts retained): 1, "maximal" novelty as for
    GRN. A zero vector ``x`` only shrinks the mean, so it scores 0. Paper operating point δ = 0.03.
    The controller's ``centroid_drift`` feature is the same number.
    """

    threshold: float = 0.03
    name: ClassVar[str] = "cd"
    higher_is_better: ClassVar[bool] = True

    def __post_init__(self):
        check_range("threshold", self.threshold)

    def score(self, x: Items, state: State) -> np.ndarray:
        xu, cu, _ = prepare(x, state)
        if len(cu) == 0:
            return np.ones(len(xu))
        total = cu.sum(axis=0)
        mu = unit(total)
        if not np.any(mu):
            return np.ones(len(xu))
        moved = unit(total[None, :] + xu)  # direction of μ_{C∪{x}} (the 1/(n+1) scale cancels)
        drift = 1.0 - moved @ mu
        drift[~np.any(moved, axis=1)] = 1.0  # x cancels C exactly: no centroid left
        return np.clip(drift, 0.0, 2.0)
