"""What the Gate takes as a decision, and how loose inputs (JSON mappings, objects, pairs, strings) become
one (core-safe). Every bad field is an ``InputError`` that names it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from branchgate.errors import InputError
from branchgate.texts import candidate_text

STATE_FIELDS = ("root_query", "frame_query", "parent_goal", "retained", "depth")


@dataclass
class DecisionState:
    """What the Gate knows about a decision point besides its candidates."""

    root_query: str = ""
    frame_query: str = ""
    parent_goal: str = ""
    retained: Sequence[str] = field(default_factory=tuple)  # candidate_text of retained branches, in order
    depth: int = 0


def decision_texts(state: DecisionState, cands: Sequence[str]) -> list[str]:
    """A decision's texts in the order the graph's row indices follow: root query, frame query, parent goal,
    the retained branches, then the candidates."""
    return [state.root_query, state.frame_query, state.parent_goal, *(state.retained or []), *cands]



def as_state(state) -> DecisionState:
    """A ``DecisionState`` from a mapping (JSON) or an object with the same attributes."""
    if isinstance(state, DecisionState):
        return state
    if state is None:
        return DecisionState()
    if isinstance(state, Mapping):
        get = state.get
    elif isinstance(state, (str, bytes, numbers.Number, Sequence)) or not any(hasattr(state, k) for k in STATE_FIELDS):
        raise InputError(f"must be a mapping {{{', '.join(STATE_FIELDS)}}} or a DecisionState, got "
                         f"{type(state).__name__}", "state")
    else:
        def get(key, default=None):
            return getattr(state, key, default)
    retained = get("retained", None) or []
    if isinstance(retained, str) or not isinstance(retained, Iterable):
        raise InputError("must be a list of texts", "state.retained")
    items = []
    for i, r in enumerate(retained):
        if isinstance(r, str):
            items.append(r)
        elif isinstance(r, Mapping):
            items.append(candidate_text(_text(r.get("query"), f"state.retained[{i}].query"),
                                        _text(r.get("goal"), f"state.retained[{i}].goal")))
        else:
            raise InputError(f"must be a text or {{query, goal}}, got {type(r).__name__}", f"state.retained[{i}]")
    depth = get("depth", 0)
    if depth is None:
        depth = 0
    if isinstance(depth, bool) or not isinstance(depth, numbers.Real) or not _finite(depth) or depth < 0:
        raise InputError(f"must be a finite non-negative number, got {str(depth)[:40]}", "state.depth")
    return DecisionState(_text(get("root_query", ""), "state.root_query"), _text(get("frame_query", ""), "state.frame_query"),
                         _text(get("parent_goal", ""), "state.parent_goal"), items, int(depth))


def as_decision(state, candidates) -> tuple[DecisionState, list[str]]:
    """A decision in the Gate's terms: its ``DecisionState`` and the candidates' texts (``candidate_text``);
    inputs as ``Gate.select`` takes them. ``candidates`` must be a list (or another iterable) of candidates:
    a mapping or a string is refused (it would gate its keys or characters)."""
    if isinstance(candidates, (Mapping, str, bytes)) or not isinstance(candidates, Iterable):
        raise InputError(f"must be a list of candidates, got {type(candidates).__name__}", "candidates")
    return as_state(state), [_candidate(c, i) for i, c in enumerate(candidates)]


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an integer beyond float range
        return False


def as_tau(tau, where: str = "tau") -> float:
    """A keep threshold: a real number in [0, 1] (nan, inf, text refused); ``where`` names it in the error."""
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not 0.0 <= tau <= 1.0:
        raise InputError(f"must be a number in [0, 1], got {tau!r}", where)
    return float(tau)


def as_max_keep(max_keep, where: str = "max_keep") -> int | None:
    """``None`` or an integer ≥ 1 (1.7, True, text refused); ``where`` names it in the error."""
    if max_keep is None:
        return None
    if isinstance(max_keep, bool) or not isinstance(max_keep, numbers.Integral) or max_keep < 1:
        raise InputError(f"must be an integer ≥ 1, got {max_keep!r}", where)
    return int(max_keep)


def _text(value, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(f"must be a string, got {type(value).__name__}", where)
    return value


def _candidate(c, i: int) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, Mapping):
        if "query" not in c:
            raise InputError("missing field 'query'", f"candidates[{i}]")
        return candidate_text(_text(c["query"], f"candidates[{i}].query"), _text(c.get("goal"), f"candidates[{i}].goal"))
    if isinstance(c, (tuple, list)) and 1 <= len(c) <= 2:
        return candidate_text(_text(c[0], f"candidates[{i}][0]"), _text(c[1] if len(c) > 1 else "", f"candidates[{i}][1]"))
    raise InputError(f"must be {{query, goal}}, a (query, goal) pair or a string, got {type(c).__name__}", f"candidates[{i}]")
