"""The stage-policy spec syntax and its generic parsing: ``key=value`` splitting, numeric options and run
budgets (``BudgetSpec``); ``policies.parse`` builds a stage's policy from a spec with these.

Spec syntax (one per stage: ``--pre``, ``--read``, ``--post``, ``--synth``):

- ``none``                      keep everything (actor ``default``)
- ``<teacher>[:k=v,...]``       a teacher from ``branchgate.models.teachers`` (``NAMES``) with constructor
                                parameters (e.g. ``mmr:threshold=0.4,lam=0.5``) and the selection keys
                                ``max_items``, ``max_tokens``, ``mode`` (``select`` = greedy budgeted selection,
                                the default at pre-retrieval and pre-synthesis; ``gate`` = each item scored
                                independently against the context, the default at the read stage and at
                                post-retrieval).
                                At pre-retrieval a teacher picks the level's breadth (4, 2, 2, ...) out of the
                                frame's oversampled candidates, greedily; its threshold applies there only
                                when the spec sets ``threshold`` explicitly.
                                At the read stage a teacher scores each hit's text (``texts.hit_text`` of its
                                title and snippet) against the texts of the hits read before in the run;
                                ``threshold`` (its own knob) and ``max_items=K`` (the best K of each result
                                list) each sweep it into a curve: with ``max_items`` and no ``threshold`` it
                                keeps the top K whatever their scores, with both the best K of those passing the
                                threshold, with neither the hits passing its default threshold. The same two
                                knobs hold at post-retrieval, where the teacher scores each new passage's full
                                text against the run's context.
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
- ``gate:PATH[,tau=T][,floor=root]`` at the read stage (``--read``): the learned read controller (``Gate.load``;
                                its ``stage`` must be "read", and a read controller is refused at the other
                                stages), ``Gate.select(state, hits, tau=T, floor=...)`` on each result list:
                                reads the hits with p_keep ≥ τ, none when none passes; ``floor=root`` reads the
                                top hit of a root-frame list (depth 0) when none passes
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

At pre-retrieval and pre-synthesis a non-empty input never yields an empty selection; at the read stage and at
post-retrieval it may (``ITEM_STAGES``: a branch that reads nothing, or whose new evidence is all pruned, makes no
process call and spawns no follow-ups — how late pruning saves nodes).

The read stage (``--read``, default ``none`` = read every hit offered) decides, once a sub-query's search has
returned its result list and before any hit is read, which of the hits new to the run to read. Each hit is shown
as a search engine shows it: title "" (the reference pipeline has none) and snippet = the first
``Config.snippet_words`` words of its passage. A skipped hit is neither processed nor seen: a later search may
offer it again. The hits read go on to the post-retrieval stage (on their full text) as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from branchgate.errors import BranchgateError

SELECTION_KEYS = ("max_items", "max_tokens", "mode")
BUDGET_KEYS = ("budget_nodes", "budget_tokens", "defer")
ITEM_STAGES = ("read", "post_retrieval")  # each item decided alone against the context; may keep none of a list
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
                raise BranchgateError(
                    f"budget_{key}={pct:g}% needs the query's reference run (Config.budget_reference, "
                    f"simulate --budget-reference){': ' + where if where else ''}"
                )
            base = reference[key] - 1 if key == "nodes" else reference[key]  # nodes: expanded subqueries
            return int(math.floor(pct / 100.0 * max(0.0, float(base)) + 1e-9))

        return one(self.nodes, self.nodes_pct, "nodes"), one(self.tokens, self.tokens_pct, "tokens")


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
        raise BranchgateError(
            f"{flag} {spec}: defer=1 is the run-scoped gate's deferral (gate:PATH,...,defer=1); {name} has none"
        )
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
                raise BranchgateError(
                    f"{flag} {spec}: budget_{key}={raw!r}: expected P% with P a number ≥ 0 "
                    "(a share of the query's reference run)"
                )
            out[f"{key}_pct"] = pct
            continue
        try:
            value = int(raw)
        except ValueError:
            raise BranchgateError(
                f"{flag} {spec}: budget_{key}={raw!r}: expected an integer ≥ 0 ({what}) or P% "
                "(a share of the query's reference run)"
            ) from None
        if value < 0:
            raise BranchgateError(f"{flag} {spec}: budget_{key} must be ≥ 0 ({what}), got {value}")
        out[key] = value
    if "nodes" not in out and "nodes_pct" not in out and "tokens" not in out and "tokens_pct" not in out:
        raise BranchgateError(f"{flag} {spec}: defer=1 needs a run budget (budget_nodes=N or budget_tokens=T)")
    return BudgetSpec(**out)


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
