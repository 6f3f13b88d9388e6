"""What every agent hook shares (``gpt_researcher.py``, ``open_deep_research.py``): recording a run as a
canonical trace while it gates.

``TraceRecorder`` holds the trace writer (a JSONL path opened here, a ``TraceWriter``, or None to only gate),
writes ``run_start`` once before the first event and ``run_end`` once, each piece of evidence once (id = hash
of its text, with its source URL), retrievals, and the final report with the evidence its cited URLs map to
(the ``citations`` label). Recording never breaks the agent: a failed write is logged once and counted in
``write_errors``. Core only: no agent package is imported.
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__"):  # the repository root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import hashlib
import logging
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)


class TraceRecorder:
    """Trace writing for one run of an agent (see the module docstring). Subclasses add ``counts`` keys,
    ``_config()`` (recorded in run_start) and may override ``root_query``."""

    def __init__(self, gate=None, trace=None, *, tau: float | None = None, max_keep: int | None = None,
                 run_id: str | None = None, system: str = "unknown", root_query: str | None = None,
                 run_prefix: str = "run", counts: tuple[str, ...] = ()):
        self.gate, self.tau, self.max_keep = gate, tau, max_keep
        self.run_id = run_id or f"{run_prefix}-{uuid.uuid4().hex[:12]}"
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
        self.counts = dict.fromkeys(("frames", "candidates", "expanded", "pruned", "fallbacks", "retrievals", *counts), 0)

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
        self._write("run_start", root_query=self.root_query, system=self.system,
                    config={"gate": self.gate_name, **self._config()})

    def _end(self, status: str) -> None:
        if not self._started or self._ended:
            return
        self._ended = True
        totals = dict(self.counts, nodes=self.counts["expanded"], retrieval_calls=self.counts["retrievals"],
                      wall_s=round(time.time() - self._t0, 3))
        self._write("run_end", status=status, totals=totals)

    def _close_writer(self) -> None:
        if self._own_writer and self.writer is not None:
            self.writer.close()

    def _evidence_id(self, text: str, source: str = "") -> str:
        """The id of a piece of evidence, written (with its source URL) the first time it is seen."""
        eid = f"e{sha256(text)[:16]}"
        if eid not in self._evidence:
            self._evidence[eid] = len(text.split())
            self._write("evidence", evidence_id=eid, text=text, source=source, tokens=self._evidence[eid])
            if source:
                self._by_url.setdefault(source, []).append(eid)
        return eid

    def _retrieval(self, cid: str, query: str, ids: list[str]) -> None:
        tokens = sum(self._evidence.get(i, 0) for i in ids)
        self._write("retrieval", candidate_id=cid, query=query, evidence_ids=ids, tokens=tokens)
        self.counts["retrievals"] += 1

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
        from branchgate.logs_to_dataset.readers.gptr import cited_urls, map_urls

        text = str(text or "")
        cited = cited_urls(text)
        ids, unmapped = map_urls(cited, self._by_url)
        self.counts["cited_unmapped"] = unmapped
        self._write("report", text=text, path=path, cited_ids=ids, cited_sources=cited)
        return ids

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


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()
