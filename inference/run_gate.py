"""Run budgets and deferral: a run-scoped gate that spends at most what the user allows (issue 25).

    run = gate.run(budget_nodes=12)                  # or budget_tokens=40_000, defer=True, run_id="r1"
    sel = run.select(state, candidates)              # kept / deferred / dropped_by_budget / exhausted
    run.spend(tokens)                                # after an expansion: the tokens it really used
    sel = run.revisit(state)                         # at the end, with budget left: the best deferred ones

The budget itself (``Budget``, ``BudgetExceeded``, ``Deferred``) is ``inference/budget.py``
(importable from here too).

**Admission rule** (``admit_by_price``, which ``RunGate.select`` and ``revisit`` apply; a rule of its own,
not ``decide``'s fixed threshold): with ``u`` the spent fraction of the budget (the larger of the node
and token fractions, reservations included), a candidate is *admissible* when

    p_keep ≥ price(u) = price_start + (price_end − price_start) · u ** price_exponent

(``price_start`` defaults to the Gate's τ or the call's ``tau``; ``price_end`` 1.0; ``price_exponent`` 2.0):
early on the run gates as the plain Gate does, and the bar rises as the budget is used up, so the last nodes
go only to strong candidates. Candidates are walked best first — by p_keep, or with ``costs`` by p_keep ·
max(ĝ, ε) / cost, ĝ the utility head — and the price is recomputed after each admission (what the decision
already took counts as spent). One is admitted when it is admissible and fits: one node, and with a token
budget its cost (``costs[i]``, the caller's upper bound; default the running maximum of the actual spends
reported so far, prior ``tokens_per_node``) in the remaining tokens; at most ``max_keep`` per decision, and
with ``max_share`` at most that share (rounded up) of the nodes left when the decision began. Admissible
candidates that do not fit (or exceed ``max_share``) are ``dropped_by_budget``. If nothing is admitted while
the budget can afford a candidate, the best affordable one is kept (``fallback``): never an empty selection
while budget remains. When no candidate is affordable (budget exhausted) ``kept`` is empty, ``exhausted`` is
True and every candidate is in ``dropped_by_budget``; no exception: the caller decides what its agent does.
``Selection.budget`` holds the decision's id, the price it began at (``price``) and after it
(``price_after``), and spent / reserved / remaining / limits after it.

**Deferral** (``defer=True``): a candidate with ``price − defer_margin ≤ p_keep < price`` is ``deferred``, not
pruned; it waits in ``RunGate.deferred`` (its text, the candidate object, its first decision's id and key,
p_keep at deferral). ``revisit(state)`` re-scores the pending deferred candidates against ``state`` (the
context as it is now) and admits, best first, those with p_keep ≥ ``revisit_floor`` (default
``price_start − defer_margin``) that fit the budget, charging them; they leave ``deferred``.

**Who charges** (``charges``): by default the run charges its ``Budget`` itself (a node and a token
reservation per admission, settled by ``spend``). With ``charges=False`` the caller charges it with what it
really spends (``Budget.charge``; the reference pipeline, which knows each expansion's exact cost before
committing it): a decision then leaves the budget as it found it and ``spend`` only updates the cost estimate.

``RunGate.to_json()`` / ``RunGate.from_json(obj, gate)`` keep a run across processes (the CLI's ``run_id``).
Core-safe: numpy and the standard library only.

Over 400 lines: ``RunGate``'s decisions, revisits and persisted state are one contract under one lock; the ledger
itself is apart (``budget.py``).
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Sequence

import numpy as np

from branchgate.errors import InputError
from branchgate.inference.budget import MAX_TOTAL, Budget, BudgetExceeded, Deferred, _amount  # noqa: F401 (re-exported)
from branchgate.inference.inputs import as_decision, as_max_keep, as_state, as_tau
from branchgate.inference.selection import Selection

BUDGET_STATE_VERSION = 1
DEFAULT_TOKENS_PER_NODE = 1000  # prior token cost of one expansion until the caller reports real ones
UTILITY_FLOOR = 1e-3  # ĝ below this counts as this in the cost-aware ranking (ĝ can be ≤ 0)


def admit_by_price(
    order: Sequence[int],
    p_keep,
    price,
    fits,
    take,
    *,
    max_keep: int | None = None,
    cap: int | None = None,
    defer_margin: float | None = None,
    fallback: bool = False,
):
    """The run-scoped gate's keep rule: walk the candidates best first (``order``) against ``price()``,
    recomputed after every admission (what the decision already took counts as spent). One at or above it is
    admitted (``take(i)``) while ``fits(i)`` and ``cap`` allow, else it is dropped by the budget; with
    ``defer_margin`` one within that margin below it is deferred; the rest are plain prunes, as is everything
    beyond ``max_keep``. With ``fallback``, when nothing is admitted, the first candidate that fits is (never
    an empty selection while the budget affords one). → (kept, deferred, dropped_by_budget, fell_back)."""
    kept, deferred, dropped = [], [], []
    for i in order:
        if max_keep is not None and len(kept) >= max_keep:
            break
        now = price()
        if p_keep[i] >= now:
            if (cap is not None and len(kept) >= cap) or not fits(i):
                dropped.append(i)
            else:
                take(i)
                kept.append(i)
        elif defer_margin is not None and p_keep[i] >= now - defer_margin:
            deferred.append(i)
    if kept or not fallback:
        return kept, deferred, dropped, False
    best = next((i for i in order if fits(i)), None)
    if best is None:
        return kept, deferred, dropped, False
    take(best)
    return [best], [i for i in deferred if i != best], [i for i in dropped if i != best], True


class RunGate:
    """A Gate scoped to one run with a ``Budget`` (see the module docstring). Thread-safe."""

    def __init__(
        self,
        gate,
        budget: Budget | None = None,
        *,
        defer: bool = False,
        run_id: str | None = None,
        tau: float | None = None,
        max_keep: int | None = None,
        price_start: float | None = None,
        price_end: float = 1.0,
        price_exponent: float = 2.0,
        defer_margin: float = 0.15,
        revisit_floor: float | None = None,
        tokens_per_node: int | None = None,
        max_share: float | None = None,
        charges: bool = True,
    ):
        self.gate = gate
        self.budget = budget if budget is not None else Budget()
        self.defer = bool(defer)
        self.run_id = run_id
        self.tau = None if tau is None else as_tau(tau)
        self.max_keep = as_max_keep(max_keep)
        self.price_start = None if price_start is None else as_tau(price_start, "price_start")
        self.price_end = as_tau(price_end, "price_end")
        if isinstance(price_exponent, bool) or not isinstance(price_exponent, numbers.Real) or not price_exponent > 0:
            raise InputError(f"must be a number > 0, got {price_exponent!r}", "price_exponent")
        self.price_exponent = float(price_exponent)
        self.defer_margin = as_tau(defer_margin, "defer_margin")
        self.revisit_floor = None if revisit_floor is None else as_tau(revisit_floor, "revisit_floor")
        self.tokens_per_node = (
            DEFAULT_TOKENS_PER_NODE if tokens_per_node is None else _amount(tokens_per_node, "tokens_per_node")
        )
        self.max_share = None if max_share is None else as_tau(max_share, "max_share")
        self.charges = bool(charges)  # False: the caller charges the budget (the module docstring's "Who charges")
        self.max_spend = 0  # the largest actual spend of one expansion reported so far
        self.pending: list[int] = []  # token reservations of admitted expansions not yet reported (oldest first)
        self.decisions = 0  # decisions made (select + revisit); the id of the next one
        self.deferred: list[Deferred] = []
        self._lock = threading.RLock()

    # -- the gate protocol -------------------------------------------------------------------------------
    name = property(lambda self: getattr(self.gate, "name", "gate"))
    path = property(lambda self: getattr(self.gate, "path", None))
    threshold = property(lambda self: self.base_tau())

    @property
    def exhausted(self) -> bool:
        return self.budget.exhausted

    def base_tau(self, tau: float | None = None) -> float:
        if tau is not None:
            return float(tau)
        if self.price_start is not None:
            return self.price_start
        return float(self.tau if self.tau is not None else getattr(self.gate, "tau", 0.5))

    def price(self, tau: float | None = None) -> float:
        """The admission price now: ``start + (end − start) · u ** exponent`` for the spent fraction ``u``."""
        start = self.base_tau(tau)
        end = max(self.price_end, start)
        return float(start + (end - start) * self.budget.spent_fraction() ** self.price_exponent)

    def estimate(self) -> int:
        """Token estimate of one expansion when the caller gives no cost: the running max of reported spends,
        at least the ``tokens_per_node`` prior until a spend is reported."""
        return int(self.max_spend if self.max_spend > 0 else self.tokens_per_node)

    # -- deciding ----------------------------------------------------------------------------------------
    def select(
        self,
        state,
        candidates: Sequence,
        tau: float | None = None,
        max_keep: int | None = None,
        costs: Sequence | None = None,
        keys: Sequence | None = None,
        objects: Sequence | None = None,
    ):
        """Gate one decision under the budget (the module docstring's admission rule). For the ``Deferred``
        entries: ``keys`` name the candidates (e.g. trace candidate ids), ``objects`` are what ``candidate``
        holds (default: the candidates as given)."""
        tau = None if tau is None else as_tau(tau)
        max_keep = as_max_keep(max_keep) if max_keep is not None else self.max_keep
        st, texts = as_decision(state, candidates)
        k = len(texts)
        explicit = costs is not None
        costs = self._costs(costs, k)
        if keys is not None and len(keys) != k:
            raise InputError(f"must have one key per candidate ({k}), got {len(keys)}", "keys")
        objects = list(candidates) if objects is None else list(objects)
        if len(objects) != k:
            raise InputError(f"must have one object per candidate ({k}), got {len(objects)}", "objects")
        p, u = self.gate.predict(st, texts)
        oor = self.gate.out_of_range(st, k) if hasattr(self.gate, "out_of_range") else []
        with self._lock:
            did = self.decisions
            self.decisions += 1
            price = self.price(tau)
            if k == 0:
                return Selection([], p, u, False, price, oor, budget=self._status(price, did))
            order = self._rank(p, u, costs, explicit=explicit)
            mark = self._mark()
            kept, deferred, dropped, fallback = admit_by_price(
                order,
                p,
                lambda: self.price(tau),
                lambda i: self._fits(costs[i]),
                lambda i: self._take(i, costs[i]),
                max_keep=max_keep,
                cap=self._cap(),
                defer_margin=self.defer_margin if self.defer else None,
                fallback=True,
            )
            exhausted = not kept and not any(self._fits(c) for c in costs)
            if exhausted:
                dropped, deferred = list(range(k)), []
            for i in deferred:
                self.deferred.append(
                    Deferred(texts[i], objects[i], did, int(i), float(p[i]), price, None if keys is None else keys[i])
                )
            status = self._status(price, did, tau)
            self._release(mark)
            return Selection(
                sorted(kept),
                p,
                u,
                fallback,
                price,
                oor,
                deferred=sorted(deferred),
                dropped_by_budget=sorted(dropped),
                budget=status,
                exhausted=exhausted,
            )

    def revisit(self, state, max_keep: int | None = None, floor: float | None = None, costs: Sequence | None = None):
        """Re-score the pending deferred candidates against ``state`` (the context now) and admit, best first,
        those with p_keep ≥ the floor that fit the budget (charged; they leave ``deferred``). The Selection's
        indices refer to ``deferred`` as it was before the call; ``selection.revisited`` holds the admitted
        ``Deferred`` entries (in ``kept`` order). ``costs``: one token estimate per pending entry (ranked then
        by p_keep · ĝ / cost, as in ``select``); default the running estimate."""
        max_keep = as_max_keep(max_keep)
        st = as_state(state)
        with self._lock:
            items = list(self.deferred)
        texts = [d.text for d in items]
        p, u = self.gate.predict(st, texts) if texts else (np.zeros(0, np.float32), np.zeros(0, np.float32))
        with self._lock:
            did = self.decisions
            self.decisions += 1
            floor = (
                floor
                if floor is not None
                else (
                    self.revisit_floor
                    if self.revisit_floor is not None
                    else max(self.base_tau() - self.defer_margin, 0.0)
                )
            )
            explicit = costs is not None
            costs = self._costs(costs, len(items))
            order = self._rank(p, u, costs, explicit=explicit)
            mark = self._mark()
            kept, _, dropped, _ = admit_by_price(
                order,
                p,
                lambda: floor,
                lambda i: self._fits(costs[i]),
                lambda i: self._take(i, costs[i]),
                max_keep=max_keep,
            )
            exhausted = bool(items) and not kept and not any(self._fits(c) for c in costs)
            taken = {id(items[i]) for i in kept}
            self.deferred = [d for d in self.deferred if id(d) not in taken]
            status = self._status(float(floor), did)
            self._release(mark)
            sel = Selection(
                sorted(kept),
                p,
                u,
                False,
                float(floor),
                [],
                dropped_by_budget=sorted(dropped),
                budget=status,
                exhausted=exhausted,
            )
            sel.revisited = [items[i] for i in sorted(kept)]
            return sel

    def spend(self, tokens: int) -> None:
        """Report the tokens one expansion really used: settles the oldest reservation (or, with none, is
        charged as it is; with ``charges=False`` nothing is charged); updates the running max used as the
        default cost estimate."""
        tokens = _amount(tokens, "tokens")
        with self._lock:
            if self.charges:
                reserved = self.pending.pop(0) if self.pending else 0
                self.budget.settle(reserved, tokens)
            self.max_spend = max(self.max_spend, tokens)

    def drop_deferred(self) -> list[Deferred]:
        """End of run: the deferred candidates never expanded (removed from ``deferred``)."""
        with self._lock:
            out, self.deferred = self.deferred, []
            return out

    # -- internals ---------------------------------------------------------------------------------------
    def _costs(self, costs, k: int) -> list[int]:
        if costs is None:
            return [self.estimate()] * k
        if isinstance(costs, (str, bytes)) or len(costs) != k:
            raise InputError(f"must have one cost per candidate ({k})", "costs")
        return [_amount(c, f"costs[{i}]") for i, c in enumerate(costs)]

    @staticmethod
    def _rank(p, u, costs, explicit: bool) -> list[int]:
        """Candidate indices best first: by p_keep, or with explicit costs by p_keep · max(ĝ, ε) / cost."""
        p = np.asarray(p, np.float64)
        if explicit:
            value = (
                p
                * np.maximum(np.asarray(u, np.float64), UTILITY_FLOOR)
                / np.maximum(np.asarray(costs, np.float64), 1.0)
            )
        else:
            value = p
        return sorted(range(len(p)), key=lambda i: (-float(value[i]), -float(p[i]), i))

    def _fits(self, cost: int) -> bool:
        return self.budget.can_afford(1, cost if self.budget.tokens is not None else 0)

    def _cap(self) -> int | None:
        """``max_share`` of the nodes left: the most one decision may admit (None: no cap)."""
        left = self.budget.remaining()["nodes"]
        return None if self.max_share is None or left is None else max(1, int(np.ceil(self.max_share * left)))

    def _mark(self) -> tuple[int, int, int]:
        """What a decision may change in the budget: spent nodes, reserved tokens, pending reservations."""
        return self.budget.spent_nodes, self.budget.reserved_tokens, len(self.pending)

    def _release(self, mark: tuple[int, int, int]) -> None:
        """With ``charges=False``: give back what the decision admitted (the caller charges what it spends)."""
        if not self.charges:
            self.budget.spent_nodes, self.budget.reserved_tokens = mark[0], mark[1]
            del self.pending[mark[2] :]

    def _take(self, i: int, cost: int) -> None:
        """Admit one candidate: charge its node and reserve its tokens."""
        self.budget.charge(nodes=1)
        if self.budget.tokens is not None:
            self.budget.reserve(cost)
            self.pending.append(int(cost))

    def _status(self, price: float, decision: int, tau: float | None = None) -> dict:
        """What a decision records: its id, the price it began at and the price after it, spent / reserved /
        remaining and the limits."""
        return {
            "decision": decision,
            "price": round(float(price), 6),
            "price_after": round(self.price(tau), 6),
            **self._spending(),
        }

    def _spending(self) -> dict:
        b = self.budget
        return {
            "spent_nodes": b.spent_nodes,
            "spent_tokens": b.spent_tokens,
            "reserved_tokens": b.reserved_tokens,
            "remaining": b.remaining(),
            "limit": {"nodes": b.nodes, "tokens": b.tokens},
        }

    def status(self) -> dict:
        """The run's budget now: its id, spent / reserved / remaining and the limits (as a decision records them),
        whether it is exhausted, the admission price now, ``defer``, the decisions made and the pending deferred
        candidates (``branchgate serve``'s ``GET /v1/runs/{run_id}``)."""
        with self._lock:
            return {
                "run_id": self.run_id,
                **self._spending(),
                "exhausted": bool(self.budget.exhausted),
                "price": round(self.price(), 6),
                "defer": self.defer,
                "decisions": self.decisions,
                "deferred": [d.to_json() for d in self.deferred],
            }

    def config(self) -> dict:
        """The run's budget and parameters (what a trace's run_start records)."""
        return {
            "budget_nodes": self.budget.nodes,
            "budget_tokens": self.budget.tokens,
            "defer": self.defer,
            "price_start": self.base_tau(),
            "price_end": self.price_end,
            "price_exponent": self.price_exponent,
            "defer_margin": self.defer_margin,
            "revisit_floor": self.revisit_floor,
            "tokens_per_node": self.tokens_per_node,
            "max_share": self.max_share,
        }

    # -- persistence -------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        with self._lock:
            return {
                "version": BUDGET_STATE_VERSION,
                "run_id": self.run_id,
                "budget": self.budget.to_json(),
                "defer": self.defer,
                "tau": self.tau,
                "max_keep": self.max_keep,
                "price_start": self.price_start,
                "price_end": self.price_end,
                "price_exponent": self.price_exponent,
                "defer_margin": self.defer_margin,
                "revisit_floor": self.revisit_floor,
                "tokens_per_node": self.tokens_per_node,
                "max_share": self.max_share,
                "charges": self.charges,
                "max_spend": self.max_spend,
                "pending": list(self.pending),
                "decisions": self.decisions,
                "deferred": [d.to_json() for d in self.deferred],
            }

    @classmethod
    def from_json(cls, obj, gate, where: str = "run state") -> RunGate:
        if not isinstance(obj, dict):
            raise InputError(f"must be an object, got {type(obj).__name__}", where)
        version = obj.get("version")
        if version != BUDGET_STATE_VERSION:
            raise InputError(f"unsupported run state version {version!r} (expected {BUDGET_STATE_VERSION})", where)
        try:
            run = cls(
                gate,
                Budget.from_json(obj.get("budget", {}), f"{where}.budget"),
                defer=bool(obj.get("defer")),
                run_id=obj.get("run_id"),
                tau=obj.get("tau"),
                max_keep=obj.get("max_keep"),
                price_start=obj.get("price_start"),
                price_end=obj.get("price_end", 1.0),
                price_exponent=obj.get("price_exponent", 2.0),
                defer_margin=obj.get("defer_margin", 0.15),
                revisit_floor=obj.get("revisit_floor"),
                tokens_per_node=obj.get("tokens_per_node"),
                max_share=obj.get("max_share"),
                charges=_flag(obj.get("charges", True), f"{where}.charges"),
            )
            run.max_spend = _amount(obj.get("max_spend", 0), f"{where}.max_spend")
            run.pending = [_amount(x, f"{where}.pending") for x in obj.get("pending", [])]
            run.decisions = _amount(obj.get("decisions", 0), f"{where}.decisions", MAX_TOTAL)
            run.deferred = [Deferred.from_json(d) for d in obj.get("deferred", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"malformed run state ({exc})", where) from None
        return run


def apply_decision(run: RunGate, d: dict, tau, max_keep) -> dict:
    """One parsed decision on an open run: its reported spends (every one checked before any is applied, so a bad
    one changes nothing), then a revisit or a select; the answer adds ``run_id``, and with ``end_run`` the
    ``never_expanded`` deferred candidates (dropped from the run). ``d`` holds ``state``, ``candidates``,
    ``costs``, ``spend`` (a list), ``revisit``, ``end_run`` and ``run_id`` (``branchgate gate``'s parsed decision);
    the CLI's state file and ``branchgate serve``'s runs both decide through this."""
    for tokens in [_amount(t, f"spend[{i}]") for i, t in enumerate(d.get("spend") or [])]:
        run.spend(tokens)
    if d.get("revisit"):
        sel = run.revisit(d["state"], max_keep=max_keep)
        answer = sel.to_json()
        answer["revisited"] = [r.to_json() for r in sel.revisited]
    else:
        sel = run.select(d["state"], d["candidates"], tau=tau, max_keep=max_keep, costs=d.get("costs"))
        answer = sel.to_json()
    answer["run_id"] = d.get("run_id", run.run_id)
    if d.get("end_run"):
        answer["never_expanded"] = [x.to_json() for x in run.drop_deferred()]
    return answer


def _flag(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"must be true or false, got {value!r}", where)
    return value
