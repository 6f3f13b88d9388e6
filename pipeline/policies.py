"""Stage policies parsed from a spec string.

Spec syntax (one per stage: ``--pre``, ``--post``, ``--synth``):

- ``none``                      keep everything (actor ``default``)
- ``<teacher>[:k=v,...]``       a teacher from ``branchgate.models.teachers`` (``NAMES``) with constructor
                                parameters (e.g. ``mmr:threshold=0.4,lam=0.5``) and the selection keys
                                ``max_items``, ``max_tokens``, ``mode`` (``select`` = greedy budgeted selection,
                                the default at pre-retrieval and pre-synthesis; ``gate`` = each item scored
                                independently against the context, the default at post-retrieval).
                                At pre-retrieval a teacher picks the level's breadth (4, 2, 2, ...) out of the
                                frame's oversampled candidates, greedily; its threshold applies there only
                                when the spec sets ``threshold`` explicitly.
- ``random:RATE``               keep each item with probability RATE (seeded per run and decision)
- ``gate:PATH[,tau=T][,root_tau=R][,greedy=1][,fallback=root]`` the learned controller
                                ``branchgate.inference.gate.Gate.load(PATH)`` (loaded on first use),
                                thresholded at its τ (or ``T``) with the top-1 fallback; with
                                ``greedy=1`` set-aware: keep the best candidate, re-score the rest as if it were
                                already expanded (appended to the retained context), repeat while the best
                                p_keep ≥ τ; ``fallback=root`` keeps the top-1 fallback at the root frame only
                                (a deeper frame whose candidates all fall below τ expands none: the branch
                                stops), an ablation of what the fallback costs below the root; ``root_tau=R``
                                thresholds the root frame at R instead (a root branch costs its whole subtree,
                                so it may need a higher bar than the deeper ones); with neither ``tau`` nor
                                ``root_tau`` the controller's own thresholds apply (its τ, and its root τ when
                                exported with one: ``Gate.thresholds``), ``tau=T`` alone applies T at every depth
- ``shallow:NODES``             pre-retrieval only: equal-budget shallow search — breadth/depth cut so the
                                whole tree (root included) has at most NODES nodes; the first candidates of
                                each frame, in order, are expanded (actor ``budget``); ``NODES`` may be left out
                                when a run budget is given (then the widest tree, cut by the budget)

Run budgets (pre-retrieval only; any policy): ``budget_nodes=N`` (at most N expanded subqueries; the root's
planning node is not counted) and/or ``budget_tokens=T`` (at most T LLM tokens in the run: plan, process,
follow-ups and synthesis calls, ``Ledger.llm_tokens()``), each an integer ≥ 0 or ``P%`` (P percent of the
query's reference run, ``Config.budget_reference``: the bench's unpruned run of the same query and seed).
``gate:PATH,budget_tokens=T`` spends the budget with the run-scoped gate (``Gate.run``: an admission price on
p_keep and ĝ); ``defer=1`` turns its deferral on (gate only). A baseline given a budget (``dpp:budget_tokens=T``,
``shallow:budget_tokens=T``) selects as usual and the run stops admitting an expansion the remaining budget
cannot afford (decision ``prune``, actor ``budget``). The run (``pipeline/run.py``) checks every expansion's
exact cost before committing it, so a budget is never exceeded.

At pre-retrieval and pre-synthesis a non-empty input never yields an empty selection; at post-retrieval it
may (a branch whose new evidence is all pruned spawns no follow-ups — how late pruning saves nodes).

Over 400 lines: every spec, its parsing and its clear errors live here, one place for the syntax.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from branchgate.decide import decide, threshold_at
from branchgate.errors import BranchgateError

STAGES = ("pre_retrieval", "post_retrieval", "pre_synthesis")
SELECTION_KEYS = ("max_items", "max_tokens", "mode")
BUDGET_KEYS = ("budget_nodes", "budget_tokens", "defer")
RUN_GATE_KEYS = ("price_start", "price_end", "price_exponent", "defer_margin", "revisit_floor")  # RunGate parameters


@dataclass(frozen=True)
class BudgetSpec:
    """A pre-retrieval policy's run budget as written in its spec; ``resolve`` gives one run's limits.

    ``nodes``/``tokens``: an absolute limit, or with ``*_pct`` set a percentage of the query's reference run."""

    nodes: int | None = None
    tokens: int | None = None
    nodes_pct: float | None = None
    tokens_pct: float | None = None
    defer: bool = False

    @property
    def relative(self) -> bool:
        return self.nodes_pct is not None or self.tokens_pct is not None

    def resolve(self, reference: dict | None, where: str = "") -> tuple[int | None, int | None]:
        """``(nodes, tokens)`` limits of one run; ``reference`` = the query's reference totals (``nodes``,
        ``tokens``), needed by a percentage. Percent budgets round down (never above the share)."""
        def one(fixed, pct, key):
            if pct is None:
                return fixed
            if not reference or reference.get(key) is None:
                raise BranchgateError(f"budget_{key}={pct:g}% needs the query's reference run (Config.budget_reference, "
                                      f"simulate --budget-reference){': ' + where if where else ''}")
            base = reference[key] - 1 if key == "nodes" else reference[key]  # nodes: expanded subqueries
            return int(math.floor(pct / 100.0 * max(0.0, float(base)) + 1e-9))
        return one(self.nodes, self.nodes_pct, "nodes"), one(self.tokens, self.tokens_pct, "tokens")


