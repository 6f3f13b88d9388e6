"""DPP volume gain with the quality-weighted Gram kernel ``L_ij = w_i w_j ⟨ẽ_i, ẽ_j⟩``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from branchgate.models.teachers.base import Items, State
from branchgate.models.teachers.common import RIDGE, check_range, prepare, ridge_residual, weight


def dpp_gain(xu: np.ndarray, wx: np.ndarray, cu: np.ndarray, wc: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """``L_xx − l_xᵀ (L_C + ρI)⁻¹ l_x`` per candidate: ``det(L_{C∪{x}}) / det(L_C)`` of the ridged kernel.

    With the rows ``f_i = w_i ẽ_i`` the kernel is ``L = F Fᵀ``, so the gain is ``ridge_residual`` of the
    weighted candidate ``w_x ẽ_x`` against the weighted context rows: no determinant is ever formed, and
    duplicates, zero-weight rows (they drop out exactly) and near-singular ``C`` stay finite. The ridge
    only shrinks the subtracted term, so the gain is ≥ the exact Schur complement ≥ 0 and never above
    ``L_xx``. Empty ``C``: ``L_xx = w_x²``.
    """
    return ridge_residual(cu * wc[:, None], xu * wx[:, None], ridge)


@dataclass
class DPP:
    """DPP marginal gain (volume added by ``x``), in [0, w_x²] ⊂ [0, 1]; higher = keep.

    Canonical definition: ``L_xx − l_xᵀ (L_C + ρI)⁻¹ l_x`` with the quality-weighted kernel
    ``L_ij = w_i w_j ⟨ẽ_i, ẽ_j⟩``, ``w = max(sim(e, q), 0)`` for the candidate and the retained rows alike
    (``dpp_gain``), ``ρ = ridge``. A retained text with non-positive relevance to ``q`` has weight 0 and
    drops out of the kernel. Irrelevant or redundant candidates add little volume. Empty ``C``: the gain
    is ``L_xx = w_x²``. The controller's ``dpp_gain`` feature is the same number.
    Paper operating point τ = 0.30 (pre-synthesis max 10).
    """

    threshold: float = 0.30
    ridge: float = RIDGE
    name: ClassVar[str] = "dpp"
    higher_is_better: ClassVar[bool] = True

    def __post_init__(self):
        check_range("threshold", self.threshold)
        check_range("ridge", self.ridge, 1e-15, 1.0)

    def score(self, x: Items, state: State) -> np.ndarray:
        xu, cu, q = prepare(x, state)
        return dpp_gain(xu, weight(xu, q), cu, weight(cu, q), self.ridge)
