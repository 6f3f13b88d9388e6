"""GPT-Researcher drop-in: gate deep-research subqueries and record the whole tree as canonical traces.

    from gpt_researcher import GPTResearcher
    from branchgate.inference.gate import Gate
    from branchgate.inference.gpt_researcher import gate_deep_research

    researcher = GPTResearcher(query="...", report_type="deep")
    hook = gate_deep_research(researcher, Gate.load("controller.onnx"), trace="traces/run.jsonl")
    await researcher.conduct_research()
    hook.record_report(await researcher.write_report())  # optional: the report and the sources it cites
    hook.close()

GPT-Researcher's deep research (``gpt_researcher/skills/deep_research.py``) asks an LLM for
``breadth`` queries ``[{"query", "researchGoal"}]`` per level (``generate_search_queries``), researches
each with a nested GPTResearcher, distils learnings and follow-up questions
(``process_research_results``) and recurses with ``breadth // 2`` per result. It logs none of that tree.
The hook patches those methods on the one skill instance (``deep_research``, ``generate_search_queries``,
``process_research_results``, ``run``): each ``deep_research`` call is a frame; its candidates are gated
(``gate=None`` only records) and never emptied, since GPT-Researcher's deep research fails on an empty
candidate list. Events: run_start, frame_open, candidate, decision, evidence + retrieval (the branch's
research context), learning, followup, run_end, and ``report`` when ``record_report(text)`` is called (the
report's cited URLs, mapped to the evidence recorded with that ``source`` URL: the ``citations`` label).

Import-safe without gpt-researcher: it is duck-typed and never imported here.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from branchgate.inference.inputs import DecisionState
from branchgate.texts import candidate_text

log = logging.getLogger(__name__)

SYSTEM = "gpt-researcher"
_GOAL = re.compile(r"Previous research goal:\s*(?P<goal>.*?)\s*(?:\n|Follow-up questions:|$)", re.S)


@dataclass
class _Frame:
    frame_id: str
    depth: int
    frame_query: str
    parent_goal: str = ""
    parent_candidate: str | None = None
    parent_frame: str | None = None
    retained: list[str] = field(default_factory=list)
    candidates: list[dict] = field(default_factory=list)  # {"id", "query", "goal", "kept"}
    children: int = 0
    batches: int = 0  # candidate lists gated in this frame; each is a decision point of its own


class DeepResearchHook:
    """Gating + recording for one ``DeepResearchSkill`` (see the module docstring)."""

    def __init__(self, skill, gate=None, trace=None, *, tau: float | None = None, max_keep: int | None = None,
                 run_id: str | None = None, system: str = SYSTEM, root_query: str | None = None):
        for name in ("generate_search_queries", "deep_research"):
            if not callable(getattr(skill, name, None)):
                raise TypeError(f"{type(skill).__name__} has no {name}(): not a GPT-Researcher DeepResearchSkill")
        self.skill, self.gate = skill, gate
        self.tau, self.max_keep = tau, max_keep
        self.run_id = run_id or f"gptr-{uuid.uuid4().hex[:12]}"
        self.system = system
        self._root_query = root_query
        self._own_writer = False
        if trace is None or hasattr(trace, "write"):
            self.writer = trace
        else:
            from branchgate.logs_to_dataset.traces import TraceWriter

            self.writer = TraceWriter(Path(trace))
            self._own_writer = True
        self._frame: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar(f"branchgate_frame_{id(self)}", default=None)
        self.frames: list[_Frame] = []
        self.retained: list[str] = []
        self._evidence: set[str] = set()
        self._by_url: dict[str, list[str]] = {}  # source URL → evidence ids (for the report's citations)
        self._started = self._ended = False
        self.write_errors = 0
        self._t0 = time.time()
        self.counts = {"frames": 0, "candidates": 0, "expanded": 0, "pruned": 0, "fallbacks": 0, "retrievals": 0}
        self._orig = {}
        self.install()

    # -- patching --------------------------------------------------------------------------------------
    def install(self) -> None:
        skill = self.skill
        for name in ("generate_search_queries", "deep_research", "process_research_results", "run"):
            if callable(getattr(skill, name, None)) and name not in self._orig:
                self._orig[name] = getattr(skill, name)
                setattr(skill, name, getattr(self, f"_{name}"))

    def uninstall(self) -> None:
        for name in self._orig:
            try:
                delattr(self.skill, name)  # back to the class's method
            except AttributeError:
                pass
        self._orig.clear()

    def close(self, status: str = "ok") -> None:
        """Write run_end (once) and close a trace file opened here."""
        self._end(status)
        if self._own_writer and self.writer is not None:
            self.writer.close()

    # -- wrappers --------------------------------------------------------------------------------------
    async def _run(self, *args, **kwargs):
        self._start()
        status = "error"
        try:
            out = await self._orig["run"](*args, **kwargs)
            status = "ok"
            return out
        finally:
            self._end(status)

    async def _deep_research(self, query, breadth, depth, *args, **kwargs):
        self._start()
        frame = self._open(str(query or ""))
        token = self._frame.set(frame)
        try:
            return await self._orig["deep_research"](query, breadth, depth, *args, **kwargs)
        finally:
            self._frame.reset(token)

    async def _generate_search_queries(self, query, num_queries=3, *args, **kwargs):
        cands = await self._orig["generate_search_queries"](query, num_queries, *args, **kwargs)
        self._start()
        frame = self._frame.get()
        if frame is None:  # called outside deep_research: a frame of its own
            frame = self._open(str(query or ""))
        return self._gate(frame, list(cands or []))

    async def _process_research_results(self, query, context, *args, **kwargs):
        result = await self._orig["process_research_results"](query, context, *args, **kwargs)
        try:
            self._record_research(self._frame.get(), str(query or ""), context, result)
        except Exception:  # recording must never break the research
            pass
        return result

    # -- frames and decisions ----------------------------------------------------------------------------
    def _open(self, query: str) -> _Frame:
        parent = self._frame.get()
        frame_id = f"f{len(self.frames)}"
        goal, parent_cand = "", None
        if parent is not None:
            m = _GOAL.search(query)
            wanted = m.group("goal").strip() if m else None
            kept = [c for c in parent.candidates if c["kept"]]
            match = next((c for c in kept if wanted is not None and c["goal"].strip() == wanted and not c.get("child")), None)
            if match is None and parent.children < len(kept):
                match = kept[parent.children]
            parent.children += 1
            if match is not None:
                match["child"] = frame_id
                goal, parent_cand = match["goal"], match["id"]
            elif wanted:
                goal = wanted
        frame = _Frame(frame_id, 0 if parent is None else parent.depth + 1, query.strip(), goal, parent_cand,
                       None if parent is None else parent.frame_id, list(self.retained))
        self.frames.append(frame)
        self.counts["frames"] += 1
        self._write("frame_open", frame_id=frame_id, parent_frame=frame.parent_frame, parent_candidate=parent_cand,
                    depth=frame.depth, frame_query=frame.frame_query, parent_goal=goal)
        return frame

    def _gate(self, frame: _Frame, cands: list) -> list:
        pairs = [_fields(c) for c in cands]
        base = len(frame.candidates)
        decision_frame, retained = frame.frame_id, frame.retained
        if base and cands:  # a second list in the same frame is gated as a decision point of its own: record it so
            frame.batches += 1  # (its own frame_open, orders 0..n-1), as the Gate saw it
            decision_frame, retained = f"{frame.frame_id}.{frame.batches}", list(self.retained)
            self._write("frame_open", frame_id=decision_frame, parent_frame=frame.parent_frame,
                        parent_candidate=frame.parent_candidate, depth=frame.depth, frame_query=frame.frame_query,
                        parent_goal=frame.parent_goal)
        for i, (q, g) in enumerate(pairs):
            cid = f"{frame.frame_id}.c{base + i}"
            frame.candidates.append({"id": cid, "query": q, "goal": g, "kept": False})
            self._write("candidate", frame_id=decision_frame, candidate_id=cid, order=i, query=q, goal=g)
        self.counts["candidates"] += len(cands)
        if not cands:
            return cands
        p_keep = [None] * len(cands)
        if self.gate is not None:
            state = DecisionState(self.root_query, frame.frame_query, frame.parent_goal, retained, frame.depth)
            sel = self.gate.select(state, pairs, tau=self.tau, max_keep=self.max_keep)
            kept, p_keep = list(sel.kept), [float(p) for p in sel.p_keep]
            actor = f"controller:{getattr(self.gate, 'name', 'gate')}"
            self.counts["fallbacks"] += int(sel.fallback)
        else:
            kept, actor = list(range(len(cands))), "default"
        if not kept:  # a custom gate returned nothing: GPT-Researcher cannot take an empty list
            kept = [max(range(len(cands)), key=lambda i: (p_keep[i] or 0.0))]
        keep = set(kept)
        for i in range(len(cands)):
            entry = frame.candidates[base + i]
            entry["kept"] = i in keep
            self._write("decision", candidate_id=entry["id"], action="expand" if i in keep else "prune", actor=actor,
                        score=p_keep[i], p_keep=p_keep[i])
        self.counts["expanded"] += len(keep)
        self.counts["pruned"] += len(cands) - len(keep)
        self.retained.extend(candidate_text(*pairs[i]) for i in kept)
        return [cands[i] for i in kept]

    def _record_research(self, frame: _Frame | None, query: str, context, result) -> None:
        cand = None
        if frame is not None:
            cand = next((c for c in frame.candidates if c["kept"] and c["query"] == query.strip()), None)
        cid = cand["id"] if cand else f"unmatched:{_sha(query)[:10]}"
        items = context if isinstance(context, list) else [context]
        ids, tokens = [], 0
        for item in items:
            text = item if isinstance(item, str) else str((item or {}).get("Content", item)) if isinstance(item, dict) else str(item)
            if not text or not text.strip():
                continue
            eid = f"e{_sha(text)[:16]}"
            n = len(text.split())
            if eid not in self._evidence:
                self._evidence.add(eid)
                source = str(item.get("url") or item.get("href") or "") if isinstance(item, dict) else ""
                self._write("evidence", evidence_id=eid, text=text, source=source, tokens=n)
                if source:
                    self._by_url.setdefault(source, []).append(eid)
            ids.append(eid)
            tokens += n
        self._write("retrieval", candidate_id=cid, query=query, evidence_ids=ids, tokens=tokens)
        self.counts["retrievals"] += 1
        if isinstance(result, dict):
            for text in result.get("learnings") or []:
                self._write("learning", candidate_id=cid, text=str(text))
            for text in result.get("followUpQuestions") or []:
                self._write("followup", candidate_id=cid, text=str(text))

    def record_report(self, text, path: str | None = None) -> list[str]:
        """Record the final report: its cited URLs (``cited_sources``) and the evidence recorded with those
        ``source`` URLs (``cited_ids``); returns the cited ids. GPT-Researcher writes the report after deep
        research, so this event may follow run_end."""
        from branchgate.logs_to_dataset.readers.gptr import cited_urls, map_urls

        text = str(text or "")
        cited = cited_urls(text)
        ids, unmapped = map_urls(cited, self._by_url)
        self.counts["cited_unmapped"] = unmapped
        self._write("report", text=text, path=path, cited_ids=ids, cited_sources=cited)
        return ids

    # -- trace writing ------------------------------------------------------------------------------------
    @property
    def root_query(self) -> str:
        if self._root_query is None:
            researcher = getattr(self.skill, "researcher", None)
            q = getattr(researcher, "query", None)
            if isinstance(q, str) and q:
                self._root_query = q
            elif self.frames:
                self._root_query = self.frames[0].frame_query
        return self._root_query or ""

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        config = {k: getattr(self.skill, k, None) for k in ("breadth", "depth", "concurrency_limit")}
        config["gate"] = None if self.gate is None else str(getattr(self.gate, "path", getattr(self.gate, "name", "gate")))
        self._write("run_start", root_query=self.root_query, system=self.system, config=config)

    def _end(self, status: str) -> None:
        if not self._started or self._ended:
            return
        self._ended = True
        totals = dict(self.counts, nodes=self.counts["expanded"], retrieval_calls=self.counts["retrievals"],
                      wall_s=round(time.time() - self._t0, 3))
        self._write("run_end", status=status, totals=totals)

    def _write(self, type_: str, **fields) -> None:
        if self.writer is None:
            return
        try:
            self.writer.write(type=type_, run_id=self.run_id, **fields)
        except Exception as exc:  # recording must never break the research; say so once, count the rest
            self.write_errors += 1
            if self.write_errors == 1:
                log.warning("branchgate: could not record a %s event of run %s (%s); further failures are counted "
                            "in hook.write_errors", type_, self.run_id, exc)


def gate_deep_research(researcher_or_skill, gate=None, trace=None, **options) -> DeepResearchHook:
    """Install the hook on a ``GPTResearcher`` (its ``deep_researcher``) or a ``DeepResearchSkill``.

    ``gate``: a ``Gate`` (or anything with ``select(state, candidates, tau, max_keep)``), or None to only
    record. ``trace``: a JSONL path or a ``TraceWriter``, or None to only gate. Options: ``tau``,
    ``max_keep``, ``run_id``, ``system``, ``root_query``.
    """
    skill = getattr(researcher_or_skill, "deep_researcher", None) or researcher_or_skill
    return DeepResearchHook(skill, gate, trace, **options)


def _fields(c) -> tuple[str, str]:
    if isinstance(c, dict):
        return str(c.get("query") or ""), str(c.get("researchGoal") or c.get("goal") or "")
    if isinstance(c, str):
        return c, ""
    return str(getattr(c, "query", c)), str(getattr(c, "researchGoal", getattr(c, "goal", "")) or "")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()
