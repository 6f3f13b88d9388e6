"""The read gate where a retrieval pipeline filters its documents: LangChain's document compressors
(``langchain.py``) and LlamaIndex's node postprocessors (``llamaindex.py``) are thin wrappers over this module.

    gate = DocumentGate("pretrained:read", trace="traces/reads.jsonl", budget_docs=20)
    kept = gate.filter("why do honeybee colonies collapse?", [doc_of(text, metadata), ...])  # indices to pass on
    with gate.run("Why do honeybee colonies collapse?"):   # several retrievals of one question: one run
        gate.filter("varroa mites", docs)
        gate.filter("pesticides and bees", docs)

**Documents as hits.** A retrieved document is shown to the read controller as a search engine shows a hit
(``doc_of``): title = its metadata's ``title`` (else the text's first line), snippet = the opening words of its text
(both by ``texts.hit_of``), URL = its metadata's ``url`` or ``source``. Its id is ``URL#h`` (``h`` a hash of the
text: chunks of one page are hits of their own), or ``sha256:h`` without a URL. A document with neither title
nor text is passed on unscored and unrecorded; a document repeated in one list (same id) shares its first copy's
decision.

**A run.** Each ``filter`` call is one search: the query searched and the documents it returned. Inside
``with gate.run(question)`` the calls (in this thread or task, or any it starts: a context variable) are the
searches of one run: they share the run's question (the read state's root query), what it has read (a
``read_state.ReadState``, as in every read decision: the window of the newest texts read; a document read before
in the run is not scored or read again, actor ``seen``) and its budget.
Outside one, every call is a run of its own whose question is the query.

**The decision.** The read controller (``Gate.select(read_state, hits, tau=τ, floor=...)``: a ``.onnx`` read
controller, a folder holding one, ``pretrained:read`` or a loaded ``Gate``) scores the new documents; those with
p_keep ≥ τ are read (τ default: the controller's), and with ``floor="root"`` (the default: every search of a run
here is at the root frame, depth 0) the best one is read when none passes, so a retrieval never comes back
empty unless the floor is off (``floor=None``). With a run budget (``budget_docs`` documents read,
``budget_tokens`` words of the documents read, per run; ``inference/budget.Budget``) the chosen documents are
admitted best p_keep first while they fit; the rest are skipped with actor ``budget``, and once the budget is
spent nothing more is read. The documents passed on keep their order.

**Traces** (``trace=``: a JSONL path, opened for appending, or a ``TraceWriter``; None: gate only). Each run is a
canonical trace (schema v2): run_start (config: the controller, τ, the floor, the budget); one root frame
(``f0``, the question); per search a candidate (its query) and its ``expand`` decision (actor ``default``: the
pipeline chose that search), the ``results`` event (every document as a hit, in rank order), one ``evidence``
event per document (its full text, the first ``MAX_TEXT_CHARS`` characters, with ``hit_id``: a retriever has
fetched every document it returns, so a skipped one's text is known and its label can be computed), one ``read``
event per hit (``read`` / ``skip``; actor ``controller:NAME``, ``seen`` or ``budget``; p_keep), and the
candidate's ``retrieval`` (the evidence of the documents read); run_end. ``branchgate dataset build --stage read
--labels teacher:NAME`` (or ``citations`` when the report is recorded) turns those runs into a read dataset.
Recording never breaks the pipeline (``recorder.TraceRecorder``); a bad input (a query that is not a string)
is an ``InputError``.

Core only: no LangChain or LlamaIndex import. Thread-safe (a run's decisions under its lock; one writer lock).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from branchgate.errors import InputError
from branchgate.inference.agents.recorder import TraceRecorder
from branchgate.inference.budget import Budget, _limit
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import as_floor, as_tau
from branchgate.inference.read_state import ReadState
from branchgate.logs_to_dataset.trace_schema import text_evidence_id
from branchgate.texts import hit_of, hit_text

MAX_TEXT_CHARS = 20_000  # of a document's text recorded as evidence (the teacher labels read the full text)
URL_KEYS = ("url", "source")  # a document's URL in its metadata: the first that is a non-empty string
COUNTS = ("searches", "hits", "hits_read", "hits_skipped", "hits_over_budget")
FRAME = "f0"  # the run's one frame: its question


@dataclass(frozen=True)
class Doc:
    """A retrieved document as the read gate sees it (``doc_of``)."""

    id: str
    url: str
    title: str
    snippet: str
    text: str


def doc_of(text, metadata: Mapping | None = None) -> Doc:
    """A document (its text and metadata) as a hit: title from ``metadata["title"]`` (else the text's first line)
    and snippet by ``texts.hit_of``; URL from ``metadata["url"]`` or ``["source"]``; id = ``URL#hash`` of the text
    (``sha256:hash`` without a URL)."""
    text = "" if text is None else str(text)
    metadata = metadata if isinstance(metadata, Mapping) else {}
    url = next((v.strip() for k in URL_KEYS if isinstance(v := metadata.get(k), str) and v.strip()), "")
    title = metadata.get("title")
    title, snippet = hit_of(text, title if isinstance(title, str) else "")
    digest = hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]
    return Doc(f"{url}#{digest}" if url else f"sha256:{digest}", url, title, snippet, text)


class _SharedWriter:
    """One trace writer for every run of a ``DocumentGate`` (runs in several threads write whole lines)."""

    def __init__(self, writer, own: bool):
        self.writer, self.own, self._lock = writer, own, threading.Lock()

    def write(self, **fields):
        with self._lock:
            return self.writer.write(**fields)

    def close(self) -> None:
        if self.own:
            with self._lock:
                self.writer.close()


class DocumentRun(TraceRecorder):
    """One run's read decisions and trace (the module docstring's "A run" and "Traces")."""

    def __init__(self, owner: DocumentGate, question: str | None, run_id, budget_docs, budget_tokens):
        super().__init__(
            None,
            owner._writer,
            run_id=run_id,
            system=owner.system,
            root_query=question,
            run_prefix=owner.system,
            counts=COUNTS,
        )
        self.owner = owner
        self.budget = Budget(budget_docs, budget_tokens)
        self.reads = ReadState(question or "")  # what the run has read (``inference/read_state.py``)

    def _config(self) -> dict:
        o = self.owner
        limits = {"docs": self.budget.nodes, "tokens": self.budget.tokens}
        return {"read": o.gate_name, "tau": o.tau, "floor": o.floor, "budget": limits}

    def filter(self, query: str, docs: Sequence[Doc]) -> list[int]:
        """The indices (ascending) of ``docs`` to pass on for the search ``query`` (module docstring)."""
        if not isinstance(query, str):
            raise InputError(f"must be a string, got {type(query).__name__}", "query")
        with self._lock:
            if self._root_query is None:
                self._root_query = self.reads.root_query = query
            first: dict[str, int] = {}  # hit id → index of its first document
            for i, d in enumerate(docs):
                if (d.title or d.snippet) and d.id not in first:
                    first[d.id] = i
            if not first:
                return list(range(len(docs)))
            read = self._decide(query, [docs[i] for i in first.values()])
            return [i for i, d in enumerate(docs) if d.id not in first or d.id in read]

    def _decide(self, query: str, hits: list[Doc]) -> set[str]:
        """One search: the gate's choice under the budget, recorded; the ids read."""
        cid = f"{FRAME}.s{self.counts['searches']}"
        if not self._started:
            self._start()
            self._write("frame_open", frame_id=FRAME, depth=0, frame_query=self.root_query)
        self._write("candidate", frame_id=FRAME, candidate_id=cid, order=self.counts["searches"], query=query)
        self._write("decision", candidate_id=cid, action="expand", actor="default")
        o, new = self.owner, self.reads.new(d.id for d in hits)
        seen, p_keep = set(range(len(hits))) - set(new), [None] * len(hits)  # read before: not scored
        chosen = []
        if new:
            rows = [{"id": hits[i].id, "title": hits[i].title, "snippet": hits[i].snippet, "rank": i} for i in new]
            sel = o.gate.select(self.reads.state(query, "", 0), rows, tau=o.tau, floor=o.floor)
            for k, i in enumerate(new):
                p_keep[i] = float(sel.p_keep[k])
            chosen = sorted((new[k] for k in sel.kept), key=lambda i: -p_keep[i])
        read, over = self._admit(chosen, hits)
        listed = [{"hit_id": d.id, "title": d.title, "snippet": d.snippet, "rank": r} for r, d in enumerate(hits)]
        self._write("results", candidate_id=cid, query=query, hits=[h | _url(d) for h, d in zip(listed, hits)])
        evidence = [self._doc_evidence(d) for d in hits]
        for i, d in enumerate(hits):
            action = "read" if i in read else "skip"
            actor = "budget" if i in over else "seen" if i in seen else o.read_name
            p = p_keep[i]
            self._write("read", candidate_id=cid, hit_id=d.id, action=action, actor=actor, score=p, p_keep=p)
        self._retrieval(cid, query, [evidence[i] for i in sorted(read)], spend=False)
        for i in sorted(read):
            self.reads.add(hits[i].id, hit_text(hits[i].title, hits[i].snippet))
        self.counts["searches"] += 1
        self.counts["hits"] += len(hits)
        self.counts["hits_read"] += len(read)
        self.counts["hits_skipped"] += len(hits) - len(read)
        self.counts["hits_over_budget"] += len(over)
        return {hits[i].id for i in read}

    def _admit(self, chosen: list[int], hits: list[Doc]) -> tuple[set[int], set[int]]:
        """The chosen hits (best first) the run's budget admits, each charged one document and its words; and
        those it cannot afford."""
        if not self.budget.limited:
            return set(chosen), set()
        read, over = set(), set()
        for i in chosen:
            words = len(hits[i].text.split())
            if self.budget.can_afford(1, words):
                self.budget.charge(1, words)
                read.add(i)
            else:
                over.add(i)
        return read, over

    def _doc_evidence(self, d: Doc) -> str:
        """The evidence id of a document's text (written once per run, with its hit id)."""
        text = d.text[:MAX_TEXT_CHARS] or hit_text(d.title, d.snippet)
        eid = text_evidence_id(text)
        if eid not in self._evidence:
            self._evidence[eid] = len(text.split())
            self._write("evidence", evidence_id=eid, text=text, source=d.url, tokens=self._evidence[eid], hit_id=d.id)
        return eid

    def end(self, status: str = "ok") -> None:
        with self._lock:
            self._end(status)


