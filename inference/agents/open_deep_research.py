"""open_deep_research drop-in: gate the supervisor's research delegations and the researchers' search queries
before they run, and record the run as canonical traces.

    from langchain_core.messages import HumanMessage
    from open_deep_research.deep_researcher import deep_researcher
    from branchgate.inference.gate import Gate
    from branchgate.inference.agents.open_deep_research import gate_open_deep_research

    with gate_open_deep_research(Gate.load("controller.onnx"), trace="traces/run.jsonl") as hook:
        state = await deep_researcher.ainvoke({"messages": [HumanMessage(content=question)]}, config)
        hook.record_report(state["final_report"])  # optional: the report and the sources it cites

Checked against open-deep-research 0.0.16 from PyPI (its wheel; run here with langgraph 1.2.24 and
langchain-core 1.8.3). Also read against GitHub's main branch (also labelled 0.0.16, not run here): it adds a
``think_tool`` (left alone) and ends research one supervisor turn later (``>`` instead of ``>=`` the iteration
limit; the hook does not predict it, see ``researcher_subgraph`` below), and uses the same three attributes.

In that package a supervisor LLM (``supervisor`` node) answers with tool calls; ``supervisor_tools`` runs the
first ``max_concurrent_research_units`` ``ConductResearch`` calls, each as a researcher subgraph
(``researcher_subgraph.ainvoke``), and answers the rest with an error message; it ends research (running
nothing) when a ``ResearchComplete`` call is present or the iteration limit is reached. A researcher LLM calls
the search tool (``tavily_search(queries=[...])``), whose results come from
``open_deep_research.utils.tavily_search_async``; ``researcher_tools`` runs every tool call of a message.

What the hook patches (module attributes of the imported package, restored by ``uninstall``/``close``):

- ``open_deep_research.deep_researcher.configurable_model`` — a proxy whose ``bind_tools(...)`` wraps the bound
  model in a Runnable that edits the model's answer before the graph stores it: its ``ConductResearch`` calls
  are one decision point (a frame, depth 0; the Gate's ``max_keep`` is capped at
  ``max_concurrent_research_units`` so the Gate, not the call order, picks which ones run), and each call with
  a ``queries`` list (the search tool) is one decision point (depth 1, below the ``ConductResearch`` call its
  researcher works on). Pruned calls are removed from the message and pruned queries from the call's
  arguments (``tool_calls``, and the provider copies in ``additional_kwargs["tool_calls"]`` and in
  ``tool_use`` content blocks), so the history the LLM sees stays consistent. A list is never emptied
  (top-1 fallback) unless a run budget is spent (``gate_open_deep_research(budget_nodes=...)``): the
  supervisor ends research when no call remains. Everything else (structured output,
  ``with_config``) passes through.
- ``open_deep_research.deep_researcher.researcher_subgraph`` — a proxy whose ``ainvoke`` marks which
  ``ConductResearch`` call a researcher run works on (matched by ``research_topic``). The frame's decisions are
  written when the first of its researchers starts, or, when none starts (research ended), as not expanded
  (``prune``, actor ``default``) at the next supervisor turn or at ``close``.
- ``open_deep_research.utils.tavily_search_async`` — wrapped to record what the search returned: an
  ``evidence`` event per result (text = its ``content``, source = its ``url``) and a ``retrieval`` per query.
  When a researcher run ends, its ``ConductResearch`` call gets a ``retrieval`` of everything its searches
  found and a ``learning`` with the compressed research.

The read gate (``gate_open_deep_research(..., read=READ_CONTROLLER, read_tau=None, read_floor=None)``;
``read_hook.py``): the same ``tavily_search_async`` wrapper decides which results of each query are read, before
``tavily_search`` deduplicates them by URL and summarises each page (``summarize_webpage``, an LLM call): a
skipped result is removed from the response, so it gets no summary and never reaches the researcher's messages.
Tavily has fetched its raw content already (``include_raw_content=True`` is the package's): the gate saves the
summaries, not the fetch. Evidence is recorded for the results read only; ``read=None`` reads everything.

``gate=None`` only records: the messages are left as they are and the package's own rule (the first
``max_concurrent_research_units`` calls) is recorded with actor ``default``. One graph run at a time per hook
(one ``run_id``); install the hook after any other patch of these three attributes (the tests replace the
search first). Import-safe without the package: it is imported when the hook is installed.

(The tool-call edit and the message and config helpers are ``odr_messages.py``; the stand-ins installed for the
model and the researcher subgraph are ``odr_proxies.py``; trace writing is ``recorder.py``.)

Over 400 lines: installing, gating and recording one package's graph; its proxies and message helpers are already
apart (``odr_proxies.py``, ``odr_messages.py``).
"""