@dataclass
class Choice:
    kept: list[int]
    scores: list[float | None]
    p_keep: list[float | None]
    # a run-scoped gate's decision (``GatePolicy.choose_run``):
    deferred: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)  # the budget could not afford them
    exhausted: bool = False
    status: dict | None = None  # the run-scoped gate's budget status (price, spent, remaining)


class Policy:
    spec: str = "none"
    actor: str = "default"
    needs_embeddings: bool = False
    prunes: bool = False
    budget: BudgetSpec | None = None  # a run budget (pre-retrieval only)

    def start_run(self, run_id: str, nodes: int | None = None, tokens: int | None = None):
        """Per-run hook (a policy object is shared by the runs of a process): called once at the start of every
        run with that run's budget limits. Returns the run-scoped gate for policies that have one, else None."""
        return None

    def choose(self, x, state, stage: str, rng: random.Random) -> Choice:
        n = len(x)
        return Choice(list(range(n)), [None] * n, [None] * n)


@dataclass
class NonePolicy(Policy):
    spec: str = "none"


@dataclass
class TeacherPolicy(Policy):
    model: object = None
    spec: str = ""
    mode: str | None = None
    max_items: int | None = None
    max_tokens: float | None = None
    explicit_threshold: bool = False
    needs_embeddings: bool = True
    prunes: bool = True

    @property
    def actor(self) -> str:
        return f"teacher:{self.model.name}"

    def choose(self, x, state, stage, rng) -> Choice:
        from branchgate.models.teachers import select

        n = len(x)
        if n == 0:
            return Choice([], [], [])
        scores = np.asarray(self.model.score(x, state), dtype=np.float64)
        mode = self.mode or ("gate" if stage == "post_retrieval" else "select")
        if mode == "gate":
            kept = decide(scores, self.model.threshold, higher_is_better=getattr(self.model, "higher_is_better", True),
                          max_keep=self.max_items, fallback=stage != "post_retrieval").kept
        elif stage == "pre_retrieval":
            # choose the frame's breadth out of the (oversampled) candidates; the threshold applies only
            # when the spec sets one explicitly
            max_items = self.max_items or (state.extra or {}).get("breadth")
            kept = sorted(select(self.model, x, state, max_items=max_items, max_tokens=self.max_tokens,
                                 use_threshold=self.explicit_threshold))
        else:
            kept = sorted(select(self.model, x, state, max_items=self.max_items, max_tokens=self.max_tokens))
        return Choice(kept, [float(s) for s in scores], [None] * n)


