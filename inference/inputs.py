"""What the Gate takes as a decision, and how loose inputs (JSON mappings, objects, pairs, strings) become
one (core-safe). Every bad field is an ``InputError`` that names it.

The candidates of a decision (``as_candidates``, ``candidate_fields``) follow one rule wherever they come
from — ``Gate.select``, a budgeted run, ``branchgate gate``'s JSON, the ``adapters.gated`` wrapper: a list
(or another iterable) whose items are each a text, a ``(query, goal)`` pair, or a mapping or object with a
query field (``QUERY_KEYS``) and optionally a goal (``GOAL_KEYS``). A string is never split into candidates,
a newline-joined plan included: split it yourself (``text.splitlines()``), since only the caller knows its
format (numbering, bullets, blank lines). Candidates are what a pre-retrieval controller (metadata ``stage`` =
``pre``) scores: a search hit given as a candidate is refused as one.

A read controller (``stage`` = ``read``) scores the hits of one search instead (``as_read_decision``):

- the hits (``as_hits``, ``hit_fields``): a list of mappings or objects, each with ``title`` and/or ``snippet``
  (strings, at least one non-empty; scored as ``texts.hit_text(title, snippet)``), optional ``id`` (a string; a
  hit without one takes its ``url`` as its id) and optional ``rank`` (an integer ≥ 0: hits are scored in rank
  order when they have ranks, every one of them, else in list order). A text, a ``(query, goal)`` pair or a
  candidate mapping (a query field, no title or snippet) is refused: it is a pre-retrieval candidate.
- the state (``as_read_state``, ``READ_STATE_FIELDS``): a mapping (or an object) with ``root_query`` (the run's
  question), ``query`` (the sub-query that was searched), ``goal`` (its goal), ``read`` (what the run has read
  so far: texts, or hits, which count as their ``hit_text`` and add their ids to ``read_ids``), ``read_ids``
  (ids of the hits already read: a hit with one of them is not new, and is not scored) and ``depth``; missing
  keys are empty. A ``DecisionState`` is taken as it is (``frame_query`` = the sub-query, ``parent_goal`` = its
  goal, ``retained`` = the texts read).

Bounds (``branchgate.limits``): every list of a decision — its candidates or hits, and each list of its state —
holds at most ``MAX_ITEMS`` items, and every count (a depth, a rank, a budget, a cost, a spend: ``as_count``) is
an integer from 0 to ``MAX_COUNT``; past them, a ``LimitError`` naming the field and the bound (an iterator is
read no further than one item past the bound). ``check_numbers`` holds every number of a JSON document (a run state
file) to ``MAX_TOTAL``.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from itertools import islice

from branchgate.errors import InputError, LimitError
from branchgate.limits import MAX_COUNT, MAX_ITEMS, MAX_TOTAL
from branchgate.texts import candidate_text, hit_text

STATE_FIELDS = ("root_query", "frame_query", "parent_goal", "retained", "depth")
QUERY_KEYS = ("query", "q", "question", "search_query", "text")  # a candidate's query: the first one present
GOAL_KEYS = ("goal", "researchGoal", "research_goal", "rationale")  # its goal: the first one present, or none
READ_STATE_FIELDS = ("root_query", "query", "goal", "read", "read_ids", "depth")  # a read decision's state
HIT_FIELDS = ("title", "snippet", "id", "url", "rank")  # a search hit's fields (``hit_fields``)
FLOORS = ("root",)  # ``Gate.select(..., floor=)`` of a read controller: None, or keep the top hit at the root
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
    get = _state_getter(state, STATE_FIELDS)
    items = [
        r if isinstance(r, str) else candidate_text(*candidate_fields(r, f"state.retained[{i}]"))
        for i, r in enumerate(_texts_list(get("retained"), "state.retained", "a list of texts"))
    ]
    return DecisionState(
        _text(get("root_query"), "state.root_query"),
        _text(get("frame_query"), "state.frame_query"),
        _text(get("parent_goal"), "state.parent_goal"),
        items,
        _depth(get("depth"), "state.depth"),
    )


def _state_getter(state, fields: Sequence[str]):
    """``get(key)`` of a state given as a mapping, or as an object with at least one of ``fields``; anything else
    is an ``InputError`` naming ``state``."""
    if not isinstance(state, Mapping) and (
        isinstance(state, (str, bytes, numbers.Number, Sequence)) or not any(hasattr(state, k) for k in fields)
    ):
        raise InputError(
            f"must be a mapping {{{', '.join(fields)}}} or a DecisionState, got {type(state).__name__}", "state"
        )
    return _getter(state)


def _texts_list(value, where: str, what: str) -> list:
    """A state's list field (None: empty; at most ``MAX_ITEMS`` items: ``bounded_list``); a string or a
    non-iterable is an ``InputError`` naming ``where``."""
    value = value or []
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InputError(f"must be {what}", where)
    return bounded_list(value, where)


def bounded_list(items: Iterable, where: str, what: str = "items") -> list:
    """``items`` as a list of at most ``MAX_ITEMS`` (an iterator is read no further than one item past it); more is a
    ``LimitError`` naming ``where`` and the bound."""
    out = list(islice(items, MAX_ITEMS + 1))
    if len(out) > MAX_ITEMS:
        n = len(items) if isinstance(items, Sized) else None
        raise LimitError(
            f"has {n if n is not None else 'more than ' + str(MAX_ITEMS)} {what}: at most {MAX_ITEMS} per decision "
            f"(branchgate.limits.MAX_ITEMS); split the decision, or pass the first {MAX_ITEMS}",
            where,
        )
    return out


def as_count(value, where: str, what: str = "an integer") -> int:
    """A count (a depth, a rank, tokens, nodes, a cost, a spend): an integer from 0 to ``MAX_COUNT`` (True, 1.5,
    text and numbers past the bound refused, naming ``where``). ``what`` says what was expected, in the error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InputError(f"must be {what} ≥ 0, got {_short(value)}", where)
    if value > MAX_COUNT:
        raise LimitError(f"must be at most {MAX_COUNT:.0e} (branchgate.limits.MAX_COUNT), got {_short(value)}", where)
    return int(value)


