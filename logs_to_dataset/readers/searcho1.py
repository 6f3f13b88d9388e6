"""Search-o1 reasoning traces: ``<qid>.q`` (the question) + ``<qid>.a`` (the agent's trace).

Layout as in DeepResearchGym's ``Searcho1_ClueWeb22``: searches between ``<|begin_search_query|>`` and
``<|end_search_query|>``, each followed by a result block between ``<|begin_search_result|>`` and
``<|end_search_result|>`` holding documents ``Doc i (URL: …, ClueWebID: …)`` + their text.

How a trace becomes a run (run_id = qid, root_query = the ``.q`` text, system "search-o1"):

- Search-o1 searches one query at a time and each search is issued after reading the results of the
  previous ones, so every search is its own decision point: search i opens frame ``f<i>`` (depth i,
  parent = frame i-1 / candidate i-1, frame_query = the root query, no goal) with one candidate
  ``c<i>`` (its query). The retained context of frame i is thus the earlier searches and their
  documents. The trace states no research goals: goals are "" (counted in the warnings).
- A search with a result block is expanded (decision ``expand``, actor ``default``): each document is an
  ``evidence`` event the first time its id appears in the run (id = ClueWebID, else URL; source = URL;
  tokens = whitespace word count) and the search gets a ``retrieval`` listing its documents' ids.
- A search the trace ends on, with no result block, is a candidate without a decision (never executed).
- Reasoning text between a result block and the next search is a ``learning`` of that search; text
  before the first search is a ``learning`` with no candidate; the text after the last result block
  (the final answer) is the ``report``. A trace without searches is a run with zero decisions whose
  report is the whole trace.

Malformed input: missing ``.q`` → the run is skipped (reported); empty, binary or non-UTF-8 ``.a`` → skipped;
an unterminated query/result block (cut trace) → read up to the cut, run_end status "truncated", counted;
stray end tags and a result block without a query are counted (the latter kept as ``raw``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from branchgate.logs_to_dataset.readers import Run, register
from branchgate.logs_to_dataset.schema import (Candidate, Decision, Evidence, FrameOpen, Learning, Raw, Report,
                                               Retrieval, RunEnd, RunStart)
from branchgate.logs_to_dataset.traces import ReadReport, is_binary

TAG = re.compile(r"<\|(begin|end)_search_(query|result)\|>")
DOC = re.compile(r"^Doc (\d+) \((.*)\)[ \t]*\r?$", re.M)
DOC_FIELDS = re.compile(r"URL:\s*(.*?)(?:,\s*ClueWebID:\s*(.*))?$")
W = "searcho1: "


@dataclass
class _Search:
    query: str
    result: str | None = None
    after: str = ""


def parse_trace(text: str, warn) -> tuple[str, list[_Search], list[str], bool]:
    """Split a trace into (text before the first search, searches, orphan result blocks, truncated)."""
    prefix_parts: list[str] = []
    searches: list[_Search] = []
    orphans: list[str] = []
    mode, cursor, truncated = None, 0, False

    def add_text(s: str) -> None:
        if searches:
            searches[-1].after += s
        else:
            prefix_parts.append(s)

    for m in TAG.finditer(text):
        kind = m.group(1, 2)
        if mode == "result" and kind != ("end", "result"):
            continue  # tags quoted inside a document are document text
        if kind == ("begin", "query"):
            if mode == "query":
                warn(W + "nested begin_search_query (earlier one dropped)")
            else:
                add_text(text[cursor:m.start()])
            mode, cursor = "query", m.end()
        elif kind == ("end", "query"):
            if mode != "query":
                warn(W + "stray end_search_query tag")
                continue
            searches.append(_Search(text[cursor:m.start()].strip()))
            mode, cursor = None, m.end()
        elif kind == ("begin", "result"):
            if mode == "query":
                warn(W + "begin_search_result inside an open query (query dropped)")
            else:
                add_text(text[cursor:m.start()])
            mode, cursor = "result", m.end()
        else:  # end result
            if mode != "result":
                warn(W + "stray end_search_result tag")
                continue
            body = text[cursor:m.start()]
            if searches and searches[-1].result is None:
                searches[-1].result = body
            else:
                warn(W + "result block without a preceding search (kept as raw)")
                orphans.append(body)
            mode, cursor = None, m.end()
    rest = text[cursor:]
    if mode == "query":
        warn(W + "unterminated search query at the end of the trace (not counted as a search)")
        truncated = True
        add_text(rest)
    elif mode == "result":
        warn(W + "unterminated search result at the end of the trace (read up to the cut)")
        truncated = True
        if searches and searches[-1].result is None:
            searches[-1].result = rest
        else:
            orphans.append(rest)
    else:
        add_text(rest)
    return "".join(prefix_parts), searches, orphans, truncated


def parse_documents(body: str, warn) -> list[tuple[str, str, str]]:
    """(evidence_id, url, text) per ``Doc i (URL: …, ClueWebID: …)`` block of a result."""
    heads = list(DOC.finditer(body))
    if heads and body[: heads[0].start()].strip():
        warn(W + "text before the first document of a result block (ignored)")
    docs = []
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(body)
        doc_text = body[h.end():end].strip()
        fields = DOC_FIELDS.match(h.group(2).strip())
        url = (fields.group(1) if fields else "").strip()
        cw = ((fields.group(2) if fields else None) or "").strip()
        if cw.lower() in ("", "none", "null"):
            cw = ""
            warn(W + "document without a ClueWebID (URL used as its id)" if url else
                 W + "document with neither ClueWebID nor URL (id = hash of its text)")
        eid = cw or url or "sha256:" + hashlib.sha256(doc_text.encode("utf-8")).hexdigest()[:16]
        docs.append((eid, url, doc_text))
    return docs


@register("searcho1")
class SearchO1Reader:
    def detect(self, path: Path) -> bool:
        return path.suffix == ".a" and (path.with_suffix(".q").exists() or not is_binary(path))

    def companions(self, path: Path) -> list[Path]:
        return [path.with_suffix(".q")]

    def read(self, path: Path, strict: bool, report: ReadReport) -> Iterator[Run]:
        qfile = path.with_suffix(".q")
        if not qfile.exists():
            report.skip(path, None, f"missing question file {qfile.name}", strict)
            return
        texts = []
        for f in (qfile, path):
            if is_binary(f):
                report.skip(f, None, "binary data (NUL bytes), not a Search-o1 text file", strict)
                return
            try:
                texts.append(f.read_text(encoding="utf-8"))
            except UnicodeDecodeError as exc:
                report.skip(f, None, f"not UTF-8 text (byte {exc.start})", strict)
                return
        question, trace = texts
        if not trace.strip():
            report.skip(path, None, "empty trace file", strict)
            return
        if not question.strip():
            report.warn(W + "empty question file (root_query is empty)")
        events = list(self.events(path.stem, question.strip(), trace, report.warn))
        report.events += len(events)
        yield Run(path.stem, events, str(path), "searcho1")

    def events(self, run_id: str, root_query: str, trace: str, warn):
        seq = iter(range(1 << 30))

        def ev(cls, **kw):
            return cls(run_id=run_id, seq=next(seq), ts=None, **kw)

        prefix, searches, orphans, truncated = parse_trace(trace, warn)
        yield ev(RunStart, root_query=root_query, system="search-o1", config={"format": "searcho1"})
        if prefix.strip() and searches:
            yield ev(Learning, candidate_id=None, text=prefix.strip())
        seen: set[str] = set()
        expanded = tokens_total = 0
        for i, s in enumerate(searches):
            fid, cid = f"f{i}", f"c{i}"
            yield ev(FrameOpen, frame_id=fid, parent_frame=f"f{i - 1}" if i else None,
                     parent_candidate=f"c{i - 1}" if i else None, depth=i, frame_query=root_query, parent_goal="")
            if not s.query:
                warn(W + "empty search query")
            warn(W + "no research goals in the trace (goal left empty)")
            yield ev(Candidate, frame_id=fid, candidate_id=cid, order=0, query=s.query, goal="")
            if s.result is None:
                warn(W + "search without a result block (trace ends; candidate left undecided)")
            else:
                expanded += 1
                yield ev(Decision, candidate_id=cid, action="expand", actor="default")
                docs = parse_documents(s.result, warn)
                if not docs:
                    warn(W + "result block without documents (empty retrieval)")
                    if s.result.strip():
                        yield ev(Raw, source_type="searcho1_result_text", data=s.result.strip())
                ids, tokens = [], 0
                for eid, url, doc_text in docs:
                    n = len(doc_text.split())
                    if eid not in seen:
                        seen.add(eid)
                        yield ev(Evidence, evidence_id=eid, text=doc_text, source=url, tokens=n)
                    if eid not in ids:
                        ids.append(eid)
                        tokens += n
                tokens_total += tokens
                yield ev(Retrieval, candidate_id=cid, query=s.query, evidence_ids=ids, tokens=tokens)
            after = s.after.strip()
            if after and i + 1 < len(searches):
                yield ev(Learning, candidate_id=cid, text=after)
        for body in orphans:
            yield ev(Raw, source_type="searcho1_orphan_result", data=body)
        final = (searches[-1].after if searches else prefix).strip()
        if final:
            yield ev(Report, text=final)
        yield ev(RunEnd, status="truncated" if truncated else "ok",
                 totals={"nodes": expanded, "retrieval_calls": expanded, "searches": len(searches),
                         "evidence": len(seen), "tokens": tokens_total})