@dataclass
class RandomPolicy(Policy):
    rate: float = 0.5
    spec: str = ""
    actor: str = "random"
    prunes: bool = True

    def choose(self, x, state, stage, rng) -> Choice:
        n = len(x)
        draws = [rng.random() for _ in range(n)]
        kept = [i for i in range(n) if draws[i] < self.rate]
        if not kept and n and stage != "post_retrieval":
            kept = [rng.randrange(n)]
        return Choice(kept, [float(1 - d) for d in draws], [self.rate] * n)


@dataclass
class GatePolicy(Policy):
    path: str = ""
    spec: str = ""
    tau: float | None = None  # overrides the controller's τ (at every depth, unless root_tau is given too)
    greedy: bool = False  # set-aware selection (see the module docstring)
    fallback_root_only: bool = False  # fallback=root: below the root a frame may keep none
    root_tau: float | None = None  # root_tau=R: the root frame's τ (neither given: the controller's own, Gate.thresholds)
    actor: str = "controller:gate"
    prunes: bool = True
    _gate: object = field(default=None, repr=False)

    run_options: dict = field(default_factory=dict)  # RunGate parameters from the spec (price_*, defer_margin)

    @property
    def model(self):
        if self._gate is None:
            self._gate = _shared_gate(self.path)
        return self._gate

    def start_run(self, run_id: str, nodes: int | None = None, tokens: int | None = None):
        """With a run budget: this run's ``RunGate`` (``Gate.run``), which ``choose_run`` then asks."""
        if self.budget is None:
            return None
        return self.model.run(budget_nodes=nodes, budget_tokens=tokens, defer=self.budget.defer, run_id=run_id,
                              tau=self.tau, **self.run_options)

    def choose_run(self, run_gate, state, cands, costs: list[int] | None, keys: list[str]) -> Choice:
        """One decision of a budgeted run: ``run_gate.select`` with the candidates' exact costs."""
        sel = run_gate.select(state, [{"query": c.query, "goal": c.goal} for c in cands], costs=costs, keys=keys)
        p = [float(v) for v in sel.p_keep]
        return Choice(list(sel.kept), p, list(p), deferred=list(sel.deferred), dropped=list(sel.dropped_by_budget),
                      exhausted=bool(sel.exhausted), status=sel.budget)

    def choose(self, x, state, stage, rng) -> Choice:
        if len(x) == 0:
            return Choice([], [], [])
        model = self.model
        p = np.asarray(model.score(x, state), dtype=np.float64)
        depth = int(state.depth or 0)
        tau = threshold_at(depth, *model.thresholds(self.tau, self.root_tau))
        fallback = stage != "post_retrieval" and not (self.fallback_root_only and depth > 0)
        if self.greedy:
            kept = self._greedy(model, x, state, p, tau, fallback=fallback)
        else:
            kept = decide(p, tau, fallback=fallback).kept
        return Choice(kept, [float(v) for v in p], [float(v) for v in p])

    @staticmethod
    def _greedy(model, x, state, p: np.ndarray, tau: float, fallback: bool) -> list[int]:
        """Set-aware keep: the best candidate, then the rest re-scored with it in the retained context."""
        from branchgate.inference.inputs import DecisionState

        root = state.query.texts[0] if len(state.query.texts) else ""
        retained = list(state.context.texts)
        kept: list[int] = []
        rest, scores = list(range(len(p))), p
        while rest:
            j = int(np.argmax(scores))
            if scores[j] < tau and (kept or not fallback):
                break
            kept.append(rest.pop(j))
            retained.append(x.texts[kept[-1]])
            if not rest:
                break
            st = DecisionState(root, state.frame_query or "", state.parent_goal or "", retained, int(state.depth or 0))
            scores = np.asarray(model.predict(st, [x.texts[i] for i in rest])[0], dtype=np.float64)
        return sorted(kept)


_GATES: dict[str, object] = {}  # one Gate per controller file and process: the τ points of a sweep share its embeddings
GATE_CACHE = 50_000  # texts whose embeddings a pipeline Gate keeps (a sweep re-scores the same queries' texts)