def check_numbers(doc, where: str) -> None:
    """Every number of a decoded JSON document (a run state file) finite and within ±``MAX_TOTAL``; else a
    ``LimitError`` naming ``where`` and the number's path (``runs.r1.budget.spent_tokens``)."""
    stack = [(doc, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, Mapping):
            stack += [(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{path}[{i}]") for i, v in enumerate(value)]
        elif isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        elif isinstance(value, numbers.Real) and not (_finite(value) and abs(value) <= MAX_TOTAL):
            raise LimitError(
                f"field '{path}' holds {_short(value)}: numbers here are finite and at most {MAX_TOTAL} "
                "(branchgate.limits.MAX_TOTAL)",
                where,
            )


def _short(value) -> str:
    """A value for an error message: at most 40 characters (a 400-digit integer is shown by its size)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    return str(value)[:40]


def _depth(depth, where: str) -> int:
    """A decision's depth: a finite number from 0 to ``MAX_COUNT`` (None: 0), as an integer."""
    if depth is None:
        return 0
    if isinstance(depth, bool) or not isinstance(depth, numbers.Real) or not _finite(depth) or depth < 0:
        raise InputError(f"must be a finite non-negative number, got {_short(depth)}", where)
    return as_count(int(depth), where, "a number")


def as_decision(state, candidates) -> tuple[DecisionState, list[str]]:
    """A decision in the Gate's terms: its ``DecisionState`` and the candidates' texts (``candidate_text``);
    inputs as ``Gate.select`` takes them (``as_candidates``, ``candidate_fields``)."""
    items = as_candidates(candidates)
    return as_state(state), [candidate_text(*candidate_fields(c, f"candidates[{i}]")) for i, c in enumerate(items)]


def as_candidates(candidates, where: str = "candidates") -> list:
    """A decision's candidates as a list: from a list, a tuple or any other iterable (a generator is consumed).
    Refused: None, a string (never split: not a newline-joined plan either), bytes, a mapping (it would gate
    its keys), an awaitable or an async iterator (await or collect it first). Items: ``candidate_fields``."""
    return _as_list(candidates, where, "candidates")


_LIST_HINTS = {  # (None, a string, a mapping) given where a list of these was expected
    "candidates": (
        " (no candidates: pass [])",
        " (a string is not split into candidates: pass a list, e.g. text.splitlines() of a newline-joined plan)",
        " (one candidate: pass [it]; a wrapper such as {'queries': [...]}: pass its list)",
    ),
    "hits": (
        " (no hits: pass [])",
        " (a string is not split into hits: pass a list of {title, snippet} mappings)",
        " (one hit: pass [it]; a wrapper such as {'results': [...]}: pass its list)",
    ),
}


def _as_list(items, where: str, kind: str) -> list:
    """The list rule of ``as_candidates`` and ``as_hits`` (``kind``: which one, for the hints)."""
    hint = ""
    if items is None:
        hint = _LIST_HINTS[kind][0]
    elif isinstance(items, str):
        hint = _LIST_HINTS[kind][1]
    elif isinstance(items, Mapping):
        hint = _LIST_HINTS[kind][2]
    elif inspect.isawaitable(items):
        hint = " (await it first)"
    elif hasattr(items, "__aiter__"):
        hint = " (collect it first: [c async for c in it])"
    if hint or isinstance(items, (bytes, bytearray)) or not isinstance(items, Iterable):
        if inspect.iscoroutine(items):
            items.close()  # refused: never awaited, and no "was never awaited" warning later
        raise InputError(f"must be a list of {kind}, got {type(items).__name__}{hint}", where)
    return bounded_list(items, where, kind)


def candidate_fields(c, where: str = "candidate") -> tuple[str, str]:
    """``(query, goal)`` of one candidate: a text (no goal); a ``(query, goal)`` pair (or ``(query,)``); a
    mapping or an object whose first ``QUERY_KEYS`` field present is the query and first ``GOAL_KEYS`` field
    the goal. Fields must be strings (None = absent); anything else is an ``InputError`` naming ``where``. A
    search hit (a title or snippet, no query field) is refused as one: hits go to a read controller."""
    if isinstance(c, str):
        return c, ""
    if isinstance(c, (tuple, list)):
        if not 1 <= len(c) <= 2:
            raise InputError(f"a (query, goal) pair has 1 or 2 items, got {len(c)}", where)
        return _text(c[0], f"{where}[0]"), _text(c[1] if len(c) > 1 else None, f"{where}[1]")
    if c is None or isinstance(c, (bytes, bytearray, numbers.Number)):
        raise InputError(f"must be a text, a (query, goal) pair or {{query, goal}}, got {type(c).__name__}", where)
    get = _getter(c)
    query = next((k for k in QUERY_KEYS if get(k) is not None), None)
    if query is None and (get("title") is not None or get("snippet") is not None):
        raise InputError(
            "is a search hit (title/snippet, no query field), not a candidate: this is a pre-retrieval controller "
            "(metadata stage=pre), which scores candidate sub-queries {query, goal}; a search's hits go to a read "
            "controller (stage=read)",
            where,
        )
    if query is None:
        raise InputError(
            f"missing (a candidate mapping or object needs one of the fields {', '.join(QUERY_KEYS)}; "
            f"got {type(c).__name__})",
            f"{where}.query",
        )
    goal = next((k for k in GOAL_KEYS if get(k) is not None), None)
    return _text(get(query), f"{where}.{query}"), ("" if goal is None else _text(get(goal), f"{where}.{goal}"))


@dataclass(frozen=True)
class HitInput:
    """One search hit as a read controller scores it (``hit_fields``)."""

    text: str  # texts.hit_text(title, snippet)
    id: str | None = None  # its id (or url); None: it cannot have been read before
    rank: int | None = None  # its rank in the result list, when given


@dataclass
class ReadDecision:
    """A read decision in the Gate's terms (``as_read_decision``); indices are the caller's, into its hit list."""

    state: DecisionState  # root query, the sub-query searched, its goal, the texts read, depth
    scored: list[int]  # the hits to score (not read before), in rank order
    texts: list[str]  # their hit texts, in the same order
    not_new: list[int]  # hits already read (``read_ids``), ascending: never scored, never kept
    n_hits: int


def as_read_decision(state, hits, where: str = "hits") -> ReadDecision:
    """A read decision from a read state (``as_read_state``) and the search's hits (``as_hits``; ``where`` names
    them in errors): the hits to score are those not already read, in rank order (list order without ranks)."""
    st, read_ids = as_read_state(state)
    items = as_hits(hits, where)
    order = sorted(range(len(items)), key=lambda i: (items[i].rank or 0, i))
    scored = [i for i in order if items[i].id is None or items[i].id not in read_ids]
    not_new = sorted(set(range(len(items))) - set(scored))
    return ReadDecision(st, scored, [items[i].text for i in scored], not_new, len(items))


def as_read_state(state) -> tuple[DecisionState, frozenset[str]]:
    """A read decision's state (module docstring; ``READ_STATE_FIELDS``) as the graph sees it — root query, the
    sub-query as the frame query, its goal, the texts read as the retained texts, depth — and the ids of the hits
    already read. A pre-retrieval state (``frame_query``, ``parent_goal``, ``retained`` and none of ``query``,
    ``goal``, ``read``) is refused."""
    if isinstance(state, DecisionState):
        return state, frozenset()
    if state is None:
        return DecisionState(), frozenset()
    get = _state_getter(state, READ_STATE_FIELDS)
    pre = [k for k in ("frame_query", "parent_goal", "retained") if get(k) is not None]
    if pre and all(get(k) is None for k in ("query", "goal", "read")):
        raise InputError(
            f"is a pre-retrieval state ({', '.join(pre)}): this is a read controller (metadata stage=read), whose "
            f"state is {{{', '.join(READ_STATE_FIELDS)}}}",
            "state",
        )
    texts, ids = [], set()
    for i, r in enumerate(_texts_list(get("read"), "state.read", "a list of texts or hits")):
        hit = HitInput(r) if isinstance(r, str) else hit_fields(r, f"state.read[{i}]")
        texts.append(hit.text)
        if hit.id:
            ids.add(hit.id)
    for i, x in enumerate(_texts_list(get("read_ids"), "state.read_ids", "a list of hit ids")):
        ids.add(_text(x, f"state.read_ids[{i}]"))
    root, query, goal = (_text(get(k), f"state.{k}") for k in ("root_query", "query", "goal"))
    return DecisionState(root, query, goal, texts, _depth(get("depth"), "state.depth")), frozenset(ids)


def as_hits(hits, where: str = "hits") -> list[HitInput]:
    """A search's hits: a list (the list rule of ``as_candidates``) of hits (``hit_fields``), ranked all or none."""
    items = [hit_fields(h, f"{where}[{i}]") for i, h in enumerate(_as_list(hits, where, "hits"))]
    unranked = [i for i, h in enumerate(items) if h.rank is None]
    if unranked and len(unranked) < len(items):
        raise InputError(
            "missing: give every hit a rank, or none (then the list order is the rank order)",
            f"{where}[{unranked[0]}].rank",
        )
    return items


def hit_fields(h, where: str = "hit") -> HitInput:
    """One search hit: a mapping or an object with ``title`` and/or ``snippet`` (strings, at least one
    non-empty), optional ``id`` (a string; else its ``url``) and ``rank`` (an integer ≥ 0). A text, a pair or a
    candidate (a query field, no title or snippet) is refused as a pre-retrieval candidate; every bad field is
    an ``InputError`` naming it."""
    not_a_hit = (
        "is a candidate sub-query ({}), not a search hit: this is a read controller (metadata stage=read), which "
        "scores a search's hits, each a mapping or object with a title and/or snippet (optional id, url, rank); "
        "candidates go to a pre-retrieval controller (stage=pre)"
    )
    if isinstance(h, (str, tuple, list)):
        raise InputError(not_a_hit.format("a text" if isinstance(h, str) else "a (query, goal) pair"), where)
    if h is None or isinstance(h, (bytes, bytearray, numbers.Number)):
        raise InputError(f"must be a hit {{{', '.join(HIT_FIELDS)}}}, got {type(h).__name__}", where)
    get = _getter(h)
    title, snippet = _text(get("title"), f"{where}.title"), _text(get("snippet"), f"{where}.snippet")
    if not title.strip() and not snippet.strip():
        query = next((k for k in QUERY_KEYS if get(k) is not None), None)
        if query is not None:
            raise InputError(not_a_hit.format(f"a {query!r} field, no title or snippet"), where)
        raise InputError("missing: a hit needs a non-empty title or snippet", f"{where}.title")
    key = "id" if get("id") is not None else "url"
    rank = get("rank")
    rank = None if rank is None else as_count(rank, f"{where}.rank")
    return HitInput(hit_text(title, snippet), _text(get(key), f"{where}.{key}") or None, rank)


def as_floor(floor, where: str = "floor") -> str | None:
    """A read decision's floor: None (nothing kept when no hit passes τ) or ``"root"`` (the top hit is kept then,
    at the root frame)."""
    if floor is not None and floor not in FLOORS:
        raise InputError(f"must be None or {' or '.join(repr(f) for f in FLOORS)}, got {str(floor)[:40]!r}", where)
    return floor


def _getter(obj):
    """``get(key)`` of a mapping or an object's attribute (None when absent)."""
    if isinstance(obj, Mapping):
        return obj.get
    return lambda key: getattr(obj, key, None)


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
