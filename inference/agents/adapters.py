"""Plug the Gate into any pipeline that has a function producing candidate subqueries.

    search_plan = gated(generate_queries, Gate.load("controller.onnx"))     # sync or async alike
    kept = await search_plan("root question", n=6)                          # the kept candidates, same objects

The wrapper calls the original function, gates what it returns and hands back the kept candidates in
their original order — never an empty list for a non-empty one (top-1 fallback). Core-safe (no torch).
What the function returns is read by the Gate's own rule (``inputs.as_candidates``, ``candidate_fields``): a
list or other iterable of texts, ``(query, goal)`` pairs, or mappings/objects with a query field. A string
(a newline-joined plan included), a dict, None, bytes or an async generator is an ``InputError``, never gated
character by character or key by key: return ``text.splitlines()`` (or your own parse) from the planner.
A function returning an awaitable is awaited (the wrapper then returns a coroutine).

With a budget — ``gated(fn, gate, budget_nodes=12, budget_tokens=None, defer=False)``, or a ``RunGate``
(``gate.run(...)``) as the gate — the calls share one run's budget (``inference/run_gate.py``): the list is
never empty while the budget can afford a candidate, and empty once it cannot (``wrapper.exhausted``; the
caller decides what its agent does then). ``cost=`` gives each candidate's token estimate; ``spend(tokens)``
reports what an expansion used; ``revisit(*args)`` returns the deferred candidates worth expanding now.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from branchgate.inference.inputs import GOAL_KEYS, QUERY_KEYS, DecisionState, as_candidates, as_state, candidate_fields  # noqa: F401 (the one candidate rule)
from branchgate.inference.selection import Selection
from branchgate.texts import candidate_text


def default_state(*args, **kwargs) -> DecisionState:
    """The first string argument (or ``query=``/``prompt=``) is both root and frame query."""
    text = next((a for a in args if isinstance(a, str)), None)
    if text is None:
        text = next((kwargs[k] for k in ("query", "prompt", "question") if isinstance(kwargs.get(k), str)), "")
    return DecisionState(root_query=text, frame_query=text)


@dataclass
class GatedCall:
    """One gated call, handed to ``on_decision``."""

    state: DecisionState
    candidates: list[Any]
    selection: Selection

    @property
    def kept(self) -> list[Any]:
        return [self.candidates[i] for i in self.selection.kept]


class GatedGenerator:
    """A candidate-generating function whose output passes through a gate.

    ``state(*args, **kwargs)`` builds the decision state from the call (default: ``default_state``);
    ``candidate(c)`` gives one candidate's ``(query, goal)`` (default: ``inputs.candidate_fields``);
    ``track_retained`` adds the kept candidates' texts to ``retained`` and feeds them to later calls
    as the retained context (the state's own ``retained`` wins when it has any). ``reset()`` starts a
    new run.
    """

    def __init__(
        self,
        generate: Callable,
        gate,
        *,
        state: Callable | None = None,
        candidate: Callable[[Any], tuple[str, str]] = candidate_fields,
        tau: float | None = None,
        max_keep: int | None = None,
        on_decision: Callable[[GatedCall], Any] | None = None,
        track_retained: bool = True,
        budget_nodes: int | None = None,
        budget_tokens: int | None = None,
        defer: bool = False,
        cost: Callable[[Any], int] | None = None,
        **run_options,
    ):
        self.generate = generate
        self._run_args = None
        if budget_nodes is not None or budget_tokens is not None or defer or run_options:
            self._run_args = dict(budget_nodes=budget_nodes, budget_tokens=budget_tokens, defer=defer, **run_options)
            gate = gate.run(**self._run_args)
        self.gate = gate
        self.cost = cost
        self.state_fn = state or default_state
        self.candidate = candidate
        self.tau, self.max_keep = tau, max_keep
        self.on_decision = on_decision
        self.track_retained = track_retained
        self.retained: list[str] = []
        functools.update_wrapper(self, generate)

    def reset(self) -> None:
        """Start a new run: no retained branches, and a fresh budget when this wrapper made the run."""
        self.retained.clear()
        if self._run_args is not None:
            self.gate = self.gate.gate.run(**self._run_args)

    @property
    def budgeted(self) -> bool:
        return hasattr(self.gate, "budget") and hasattr(self.gate, "revisit")

    @property
    def exhausted(self) -> bool:
        return self.budgeted and self.gate.exhausted

    def spend(self, tokens: int) -> None:
        """Report the tokens one kept candidate's expansion used (a budgeted run; otherwise ignored)."""
        if self.budgeted:
            self.gate.spend(tokens)

    def revisit(self, *args, max_keep: int | None = None, **kwargs) -> list:
        """The deferred candidates worth expanding now, re-scored against the state built from this call's
        arguments (as for a generating call); they are charged to the budget. [] without a budgeted run."""
        if not self.budgeted or not self.gate.deferred:
            return []
        state = self._state(*args, **kwargs)
        before = [d.candidate for d in self.gate.deferred]  # the selection's indices refer to this list
        selection = self.gate.revisit(state, max_keep=max_keep)
        if self.track_retained:
            self.retained.extend(d.text for d in selection.revisited)
        call = GatedCall(state, before, selection)
        if self.on_decision is not None:
            self.on_decision(call)
        return call.kept

    def _state(self, *args, **kwargs) -> DecisionState:
        state = as_state(self.state_fn(*args, **kwargs))
        if self.track_retained and not state.retained and self.retained:
            state = DecisionState(
                state.root_query, state.frame_query, state.parent_goal, list(self.retained), state.depth
            )
        return state

    def __call__(self, *args, **kwargs):
        result = self.generate(*args, **kwargs)
        if inspect.isawaitable(result):
            return self._gate_awaited(result, *args, **kwargs)
        return self.gate_candidates(result, *args, **kwargs)

    async def _gate_awaited(self, result, *args, **kwargs):
        return self.gate_candidates(await result, *args, **kwargs)

    def gate_candidates(self, candidates, *args, **kwargs) -> list:
        where = f"candidates returned by {getattr(self.generate, '__qualname__', 'the wrapped function')}()"
        candidates = as_candidates(candidates, where)
        if not candidates:
            return candidates
        state = self._state(*args, **kwargs)
        pairs = [
            candidate_fields(c if self.candidate is candidate_fields else self.candidate(c), f"{where}[{i}]")
            for i, c in enumerate(candidates)
        ]
        if self.budgeted:
            costs = None if self.cost is None else [self.cost(c) for c in candidates]
            selection = self.gate.select(
                state, pairs, tau=self.tau, max_keep=self.max_keep, costs=costs, objects=candidates
            )
        else:
            selection = self.gate.select(state, pairs, tau=self.tau, max_keep=self.max_keep)
        if self.track_retained:
            self.retained.extend(candidate_text(*pairs[i]) for i in selection.kept)
        call = GatedCall(state, candidates, selection)
        if self.on_decision is not None:
            self.on_decision(call)
        return call.kept


def gated(generate: Callable, gate, **options) -> GatedGenerator:
    """Wrap a sync or async candidate-generating function with ``gate`` (see ``GatedGenerator``)."""
    return GatedGenerator(generate, gate, **options)