def _shared_gate(path: str):
    from pathlib import Path

    try:
        from branchgate.inference.gate import Gate
    except ImportError as exc:
        raise BranchgateError(f"gate:{path}: the learned gate is not available ({exc})") from None
    p = Path(path)
    key = f"{p.resolve()}|{p.stat().st_mtime_ns if p.exists() else ''}"  # a file rewritten in place is reloaded
    if key not in _GATES:
        _GATES[key] = Gate.load(path, cache_size=GATE_CACHE)
    return _GATES[key]


SHALLOW_UNLIMITED = 1 << 30  # ``shallow:budget_tokens=T`` without NODES: the widest tree, cut by the run budget


@dataclass
class ShallowPolicy(Policy):
    """Equal-budget shallow search; ``plan`` fixes per-level breadth and depth from the run's shape."""

    nodes: int = 0
    spec: str = ""
    actor: str = "budget"
    prunes: bool = True
    levels: list[int] = field(default_factory=list)  # expansions per frame at each level

    def plan(self, candidates_per_level: list[int]) -> list[int]:
        self.levels = shallow_levels(self.nodes - 1, candidates_per_level)
        return self.levels

    def choose(self, x, state, stage, rng) -> Choice:
        n = len(x)
        depth = int(state.depth or 0)
        keep = self.levels[depth] if depth < len(self.levels) else 0
        budget = state.extra.get("budget_left", n)
        k = max(0, min(n, keep, budget))
        return Choice(list(range(k)), [None] * n, [None] * n)


def shallow_levels(expansions: int, candidates_per_level: list[int]) -> list[int]:
    """Per-level breadth of the largest full tree with at most ``expansions`` expanded nodes.

    Trees follow GPT-Researcher's shape — breadth b at the first level, then max(2, b // 2) (b itself when
    b < 2) — capped by the candidates each frame has and by the configured depth. Ties prefer the wider,
    shallower tree. A budget below one expansion expands nothing.
    """
    best: tuple[int, int, list[int]] = (0, 0, [])
    for b in range(1, (candidates_per_level[0] if candidates_per_level else 0) + 1):
        for d in range(1, len(candidates_per_level) + 1):
            levels, width, total, frames = [], b, 0, 1
            for lvl in range(d):
                w = min(width, candidates_per_level[lvl])
                levels.append(w)
                frames *= w
                total += frames
                width = max(2, width // 2) if width >= 2 else 1
            if total <= expansions and (total, b) > best[:2]:
                best = (total, b, levels)
    return best[2]


def _number_option(opts: dict, key: str, flag: str, spec: str, positive: bool = False) -> float:
    """A spec's numeric option ``key``: a finite number in [0, 1] (``positive``: any finite number > 0)."""
    try:
        value = float(opts[key])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value > 0 if positive else 0.0 <= value <= 1.0)):
        need = "a number > 0" if positive else "in [0, 1]" if value == value else "a number"
        raise BranchgateError(f"{flag} {spec}: {key} must be {need}, got {opts[key]!r}")
    return value


def parse(spec: str | None, stage: str) -> Policy:
    """A stage policy from its spec (see the module docstring)."""
    if stage not in STAGES:
        raise BranchgateError(f"unknown stage {stage!r}")
    spec = (spec or "none").strip()
    name, _, arg = spec.partition(":")
    name = name.strip().lower()
    flag = {"pre_retrieval": "--pre", "post_retrieval": "--post", "pre_synthesis": "--synth"}[stage]
    trailing_only = name == "gate"  # a controller path may hold commas: only its trailing key=value pieces count
    try:
        arg, opts = _split_keys(arg, BUDGET_KEYS + (("tau", "root_tau", "greedy", "fallback", *RUN_GATE_KEYS) if name == "gate" else ()),
                                trailing_only)
    except BranchgateError as exc:
        raise BranchgateError(f"{flag} {spec}: {exc}") from None
    budget = _budget(opts, flag, spec, stage, name)
    policy = _parse(name, arg, opts, spec, stage, flag, budget)
    policy.budget = budget
    return policy


