"""Hybrid teacher: query relevance + geometric novelty + coverage per token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from branchgate.models.teachers.base import Items, State
from branchgate.models.teachers.common import RIDGE, check_range, prepare, relevance
from branchgate.models.teachers.coverage import SubmodularCoverage
from branchgate.models.teachers.novelty import residual_novelty


@dataclass
class Hybrid:
    """``α·sim(e(x), q) + β·V_GRN(x | C) + γ·V_SC(x | C, Q)``, (α, β, γ) = (0.40, 0.30, 0.30).

    Sign of the novelty term: the paper prints ``− β·V_GRN`` but describes the term as the one that
    "rewards orthogonal novelty", with α, β, γ ≥ 0 in its generic ``α·Rel + β·Nov + γ·Cov``. A minus
    sign would prefer candidates *inside* span(C) (duplicates), contradicting GRN's own use as a
    keep-if-novel score, so novelty enters with **+β** here. ``beta=-0.30`` reproduces the printed formula.

    Empty ``C``: V_GRN = 1 and V_SC = F({x})/cost(x) (see those teachers). Higher = keep. The paper
    gives no threshold for this variant; the default 0.45 sits near the median of pre-retrieval
    subquery scores against a few retained branches (see tests / benchmarks) — calibrate it per use.
    """

    alpha: float = 0.40
    beta: float = 0.30
    gamma: float = 0.30
    threshold: float = 0.45
    ridge: float = RIDGE
    name: ClassVar[str] = "hybrid"
    higher_is_better: ClassVar[bool] = True

    def __post_init__(self):
        for key in ("alpha", "beta", "gamma", "threshold"):
            check_range(key, getattr(self, key))
        check_range("ridge", self.ridge, 1e-15, 1.0)

    def score(self, x: Items, state: State) -> np.ndarray:
        xu, cu, q = prepare(x, state)
        out = self.alpha * relevance(xu, q) + self.beta * residual_novelty(xu, cu, self.ridge)
        if self.gamma:
            out = out + self.gamma * SubmodularCoverage().score(x, state)
        return out
