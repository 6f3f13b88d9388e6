"""What every agent hook shares (``gpt_researcher.py``, ``open_deep_research.py``): recording a run as a
canonical trace while it gates.

``TraceRecorder`` holds the trace writer (a JSONL path opened here, a ``TraceWriter``, or None to only gate),
writes ``run_start`` once before the first event and ``run_end`` once, each piece of evidence once (id = hash
of its text, with its source URL), retrievals, and the final report with the evidence its cited URLs map to
(the ``citations`` label). Recording never breaks the agent: a failed write is logged once and counted in
``write_errors``. Core only: no agent package is imported.

Budgets (``inference/run_gate.py``): with ``budget_nodes`` / ``budget_tokens`` / ``defer`` the gate becomes a
run-scoped ``RunGate`` (or pass one as the gate). run_start's config then holds ``budget`` (the limits and the
admission parameters); every decision event carries ``spent`` and ``remaining`` (and ``price``); candidates
the budget could not afford are pruned with ``actor: "budget"``, deferred ones get action ``defer``, and the
later ``expand`` of a deferred candidate names the seq of its ``defer`` decision in ``deferred_from``. The
first decision that finds the budget exhausted writes a ``raw`` event ``budget:exhausted``. A kept branch's
retrieval reports its tokens (the evidence it brought in that no earlier retrieval did, in the recorder's
token measure: words) to the budget.

The read stage (which results of a search to read) is ``read_hook.ReadHook``, a mixin beside this class; a piece
of evidence from a URL the read stage read carries that hit's id (``hit_id``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from pathlib import Path

from branchgate.logs_to_dataset.readers.gptr import cited_urls, map_urls
from branchgate.logs_to_dataset.trace_schema import text_evidence_id

log = logging.getLogger(__name__)


class TraceRecorder:
    """Trace writing for one run of an agent (see the module docstring). Subclasses add ``counts`` keys,
    ``_config()`` (recorded in run_start) and may override ``root_query``."""

    def __init__(
        self,
        gate=None,
        trace=None,
        *,
        tau: float | None = None,
        max_keep: int | None = None,
        run_id: str | None = None,
        system: str = "unknown",
        root_query: str | None = None,
        run_prefix: str = "run",
        counts: tuple[str, ...] = (),
        budget_nodes: int | None = None,
        budget_tokens: int | None = None,
        defer: bool = False,
        budget_options: dict | None = None,
    ):
        self.tau, self.max_keep = tau, max_keep
        self.run_id = run_id or f"{run_prefix}-{uuid.uuid4().hex[:12]}"
        if gate is not None and (budget_nodes is not None or budget_tokens is not None or defer or budget_options):
            gate = gate.run(
                budget_nodes=budget_nodes,
                budget_tokens=budget_tokens,
                defer=defer,
                run_id=self.run_id,
                **(budget_options or {}),
            )
        elif gate is None and (budget_nodes is not None or budget_tokens is not None or defer):
            raise ValueError("a budget (budget_nodes, budget_tokens, defer) needs a gate")
        self.gate = gate
        self.system, self._root_query = system, root_query
        self._own_writer = False
        if trace is None or hasattr(trace, "write"):
            self.writer = trace
        else:
            from branchgate.logs_to_dataset.traces import TraceWriter

            self.writer = TraceWriter(Path(trace))
            self._own_writer = True
        self.frames: list = []
        self.retained: list[str] = []
        self._evidence: dict[str, int] = {}  # evidence id → its tokens (each written once)
        self._by_url: dict[str, list[str]] = {}  # source URL → evidence ids (for the report's citations)
        self._started = self._ended = False
        self.write_errors = 0
        self._t0 = time.time()
        self.counts = dict.fromkeys(
            ("frames", "candidates", "expanded", "pruned", "fallbacks", "retrievals", *counts), 0
        )
        if self.run_gate is not None:
            self.counts.update(deferred=0, revisited=0, dropped_by_budget=0, exhausted=0)
        self._defer_seq: dict[str, int | None] = {}  # candidate id → seq of its defer decision
        self._charged: set[str] = set()  # evidence ids already reported to the budget
        self._lock = threading.RLock()  # one event at a time (the read gate writes from retriever threads)

    @property
    def run_gate(self):
        """The run-scoped gate (``inference.run_gate.RunGate``) when the run has a budget, else None."""
        gate = self.gate
        return gate if gate is not None and hasattr(gate, "revisit") and hasattr(gate, "budget") else None

    @property
    def root_query(self) -> str:
        if self._root_query is None and self.frames:
            self._root_query = self.frames[0].frame_query
        return self._root_query or ""

    def _config(self) -> dict:
        return {}

    @property
    def gate_name(self) -> str | None:
        return None if self.gate is None else str(getattr(self.gate, "path", getattr(self.gate, "name", "gate")))

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        config = {"gate": self.gate_name, **self._config()}
        if self.run_gate is not None:
            config["budget"] = self.run_gate.config()
        self._write("run_start", root_query=self.root_query, system=self.system, config=config)

    def _end(self, status: str) -> None:
        if not self._started or self._ended:
            return
        self._ended = True
        totals = dict(
            self.counts,
            nodes=self.counts["expanded"],
            retrieval_calls=self.counts["retrievals"],
            wall_s=round(time.time() - self._t0, 3),
        )
        self._write("run_end", status=status, totals=totals)

    def _close_writer(self) -> None:
        if self._own_writer and self.writer is not None:
            self.writer.close()

    def _evidence_id(self, text: str, source: str = "") -> str:
        """The id of a piece of evidence, written (with its source URL) the first time it is seen."""
        eid = text_evidence_id(text)
        if eid not in self._evidence:
            self._evidence[eid] = len(text.split())
            hit = {"hit_id": source} if source and source in getattr(self, "read_urls", ()) else {}
            self._write("evidence", evidence_id=eid, text=text, source=source, tokens=self._evidence[eid], **hit)
            if source:
                self._by_url.setdefault(source, []).append(eid)
        return eid

    def _retrieval(self, cid: str, query: str, ids: list[str], spend: bool = True) -> None:
        """A branch's retrieval; with a budget (and ``spend``) its new evidence's tokens are reported to it."""
        tokens = sum(self._evidence.get(i, 0) for i in ids)
        self._write("retrieval", candidate_id=cid, query=query, evidence_ids=ids, tokens=tokens)
        self.counts["retrievals"] += 1
        if spend and self.run_gate is not None:
            new = [i for i in dict.fromkeys(ids) if i not in self._charged]
            self._charged.update(new)
            self.run_gate.spend(sum(self._evidence.get(i, 0) for i in new))

    # -- gating and decision events --------------------------------------------------------------------
    def _gate_select(self, state, pairs: list, keys: list[str]):
        """The gate's Selection for one decision (a budgeted run's, naming candidates by ``keys``)."""
        if self.run_gate is not None:
            return self.gate.select(state, pairs, tau=self.tau, max_keep=self.max_keep, keys=keys)
        return self.gate.select(state, pairs, tau=self.tau, max_keep=self.max_keep)

    def _decisions(
        self,
        ids: list[str],
        kept,
        actor: str,
        p_keep: list,
        selection=None,
        deferred_from: dict[str, int | None] | None = None,
    ) -> None:
        """One decision event per candidate id: ``expand`` (kept), ``defer`` (``selection.deferred``) or
        ``prune`` (actor ``budget`` for ``selection.dropped_by_budget``); with a budget, each carries the
        decision's ``spent`` / ``remaining`` / ``price``. Counts expanded / pruned / deferred / budget drops."""
        keep = set(kept)
        deferred = set(getattr(selection, "deferred", None) or [])
        dropped = set(getattr(selection, "dropped_by_budget", None) or [])
        status = getattr(selection, "budget", None)
        extra = {}
        if status is not None:
            extra = {
                "spent": {
                    "nodes": status["spent_nodes"],
                    "tokens": status["spent_tokens"],
                    "reserved_tokens": status["reserved_tokens"],
                },
                "remaining": dict(status["remaining"]),
                "price": status["price"],
            }
            if getattr(selection, "exhausted", False):
                self.counts["exhausted"] += 1
                if self.counts["exhausted"] == 1:
                    self._write("raw", source_type="budget:exhausted", data={"candidate_ids": list(ids), **extra})
        for i, cid in enumerate(ids):
            action = "expand" if i in keep else "defer" if i in deferred else "prune"
            fields = dict(extra)
            if deferred_from and cid in deferred_from:
                fields["deferred_from"] = deferred_from[cid]
            event = self._write(
                "decision",
                candidate_id=cid,
                action=action,
                actor="budget" if i in dropped and i not in keep else actor,
                score=p_keep[i],
                p_keep=p_keep[i],
                **fields,
            )
            if action == "defer":
                self._defer_seq[cid] = getattr(event, "seq", None)
        self.counts["expanded"] += len(keep)
        self.counts["pruned"] += len(ids) - len(keep) - len(deferred - keep)
        if self.run_gate is not None:
            self.counts["deferred"] += len(deferred - keep)
            self.counts["dropped_by_budget"] += len(dropped - keep)

    def _revisit(self, state, actor: str, max_keep: int | None = None) -> list:
        """Re-score the run's deferred candidates against ``state`` and record an ``expand`` (naming its
        ``defer`` decision in ``deferred_from``) for each the budget admits; returns their ``Deferred``
        entries (``key`` = candidate id). [] without a budgeted run or deferred candidates."""
        run = self.run_gate
        if run is None or not run.deferred:
            return []
        sel = run.revisit(state, max_keep=max_keep)
        if not sel.revisited:
            return []
        ids = [d.key for d in sel.revisited]
        p = [float(sel.p_keep[i]) for i in sel.kept]
        self._decisions(
            ids, range(len(ids)), actor, p, _Status(sel), deferred_from={cid: self._defer_seq.get(cid) for cid in ids}
        )
        self.counts["revisited"] += len(ids)
        return list(sel.revisited)

    def _out_of_range(self, frame_id: str, selection) -> None:
        """A decision outside the controller's training range (``Selection.out_of_range``): a ``raw`` event
        ``gate:out_of_range`` naming the features, counted in ``counts["out_of_range"]``."""
        names = list(getattr(selection, "out_of_range", None) or [])
        if names:
            self.counts["out_of_range"] = self.counts.get("out_of_range", 0) + 1
            self._write("raw", source_type="gate:out_of_range", data={"frame_id": frame_id, "features": names})

    def record_report(self, text, path: str | None = None) -> list[str]:
        """Record the final report: its cited URLs (``cited_sources``) and the evidence recorded with those
        ``source`` URLs (``cited_ids``, the ``citations`` label); returns the cited ids. It may follow run_end."""
        text = str(text or "")
        cited = cited_urls(text)
        ids, unmapped = map_urls(cited, self._by_url)
        self.counts["cited_unmapped"] = unmapped
        self._write("report", text=text, path=path, cited_ids=ids, cited_sources=cited)
        return ids

    def _write(self, type_: str, **fields):
        """Write one event (returns it, or None when not recording or the write failed)."""
        if self.writer is None:
            return None
        try:
            with self._lock:
                return self.writer.write(type=type_, run_id=self.run_id, **fields)
        except Exception as exc:  # recording must never break the research; say so once, count the rest
            self.write_errors += 1
            if self.write_errors == 1:
                log.warning(
                    "branchgate: could not record a %s event of run %s (%s); further failures are counted "
                    "in hook.write_errors",
                    type_,
                    self.run_id,
                    exc,
                )


class _Status:
    """A revisit's budget status for ``_decisions`` (its admitted entries: no defers, no budget drops)."""

    def __init__(self, selection):
        self.budget, self.deferred, self.dropped_by_budget, self.exhausted = selection.budget, [], [], False


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()