def _split_keys(arg: str, keys: tuple[str, ...], trailing_only: bool) -> tuple[str, dict[str, str]]:
    """``arg`` without its ``key=value`` pieces of ``keys`` (the first occurrence of a key wins), and those."""
    pieces, opts = arg.split(","), {}
    if trailing_only:
        while len(pieces) > 1 and "=" in pieces[-1] and pieces[-1].partition("=")[0].strip() in keys:
            key, _, value = pieces.pop().partition("=")
            opts.setdefault(key.strip(), value.strip())
        return ",".join(pieces), opts
    rest = []
    for piece in pieces:
        key, eq, value = piece.partition("=")
        if eq and key.strip() in keys:
            if key.strip() in opts:
                raise BranchgateError(f"{key.strip()} is given twice")
            opts[key.strip()] = value.strip()
        else:
            rest.append(piece)
    return ",".join(rest), opts


def _budget(opts: dict[str, str], flag: str, spec: str, stage: str, name: str) -> BudgetSpec | None:
    """The spec's run budget (``budget_nodes``, ``budget_tokens``, ``defer``), checked; None without one."""
    given = [k for k in BUDGET_KEYS if k in opts]
    if not given:
        return None
    if stage != "pre_retrieval":
        raise BranchgateError(f"{flag} {spec}: {', '.join(given)}: run budgets are a pre-retrieval setting (use --pre)")
    defer = opts.get("defer", "0")
    if defer not in ("0", "1"):
        raise BranchgateError(f"{flag} {spec}: defer must be 0 or 1, got {defer!r}")
    if given == ["defer"] and defer == "0":
        return None
    if defer == "1" and name != "gate":
        raise BranchgateError(f"{flag} {spec}: defer=1 is the run-scoped gate's deferral (gate:PATH,...,defer=1); "
                              f"{name} has none")
    out: dict = {"defer": defer == "1"}
    for key in ("nodes", "tokens"):
        raw = opts.get(f"budget_{key}")
        if raw is None:
            continue
        what = "expanded subqueries" if key == "nodes" else "LLM tokens per run"
        if raw.endswith("%"):
            try:
                pct = float(raw[:-1])
            except ValueError:
                pct = float("nan")
            if not math.isfinite(pct) or pct < 0:
                raise BranchgateError(f"{flag} {spec}: budget_{key}={raw!r}: expected P% with P a number ≥ 0 "
                                      "(a share of the query's reference run)")
            out[f"{key}_pct"] = pct
            continue
        try:
            value = int(raw)
        except ValueError:
            raise BranchgateError(f"{flag} {spec}: budget_{key}={raw!r}: expected an integer ≥ 0 ({what}) or P% "
                                  "(a share of the query's reference run)") from None
        if value < 0:
            raise BranchgateError(f"{flag} {spec}: budget_{key} must be ≥ 0 ({what}), got {value}")
        out[key] = value
    if "nodes" not in out and "nodes_pct" not in out and "tokens" not in out and "tokens_pct" not in out:
        raise BranchgateError(f"{flag} {spec}: defer=1 needs a run budget (budget_nodes=N or budget_tokens=T)")
    return BudgetSpec(**out)


