"""The Gate's answer for one decision (``Selection``): what ``Gate.select``, a budgeted run's ``RunGate.select``
and ``revisit`` return, and what ``branchgate gate`` prints (``to_json``). Core-safe (numpy only)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Selection:
    """The Gate's answer for one decision. ``kept`` are candidate indices in their original order (a read
    controller's: indices into the caller's hit list, whatever the ranks)."""

    kept: list[int]
    p_keep: np.ndarray  # [K] for every candidate (NaN for a hit not scored: ``not_new``)
    utility: np.ndarray  # [K] predicted marginal utility ĝ (NaN likewise)
    fallback: bool  # True when no candidate passed τ and the top-1 was kept anyway
    tau: float = 0.5
    out_of_range: list[str] = field(default_factory=list)  # features outside the training range (clamped)
    # A budgeted run's decision (``Gate.run``, ``inference.run_gate``); empty for a plain ``select``:
    deferred: list[int] = field(default_factory=list)  # set aside for ``RunGate.revisit``
    dropped_by_budget: list[int] = field(default_factory=list)  # the budget could not afford them
    budget: dict | None = None  # spent / reserved / remaining / price at this decision
    exhausted: bool = False  # no candidate was affordable: nothing kept
    revisited: list = field(default_factory=list, repr=False)  # RunGate.revisit: the admitted Deferred entries
    # A read decision's (``Gate.select`` with a read controller): hits already read (``read_ids``), not scored
    not_new: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        """The answer as JSON (``branchgate gate``): ``p_keep`` / ``utility`` of a hit not scored are null."""
        out = {
            "kept": [int(i) for i in self.kept],
            "p_keep": _floats(self.p_keep),
            "utility": _floats(self.utility),
            "fallback": bool(self.fallback),
        }
        if self.out_of_range:  # only when the decision lay outside what the model saw in training
            out["out_of_range"] = list(self.out_of_range)
        if self.not_new:
            out["not_new"] = [int(i) for i in self.not_new]
        if self.deferred:
            out["deferred"] = [int(i) for i in self.deferred]
        if self.dropped_by_budget:
            out["dropped_by_budget"] = [int(i) for i in self.dropped_by_budget]
        if self.budget is not None:
            out["budget"] = dict(self.budget)
        if self.exhausted:
            out["exhausted"] = True
        return out


def _floats(values) -> list:
    """Floats for JSON, NaN (a hit not scored) as None."""
    return [None if np.isnan(v) else float(v) for v in values]