from __future__ import annotations

import contextvars
import importlib
import logging
from dataclasses import dataclass, field

from branchgate.inference.agents.odr_messages import _edited, _first_human, _package_version, _queries, _setting
from branchgate.inference.agents.odr_proxies import _ModelProxy, _SubgraphProxy
from branchgate.inference.agents.read_hook import ReadHook, SearchCall
from branchgate.inference.agents.recorder import TraceRecorder, sha256
from branchgate.inference.inputs import DecisionState
from branchgate.texts import candidate_text

log = logging.getLogger(__name__)

SYSTEM = "open-deep-research"
CONDUCT = "ConductResearch"
PATCHED = (
    ("open_deep_research.deep_researcher", "configurable_model"),
    ("open_deep_research.deep_researcher", "researcher_subgraph"),
    ("open_deep_research.utils", "tavily_search_async"),
)


@dataclass
class _Frame:
    frame_id: str
    depth: int
    frame_query: str
    parent_frame: str | None = None
    parent_candidate: str | None = None
    candidates: list[dict] = field(default_factory=list)  # {"id", "query", "kept", "claimed", "retrieved"}
    pending: list[tuple] | None = None  # decisions waiting for the package to act: (index, action, actor, p)
    budget: dict | None = None  # a budgeted run's spent / remaining / price at this frame's decision


@dataclass
class _Branch:
    """One researcher run and the ConductResearch candidate it works on (None: not matched)."""

    topic: str
    candidate: dict | None
    searches: list[_Frame] = field(default_factory=list)
    evidence: list[tuple[str, int]] = field(default_factory=list)  # (evidence id, tokens) its searches found


