"""What the GPT-Researcher hook (``gpt_researcher.py``) installs: ``ResearchPatches``, a mixin of
``ResearchHook``, patches the deep-research skill's methods on the instance and the researcher's
``conduct_research``, and wraps them (a whole run between run_start and run_end, deep frames, gated query
lists, recorded research results, deferred sub-queries researched at the end); ``_patch_conductor`` routes
the research conductor class's ``plan_research`` and ``_process_sub_query`` through the active hook, once
per process, and ``_search_relevant_source_urls`` through the read stage: each retriever class of the
researcher is swapped for a subclass of itself (``read_gated``, once per class) whose ``search`` hands its
results to the hook's read gate (``read_hook.ReadHook.read_results``) before GPT-Researcher splits them into
pages to scrape and content already fetched. The subclass keeps the class's name (GPT-Researcher tells MCP
retrievers apart by it) and is inert outside a hooked search (a context variable, which ``asyncio.to_thread``
carries into the retriever's thread).
"""

from __future__ import annotations

import contextvars
import logging

from branchgate.inference.inputs import DecisionState
from branchgate.texts import candidate_text

log = logging.getLogger("branchgate.inference.agents.gpt_researcher")  # one logger name for the hook's messages

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("branchgate_gptr_hook", default=None)
_SEARCH: contextvars.ContextVar = contextvars.ContextVar("branchgate_gptr_search", default=None)  # (hook, SearchCall)
_PATCHED: dict[type, dict] = {}  # research conductor class → its own plan_research / _process_sub_query / search
_GATED: dict[type, type] = {}  # retriever class → its read-gated subclass


class ResearchPatches:
    """``ResearchHook``'s patches and wrappers (a mixin: ``gpt_researcher.ResearchHook`` is the class)."""

    def install(self) -> None:
        skill = self.skill
        if skill is not None:
            for name in ("generate_search_queries", "deep_research", "process_research_results", "run"):
                if callable(getattr(skill, name, None)) and name not in self._orig:
                    self._orig[name] = getattr(skill, name)
                    setattr(skill, name, getattr(self, f"_{name}"))
        if self.conductor is not None and "conduct_research" not in self._orig:
            _patch_conductor(type(self.conductor))
            self._orig["conduct_research"] = self.researcher.conduct_research
            self.researcher.conduct_research = self._conduct_research

    def uninstall(self) -> None:
        """Restore the patched instances (the conductor class's patch stays: it is inert outside a hook)."""
        for name in self._orig:
            try:
                delattr(self.researcher if name == "conduct_research" else self.skill, name)  # back to the class's
            except AttributeError:
                pass
        self._orig.clear()

    # -- wrappers --------------------------------------------------------------------------------------
    async def _whole_run(self, name: str, args, kwargs):
        """Call the patched ``name`` as the whole run: run_start before it, run_end (ok / error) after it; a
        standard-mode run with budget left researches its best deferred sub-queries first (``_expand_deferred``)."""
        self._start()
        status = "error"
        try:
            out = await self._orig[name](*args, **kwargs)
            if name == "conduct_research" and self.skill is None and self.run_gate is not None:
                out = await self._expand_deferred(out)
            status = "ok"
            return out
        finally:
            self._end(status)

    async def _expand_deferred(self, context):
        """The run ends with budget left: re-score this researcher's own deferred sub-queries against the
        context now, research those the budget admits (best first) and append their context."""
        frame = self._plans.get(id(self.conductor))
        run = self.run_gate
        if frame is None or not run.deferred or run.exhausted:
            return context
        own = {c["id"]: c for c in frame.candidates}
        others = [d for d in run.deferred if d.key not in own]
        run.deferred = [d for d in run.deferred if d.key in own]  # only this plan's can be researched here
        try:
            state = DecisionState(
                self.root_query, frame.frame_query, frame.parent_goal, list(self.retained), frame.depth
            )
            chosen = self._revisit(state, f"controller:{getattr(self.gate, 'name', 'gate')}")
        finally:
            run.deferred = others + run.deferred
        extra = []
        for d in chosen:
            entry = own[d.key]
            entry["kept"] = True
            self.retained.append(candidate_text(entry["query"], entry["goal"]))
            domains = getattr(self.researcher, "query_domains", None) or []
            got = await self.conductor._process_sub_query(entry["query"], [], domains)
            if got:
                extra.append(got if isinstance(got, str) else str(got))
        if extra and isinstance(context, str):
            context = " ".join([context, *extra]) if context else " ".join(extra)
            self.researcher.context = context
        elif extra and isinstance(context, list):
            context = [*context, *extra]
            self.researcher.context = context
        return context

    async def _run(self, *args, **kwargs):
        return await self._whole_run("run", args, kwargs)

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

    async def _conduct_research(self, *args, **kwargs):
        token = _ACTIVE.set(self)  # the conductor class's patch (and nested researchers) act for this hook
        try:
            return await self._whole_run("conduct_research", args, kwargs)
        finally:
            _ACTIVE.reset(token)


