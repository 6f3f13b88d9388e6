"""Novelty teachers: geometric residual novelty (GRN) and centroid drift (CD)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from branchgate.models.teachers.base import Items, State
from branchgate.models.teachers.common import EPS, check_range, prepare, unit


def residual_novelty(xu: np.ndarray, cu: np.ndarray, rtol: float = 1e-6) -> np.ndarray:
    """``‖x − P_C x‖²`` per unit row of ``xu``, ``P_C`` the orthogonal projection onto span(C).

    The basis of span(C) comes from a thin SVD of the unit context rows; directions whose singular
    value is below ``rtol·s_max`` are treated as numerical noise (duplicates, zero rows and nearly
    collinear rows add no direction), so the result is stable on near-singular ``C``. Clipped to [0, 1].
    """
    sq = np.einsum("ij,ij->i", xu, xu)
    if len(cu) == 0 or not np.any(np.abs(cu) > 0):
        return np.clip(sq, 0.0, 1.0)
    _, s, vt = np.linalg.svd(cu, full_matrices=False)
    basis = vt[s > max(rtol * s[0], EPS)]
    proj = xu @ basis.T
    return np.clip(sq - np.einsum("ij,ij->i", proj, proj), 0.0, 1.0)


@dataclass
class GRN:
    """Geometric residual novelty ``‖e(x) − P_C(e(x))‖²`` on unit embeddings, in [0, 1].

    1 = a direction absent from ``C``; 0 = inside span(C) (e.g. a duplicate). Higher = more worth
    keeping. Empty ``C``: 1 (the whole vector is new). A zero vector (empty text) scores 0.
    Paper operating point τ = 0.85. ``rtol``: rank tolerance of span(C), see ``residual_novelty``.
    """

    threshold: float = 0.85
    rtol: float = 1e-6
    name: ClassVar[str] = "grn"
    higher_is_better: ClassVar[bool] = True

    def __post_init__(self):
        check_range("threshold", self.threshold)
        check_range("rtol", self.rtol, 0.0, 1.0)

    def score(self, x: Items, state: State) -> np.ndarray:
        xu, cu, _ = prepare(x, state)
        return residual_novelty(xu, cu, self.rtol)


@dataclass
class CentroidDrift:
    """Centroid drift ``1 − sim(μ_C, μ_{C∪{x}})``, μ the mean of unit embeddings; range [0, 2].

    Higher = ``x`` moves the centre of the retained context more = more worth keeping.
    Empty ``C`` (or a zero centroid, e.g. only empty texts retained): 1, "maximal" novelty as for
    GRN. A zero vector ``x`` only shrinks the mean, so it scores 0. Paper operating point δ = 0.03.
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
