"""GPT-Researcher drop-in: gate its subqueries before they are researched, in both of its modes, and record
the whole research tree as canonical traces.

    from gpt_researcher import GPTResearcher
    from branchgate.inference.gate import Gate
    from branchgate.inference.agents.gpt_researcher import gate_research

    researcher = GPTResearcher(query="...", report_type="research_report")   # or report_type="deep"
    hook = gate_research(researcher, Gate.load("controller.onnx"), trace="traces/run.jsonl")
    await researcher.conduct_research()
    hook.record_report(await researcher.write_report())  # optional: the report and the sources it cites
    hook.close()

Checked against gpt-researcher 0.15.1 (the newest release that installs on Python 3.11).

**Standard mode** (``research_report`` and the other single-level report types). ``ResearchConductor.plan_research``
returns the sub-queries of one research step (``generate_sub_queries``: untyped ``json_repair`` output, so
anything but a list of strings is passed through ungated and counted in ``hook.counts["untyped_plans"]``);
its callers append the researched query itself (except for ``subtopic_report``) and research all of them
with ``asyncio.gather``. The hook gates that list (the query GPT-Researcher appends is always researched:
it is not a candidate) and records each sub-query's context (``_process_sub_query``) as its retrieval, one
evidence item per ``Source:`` block, so report citations map to branches. Both methods are patched on the
conductor *class*, once per process; they act only inside a hooked researcher's ``conduct_research``
(a context variable), so other researchers in the process are untouched.

**Deep mode** (``report_type="deep"``, ``gpt_researcher/skills/deep_research.py``). The skill asks an LLM for
``breadth`` queries ``[{"query", "researchGoal"}]`` per level (``generate_search_queries``), researches each
with a nested standard-mode GPTResearcher, distils learnings and follow-up questions
(``process_research_results``) and recurses with ``breadth // 2`` per result. The hook patches those methods
on the one skill instance: each ``deep_research`` call is a frame whose candidates are gated. The nested
researchers' own plans are gated too (the class-level patch) and recorded as frames below the deep branch
they research; that branch's retrieval is then the evidence its nested sub-queries found. What holds in
0.15.1: an empty candidate list makes deep research return an empty context (no crash, but nothing is
researched), so the hook never empties a list (if a custom gate keeps nothing, the top-1 is kept); a query
without ``researchGoal`` is researched (paid for) and then dropped by GPT-Researcher (a ``KeyError`` its
``process_query`` swallows): the hook records that branch's retrieval and a ``raw`` event
``gptr:dropped_without_goal``, and counts it in ``hook.counts["dropped_without_goal"]``.

**Budgets** (``gate_research(..., budget_nodes=N, budget_tokens=T, defer=True)``; ``inference/run_gate.py``): the
gated lists of the whole run (every frame, both modes) share one budget. Nodes are the sub-queries the hook lets
through; tokens are what each researched branch brought in (its new evidence, in words, reported when its
context is recorded). Once the budget cannot afford a candidate the hook stops expanding: it hands
GPT-Researcher an empty list (a standard-mode step then researches only the query it appends itself; a deep
level researches nothing and returns), the sub-queries are pruned with ``actor: "budget"`` and nothing
crashes. With ``defer=True`` candidates just below the admission price are deferred (action ``defer``); when
a standard-mode ``conduct_research`` ends with budget left, the best of its own plan's deferred sub-queries are
re-scored against the context then, researched through the conductor's ``_process_sub_query`` and their
context appended to ``researcher.context`` (their ``expand`` names the defer in ``deferred_from``). Deferred
candidates of deep mode and of nested researchers stay deferred (never expanded). ``hook.counts`` adds
``deferred``, ``revisited``, ``dropped_by_budget``, ``exhausted``.

**The read gate** (``gate_research(..., read=READ_CONTROLLER, read_tau=None, read_floor=None)``;
``read_hook.py``). In 0.15.1 ``ResearchConductor._search_relevant_source_urls`` gets each retriever's results
(``{href, body}``; a body over 100 characters is taken as already fetched content, the other URLs are
deduplicated, shuffled and scraped by ``_scrape_data_by_urls``). The hook routes that method through the read
stage (``gptr_patches``): every result list is decided there, before either path, so a skipped URL is never
fetched and a skipped prefetched page never reaches the context compressor. The search is matched to its
branch: a kept candidate of the conductor's gated plan with that query, else the plan's own search (the query
GPT-Researcher appends: a ``results`` event naming its ``frame_id``). ``read=None`` records every result list
and passes everything on.

Events: run_start, frame_open, candidate, decision, results + read, evidence + retrieval, learning, followup,
raw, run_end, and ``report`` when ``record_report(text)`` is called (the report's cited URLs, mapped to the evidence
recorded with that ``source`` URL: the ``citations`` label). ``gate=None`` only records.

Import-safe without gpt-researcher: it is duck-typed and never imported here. (What the hook patches and the
wrappers it installs are ``gptr_patches.py``; trace writing is ``recorder.py``.)
"""

