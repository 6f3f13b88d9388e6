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
"""

from __future__ import annotations

import heapq

from branchgate.pipeline.accounting import count_tokens, token_counts
from branchgate.pipeline.textutil import sentences

REPORT_SENTENCES = 8  # the extractive report: at most this many sentences (run.py's synthesis)
REPORT_WORDS = 80  # ... of at most this many words each
MIN_SENTENCE_WORDS = 5  # shorter sentences are never reported (generate.cited_learnings)


def report_sentence_tokens(env, pi: int) -> tuple[int, ...]:
    """Tokens of every sentence of passage ``pi`` the report could quote (truncated as the report truncates)."""
    def compute():
        sents = [" ".join(s.split()[:REPORT_WORDS]) for s in sentences(env.texts[pi])
                 if len(s.split()) >= MIN_SENTENCE_WORDS]
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

    def copy(self) -> "SynthBound":
        out = SynthBound.__new__(SynthBound)
        out.env, out.root_tokens, out.passages, out.top = self.env, self.root_tokens, self.passages, list(self.top)
        return out


class RunBudget:
    """One run's limits and what it has spent, as the pipeline counts it (the truth the bench checks)."""

    def __init__(self, nodes: int | None, tokens: int | None, ledger, synth: SynthBound):
        self.nodes, self.tokens, self.ledger, self.synth = nodes, tokens, ledger, synth
        self.expanded = 0
        self.dropped = 0  # candidates a policy kept that the budget could not afford
        self.leaf_expansions = 0  # expanded without their follow-ups (the follow-ups did not fit)
        self.exhausted_at: int | None = None  # seq of the raw "budget:exhausted" event (the first exhausted decision)

    @property
    def limited(self) -> bool:
        return self.nodes is not None or self.tokens is not None

    def committed(self) -> int:
        """Tokens spent plus the synthesis bound of the context: what the run is committed to."""
        return self.ledger.llm_tokens() + self.synth.value

    def fits(self, tokens: int, nodes: int = 1, committed: int | None = None, expanded: int | None = None) -> bool:
        """Whether ``tokens`` more (and ``nodes`` more expansions) fit, from ``committed``/``expanded`` (default:
        the run's own counts; the frame's plan passes what its earlier expansions would leave)."""
        committed = self.committed() if committed is None else committed
        expanded = self.expanded if expanded is None else expanded
        return ((self.nodes is None or expanded + nodes <= self.nodes)
                and (self.tokens is None or committed + tokens <= self.tokens))

    def remaining(self) -> dict:
        return {"nodes": None if self.nodes is None else max(self.nodes - self.expanded, 0),
                "tokens": None if self.tokens is None else max(self.tokens - self.committed(), 0)}

    def status(self) -> dict:
        """What a decision event records (``spent``, ``remaining``: the fields of ``inference/recorder.py``, as the
        pipeline counts them; ``reserved_tokens`` = the synthesis bound held for the final call)."""
        return {"spent": {"nodes": self.expanded, "tokens": self.ledger.llm_tokens(),
                          "reserved_tokens": self.synth.value}, "remaining": self.remaining()}

    def totals(self) -> dict:
        return {"nodes": self.nodes, "tokens": self.tokens, "spent_nodes": self.expanded,
                "spent_tokens": self.ledger.llm_tokens(), "dropped": self.dropped,
                "leaf_expansions": self.leaf_expansions, "exhausted": self.exhausted_at is not None}