def _patch_conductor(cls) -> None:
    """Route ``cls.plan_research`` and ``cls._process_sub_query`` through the active hook (``_ACTIVE``), once
    per class; outside a hooked ``conduct_research`` they behave exactly as GPT-Researcher's own."""
    if cls in _PATCHED:
        return
    orig = _PATCHED[cls] = {
        "plan": cls.plan_research,
        "sub": cls._process_sub_query,
        "search": getattr(cls, "_search_relevant_source_urls", None),
    }

    async def plan_research(self, query, *args, **kwargs):
        outline = await orig["plan"](self, query, *args, **kwargs)
        hook = _ACTIVE.get()
        return outline if hook is None else hook._plan(self, query, outline)

    async def _process_sub_query(self, sub_query, *args, **kwargs):
        context = await orig["sub"](self, sub_query, *args, **kwargs)
        hook = _ACTIVE.get()
        if hook is not None:
            try:
                hook._sub_query_done(self, sub_query, context)
            except Exception:  # recording must never break the research
                log.exception("branchgate: could not record sub-query %r", sub_query)
        return context

    async def _search_relevant_source_urls(self, query, *args, **kwargs):
        hook = _ACTIVE.get()
        researcher = getattr(self, "researcher", None)
        if hook is None or researcher is None:
            return await orig["search"](self, query, *args, **kwargs)
        researcher.retrievers = [read_gated(r) for r in getattr(researcher, "retrievers", None) or []]
        token = _SEARCH.set((hook, hook._search_of(self, str(query or ""))))
        try:
            return await orig["search"](self, query, *args, **kwargs)
        finally:
            _SEARCH.reset(token)

    cls.plan_research, cls._process_sub_query = plan_research, _process_sub_query
    if orig["search"] is not None:
        cls._search_relevant_source_urls = _search_relevant_source_urls


def read_gated(retriever):
    """``retriever`` (a GPT-Researcher retriever class) as a subclass whose ``search`` passes its results through
    the active hook's read gate; the same subclass every time (a gated class, or anything but a class, is
    returned as it is)."""
    if not isinstance(retriever, type) or getattr(retriever, "_branchgate_read", False):
        return retriever
    if retriever not in _GATED:

        def search(self, *args, **kwargs):
            results = super(gated, self).search(*args, **kwargs)
            active = _SEARCH.get()
            if active is None or not isinstance(results, list) or not results:
                return results
            hook, where = active
            return hook.read_results(where, results)

        names = {
            "__module__": retriever.__module__,
            "__qualname__": retriever.__qualname__,
            "__doc__": retriever.__doc__,
        }
        gated = type(retriever.__name__, (retriever,), {"search": search, "_branchgate_read": True, **names})
        _GATED[retriever] = gated
    return _GATED[retriever]