def _url(d: Doc) -> dict:
    return {"url": d.url} if d.url else {}


class DocumentGate:
    """A read controller over retrieved documents, with τ, the floor, run budgets and traces (module docstring)."""

    def __init__(
        self,
        read="pretrained:read",
        trace=None,
        *,
        tau: float | None = None,
        floor: str | None = "root",
        budget_docs: int | None = None,
        budget_tokens: int | None = None,
        system: str = "documents",
    ):
        gate = Gate.load(read) if isinstance(read, (str, Path)) else read
        if getattr(gate, "stage", None) != "read":
            raise InputError(
                f"needs a read controller (metadata stage 'read'), got a {getattr(gate, 'stage', type(gate).__name__)}"
                " controller",
                "read",
            )
        self.gate, self.system = gate, system
        self.tau = None if tau is None else as_tau(tau)
        self.floor = as_floor(floor)
        self.budget_docs = _limit(budget_docs, "budget_docs")
        self.budget_tokens = _limit(budget_tokens, "budget_tokens")
        if trace is None or hasattr(trace, "write"):
            self._writer = None if trace is None else _SharedWriter(trace, own=False)
        else:
            from branchgate.logs_to_dataset.traces import TraceWriter

            self._writer = _SharedWriter(TraceWriter(Path(trace)), own=True)
        self._current: contextvars.ContextVar[DocumentRun | None] = contextvars.ContextVar(
            f"branchgate_run_{id(self)}", default=None
        )

    gate_name = property(lambda self: str(getattr(self.gate, "path", None) or getattr(self.gate, "name", "read")))
    read_name = property(lambda self: f"controller:{getattr(self.gate, 'name', 'read')}")

    @contextlib.contextmanager
    def run(self, question: str | None = None, *, run_id: str | None = None, budget_docs=..., budget_tokens=...):
        """One run of several searches (module docstring); ``budget_*`` default to the gate's. Yields the
        ``DocumentRun`` (its ``counts``, ``budget``, ``run_id``); run_end is written when the block ends."""
        docs = self.budget_docs if budget_docs is ... else _limit(budget_docs, "budget_docs")
        tokens = self.budget_tokens if budget_tokens is ... else _limit(budget_tokens, "budget_tokens")
        run = DocumentRun(self, question, run_id, docs, tokens)
        token = self._current.set(run)
        status = "error"
        try:
            yield run
            status = "ok"
        finally:
            self._current.reset(token)
            run.end(status)

    @property
    def current_run(self) -> DocumentRun | None:
        """The run the calls here belong to (None outside ``with gate.run(...)``)."""
        return self._current.get()

    def filter(self, query: str, docs: Sequence[Doc]) -> list[int]:
        """The indices (ascending) of ``docs`` to pass on for the search ``query``: in the current run, else in a
        run of its own."""
        docs = list(docs)
        run = self._current.get()
        if run is not None:
            return run.filter(query, docs)
        with self.run(query) as run:
            return run.filter(query, docs)

    def close(self) -> None:
        """Close the trace file this gate opened (a writer it was given stays open)."""
        if self._writer is not None:
            self._writer.close()
