"""Stage policies (none, a teacher, random, the learned gate, the learned read gate, shallow) and ``parse``, which
builds one from its spec.

Spec syntax: ``pipeline/policy_spec.py``, which also holds the spec's key, number and run-budget parsing.

Over 400 lines: every stage's policies and ``parse``, which checks each spec's keys against its policy and stage,
in one file, so that what a spec may say at each stage reads in one place.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from branchgate.decide import decide, threshold_at
from branchgate.errors import BranchgateError
from branchgate.inference.inputs import DecisionState
from branchgate.models import teachers
from branchgate.models.teachers import select
from branchgate.pipeline.policy_spec import (
    BUDGET_KEYS,
    ITEM_STAGES,
    RUN_GATE_KEYS,
    SELECTION_KEYS,
    BudgetSpec,
    _budget,
    _number_option,
    _params,
    _split_keys,
)

STAGES = ("pre_retrieval", "read", "post_retrieval", "pre_synthesis")
FLAGS = {
    "pre_retrieval": "--pre-policy",
    "read": "--read-policy",
    "post_retrieval": "--post-policy",
    "pre_synthesis": "--synth-policy",
}
READ_CONTROLLER = "read"  # ``Gate.stage`` of a read controller ("pre", or no ``stage``: a pre-retrieval one)


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

    def check(self) -> None:
        """Load what the policy reads from a file (a controller) and check it fits the policy's stage; raises
        ``BranchgateError`` naming the option otherwise. Nothing to do for policies without a file."""

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

    @property
    def higher_is_better(self) -> bool:
        return getattr(self.model, "higher_is_better", True)

    def gate_threshold(self, stage: str) -> float:
        """The threshold of mode ``gate``: the teacher's own, except at the read and post-retrieval stages with
        ``max_items`` and no ``threshold`` in the spec, where every score passes (``max_items=K`` alone keeps the
        top K of each list: a teacher's second knob, so that the bench can sweep it into a curve)."""
        if stage in ITEM_STAGES and self.max_items is not None and not self.explicit_threshold:
            return -math.inf if self.higher_is_better else math.inf
        return self.model.threshold

    def choose(self, x, state, stage, rng) -> Choice:
        n = len(x)
        if n == 0:
            return Choice([], [], [])
        scores = np.asarray(self.model.score(x, state), dtype=np.float64)
        mode = self.mode or ("gate" if stage in ITEM_STAGES else "select")
        if mode == "gate":
            kept = decide(
                scores,
                self.gate_threshold(stage),
                higher_is_better=self.higher_is_better,
                max_keep=self.max_items,
                fallback=stage not in ITEM_STAGES,
            ).kept
        elif stage == "pre_retrieval":
            # choose the frame's breadth out of the (oversampled) candidates; the threshold applies only
            # when the spec sets one explicitly
            max_items = self.max_items or (state.extra or {}).get("breadth")
            kept = sorted(
                select(
                    self.model,
                    x,
                    state,
                    max_items=max_items,
                    max_tokens=self.max_tokens,
                    use_threshold=self.explicit_threshold,
                )
            )
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
        if not kept and n and stage not in ITEM_STAGES:
            kept = [rng.randrange(n)]
        return Choice(kept, [float(1 - d) for d in draws], [self.rate] * n)


@dataclass
class ControllerPolicy(Policy):
    """A learned controller file at one stage, loaded once on first use (``model``); ``check`` refuses a controller
    of the other stage (a read controller at ``--pre``/``--post``, a pre-retrieval one at ``--read``)."""

    path: str = ""
    spec: str = ""
    tau: float | None = None  # overrides the controller's τ
    actor: str = "controller:gate"
    prunes: bool = True
    flag: str = "--pre-policy"  # the option that gave the spec (error messages)
    _gate: object = field(default=None, repr=False)
    reads: ClassVar[bool] = False  # decides result lists (a read controller)

    @property
    def model(self):
        self.check()
        return self._gate

    def check(self) -> None:
        if self._gate is None:
            self._gate = _controller(self.path, self.spec, self.flag, read=self.reads)


@dataclass
class GatePolicy(ControllerPolicy):
    """The learned pre-retrieval controller (``gate:PATH[,...]``); ``tau`` applies at every depth unless
    ``root_tau`` is given too."""

    greedy: bool = False  # set-aware selection (see ``policy_spec``'s docstring)
    fallback_root_only: bool = False  # fallback=root: below the root a frame may keep none
    root_tau: float | None = None  # root_tau=R: the root frame's τ (neither given: the controller's own)
    run_options: dict = field(default_factory=dict)  # RunGate parameters from the spec (price_*, defer_margin)

    def start_run(self, run_id: str, nodes: int | None = None, tokens: int | None = None):
        """With a run budget: this run's ``RunGate`` (``Gate.run``), which ``choose_run`` then asks. It charges
        nothing itself: the run charges exact costs to the same ledger (``pipeline/exact_costs.py``)."""
        if self.budget is None:
            return None
        return self.model.run(
            budget_nodes=nodes,
            budget_tokens=tokens,
            defer=self.budget.defer,
            run_id=run_id,
            tau=self.tau,
            charges=False,
            **self.run_options,
        )

    def choose_run(self, run_gate, state, cands, costs: list[int] | None, keys: list[str]) -> Choice:
        """One decision of a budgeted run: ``run_gate.select`` with the candidates' exact costs."""
        sel = run_gate.select(state, [{"query": c.query, "goal": c.goal} for c in cands], costs=costs, keys=keys)
        p = [float(v) for v in sel.p_keep]
        return Choice(
            list(sel.kept),
            p,
            list(p),
            deferred=list(sel.deferred),
            dropped=list(sel.dropped_by_budget),
            exhausted=bool(sel.exhausted),
            status=sel.budget,
        )

    def choose(self, x, state, stage, rng) -> Choice:
        if len(x) == 0:
            return Choice([], [], [])
        model = self.model
        p = np.asarray(model.score(x, state), dtype=np.float64)
        depth = int(state.depth or 0)
        tau = threshold_at(depth, *model.thresholds(self.tau, self.root_tau))
        fallback = stage not in ITEM_STAGES and not (self.fallback_root_only and depth > 0)
        if self.greedy:
            kept = self._greedy(model, x, state, p, tau, fallback=fallback)
        else:
            kept = decide(p, tau, fallback=fallback).kept
        return Choice(kept, [float(v) for v in p], [float(v) for v in p])

    @staticmethod
    def _greedy(model, x, state, p: np.ndarray, tau: float, fallback: bool) -> list[int]:
        """Set-aware keep: ``decide`` one candidate at a time (the best, if it passes τ; the top-1 fallback only
        for the first), then re-score the rest with it in the retained context."""
        root = state.query.texts[0] if len(state.query.texts) else ""
        retained = list(state.context.texts)
        kept: list[int] = []
        rest, scores = list(range(len(p))), p
        while rest:
            best = decide(scores, tau, max_keep=1, fallback=fallback and not kept).kept
            if not best:
                break
            kept.append(rest.pop(best[0]))
            retained.append(x.texts[kept[-1]])
            if not rest:
                break
            st = DecisionState(root, state.frame_query or "", state.parent_goal or "", retained, int(state.depth or 0))
            scores = np.asarray(model.predict(st, [x.texts[i] for i in rest])[0], dtype=np.float64)
        return sorted(kept)


@dataclass
class ReadGatePolicy(ControllerPolicy):
    """The learned read controller at the read stage (``gate:PATH[,tau=T][,floor=root]`` given to ``--read``):
    ``Gate.select(state, hits, tau=, floor=)`` on each result list; reads the hits it keeps (possibly none)."""

    floor: str | None = None  # "root": read the top hit of a root-frame list when none passes τ
    flag: str = "--read-policy"
    reads: ClassVar[bool] = True

    def choose_hits(self, state: dict, hits: list[dict]) -> Choice:
        """One result list: ``state`` = {root_query, query, goal, read, read_ids, depth}, ``hits`` = [{id, title,
        snippet, rank}]; kept = the indices of the hits to read, scores = p_keep."""
        if not hits:
            return Choice([], [], [])
        sel = self.model.select(state, hits, tau=self.tau, floor=self.floor)
        p = [float(v) if math.isfinite(v) else None for v in np.asarray(sel.p_keep, dtype=np.float64).reshape(-1)]
        return Choice(sorted(int(i) for i in sel.kept), p, list(p))  # None: not scored (the Gate's not_new)

    def choose(self, x, state, stage, rng) -> Choice:
        raise BranchgateError(f"--read-policy {self.spec}: a read controller decides result lists only (choose_hits)")


_GATES: dict[str, object] = {}  # one Gate per controller file and process: the τ points of a sweep share its embeddings
GATE_CACHE = 50_000  # texts whose embeddings a pipeline Gate keeps (a sweep re-scores the same queries' texts)


def _shared_gate(path: str):
    try:
        from branchgate.inference.gate import Gate
    except ImportError as exc:
        raise BranchgateError(f"gate:{path}: the learned gate is not available ({exc})") from None
    p = Path(path)
    key = f"{p.resolve()}|{p.stat().st_mtime_ns if p.exists() else ''}"  # a file rewritten in place is reloaded
    if key not in _GATES:
        _GATES[key] = Gate.load(path, cache_size=GATE_CACHE)
    return _GATES[key]


def _controller(path: str, spec: str, flag: str, read: bool):
    """The shared Gate of ``path``, checked to be the kind ``flag`` takes: a read controller (``Gate.stage`` "read")
    for ``--read`` (``read``), a pre-retrieval one (any other stage; a Gate without ``stage`` is one) elsewhere."""
    gate = _shared_gate(path)
    stage = getattr(gate, "stage", None)
    if read and stage != READ_CONTROLLER:
        raise BranchgateError(
            f"{flag} {spec}: {path} is a pre-retrieval controller (Gate.stage {stage!r}), not a read controller; "
            "--read-policy takes a controller trained on read decisions (stage 'read')"
        )
    if not read and stage == READ_CONTROLLER:
        raise BranchgateError(
            f"{flag} {spec}: {path} is a read controller (Gate.stage 'read'): it decides which hits to read; "
            "give it to --read-policy"
        )
    return gate


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


def parse(spec: str | None, stage: str) -> Policy:
    """A stage policy from its spec (syntax: ``policy_spec``'s docstring)."""
    if stage not in STAGES:
        raise BranchgateError(f"unknown stage {stage!r}")
    spec = (spec or "none").strip()
    name, _, arg = spec.partition(":")
    name = name.strip().lower()
    flag = FLAGS[stage]
    trailing_only = name == "gate"  # a controller path may hold commas: only its trailing key=value pieces count
    try:
        arg, opts = _split_keys(
            arg,
            BUDGET_KEYS
            + (("tau", "root_tau", "greedy", "fallback", "floor", *RUN_GATE_KEYS) if name == "gate" else ()),
            trailing_only,
        )
    except BranchgateError as exc:
        raise BranchgateError(f"{flag} {spec}: {exc}") from None
    budget = _budget(opts, flag, spec, stage, name)
    policy = _parse(name, arg, opts, spec, stage, flag, budget)
    policy.budget = budget
    return policy


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
    if name == "gate" and stage == "read":
        return _read_gate(arg, opts, spec)
    if name == "gate":
        path = arg
        if "floor" in opts:
            raise BranchgateError(
                f"{flag} {spec}: floor=root is a read-stage setting (--read-policy gate:PATH,floor=root)"
            )
        if not path:
            raise BranchgateError(
                f"{flag} {spec}: expected gate:PATH[,tau=T][,root_tau=R][,greedy=1][,fallback=root]"
                "[,budget_nodes=N|budget_tokens=T][,defer=1] (a controller.onnx or its folder)"
            )
        tau, root_tau = (
            _number_option(opts, key, flag, spec) if opts.get(key) else None for key in ("tau", "root_tau")
        )
        if budget is not None and root_tau is not None:
            raise BranchgateError(
                f"{flag} {spec}: root_tau and a run budget do not combine (the run-scoped gate sets its own price)"
            )
        if opts.get("greedy", "0") not in ("0", "1"):
            raise BranchgateError(f"{flag} {spec}: greedy must be 0 or 1, got {opts['greedy']!r}")
        if opts.get("fallback", "all") not in ("all", "root"):
            raise BranchgateError(f"{flag} {spec}: fallback must be all or root, got {opts['fallback']!r}")
        if budget is not None and opts.get("fallback", "all") != "all":
            raise BranchgateError(
                f"{flag} {spec}: fallback=root and a run budget do not combine (the run-scoped "
                "gate decides when a branch stops)"
            )
        if budget is not None and opts.get("greedy") == "1":
            raise BranchgateError(
                f"{flag} {spec}: greedy=1 and a run budget do not combine (the run-scoped gate "
                "chooses under the budget)"
            )
        run_options = {}
        for key in RUN_GATE_KEYS:
            if key not in opts:
                continue
            if budget is None:
                raise BranchgateError(
                    f"{flag} {spec}: {key} is a run-budget setting (give budget_nodes or budget_tokens)"
                )
            run_options[key] = _number_option(opts, key, flag, spec, positive=key == "price_exponent")
        return GatePolicy(
            path=path,
            spec=spec,
            flag=flag,
            tau=tau,
            root_tau=root_tau,
            greedy=opts.get("greedy") == "1",
            fallback_root_only=opts.get("fallback") == "root",
            run_options=run_options,
        )
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

    if name not in teachers.NAMES:
        raise BranchgateError(
            f"{flag} {spec}: unknown policy {name!r}; use none, random:RATE, gate:PATH, "
            f"{'' if stage == 'read' else 'shallow:NODES '}or a teacher: {', '.join(teachers.NAMES)}"
        )
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
    return TeacherPolicy(
        model=model,
        spec=spec,
        mode=sel.get("mode"),
        explicit_threshold="threshold" in params,
        max_items=None if max_items is None else int(max_items),
        max_tokens=sel.get("max_tokens"),
    )


def _read_gate(path: str, opts: dict, spec: str) -> ReadGatePolicy:
    """``--read-policy gate:PATH[,tau=T][,floor=root]``: the read controller's policy (loaded on first use)."""
    if not path:
        raise BranchgateError(
            f"--read-policy {spec}: expected gate:PATH[,tau=T][,floor=root] (a read controller's controller.onnx "
            "or its folder)"
        )
    other = [k for k in opts if k not in ("tau", "floor")]
    if other:
        raise BranchgateError(
            f"--read-policy {spec}: {', '.join(other)}: not a read-stage setting (the read controller takes tau=T "
            "and floor=root)"
        )
    if opts.get("floor", "root") != "root":
        raise BranchgateError(f"--read-policy {spec}: floor must be root, got {opts['floor']!r}")
    tau = _number_option(opts, "tau", "--read-policy", spec) if opts.get("tau") else None
    return ReadGatePolicy(path=path, spec=spec, tau=tau, floor=opts.get("floor"))
