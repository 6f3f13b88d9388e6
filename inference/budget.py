"""What a run may spend and what it set aside: ``Budget``, ``BudgetExceeded`` and ``Deferred`` (the state
``inference/run_gate.py``'s ``RunGate`` spends and persists).

**Budget** — ``nodes`` (expanded subqueries) and/or ``tokens`` (caller-reported). A node is charged when
``select``/``revisit`` admits a candidate (with ``RunGate(charges=False)``, by the caller). Tokens are
*reserved* at admission (the candidate's cost estimate) and settled when the caller reports what the
expansion really used (``spend``, oldest reservation first);
``remaining = limit − spent − reserved``. ``charge`` refuses (``BudgetExceeded``) anything that would go past a
limit, so with upper-bound estimates a run never exceeds its budget. An actual spend beyond its estimate is
recorded as it happened (``overspent``), never hidden.

``can_afford`` is the one fit rule of a run budget: the run-scoped gate asks it with its estimates, the
reference pipeline (``pipeline/exact_costs.RunBudget``, which keeps its run's spending in this same ledger) with
exact costs, from the counts its plan would leave (``nodes_used``/``tokens_used``).

Core-safe: the standard library only.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass
from typing import Any

from branchgate.errors import BranchgateError, InputError, LimitError
from branchgate.limits import MAX_COUNT, MAX_TOTAL


class BudgetExceeded(BranchgateError):
    """A charge would take a run past its node or token budget."""


def _limit(value, where: str, most: int = MAX_COUNT) -> int | None:
    """A limit, cost or spend: None or an integer from 0 to ``most`` (a float only when it is whole); larger
    numbers (``10**400``) are refused before anything is charged, so a run stays usable after a bad call."""
    if value is None:
        return None
    why = f"must be a non-negative integer up to {most:.0e} or None, got {str(value)[:40]}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value or value < 0:
        raise InputError(why, where)
    if isinstance(value, float) and not value.is_integer():
        raise InputError(why, where)
    if value > most:  # a bound of branchgate.limits (MAX_COUNT for one count, MAX_TOTAL for a run's sums)
        raise LimitError(why, where)
    return int(value)


def _amount(value, where: str, most: int = MAX_COUNT) -> int:
    value = _limit(value, where, most)
    return 0 if value is None else value


class Budget:
    """What a run may spend: ``nodes`` (expanded subqueries) and/or ``tokens`` (reported by the caller);
    None = unlimited. ``reserved_tokens`` are estimates of admitted expansions not yet reported."""

    def __init__(self, nodes: int | None = None, tokens: int | None = None):
        self.nodes = _limit(nodes, "budget_nodes")
        self.tokens = _limit(tokens, "budget_tokens")
        self.spent_nodes = 0
        self.spent_tokens = 0
        self.reserved_tokens = 0

    @property
    def limited(self) -> bool:
        return self.nodes is not None or self.tokens is not None

    def remaining(self, nodes_used: int | None = None, tokens_used: int | None = None) -> dict:
        """``{"nodes", "tokens"}`` left (None = unlimited), never below 0, after ``nodes_used``/``tokens_used``
        (default: the nodes spent; the tokens spent and reserved)."""
        nodes_used = self.spent_nodes if nodes_used is None else nodes_used
        tokens_used = self.spent_tokens + self.reserved_tokens if tokens_used is None else tokens_used
        nodes = None if self.nodes is None else max(self.nodes - nodes_used, 0)
        tokens = None if self.tokens is None else max(self.tokens - tokens_used, 0)
        return {"nodes": nodes, "tokens": tokens}

    @property
    def exhausted(self) -> bool:
        left = self.remaining()
        return left["nodes"] == 0 or left["tokens"] == 0

    @property
    def overspent(self) -> int:
        """Tokens reported beyond the token budget (0 unless an actual spend exceeded its estimate)."""
        return 0 if self.tokens is None else max(self.spent_tokens + self.reserved_tokens - self.tokens, 0)

    def spent_fraction(self) -> float:
        """The larger of the node and token fractions used (reservations included), in [0, 1]."""
        fracs = [0.0]
        if self.nodes is not None:
            fracs.append(1.0 if self.nodes == 0 else self.spent_nodes / self.nodes)
        if self.tokens is not None:
            fracs.append(1.0 if self.tokens == 0 else (self.spent_tokens + self.reserved_tokens) / self.tokens)
        return float(min(max(fracs), 1.0))

    def can_afford(
        self, nodes: int = 1, tokens: int = 0, *, nodes_used: int | None = None, tokens_used: int | None = None
    ) -> bool:
        """Whether ``nodes`` and ``tokens`` more fit what is left (``remaining``, after ``*_used`` when given)."""
        left = self.remaining(nodes_used, tokens_used)
        return (left["nodes"] is None or nodes <= left["nodes"]) and (
            left["tokens"] is None or tokens <= left["tokens"]
        )

    def charge(self, nodes: int = 0, tokens: int = 0) -> None:
        """Spend ``nodes`` and ``tokens``; ``BudgetExceeded`` (nothing charged) if that would exceed a limit."""
        nodes, tokens = _amount(nodes, "nodes"), _amount(tokens, "tokens")
        if not self.can_afford(nodes, tokens):
            raise BudgetExceeded(
                f"charging {nodes} node(s) and {tokens} token(s) would exceed the budget (remaining {self.remaining()})"
            )
        self.spent_nodes += nodes
        self.spent_tokens += tokens

    def reserve(self, tokens: int) -> None:
        """Hold ``tokens`` for an admitted expansion (``BudgetExceeded`` if they do not fit)."""
        tokens = _amount(tokens, "tokens")
        if not self.can_afford(0, tokens):
            raise BudgetExceeded(f"reserving {tokens} token(s) would exceed the budget (remaining {self.remaining()})")
        self.reserved_tokens += tokens

    def settle(self, reserved: int, actual: int) -> None:
        """Replace a reservation of ``reserved`` tokens by the ``actual`` spend (recorded even beyond the limit:
        the tokens were used; ``overspent`` says so)."""
        self.reserved_tokens = max(self.reserved_tokens - _amount(reserved, "reserved"), 0)
        self.spent_tokens += _amount(actual, "tokens")

    def to_json(self) -> dict:
        return {
            "nodes": self.nodes,
            "tokens": self.tokens,
            "spent_nodes": self.spent_nodes,
            "spent_tokens": self.spent_tokens,
            "reserved_tokens": self.reserved_tokens,
        }

    @classmethod
    def from_json(cls, obj, where: str = "budget") -> Budget:
        if not isinstance(obj, dict):
            raise InputError(f"must be an object, got {type(obj).__name__}", where)
        b = cls(obj.get("nodes"), obj.get("tokens"))
        for key in ("spent_nodes", "spent_tokens", "reserved_tokens"):
            setattr(b, key, _amount(obj.get(key, 0), f"{where}.{key}", MAX_TOTAL))
        return b

    def __repr__(self) -> str:
        return (
            f"Budget(nodes={self.nodes}, tokens={self.tokens}, spent_nodes={self.spent_nodes}, "
            f"spent_tokens={self.spent_tokens}, reserved_tokens={self.reserved_tokens})"
        )


@dataclass
class Deferred:
    """A candidate set aside by a decision, waiting for ``revisit``."""

    text: str  # its candidate_text, as the Gate scored it
    candidate: Any  # the object the caller passed (kept as given; JSON-able ones survive to_json)
    decision: int  # the id of the decision that deferred it (RunGate's decision counter)
    index: int  # its index in that decision's candidate list
    p_keep: float  # at deferral
    price: float  # the admission price it missed
    key: Any = None  # the caller's id for it (e.g. the trace's candidate_id), if given

    def to_json(self) -> dict:
        out = {
            "text": self.text,
            "decision": self.decision,
            "index": self.index,
            "p_keep": self.p_keep,
            "price": self.price,
            "key": self.key,
        }
        if _jsonable(self.candidate):
            out["candidate"] = self.candidate
        return out

    @classmethod
    def from_json(cls, obj: dict) -> Deferred:
        return cls(
            str(obj["text"]),
            obj.get("candidate", obj["text"]),
            int(obj["decision"]),
            int(obj["index"]),
            float(obj["p_keep"]),
            float(obj["price"]),
            obj.get("key"),
        )


def _jsonable(x) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False
