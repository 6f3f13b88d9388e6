"""Heuristic marginal-value teachers. Each implements ``base.ValueModel``.

Registry: ``NAMES`` and ``get(name, **params)``; parameters are the teachers' constructor arguments
(paper defaults), ``threshold`` always overridable.
"""

from __future__ import annotations

from dataclasses import fields

from branchgate.errors import BranchgateError
from branchgate.models.teachers.base import Items, State, ValueModel, gate, select, set_gain  # noqa: F401
from branchgate.models.teachers.coverage import SubmodularCoverage
from branchgate.models.teachers.dpp import DPP
from branchgate.models.teachers.hybrid import Hybrid
from branchgate.models.teachers.lexical import Lexical
from branchgate.models.teachers.mmr import MMR
from branchgate.models.teachers.novelty import GRN, CentroidDrift

TEACHERS = {cls.name: cls for cls in (MMR, GRN, CentroidDrift, DPP, SubmodularCoverage, Lexical, Hybrid)}
NAMES: tuple[str, ...] = tuple(TEACHERS)


def get(name: str, **params) -> ValueModel:
    """A teacher by name (one of ``NAMES``) with optional constructor parameters."""
    cls = TEACHERS.get(str(name).strip().lower())
    if cls is None:
        raise BranchgateError(f"unknown teacher {name!r}; valid names: {', '.join(NAMES)}")
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BranchgateError(
            f"teacher {cls.name!r} has no parameter(s) {', '.join(unknown)}; valid: {', '.join(allowed)}"
        )
    return cls(**params)


def params(model: ValueModel) -> dict:
    """The constructor parameters of a teacher (for manifests and logs)."""
    return {f.name: getattr(model, f.name) for f in fields(model)}


__all__ = [
    "Items",
    "State",
    "ValueModel",
    "gate",
    "select",
    "set_gain",
    "get",
    "params",
    "NAMES",
    "TEACHERS",
    "MMR",
    "GRN",
    "CentroidDrift",
    "DPP",
    "SubmodularCoverage",
    "Lexical",
    "Hybrid",
]
