"""Run budgets in the reference pipeline: exact costs before committing, so a budget is never exceeded.

A run's tokens are its LLM tokens (``Ledger.llm_tokens()``: the plan, process, follow-ups and synthesis calls).
The offline generator is deterministic, so ``run.Runner`` computes an expansion completely before committing
it (retrieval, post-retrieval pruning, the learnings of the process call, the follow-ups call) and knows its
exact cost:

    cost = process call + follow-ups call + growth of the synthesis bound

The synthesis call comes last and reads the final context, so every admission reserves its share of it: the
*synthesis bound* of a context is ``tokens(Q) + Σ tokens(passage) + the 8 longest report sentences`` (the
report is at most ``REPORT_SENTENCES`` sentences of at most ``REPORT_WORDS`` words, taken from the final
context's passages; WordPiece counts of space-joined texts add up). It only grows with the context and bounds
the synthesis call of the context or of any pre-synthesis pruning of it. An expansion is admitted only if

    llm tokens spent so far + synthesis bound of the context + cost  ≤  budget

(``RunBudget.fits``); one that does not fit but whose process call alone does is expanded as a leaf (no
follow-ups, counted in ``leaf_expansions``); otherwise it is dropped (decision ``prune``, actor ``budget``).
The plan call is admitted the same way (else the run plans nothing), and the synthesis call is skipped only
if the root question alone does not fit. A node budget counts expanded subqueries (the root's planning
node is not one).

**One ledger.** What a run has spent and what fits is the core ``Budget`` (``inference/budget.py``):
spent nodes = expanded subqueries, spent tokens = LLM tokens, reserved tokens = the synthesis bound, and its
``can_afford`` is the fit rule. With a run-scoped gate it is the gate's own budget (``commit_plan`` adopts it),
so the gate's price and the exact checks read the same counts; the gate charges nothing itself
(``RunGate(charges=False)``): the run charges each expansion's exact cost when it commits it (``commit``).
``RunBudget`` adds what is the pipeline's: the synthesis bound, the checks of a frame's plan from the counts
its earlier expansions would leave, and what the trace reports.
"""

from __future__ import annotations

import heapq

from branchgate.errors import BranchgateError
from branchgate.inference.budget import Budget
from branchgate.pipeline.accounting import count_tokens, token_counts
from branchgate.pipeline.textutil import sentences

REPORT_SENTENCES = 8  # the extractive report: at most this many sentences (run.py's synthesis)
REPORT_WORDS = 80  # ... of at most this many words each
MIN_SENTENCE_WORDS = 5  # shorter sentences are never reported (generate.cited_learnings)


def report_sentence_tokens(env, pi: int) -> tuple[int, ...]:
    """Tokens of every sentence of passage ``pi`` the report could quote (truncated as the report truncates)."""

    def compute():
        sents = [
            " ".join(s.split()[:REPORT_WORDS]) for s in sentences(env.texts[pi]) if len(s.split()) >= MIN_SENTENCE_WORDS
        ]
        return tuple(token_counts(sents))

    return env.memo.get_or(("report_sentence_tokens", pi), compute)


class SynthBound:
    """Upper bound of the synthesis call's tokens over a growing context (see the module docstring)."""

    def __init__(self, env, root: str):
        self.env = env
        self.root_tokens = count_tokens(root)
        self.passages = 0  # Σ tokens of the context's passages
        self.top: list[int] = []  # the REPORT_SENTENCES largest sentence counts (a min-heap)

    @property
    def value(self) -> int:
        return self.root_tokens + self.passages + sum(self.top)

    def _merged(self, idx: list[int], passage_tokens: list[int]) -> tuple[int, list[int]]:
        top = list(self.top)
        for pi in idx:
            for n in report_sentence_tokens(self.env, pi):
                if len(top) < REPORT_SENTENCES:
                    heapq.heappush(top, n)
                elif n > top[0]:
                    heapq.heapreplace(top, n)
        return self.passages + int(sum(passage_tokens)), top

    def growth(self, idx: list[int], passage_tokens: list[int]) -> int:
        """How much the bound grows when passages ``idx`` (with their token counts) join the context."""
        passages, top = self._merged(idx, passage_tokens)
        return self.root_tokens + passages + sum(top) - self.value

    def add(self, idx: list[int], passage_tokens: list[int]) -> None:
        self.passages, self.top = self._merged(idx, passage_tokens)

    def copy(self) -> SynthBound:
        out = SynthBound.__new__(SynthBound)
        out.env, out.root_tokens, out.passages, out.top = self.env, self.root_tokens, self.passages, list(self.top)
        return out


