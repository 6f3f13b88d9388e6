"""DPP volume gain with the quality-weighted Gram kernel ``L_ij = w_i w_j ⟨ẽ_i, ẽ_j⟩``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from branchgate.models.teachers.base import Items, State
from branchgate.models.teachers.common import check_range, prepare, weight


def dpp_gain(xu: np.ndarray, wx: np.ndarray, cu: np.ndarray, wc: np.ndarray, ridge: float = 1e-6) -> np.ndarray:
    """``det(L_{C∪{x}}) / det(L_C)`` per candidate, as the Schur complement ``L_xx − l_xᵀ (L_C + εI)⁻¹ l_x``.

    Uses a Cholesky factor of the ridged ``L_C`` (no determinant is ever formed), so duplicates,
    zero-weight rows and near-singular ``C`` stay finite. The ridge only shrinks the subtracted term,
    so the gain is ≥ the exact Schur complement ≥ 0 and never above ``L_xx``. Empty ``C``: ``L_xx = w_x²``.
    """
    lxx = wx * wx
    if len(cu) == 0:
        return lxx
    fc = cu * wc[:, None]  # rows w_c ẽ_c: L_C = fc fcᵀ, l_x = fc (w_x ẽ_x)
    lcc = fc @ fc.T
    lcx = fc @ (xu * wx[:, None]).T  # [n, m]
    eye = np.eye(len(cu))
    eps = ridge
    for _ in range(8):
        try:
            chol = np.linalg.cholesky(lcc + eps * eye)
            break
        except np.linalg.LinAlgError:
            eps *= 100.0
    else:  # pragma: no cover - L_C is PSD, so a ridge always makes it factorisable
        raise np.linalg.LinAlgError("DPP kernel could not be factorised")
    half = np.linalg.solve(chol, lcx)  # chol⁻¹ l_x
    gain = lxx - np.einsum("ij,ij->j", half, half)
    return np.clip(gain, 0.0, lxx)


@dataclass
class DPP:
    """DPP marginal gain (volume added by ``x``), in [0, w_x²] ⊂ [0, 1]; higher = keep.

    ``w = max(sim(e, q), 0)``: irrelevant or redundant candidates add little volume.
    Empty ``C``: the gain is ``L_xx = w_x²``. Paper operating point τ = 0.30 (pre-synthesis max 10).
    ``ridge``: added to the diagonal of ``L_C`` before the Cholesky factorisation.
    """

    threshold: float = 0.30
    ridge: float = 1e-6
    name: ClassVar[str] = "dpp"
    higher_is_better: ClassVar[bool] = True

    def __post_init__(self):
        check_range("threshold", self.threshold)
        check_range("ridge", self.ridge, 1e-15, 1.0)

    def score(self, x: Items, state: State) -> np.ndarray:
        xu, cu, q = prepare(x, state)
        return dpp_gain(xu, weight(xu, q), cu, weight(cu, q), self.ridge)