def _parse(name: str, arg: str, opts: dict, spec: str, stage: str, flag: str, budget: BudgetSpec | None) -> Policy:
    if name == "none":
        if arg:
            raise BranchgateError(f"{flag} {spec}: 'none' takes no argument but a run budget")
        return NonePolicy(spec=spec)
    if name == "random":
        try:
            rate = float(arg)
        except ValueError:
            raise BranchgateError(f"{flag} {spec}: expected random:RATE with RATE in [0, 1]") from None
        if not 0 <= rate <= 1:
            raise BranchgateError(f"{flag} {spec}: RATE must be in [0, 1]")
        return RandomPolicy(rate=rate, spec=spec)
    if name == "gate":
        path = arg
        if not path:
            raise BranchgateError(f"{flag} {spec}: expected gate:PATH[,tau=T][,root_tau=R][,greedy=1][,fallback=root][,budget_nodes=N|budget_tokens=T]"
                                  "[,defer=1] (a controller.onnx or its folder)")
        tau, root_tau = (_number_option(opts, key, flag, spec) if opts.get(key) else None for key in ("tau", "root_tau"))
        if budget is not None and root_tau is not None:
            raise BranchgateError(f"{flag} {spec}: root_tau and a run budget do not combine (the run-scoped gate "
                                  "sets its own price)")
        if opts.get("greedy", "0") not in ("0", "1"):
            raise BranchgateError(f"{flag} {spec}: greedy must be 0 or 1, got {opts['greedy']!r}")
        if opts.get("fallback", "all") not in ("all", "root"):
            raise BranchgateError(f"{flag} {spec}: fallback must be all or root, got {opts['fallback']!r}")
        if budget is not None and opts.get("fallback", "all") != "all":
            raise BranchgateError(f"{flag} {spec}: fallback=root and a run budget do not combine (the run-scoped "
                                  "gate decides when a branch stops)")
        if budget is not None and opts.get("greedy") == "1":
            raise BranchgateError(f"{flag} {spec}: greedy=1 and a run budget do not combine (the run-scoped gate "
                                  "chooses under the budget)")
        run_options = {}
        for key in RUN_GATE_KEYS:
            if key not in opts:
                continue
            if budget is None:
                raise BranchgateError(f"{flag} {spec}: {key} is a run-budget setting (give budget_nodes or budget_tokens)")
            run_options[key] = _number_option(opts, key, flag, spec, positive=key == "price_exponent")
        return GatePolicy(path=path, spec=spec, tau=tau, root_tau=root_tau, greedy=opts.get("greedy") == "1",
                          fallback_root_only=opts.get("fallback") == "root", run_options=run_options)
    if name == "shallow":
        if stage != "pre_retrieval":
            raise BranchgateError(f"{flag} {spec}: shallow:NODES is a pre-retrieval policy (use it with --pre)")
        if not arg.strip() and budget is not None:
            return ShallowPolicy(nodes=SHALLOW_UNLIMITED, spec=spec)
        try:
            nodes = int(arg)
        except ValueError:
            raise BranchgateError(f"{flag} {spec}: expected shallow:NODES with an integer node budget") from None
        if nodes < 1:
            raise BranchgateError(f"{flag} {spec}: NODES must be ≥ 1 (the root counts as one node)")
        return ShallowPolicy(nodes=nodes, spec=spec)
    from branchgate.models import teachers

    if name not in teachers.NAMES:
        raise BranchgateError(f"{flag} {spec}: unknown policy {name!r}; use none, random:RATE, gate:PATH, "
                              f"shallow:NODES or a teacher: {', '.join(teachers.NAMES)}")
    params = _params(arg, flag, spec)
    sel = {k: params.pop(k) for k in SELECTION_KEYS if k in params}
    if sel.get("mode") not in (None, "gate", "select"):
        raise BranchgateError(f"{flag} {spec}: mode must be gate or select")
    max_items = sel.get("max_items")
    if max_items is not None and (not float(max_items).is_integer() or max_items < 1):
        raise BranchgateError(f"{flag} {spec}: max_items must be a positive integer")
    try:
        model = teachers.get(name, **params)
    except TypeError as exc:
        raise BranchgateError(f"{flag} {spec}: {exc}") from None
    return TeacherPolicy(model=model, spec=spec, mode=sel.get("mode"), explicit_threshold="threshold" in params,
                         max_items=None if max_items is None else int(max_items), max_tokens=sel.get("max_tokens"))


def _params(arg: str, flag: str, spec: str) -> dict:
    out: dict = {}
    for part in filter(None, (p.strip() for p in arg.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise BranchgateError(f"{flag} {spec}: expected key=value, got {part!r}")
        key, value = key.strip(), value.strip()
        if key == "mode":
            out[key] = value
            continue
        try:
            num = float(value)
        except ValueError:
            raise BranchgateError(f"{flag} {spec}: {key}={value!r} is not a number") from None
        if not math.isfinite(num):
            raise BranchgateError(f"{flag} {spec}: {key} must be finite")
        out[key] = num
    return out
