"""The read gate inside an agent hook: one search's result list in, the results to read out.

The GPT-Researcher hook (``gptr_patches``: each retriever's results in ``_search_relevant_source_urls``) and the
open_deep_research hook (``open_deep_research.py``: Tavily's results before ``summarize_webpage``) hand every
search's results here after the search call returns and before any page is fetched, scraped or summarised.
``ReadHook`` is a mixin of ``recorder.TraceRecorder``:

- Each result becomes a hit (``as_hit``): id = its URL (``href``, else ``url``); title and snippet by
  ``texts.hit_of`` from its ``title`` and its text (``body`` / ``snippet`` / ``content`` / ``raw_content``, the
  first that is set): the first ``texts.SNIPPET_WORDS`` words. A retriever that returns whole pages is cut to a
  snippet's length, so the controller never sees more than a search engine shows. A result without a URL, or
  without any text, is passed on untouched and not recorded.
- With a read controller (``read=``, a ``Gate`` whose stage is ``read``) the new hits are scored against the run's
  read state (the root question, the sub-query searched and its goal, the hits read so far in this run, the
  depth) and those with p_keep ≥ τ are read (``read_tau``, default the controller's; ``read_floor="root"`` keeps
  the top hit at the root frame when none passes). A hit whose URL this run has read before is not read again
  (actor ``seen``). Without a controller (``read=None``) every result is passed on, exactly as the agent would,
  and recorded as read: the hook then only collects the logs a read controller is trained on.
- Each search is recorded as a ``results`` event (its hits in rank order) and one ``read`` event per hit
  (``read`` or ``skip``; actor ``controller:NAME``, ``default`` or ``seen``; its p_keep). Evidence recorded later
  from a read hit's URL carries that hit's id (``hit_id``), so a read dataset labels each hit by what it gave.
- ``counts`` adds ``searches``, ``hits``, ``hits_read`` and ``hits_skipped``.

Thread-safe: GPT-Researcher calls its retrievers in worker threads (``asyncio.to_thread``); a decision and its
events are written under one lock (``recorder.TraceRecorder._lock``). Core only: no agent package is imported.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from branchgate.inference.read_state import ReadState
from branchgate.texts import hit_of, hit_text

log = logging.getLogger(__name__)

TEXT_KEYS = ("body", "snippet", "content", "raw_content")  # a result's text, the first that is set
READ_COUNTS = ("searches", "hits", "hits_read", "hits_skipped")


@dataclass(frozen=True)
class SearchCall:
    """Which branch one search call belongs to: the searched candidate's id, its query and goal, the depth of its
    frame; ``frame_id`` for the agent's own search, which no candidate stands for (``trace_schema.Results``)."""

    candidate_id: str
    query: str
    goal: str = ""
    depth: int = 0
    frame_id: str | None = None


def as_hit(result, rank: int) -> dict | None:
    """A search result as the read gate sees it: ``{"id", "url", "title", "snippet", "rank"}``; None for a result
    without a URL or without any text (passed on unrecorded)."""
    if not isinstance(result, Mapping):
        return None
    url = str(result.get("href") or result.get("url") or "").strip()
    body = next((str(result[k]) for k in TEXT_KEYS if result.get(k)), "")
    title, text = hit_of(body, str(result.get("title") or ""))
    hit = {"id": url, "url": url, "title": title, "snippet": text, "rank": rank}
    return hit if url and (title or text) else None


class ReadHook:
    """The read gate and its events for an agent hook (see the module docstring)."""

    def _init_read(self, read=None, read_tau: float | None = None, read_floor: str | None = None) -> None:
        if read is not None and getattr(read, "stage", None) != "read":
            raise ValueError(
                f"read: a read controller is needed (metadata stage 'read'), got a "
                f"{getattr(read, 'stage', type(read).__name__)} controller"
            )
        self.read_gate, self.read_tau, self.read_floor = read, read_tau, read_floor
        self.reads = ReadState()  # the URLs read in this run and the window of their texts (``read_state``)
        self.counts.update(dict.fromkeys(READ_COUNTS, 0))

    @property
    def read_urls(self) -> dict[str, None]:
        """The URLs read in this run, in the order first read."""
        return self.reads.read_ids

    @property
    def read_name(self) -> str:
        return f"controller:{getattr(self.read_gate, 'name', 'read')}"

    def read_results(self, search: SearchCall, results: Sequence) -> list:
        """The results of ``search`` to pass on, in their order (see the module docstring); recording and gating
        never break the agent: if either fails, every result is passed on and the failure is logged."""
        results = list(results or [])
        try:
            with self._lock:
                return self._read_decision(search, results)
        except Exception:
            log.exception("branchgate: the read gate failed on the results of %r; all are read", search.query)
            return results

    def _read_decision(self, search: SearchCall, results: list) -> list:
        hits: dict[int, dict] = {}  # index in ``results`` → hit, for the results that are hits
        ids: set[str] = set()  # their URLs: a URL repeated in one list is one hit (the first)
        for i, r in enumerate(results):
            hit = as_hit(r, len(hits))
            if hit is not None and hit["id"] not in ids:
                ids.add(hit["id"])
                hits[i] = hit
        if not hits:
            return results
        self._start()
        index = list(hits)
        new = {index[k] for k in self.reads.new(h["id"] for h in hits.values())}
        seen = set(hits) - new
        if self.read_gate is None:
            read, p_keep = set(hits), {}
        else:
            read, p_keep = self._read_select(search, {i: h for i, h in hits.items() if i not in seen})
        cid = search.candidate_id
        fields = {"frame_id": search.frame_id} if search.frame_id is not None else {}
        listed = [{k: v for k, v in h.items() if k != "id"} | {"hit_id": h["id"]} for h in hits.values()]
        self._write("results", candidate_id=cid, query=search.query, hits=listed, **fields)
        for i, hit in hits.items():
            action = "read" if i in read else "skip"
            actor = "seen" if i in seen and action == "skip" else self.read_name if self.read_gate else "default"
            p = p_keep.get(i)
            self._write("read", candidate_id=cid, hit_id=hit["id"], action=action, actor=actor, score=p, p_keep=p)
            if action == "read":
                self.reads.add(hit["id"], hit_text(hit["title"], hit["snippet"]))
        self.counts["searches"] += 1
        self.counts["hits"] += len(hits)
        self.counts["hits_read"] += len(read)
        self.counts["hits_skipped"] += len(hits) - len(read)
        return [r for i, r in enumerate(results) if i not in hits or i in read]

    def _read_select(self, search: SearchCall, new: dict[int, dict]) -> tuple[set[int], dict[int, float]]:
        """The read controller's choice among the new hits (index → hit): the indices it reads, and each one's
        p_keep."""
        if not new:
            return set(), {}
        self.reads.root_query = self.root_query
        state = self.reads.state(search.query, search.goal, search.depth)
        index = list(new)
        sel = self.read_gate.select(state, list(new.values()), tau=self.read_tau, floor=self.read_floor)
        return {index[k] for k in sel.kept}, {i: float(p) for i, p in zip(index, sel.p_keep)}
