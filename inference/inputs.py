"""What the Gate takes as a decision, and how loose inputs (JSON mappings, objects, pairs, strings) become
one (core-safe). Every bad field is an ``InputError`` that names it.

The candidates of a decision (``as_candidates``, ``candidate_fields``) follow one rule wherever they come
from — ``Gate.select``, a budgeted run, ``branchgate gate``'s JSON, the ``adapters.gated`` wrapper: a list
(or another iterable) whose items are each a text, a ``(query, goal)`` pair, or a mapping or object with a
query field (``QUERY_KEYS``) and optionally a goal (``GOAL_KEYS``). A string is never split into candidates,
a newline-joined plan included: split it yourself (``text.splitlines()``), since only the caller knows its
format (numbering, bullets, blank lines).
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from branchgate.errors import InputError
from branchgate.texts import candidate_text

STATE_FIELDS = ("root_query", "frame_query", "parent_goal", "retained", "depth")
QUERY_KEYS = ("query", "q", "question", "search_query", "text")  # a candidate's query: the first one present
GOAL_KEYS = ("goal", "researchGoal", "research_goal", "rationale")  # its goal: the first one present, or none
THREADS_PER_CORE = 4  # more threads than this per core only thrash (2000 ran past 70 s and ignored Ctrl-C)


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
        raise InputError(
            f"must be a mapping {{{', '.join(STATE_FIELDS)}}} or a DecisionState, got {type(state).__name__}", "state"
        )
    else:

        def get(key, default=None):
            return getattr(state, key, default)

    retained = get("retained", None) or []
    if isinstance(retained, str) or not isinstance(retained, Iterable):
        raise InputError("must be a list of texts", "state.retained")
    items = [
        r if isinstance(r, str) else candidate_text(*candidate_fields(r, f"state.retained[{i}]"))
        for i, r in enumerate(retained)
    ]
    depth = get("depth", 0)
    if depth is None:
        depth = 0
    if isinstance(depth, bool) or not isinstance(depth, numbers.Real) or not _finite(depth) or depth < 0:
        raise InputError(f"must be a finite non-negative number, got {str(depth)[:40]}", "state.depth")
    return DecisionState(
        _text(get("root_query", ""), "state.root_query"),
        _text(get("frame_query", ""), "state.frame_query"),
        _text(get("parent_goal", ""), "state.parent_goal"),
        items,
        int(depth),
    )


def as_decision(state, candidates) -> tuple[DecisionState, list[str]]:
    """A decision in the Gate's terms: its ``DecisionState`` and the candidates' texts (``candidate_text``);
    inputs as ``Gate.select`` takes them (``as_candidates``, ``candidate_fields``)."""
    items = as_candidates(candidates)
    return as_state(state), [candidate_text(*candidate_fields(c, f"candidates[{i}]")) for i, c in enumerate(items)]


def as_candidates(candidates, where: str = "candidates") -> list:
    """A decision's candidates as a list: from a list, a tuple or any other iterable (a generator is consumed).
    Refused: None, a string (never split: not a newline-joined plan either), bytes, a mapping (it would gate
    its keys), an awaitable or an async iterator (await or collect it first). Items: ``candidate_fields``."""
    hint = ""
    if candidates is None:
        hint = " (no candidates: pass [])"
    elif isinstance(candidates, str):
        hint = " (a string is not split into candidates: pass a list, e.g. text.splitlines() of a newline-joined plan)"
    elif isinstance(candidates, Mapping):
        hint = " (one candidate: pass [it]; a wrapper such as {'queries': [...]}: pass its list)"
    elif inspect.isawaitable(candidates):
        hint = " (await it first)"
    elif hasattr(candidates, "__aiter__"):
        hint = " (collect it first: [c async for c in it])"
    if hint or isinstance(candidates, (bytes, bytearray)) or not isinstance(candidates, Iterable):
        if inspect.iscoroutine(candidates):
            candidates.close()  # refused: never awaited, and no "was never awaited" warning later
        raise InputError(f"must be a list of candidates, got {type(candidates).__name__}{hint}", where)
    return list(candidates)


def candidate_fields(c, where: str = "candidate") -> tuple[str, str]:
    """``(query, goal)`` of one candidate: a text (no goal); a ``(query, goal)`` pair (or ``(query,)``); a
    mapping or an object whose first ``QUERY_KEYS`` field present is the query and first ``GOAL_KEYS`` field
    the goal. Fields must be strings (None = absent); anything else is an ``InputError`` naming ``where``."""
    if isinstance(c, str):
        return c, ""
    if isinstance(c, (tuple, list)):
        if not 1 <= len(c) <= 2:
            raise InputError(f"a (query, goal) pair has 1 or 2 items, got {len(c)}", where)
        return _text(c[0], f"{where}[0]"), _text(c[1] if len(c) > 1 else None, f"{where}[1]")
    if c is None or isinstance(c, (bytes, bytearray, numbers.Number)):
        raise InputError(f"must be a text, a (query, goal) pair or {{query, goal}}, got {type(c).__name__}", where)
    if isinstance(c, Mapping):
        get = c.get
    else:

        def get(key):
            return getattr(c, key, None)

    query = next((k for k in QUERY_KEYS if get(k) is not None), None)
    if query is None:
        raise InputError(
            f"missing (a candidate mapping or object needs one of the fields {', '.join(QUERY_KEYS)}; "
            f"got {type(c).__name__})",
            f"{where}.query",
        )
    goal = next((k for k in GOAL_KEYS if get(k) is not None), None)
    return _text(get(query), f"{where}.{query}"), ("" if goal is None else _text(get(goal), f"{where}.{goal}"))


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


def as_threads(threads, where: str = "threads") -> int | None:
    """``None`` (the default: all cores) or an integer from 1 to ``THREADS_PER_CORE`` × the cores."""
    if threads is None:
        return None
    cores = os.cpu_count() or 1
    most = THREADS_PER_CORE * cores
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or not 1 <= threads <= most:
        raise InputError(
            f"must be an integer from 1 to {most} ({THREADS_PER_CORE} per core, {cores} cores), got {threads!r}", where
        )
    return int(threads)


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
