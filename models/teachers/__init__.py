"""Heuristic marginal-value teachers (TEACHERS.md). Each implements ``base.ValueModel``."""

from branchgate.models.teachers.base import Items, State, ValueModel, gate, select  # noqa: F401