from __future__ import annotations

import contextvars
import logging
import re
from dataclasses import dataclass, field

from branchgate.inference.agents.gptr_patches import ResearchPatches
from branchgate.inference.agents.read_hook import ReadHook, SearchCall
from branchgate.inference.agents.recorder import TraceRecorder, sha256
from branchgate.inference.inputs import DecisionState
from branchgate.texts import candidate_text

log = logging.getLogger(__name__)

SYSTEM = "gpt-researcher"
_SOURCE = re.compile(r"^Source: *(?P<url>\S*) *$", re.M)  # a block of GPT-Researcher's pretty_print_docs context
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
    evidence_ids: list[str] = field(default_factory=list)  # a plan frame's: all its research found
    own_searches: int = 0  # a plan frame's searches of no candidate (the query GPT-Researcher adds)


class ResearchHook(ResearchPatches, ReadHook, TraceRecorder):
    """Gating + recording for one GPTResearcher (either mode) or one ``DeepResearchSkill`` (see the module
    docstring; what it patches and the wrappers it installs: ``gptr_patches.ResearchPatches``)."""

    def __init__(
        self,
        target,
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
        skill = getattr(target, "deep_researcher", None)
        conductor = getattr(target, "research_conductor", None)
        if skill is None and conductor is None:  # a DeepResearchSkill itself
            skill = target
        if skill is not None:
            for name in ("generate_search_queries", "deep_research"):
                if not callable(getattr(skill, name, None)):
                    raise TypeError(f"{type(skill).__name__} has no {name}(): not a GPT-Researcher DeepResearchSkill")
        if conductor is not None:
            for name in ("plan_research", "_process_sub_query"):
                if not callable(getattr(type(conductor), name, None)):
                    raise TypeError(
                        f"{type(conductor).__name__} has no {name}(): not a GPT-Researcher ResearchConductor"
                    )
            if not callable(getattr(target, "conduct_research", None)):
                raise TypeError(f"{type(target).__name__} has no conduct_research(): not a GPTResearcher")
        self.researcher = target if conductor is not None else getattr(skill, "researcher", None)
        self.skill, self.conductor = skill, conductor
        counts = ("untyped_plans", "dropped_without_goal")
        super().__init__(gate, trace, system=system, run_prefix="gptr", counts=counts, **options)
        self._frame: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar(
            f"branchgate_frame_{id(self)}", default=None
        )
        self._plans: dict[int, _Frame] = {}  # id(conductor) → the frame of its plan
        self._init_read(read, read_tau, read_floor)
        self._orig = {}
        self.install()

    def close(self, status: str = "ok") -> None:
        """Write run_end (once) and close a trace file opened here."""
        self._end(status)
        self._close_writer()

    def _plan(self, conductor, query, outline):
        """Gate one standard-mode research plan (``plan_research``'s sub-queries)."""
        if not isinstance(outline, list) or not all(isinstance(q, str) for q in outline):
            self.counts["untyped_plans"] += 1
            log.warning(
                "branchgate: plan_research returned %s, not a list of strings: passed through ungated",
                type(outline).__name__,
            )
            return outline
        self._start()
        own = str(getattr(getattr(conductor, "researcher", None), "query", None) or query or "")
        frame = self._open(own, branch=own)
        self._plans[id(conductor)] = frame
        return self._gate(frame, outline)

    def _sub_query_done(self, conductor, sub_query, context) -> None:
        """Record one researched sub-query's context: the retrieval of its candidate; the query GPT-Researcher
        appends itself has no candidate, so its evidence only joins the plan's (and so its deep branch's)."""
        frame = self._plans.get(id(conductor))
        if frame is None:
            return
        q = str(sub_query or "").strip()
        cand = next((c for c in frame.candidates if c["kept"] and c["query"] == q and not c.get("done")), None)
        ids = self._evidence_of(context)
        frame.evidence_ids.extend(i for i in ids if i not in frame.evidence_ids)
        if cand is not None:
            cand["done"] = True
            self._retrieval(cand["id"], q, ids)

    def _search_of(self, conductor, query: str) -> SearchCall:
        """The branch one search call of ``conductor`` belongs to: the kept candidate of its gated plan with this
        query (the first not searched yet), else the plan's own search (the query GPT-Researcher adds to every
        plan), else a search outside any gated plan (its results are recorded, no read point is built)."""
        q = query.strip()
        frame = self._plans.get(id(conductor))
        with self._lock:
            if frame is None:
                return SearchCall(f"unplanned:{sha256(q)[:10]}", q)
            same = [c for c in frame.candidates if c["kept"] and c["query"] == q]
            cand = next((c for c in same if not c.get("searched")), same[-1] if same else None)
            if cand is not None:
                cand["searched"] = True
                return SearchCall(cand["id"], q, cand["goal"], frame.depth)
            frame.own_searches += 1
            return SearchCall(f"{frame.frame_id}.own{frame.own_searches}", q, "", frame.depth, frame.frame_id)

    # -- frames and decisions ----------------------------------------------------------------------------
    def _open(self, query: str, branch: str | None = None) -> _Frame:
        """A new frame below the current deep frame (if any). A deep frame's parent candidate is found by the
        research goal its query repeats (else the next kept one); a plan frame's (``branch``: the query its
        nested researcher was made for) by that query."""
        parent = self._frame.get()
        frame_id = f"f{len(self.frames)}"
        goal, parent_cand = "", None
        if parent is not None and branch is not None:
            match = next(
                (c for c in parent.candidates if c["kept"] and c["query"] == branch.strip() and not c.get("plan")), None
            )
            if match is not None:
                match["plan"] = frame_id
                goal, parent_cand = match["goal"], match["id"]
        elif parent is not None:
            m = _GOAL.search(query)
            wanted = m.group("goal").strip() if m else None
            kept = [c for c in parent.candidates if c["kept"]]
            match = next(
                (c for c in kept if wanted is not None and c["goal"].strip() == wanted and not c.get("child")), None
            )
            if match is None and parent.children < len(kept):
                match = kept[parent.children]
            parent.children += 1
            if match is not None:
                match["child"] = frame_id
                goal, parent_cand = match["goal"], match["id"]
            elif wanted:
                goal = wanted
        frame = _Frame(
            frame_id,
            0 if parent is None else parent.depth + 1,
            query.strip(),
            goal,
            parent_cand,
            None if parent is None else parent.frame_id,
            list(self.retained),
        )
        self.frames.append(frame)
        self.counts["frames"] += 1
        self._write(
            "frame_open",
            frame_id=frame_id,
            parent_frame=frame.parent_frame,
            parent_candidate=parent_cand,
            depth=frame.depth,
            frame_query=frame.frame_query,
            parent_goal=goal,
        )
        return frame

    def _gate(self, frame: _Frame, cands: list) -> list:
        pairs = [_fields(c) for c in cands]
        base = len(frame.candidates)
        decision_frame, retained = frame.frame_id, frame.retained
        if base and cands:  # a second list in the same frame is gated as a decision point of its own: record it so
            frame.batches += 1  # (its own frame_open, orders 0..n-1), as the Gate saw it
            decision_frame, retained = f"{frame.frame_id}.{frame.batches}", list(self.retained)
            self._write(
                "frame_open",
                frame_id=decision_frame,
                parent_frame=frame.parent_frame,
                parent_candidate=frame.parent_candidate,
                depth=frame.depth,
                frame_query=frame.frame_query,
                parent_goal=frame.parent_goal,
            )
        for i, (q, g) in enumerate(pairs):
            cid = f"{frame.frame_id}.c{base + i}"
            frame.candidates.append(
                {
                    "id": cid,
                    "query": q,
                    "goal": g,
                    "kept": False,
                    "has_goal": not isinstance(cands[i], dict) or "researchGoal" in cands[i],
                }
            )
            self._write("candidate", frame_id=decision_frame, candidate_id=cid, order=i, query=q, goal=g)
        self.counts["candidates"] += len(cands)
        if not cands:
            return cands
        p_keep = [None] * len(cands)
        ids = [frame.candidates[base + i]["id"] for i in range(len(cands))]
        sel = None
        if self.gate is not None:
            state = DecisionState(self.root_query, frame.frame_query, frame.parent_goal, retained, frame.depth)
            sel = self._gate_select(state, pairs, ids)
            self._out_of_range(decision_frame, sel)
            kept, p_keep = list(sel.kept), [float(p) for p in sel.p_keep]
            actor = f"controller:{getattr(self.gate, 'name', 'gate')}"
            self.counts["fallbacks"] += int(sel.fallback)
        else:
            kept, actor = list(range(len(cands))), "default"
        exhausted = bool(getattr(sel, "exhausted", False))
        if not kept and not exhausted:  # a custom gate returned nothing: never an empty list (module docstring)
            kept = [max(range(len(cands)), key=lambda i: p_keep[i] or 0.0)]
        for i in range(len(cands)):
            frame.candidates[base + i]["kept"] = i in kept
        self._decisions(ids, kept, actor, p_keep, sel)
        self.retained.extend(candidate_text(*pairs[i]) for i in kept)
        return [cands[i] for i in kept]

    def _record_research(self, frame: _Frame | None, query: str, context, result) -> None:
        """A deep branch's research: its retrieval is what its nested plan found (when that plan was gated
        here), else the context GPT-Researcher hands ``process_research_results``."""
        cand = None
        if frame is not None:
            cand = next((c for c in frame.candidates if c["kept"] and c["query"] == query.strip()), None)
        cid = cand["id"] if cand else f"unmatched:{sha256(query)[:10]}"
        plan = next((f for f in self.frames if cand is not None and f.frame_id == cand.get("plan")), None)
        ids = list(plan.evidence_ids) if plan is not None and plan.evidence_ids else self._evidence_of(context)
        self._retrieval(cid, query, ids)
        if cand is not None and not cand.get("has_goal", True):
            self.counts["dropped_without_goal"] += 1
            self._write(
                "raw",
                source_type="gptr:dropped_without_goal",
                data={
                    "candidate_id": cid,
                    "query": query,
                    "note": "no researchGoal: researched, then dropped by GPT-Researcher (KeyError "
                    "swallowed in deep_research's process_query); no learnings or follow-ups used",
                },
            )
        if isinstance(result, dict):
            for text in result.get("learnings") or []:
                self._write("learning", candidate_id=cid, text=str(text))
            for text in result.get("followUpQuestions") or []:
                self._write("followup", candidate_id=cid, text=str(text))

    def _evidence_of(self, context) -> list[str]:
        """Evidence ids of a research context (written once each, with their source URL)."""
        return list(dict.fromkeys(self._evidence_id(text, source) for text, source in _context_items(context)))

    # -- trace writing ------------------------------------------------------------------------------------
    @property
    def root_query(self) -> str:
        q = getattr(self.researcher, "query", None)
        if self._root_query is None and isinstance(q, str) and q:
            self._root_query = q
        return super().root_query

    def _config(self) -> dict:
        config = (
            {k: getattr(self.skill, k, None) for k in ("breadth", "depth", "concurrency_limit")} if self.skill else {}
        )
        return {
            **config,
            "mode": "deep" if self.skill is not None else "standard",
            "report_type": getattr(self.researcher, "report_type", None),
        }


def gate_research(target, gate=None, trace=None, **options) -> ResearchHook:
    """Install the hook on a ``GPTResearcher`` (standard or deep mode; in deep mode its nested researchers'
    plans too) or on a ``DeepResearchSkill`` alone (its deep frames only).

    ``gate``: a ``Gate`` (or anything with ``select(state, candidates, tau, max_keep)``), or None to only
    record. ``trace``: a JSONL path or a ``TraceWriter``, or None to only gate. Options: ``tau``,
    ``max_keep``, ``run_id``, ``system``, ``root_query``; a run budget ``budget_nodes``, ``budget_tokens``,
    ``defer`` and ``budget_options`` (``RunGate`` parameters: price_start, price_end, price_exponent,
    defer_margin, revisit_floor, tokens_per_node, max_share); the read gate ``read`` (a read controller, or
    None to record the result lists only), ``read_tau``, ``read_floor``; see the module docstring.
    """
    return ResearchHook(target, gate, trace, **options)


def _context_items(context) -> list[tuple[str, str]]:
    """(text, source URL) items of a research context: a list of strings or ``{Content|raw_content, url}``
    dicts, or GPT-Researcher's string of ``Source: URL / Title / Content`` blocks (one item per block)."""
    items = context if isinstance(context, list) else [context]
    out = []
    for item in items:
        if isinstance(item, dict):
            text = str(item.get("Content") or item.get("raw_content") or item.get("content") or "")
            out.append((text, str(item.get("url") or item.get("href") or item.get("Source") or "")))
            continue
        text = "" if item is None else str(item)
        marks = list(_SOURCE.finditer(text))
        if not marks:
            out.append((text, ""))
            continue
        if text[: marks[0].start()].strip():
            out.append((text[: marks[0].start()], ""))
        for m, nxt in zip(marks, marks[1:] + [None]):  # "Source: None": 0.15.1's fast path lost the URL
            url = "" if m.group("url") == "None" else m.group("url")
            out.append((text[m.end() : nxt.start() if nxt else len(text)], url))
    return [(t.strip(), src) for t, src in out if t.strip()]


def _fields(c) -> tuple[str, str]:
    if isinstance(c, dict):
        return str(c.get("query") or ""), str(c.get("researchGoal") or c.get("goal") or "")
    if isinstance(c, str):
        return c, ""
    return str(getattr(c, "query", c)), str(getattr(c, "researchGoal", getattr(c, "goal", "")) or "")
