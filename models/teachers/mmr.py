"""Maximal marginal relevance: ``λ·sim(e(x), q) − (1−λ)·max_{c∈C} sim(e(x), e(c))``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from branchgate.models.teachers.base import Items, State
from branchgate.models.teachers.common import check_range, max_sim, prepare, relevance


@dataclass
class MMR:
    """MMR (Carbonell & Goldstein). Range [−1, 1]; higher = more relevant and less redundant.

    Empty ``C``: the redundancy term is 0, so the score is ``λ·sim(e(x), q)``.
    Paper operating point: λ = 0.35, threshold 0.35 (pre-synthesis: at most 10 items).
    """

    lam: float = 0.35
    threshold: float = 0.35
    name: ClassVar[str] = "mmr"
    higher_is_better: ClassVar[bool] = True

    def __post_init__(self):
        check_range("lam", self.lam, 0.0, 1.0)
        check_range("threshold", self.threshold)

    def score(self, x: Items, state: State) -> np.ndarray:
        xu, cu, q = prepare(x, state)
        return self.lam * relevance(xu, q) - (1.0 - self.lam) * max_sim(xu, cu)