class OpenDeepResearchHook(ReadHook, TraceRecorder):
    """Gating + recording for open_deep_research runs (see the module docstring)."""

    def __init__(
        self,
        gate=None,
        trace=None,
        *,
        system: str = SYSTEM,
        read=None,
        read_tau: float | None = None,
        read_floor: str | None = None,
        **options,
    ):
        """``options``: ``TraceRecorder``'s (``tau``, ``max_keep``, ``run_id``, ``root_query``, ``budget_nodes``,
        ``budget_tokens``, ``defer``, ``budget_options``); ``read*``: the read stage's (``ReadHook``)."""
        counts = ("not_run", "unmatched_runs", "unmatched_queries")
        super().__init__(gate, trace, system=system, run_prefix="odr", counts=counts, **options)
        self._branch: contextvars.ContextVar[_Branch | None] = contextvars.ContextVar(
            f"branchgate_odr_{id(self)}", default=None
        )
        self._supervisor: _Frame | None = None  # the latest supervisor frame
        self._init_read(read, read_tau, read_floor)
        self._orig: list[tuple[object, str, object]] = []
        self.install()

    # -- patching --------------------------------------------------------------------------------------
    def install(self) -> None:
        if self._orig:
            return
        wrappers = {
            "configurable_model": lambda m: _ModelProxy(m, self),
            "researcher_subgraph": lambda g: _SubgraphProxy(g, self),
            "tavily_search_async": self._recording_search,
        }
        for module_name, attr in PATCHED:
            module = importlib.import_module(module_name)
            current = getattr(module, attr)
            if "_branchgate_hook" in getattr(current, "__dict__", {}):  # no getattr: the model proxies lookups
                self.uninstall()
                raise RuntimeError(f"another branchgate hook is installed on {module_name}.{attr}; close it first")
            self._orig.append((module, attr, current))
            setattr(module, attr, wrappers[attr](current))

    def uninstall(self) -> None:
        for module, attr, original in reversed(self._orig):
            setattr(module, attr, original)
        self._orig.clear()

    def close(self, status: str = "ok") -> None:
        """Record what never ran, write run_end (once), close a trace file opened here, and uninstall."""
        self._flush(self._supervisor, ran=False)
        self._end(status)
        self._close_writer()
        self.uninstall()

    def __enter__(self) -> OpenDeepResearchHook:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close("ok" if exc_type is None else "error")

    # -- the model's answer ----------------------------------------------------------------------------
    def on_message(self, messages, message, config=None):
        """Gate and record the tool calls of one model answer; returns the (edited) answer."""
        calls = list(getattr(message, "tool_calls", None) or [])
        if not calls:
            return message
        drop, queries = set(), {}
        conduct = [i for i, c in enumerate(calls) if c.get("name") == CONDUCT]
        if conduct:
            drop = self._supervisor_turn(messages, calls, conduct, config)
        for i, c in enumerate(calls):
            listed = _queries(c)
            if listed:
                kept = self._search_call(messages, listed)
                if not kept:  # the run's budget is spent: the search call goes (the researcher then ends)
                    drop.add(i)
                elif len(kept) < len(listed):
                    queries[i] = kept
        if self.gate is None or not (drop or queries):
            return message
        return _edited(message, calls, drop, queries)

    def _supervisor_turn(self, messages, calls, conduct, config) -> set[int]:
        self._flush(self._supervisor, ran=False)  # the previous turn's calls, if the package never ran them
        frame = self._open(_first_human(messages), 0)
        self._supervisor = frame
        pairs = [(str((calls[i].get("args") or {}).get("research_topic") or "").strip(), "") for i in conduct]
        cap = _setting(config, "max_concurrent_research_units")
        kept, p_keep, actor = self._select(frame, pairs, cap)
        running = kept[:cap] if isinstance(cap, int) and cap > 0 else kept  # the package runs the first `cap`
        frame.pending = [
            (i, "expand" if i in running else "prune", actor if i in running or i not in kept else "default", p_keep[i])
            for i in range(len(pairs))
        ]
        frame.pending = self._budget_actions(frame)
        return {conduct[i] for i in range(len(pairs)) if i not in kept}

    def _search_call(self, messages, queries: list[str]) -> list[str]:
        branch = self._branch.get()
        topic = branch.topic if branch is not None else _first_human(messages)
        parent = branch.candidate if branch is not None else None
        frame = self._open(
            topic,
            1 if parent else 0,
            parent_frame=parent["frame"] if parent else None,
            parent_candidate=parent["id"] if parent else None,
        )
        if branch is not None:
            branch.searches.append(frame)
        kept, p_keep, actor = self._select(frame, [(q, "") for q in queries], None)
        frame.pending = [(i, "expand" if i in kept else "prune", actor, p_keep[i]) for i in range(len(queries))]
        frame.pending = self._budget_actions(frame)
        self._flush(frame, ran=True)  # researcher_tools runs every tool call of the message
        return [queries[i] for i in kept]

    def _select(self, frame: _Frame, pairs: list[tuple[str, str]], cap) -> tuple[list[int], list, str]:
        """(kept indices in order, p_keep per candidate, actor); never empty for a non-empty list."""
        for i, (q, g) in enumerate(pairs):
            cid = f"{frame.frame_id}.c{i}"
            frame.candidates.append(
                {
                    "id": cid,
                    "frame": frame.frame_id,
                    "query": q,
                    "goal": g,
                    "kept": False,
                    "claimed": False,
                    "retrieved": False,
                }
            )
            self._write("candidate", frame_id=frame.frame_id, candidate_id=cid, order=i, query=q, goal=g)
        self.counts["candidates"] += len(pairs)
        if self.gate is None:
            return list(range(len(pairs))), [None] * len(pairs), "default"
        limits = [x for x in (self.max_keep, cap) if isinstance(x, int) and x > 0]
        state = DecisionState(self.root_query, frame.frame_query, "", list(self.retained), frame.depth)
        sel = self.gate.select(state, pairs, tau=self.tau, max_keep=min(limits) if limits else None)
        self._out_of_range(frame.frame_id, sel)
        p_keep = [float(p) for p in sel.p_keep]
        kept = sorted({int(i) for i in sel.kept if 0 <= int(i) < len(pairs)})
        self.counts["fallbacks"] += int(bool(sel.fallback))
        frame.budget = None
        if getattr(sel, "budget", None) is not None:  # a budgeted run (RunGate): its drops and defers, by index
            frame.budget = {
                "status": sel.budget,
                "deferred": set(sel.deferred),
                "dropped": set(sel.dropped_by_budget),
                "exhausted": bool(sel.exhausted),
            }
        if not kept and not getattr(sel, "exhausted", False):  # a custom gate returned nothing: keep the best one
            kept = [max(range(len(pairs)), key=lambda i: p_keep[i])]
        return kept, p_keep, f"controller:{getattr(self.gate, 'name', 'gate')}"

    def _budget_actions(self, frame: _Frame) -> list[tuple]:
        """A budgeted run's pending decisions: deferred ones ``defer``, budget drops pruned by actor ``budget``."""
        b = frame.budget
        if b is None:
            return frame.pending
        out = []
        for i, action, actor, p in frame.pending:
            if action != "expand" and i in b["deferred"]:
                action = "defer"
            elif action != "expand" and i in b["dropped"]:
                actor = "budget"
            out.append((i, action, actor, p))
        if b["exhausted"]:
            self.counts["exhausted"] = self.counts.get("exhausted", 0) + 1
            if self.counts["exhausted"] == 1:
                self._write(
                    "raw",
                    source_type="budget:exhausted",
                    data={"frame_id": frame.frame_id, "remaining": b["status"]["remaining"]},
                )
        return out

    def _flush(self, frame: _Frame | None, ran: bool) -> None:
        """Write a frame's pending decisions; ``ran=False``: the package ran none of them."""
        if frame is None or frame.pending is None:
            return
        pending, frame.pending = frame.pending, None
        extra = {}
        if frame.budget is not None:
            st = frame.budget["status"]
            extra = {
                "spent": {
                    "nodes": st["spent_nodes"],
                    "tokens": st["spent_tokens"],
                    "reserved_tokens": st["reserved_tokens"],
                },
                "remaining": dict(st["remaining"]),
                "price": st["price"],
            }
        for i, action, actor, p in pending:
            entry = frame.candidates[i]
            if action == "expand" and not ran:
                action, actor = "prune", "default"
                self.counts["not_run"] += 1
            entry["kept"] = action == "expand"
            if action == "defer":
                self.counts["deferred"] = self.counts.get("deferred", 0) + 1
            elif actor == "budget":
                self.counts["dropped_by_budget"] = self.counts.get("dropped_by_budget", 0) + 1
            self._write("decision", candidate_id=entry["id"], action=action, actor=actor, score=p, p_keep=p, **extra)
            if entry["kept"]:
                self.retained.append(candidate_text(entry["query"], entry["goal"]))
        expanded = sum(1 for c in frame.candidates if c["kept"])
        self.counts["expanded"] += expanded
        self.counts["pruned"] += len(pending) - expanded

    # -- researcher runs and searches ------------------------------------------------------------------
    def start_branch(self, topic: str) -> _Branch:
        frame = self._supervisor
        entry = None
        if frame is not None:
            planned = {i for i, action, _, _ in frame.pending or [] if action == "expand"}
            entry = next(
                (
                    c
                    for i, c in enumerate(frame.candidates)
                    if not c["claimed"]
                    and c["query"] == topic.strip()
                    and (c["kept"] if frame.pending is None else i in planned)
                ),
                None,
            )
            if entry is not None:
                self._flush(frame, ran=True)
                entry["claimed"] = True
        if entry is None:
            self.counts["unmatched_runs"] += 1
        return _Branch(topic.strip(), entry)

    def end_branch(self, branch: _Branch, result) -> None:
        if branch.candidate is None:
            return
        if branch.searches:  # what its searches found (unknown when it searched with another tool)
            self._retrieval(branch.candidate["id"], branch.topic, list(dict.fromkeys(e for e, _ in branch.evidence)))
        text = (
            result.get("compressed_research")
            if isinstance(result, dict)
            else getattr(result, "compressed_research", None)
        )
        if text:
            self._write("learning", candidate_id=branch.candidate["id"], text=str(text))

    def _recording_search(self, search):
        async def recorded(search_queries, *args, **kwargs):
            results = await search(search_queries, *args, **kwargs)
            try:
                return self._record_search(list(search_queries), results)
            except Exception as exc:  # recording must never break the research
                self.write_errors += 1
                log.warning("branchgate: could not record a search of run %s (%s)", self.run_id, exc)
            return results

        recorded._branchgate_hook = self
        return recorded

    def _record_search(self, queries: list, results) -> list:
        """Record each query's response and pass on only the results the read stage reads (``read_hook``)."""
        branch = self._branch.get()
        frames = branch.searches if branch is not None else [f for f in self.frames if f.depth <= 1]
        out = []
        for query, response in zip(queries, results or []):
            found = next(
                (
                    (f, c)
                    for f in frames
                    for c in f.candidates
                    if c["kept"] and not c["retrieved"] and c["query"] == str(query)
                ),
                None,
            )
            if found is None:
                self.counts["unmatched_queries"] += 1
                search = SearchCall(f"unmatched:{sha256(str(query))[:10]}", str(query))
            else:
                found[1]["retrieved"] = True
                search = SearchCall(found[1]["id"], str(query), "", found[0].depth)
            if isinstance(response, dict) and isinstance(response.get("results"), list):
                response = {**response, "results": self.read_results(search, response["results"])}
            out.append(response)
            if found is not None:
                self._record_response(found[1], str(query), response, branch)
        return out + list(results or [])[len(out) :]

    def _record_response(self, entry: dict, query: str, response, branch) -> None:
        """The evidence (each read result's ``content``, source its URL) and the retrieval of one query."""
        ids = []
        for hit in (response.get("results") or []) if isinstance(response, dict) else []:
            text = str(hit.get("content") or "") if isinstance(hit, dict) else ""
            if not text.strip():
                continue
            eid = self._evidence_id(text, str(hit.get("url") or ""))
            if eid not in ids:
                ids.append(eid)
                if branch is not None:
                    branch.evidence.append((eid, self._evidence[eid]))
        self._retrieval(entry["id"], query, ids)

    def record_report(self, text, path: str | None = None) -> list[str]:
        """Record the final report (``TraceRecorder.record_report``): its cited URLs and the evidence recorded
        with those ``source`` URLs (``cited_ids``, the ``citations`` label); returns the cited ids."""
        self._flush(self._supervisor, ran=False)  # the graph has finished: a pending turn never ran
        return super().record_report(text, path)

    # -- trace writing ---------------------------------------------------------------------------------
    def _open(self, frame_query: str, depth: int, parent_frame=None, parent_candidate=None) -> _Frame:
        frame = _Frame(f"f{len(self.frames)}", depth, frame_query.strip(), parent_frame, parent_candidate)
        self.frames.append(frame)
        self._start()
        self.counts["frames"] += 1
        self._write(
            "frame_open",
            frame_id=frame.frame_id,
            parent_frame=parent_frame,
            parent_candidate=parent_candidate,
            depth=depth,
            frame_query=frame.frame_query,
            parent_goal="",
        )
        return frame

    def _config(self) -> dict:
        return {"tau": self.tau, "max_keep": self.max_keep, "package": _package_version()}


def gate_open_deep_research(gate=None, trace=None, **options) -> OpenDeepResearchHook:
    """Install the hook on the imported ``open_deep_research`` package (see the module docstring).

    ``gate``: a ``Gate`` (or anything with ``select(state, candidates, tau, max_keep)``), or None to only
    record. ``trace``: a JSONL path or a ``TraceWriter``, or None to only gate. Options: ``tau``, ``max_keep``,
    ``run_id``, ``system``, ``root_query`` (default: the research brief the supervisor receives); a run budget
    ``budget_nodes``, ``budget_tokens``, ``defer``, ``budget_options`` (``inference/run_gate.py``): the
    delegations and search queries of the run share it; once it is spent the ConductResearch calls (the
    supervisor then ends research) and search calls (the researcher then compresses what it has) are removed,
    their candidates pruned with actor ``budget``. Deferred candidates are recorded (``defer``) but never
    revisited here (the graph gives the hook no point to add work at the end). The read gate: ``read`` (a read
    controller, or None to record every result list), ``read_tau``, ``read_floor``.
    """
    return OpenDeepResearchHook(gate, trace, **options)