class RunBudget:
    """One run's budget as the pipeline spends it: the ledger ``account`` (a core ``Budget``; see the module
    docstring) and the pipeline's own counts (``dropped``, ``leaf_expansions``, ``exhausted_at``)."""

    def __init__(self, nodes: int | None, tokens: int | None, ledger, synth: SynthBound):
        self.account = Budget(nodes, tokens)
        self.ledger, self.synth = ledger, synth  # the run's LLM tokens by stage; the synthesis bound
        self.dropped = 0  # candidates a policy kept that the budget could not afford
        self.leaf_expansions = 0  # expanded without their follow-ups (the follow-ups did not fit)
        self.exhausted_at: int | None = None  # seq of the raw "budget:exhausted" event (the first exhausted decision)

    nodes = property(lambda self: self.account.nodes)
    tokens = property(lambda self: self.account.tokens)
    limited = property(lambda self: self.account.limited)
    expanded = property(lambda self: self.account.spent_nodes)  # expanded subqueries

    def commit_plan(self, tokens: int, growth: int, run_gate=None) -> None:
        """The plan call is made: charge its ``tokens`` and hold the synthesis bound, grown by ``growth`` (the
        protected passages about to join the context). With a run-scoped gate its budget becomes the ledger
        first (nothing is charged before the plan), so the gate decides on what the run has spent."""
        if run_gate is not None:
            if run_gate.charges:
                raise BranchgateError("a pipeline run's gate must leave charging to the run (RunGate(charges=False))")
            self.account = run_gate.budget
        self.account.charge(tokens=tokens)
        self.account.reserve(self.synth.value + growth)

    def commit(self, cost: int, growth: int) -> None:
        """An expansion is committed: charge its node and LLM tokens (``cost`` less ``growth``) and hold the
        growth of the synthesis bound."""
        self.account.charge(nodes=1, tokens=cost - growth)
        self.account.reserve(growth)

    def committed(self) -> int:
        """LLM tokens spent plus the synthesis bound of the context: what the run is committed to."""
        return self.account.spent_tokens + self.synth.value

    def fits(self, tokens: int, nodes: int = 1, committed: int | None = None, expanded: int | None = None) -> bool:
        """Whether ``tokens`` more (and ``nodes`` more expansions) fit, from ``committed``/``expanded`` (default:
        the run's own counts; the frame's plan passes what its earlier expansions would leave)."""
        return self.account.can_afford(
            nodes, tokens, nodes_used=expanded, tokens_used=self.committed() if committed is None else committed
        )

    def remaining(self) -> dict:
        return self.account.remaining(tokens_used=self.committed())

    def status(self) -> dict:
        """What a decision event records (``spent``, ``remaining``: the fields of ``inference/agents/recorder.py``;
        ``reserved_tokens`` = the synthesis bound held for the final call)."""
        return {
            "spent": {"nodes": self.expanded, "tokens": self.account.spent_tokens, "reserved_tokens": self.synth.value},
            "remaining": self.remaining(),
        }

    def totals(self) -> dict:
        """The run_end totals: ``spent_tokens`` = every LLM token of the run, the synthesis call included."""
        return {
            "nodes": self.nodes,
            "tokens": self.tokens,
            "spent_nodes": self.expanded,
            "spent_tokens": self.ledger.llm_tokens(),
            "dropped": self.dropped,
            "leaf_expansions": self.leaf_expansions,
            "exhausted": self.exhausted_at is not None,
        }
