"""GPT-Researcher run logs: ``outputs/task_*.json`` written by its ``CustomLogsHandler``.

The file is one JSON object ``{timestamp, events: [...], content: {query, sources, context, report,
costs, ...}}``; each event is ``{timestamp, type: "event", data: {type: "logs", content: <tag>, output,
metadata}}`` (bare ``{type: "logs", content, output, metadata}`` events and ``JSONResearchHandler``
events ``{timestamp, type, data}`` are read too). GPT-Researcher logs no branch ids, no research goals,
no link between a source and the subquery that found it, and no source text, so this is a best-effort
mapping (run_id = file stem, root_query = ``content.query``, system "gpt-researcher"):

| log | canonical |
|---|---|
| ``subqueries`` (metadata = the list) | ``frame_open`` + one ``candidate`` per subquery (goal ""). GPT-Researcher \
appends the researched query itself as the last subquery: that is the frame_query. Root frame (frame_query = root \
query): depth 0; other frames (deep research branches): depth 1 = "below the root", exact level and parent not logged |
| ``running_subquery_research`` / ``sub_query`` | ``decision`` expand (actor default) of the latest candidate with \
that query |
| ``subquery_context_not_found`` | ``retrieval`` with no evidence for that candidate (known to have found nothing) |
| ``added_source_url`` | ``evidence`` (id = source = URL, text "", not linked to a subquery) |
| ``content.sources`` (``{url, ...}`` or URL strings) | ``evidence`` for URLs not added by an ``added_source_url`` \
log (text = the source's ``content``/``raw_content`` when a string) |
| ``content.report`` | ``report``: ``cited_sources`` = the URLs the text cites (markdown links, bare URLs, the \
references list), ``cited_ids`` = those that are a logged source's evidence id (None when the text cites no URL); \
``content.costs`` → ``run_end.totals.cost_usd`` |
| any other event, the rest of ``content`` | ``raw`` (``source_type`` "gptr:<tag>"), kept verbatim |

Nothing here is a read decision (``dataset build --stage read`` finds no result lists): GPT-Researcher logs the
URLs it is about to scrape (``added_source_url``: new ones only, after deduplication, not tied to a sub-query), not
what each search returned (no titles, snippets or ranks, nor the results it did not fetch). The hook
(``inference/agents/gpt_researcher.py``, ``read=None``) records the result lists.

What could not be rebuilt is counted in the read report's warnings ("gptr: ..."), never invented: so
expanded candidates have no retrieved evidence and their realized utility is unknown (NaN) downstream, and
a cited source, though mapped to its evidence, is not tied to a branch (counted); a cited URL that no log
names as a source, and numbered citations (``[1]``) without URLs, are counted and not mapped.

Malformed input: not JSON / truncated / empty / binary / no ``events`` list → the file is skipped
(reported); an event that is not an object or a ``logs`` event without a tag → that event is skipped
(reported as ``events[i]``); under ``strict`` the first of these raises ``InputError``.

Over 400 lines: one log format's reader: each of GPT-Researcher's event shapes is a short function here.
"""

from __future__ import annotations

import ast
import math
import re
from collections import deque
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from branchgate.errors import InputError
from branchgate.fileio import load_json
from branchgate.logs_to_dataset.trace_schema import (
    Candidate,
    Decision,
    Evidence,
    FrameOpen,
    Raw,
    Report,
    Retrieval,
    RunEnd,
    RunStart,
)
from branchgate.logs_to_dataset.traces import ReadReport, Run, text_problem

W = "gptr: "
STARTING = re.compile(r"Starting the research task for '(.*)'\.\.\.", re.S)
RUNNING = re.compile(r"Running research for '(.*)'\.\.\.", re.S)
NOT_FOUND = re.compile(r"No content found for '(.*)'\.\.\.", re.S)
QUERIES = re.compile(r"following queries:\s*(\[.*\])", re.S)
URL = re.compile(r"(https?://\S+)")
CITED_URL = re.compile(r"https?://[^\s<>()\[\]\"'`]+")
NUMBERED = re.compile(r"\[\d+(?:\s*[,–-]\s*\d+)*\]")
COST = re.compile(r"Total Research Costs: \$(\S*)")  # the whole word after "$": ``_cost`` reads all of it or nothing
NUMBER = re.compile(
    r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
)  # how Python prints a float
RUNNING_TAGS = ("running_subquery_research", "running_subquery_with_vectorstore_research")


def cited_urls(text: str) -> list[str]:
    """The URLs a GPT-Researcher report cites (markdown links, bare URLs, its references list), in order."""
    return list(dict.fromkeys(u.rstrip(".,;:!?*_") for u in CITED_URL.findall(text)))


def map_urls(cited: list[str], ids_by_url: dict[str, list[str]]) -> tuple[list[str], int]:
    """(evidence ids of the cited URLs, ignoring a trailing slash; how many cited URLs have none)."""
    by_norm: dict[str, list[str]] = {}
    for url, ids in ids_by_url.items():
        by_norm.setdefault(url.rstrip("/"), []).extend(ids)
    found = [by_norm.get(u.rstrip("/")) for u in cited]
    return list(dict.fromkeys(i for ids in found if ids for i in ids)), sum(1 for ids in found if not ids)


def _cost(value) -> float | None:
    """A cost in USD from a log (a number, or the text after "$": a whole decimal number, trailing sentence dot
    allowed), or None when it is not a finite non-negative number (``1_000``, ``0x10``, ``nan``, ``1,000``: None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str):
        value = value.strip().rstrip(".")
        if len(value) > 64 or not NUMBER.fullmatch(value):
            return None
    try:
        out = float(value)
    except (ValueError, OverflowError):
        return None
    return out if math.isfinite(out) and out >= 0 else None


def _ts(value) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def _unwrap(ev: dict) -> tuple[str | None, dict]:
    """(log tag or None, the logs payload) for CustomLogsHandler-wrapped or bare ``logs`` events."""
    data = ev.get("data") if ev.get("type") == "event" and isinstance(ev.get("data"), dict) else ev
    if data.get("type") == "logs":
        return data.get("content"), data
    return None, data


def _subqueries(data: dict) -> list[str] | None:
    meta = data.get("metadata")
    if isinstance(meta, list) and all(isinstance(q, str) for q in meta):
        return meta
    m = QUERIES.search(str(data.get("output") or ""))
    if m:
        text = m.group(1).strip()
        if len(text) > 1_000_000:  # no list of subqueries is that long; parsing it would only cost memory
            return None
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # e.g. [{[1]: 2}]: unhashable
            return None
        if isinstance(parsed, list) and all(isinstance(q, str) for q in parsed):
            return parsed
    return None


class GPTResearcherReader:
    name = "gptr"

    def detect(self, path: Path) -> bool:
        if path.suffix.lower() != ".json":
            return False
        if path.name.startswith("task_"):
            return True
        with open(path, "rb") as fh:
            head = fh.read(4096)
        return b'"events"' in head and (b'"content"' in head or b'"timestamp"' in head)

    def read(self, path: Path, strict: bool, report: ReadReport) -> Iterator[Run]:
        problem = text_problem(path)
        if problem:
            report.skip(path, None, f"{problem}, not a GPT-Researcher log", strict)
            return
        raw = path.read_bytes()
        if not raw.strip():
            report.skip(path, None, "empty file", strict)
            return
        try:
            doc = load_json(raw, str(path))
        except InputError as exc:
            reason = exc.reason
            if reason.startswith("invalid JSON (") and not raw.rstrip().endswith(b"}"):
                reason = f"truncated JSON (the file ends early): {reason}"  # a crashed writer leaves it unclosed
            report.skip(path, exc.line, reason, strict)
            return
        if not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
            report.skip(path, None, "not a GPT-Researcher log: missing 'events' list", strict)
            return
        events = list(_LogMapper(path, doc, strict, report).events())
        report.events += len(events)
        yield Run(path.stem, events, str(path), "gptr")


class _LogMapper:
    """The canonical events of one GPT-Researcher log (the table in the module docstring), in log order."""

    def __init__(self, path: Path, doc: dict, strict: bool, report: ReadReport):
        self.path, self.doc, self.strict, self.report, self.warn = path, doc, strict, report, report.warn
        self.run_id = path.stem
        self.seq = iter(range(1 << 30))
        self.content: dict = {}
        self.started: list[str] = []  # queries of the 'starting_research' logs
        self.root = ""
        self.frames: list[list[Candidate]] = []  # candidates per frame, in order
        self.announced = _Announced()
        self.expanded: set[str] = set()
        self.urls: set[str] = set()
        self.cost = None

    def ev(self, cls, ts=None, **kw):
        return cls(run_id=self.run_id, seq=next(self.seq), ts=ts, **kw)

    def events(self):
        yield self.run_start()
        for i, item in enumerate(self.doc["events"]):
            yield from self.log_event(f"events[{i}]", item)
        yield from self.content_events()

    def run_start(self) -> RunStart:
        """``run_start``; the root query is ``content.query``, else the first 'starting_research' log's."""
        doc, content = self.doc, self.doc.get("content")
        self.content = content if isinstance(content, dict) else {}
        if not isinstance(content, dict):
            self.warn(W + "missing 'content' object (no query, report or costs)")
        for item in doc["events"]:
            if isinstance(item, dict):
                tag, data = _unwrap(item)
                if tag == "starting_research":
                    m = STARTING.search(str(data.get("output") or ""))
                    if m:
                        self.started.append(m.group(1))
        query = self.content.get("query")
        self.root = query if isinstance(query, str) and query else ""
        if not self.root:
            self.root = self.started[0] if self.started else ""
            self.warn(
                W + ("root query taken from the first 'starting_research' log" if self.root else "root query unknown")
            )
        return self.ev(
            RunStart,
            ts=_ts(doc.get("timestamp")),
            root_query=self.root,
            system="gpt-researcher",
            config={"format": "gptr"},
        )

    def log_event(self, where: str, item):
        """The events of one entry of the log's ``events`` list (a bad entry is skipped and reported)."""
        if not isinstance(item, dict):
            self.report.skip(self.path, None, f"{where}: event is not a JSON object", self.strict)
            return
        tag, data = _unwrap(item)
        ts = _ts(item.get("timestamp"))
        if data.get("type") == "logs" and not isinstance(tag, str):
            self.report.skip(self.path, None, f"{where}: logs event without a 'content' tag", self.strict)
            return
        output = str(data.get("output") or "")
        if tag == "subqueries":
            yield from self.subqueries(where, data, ts)
        elif tag in RUNNING_TAGS or (tag is None and item.get("type") == "sub_query"):
            yield self.subquery_run(tag, item, output, ts)
        elif tag == "subquery_context_not_found":
            m = NOT_FOUND.search(output)
            cand = self.announced.ran(m.group(1) if m else None)
            if cand is None:
                yield self.ev(Raw, ts=ts, source_type=f"gptr:{tag}", data=item)
            else:
                yield self.ev(
                    Retrieval, ts=ts, candidate_id=cand.candidate_id, query=cand.query, evidence_ids=[], tokens=0
                )
        elif tag == "added_source_url":
            yield from self.source_url(where, data, output, ts)
        else:
            if tag == "research_step_finalized":
                self.read_cost(output)
            yield self.ev(Raw, ts=ts, source_type=f"gptr:{tag or item.get('type')}", data=item)

    def subqueries(self, where: str, data: dict, ts):
        """A ``frame_open`` and its candidates for a 'subqueries' log."""
        queries = _subqueries(data)
        if queries is None:
            self.report.skip(self.path, None, f"{where}: 'subqueries' log without a list of queries", self.strict)
            return
        fid = f"f{len(self.frames)}"
        own = queries[-1] if queries else ""
        if own and own == self.root:
            frame_query, depth = self.root, 0
        else:
            frame_query, depth = (own, 1) if own in self.started else ("", 1)
            self.warn(W + "frame below the root: parent and exact depth not logged (depth set to 1)")
            if not frame_query:
                self.warn(W + "frame query unknown")
        yield self.ev(
            FrameOpen,
            ts=ts,
            frame_id=fid,
            parent_frame=None,
            parent_candidate=None,
            depth=depth,
            frame_query=frame_query,
            parent_goal="",
        )
        cands = []
        for k, q in enumerate(queries):
            cand = self.ev(Candidate, ts=ts, frame_id=fid, candidate_id=f"{fid}.c{k}", order=k, query=q, goal="")
            cands.append(cand)
            yield cand
        self.warn(W + "research goals are not logged (goal left empty)", len(queries))
        self.announced.add(cands)
        self.frames.append(cands)

    def subquery_run(self, tag, item: dict, output: str, ts):
        """An expand ``decision`` for a log that runs an announced subquery, else a ``raw`` event."""
        if tag:
            m = RUNNING.search(output)
            query = m.group(1) if m else None
        else:  # JSONResearchHandler: {"type": "sub_query", "data": {"query": ...}}
            inner = item.get("data")
            query = inner.get("query") if isinstance(inner, dict) else None
        cand = self.announced.run(query)
        if cand is None:
            self.warn(W + "subquery run that no 'subqueries' log announced (kept as raw)")
            return self.ev(Raw, ts=ts, source_type=f"gptr:{tag or item.get('type')}", data=item)
        self.expanded.add(cand.candidate_id)
        return self.ev(Decision, ts=ts, candidate_id=cand.candidate_id, action="expand", actor="default")

    def source_url(self, where: str, data: dict, output: str, ts):
        """An ``evidence`` event for an 'added_source_url' log naming a new URL."""
        meta = data.get("metadata")
        m = URL.search(output)
        url = meta if isinstance(meta, str) and meta else (m.group(1) if m else "")
        if not url:
            self.report.skip(self.path, None, f"{where}: 'added_source_url' log without a URL", self.strict)
            return
        if url not in self.urls:
            self.urls.add(url)
            self.warn(W + "source not linked to a subquery and its text not logged")
            yield self.ev(Evidence, ts=ts, evidence_id=url, text="", source=url, tokens=0)

    def read_cost(self, output: str) -> None:
        """The running cost of a 'research_step_finalized' log (an unreadable one is counted and ignored)."""
        m = COST.search(output)
        found = _cost(m.group(1)) if m else None
        if m and found is None:
            self.warn(W + "unreadable cost in a 'research_step_finalized' log (ignored)")
        self.cost = found if found is not None else self.cost

    def content_events(self):
        """After the logs: evidence for ``content.sources`` not yet added, the rest of ``content`` as ``raw``,
        the ``report`` and ``run_end``."""
        content, urls, warn = self.content, self.urls, self.warn
        sources = content.get("sources") if isinstance(content.get("sources"), list) else []
        for src in sources:
            url = src if isinstance(src, str) else src.get("url") if isinstance(src, dict) else None
            if isinstance(url, str) and url and url not in urls:
                urls.add(url)
                body = next(
                    (
                        src[k]
                        for k in ("content", "raw_content")
                        if isinstance(src, dict) and isinstance(src.get(k), str)
                    ),
                    "",
                )
                warn(W + "source not linked to a subquery" + ("" if body else " and its text not logged"))
                yield self.ev(Evidence, evidence_id=url, text=body, source=url, tokens=len(body.split()))
        rest = {k: v for k, v in content.items() if k not in ("query", "report")}
        if rest:
            yield self.ev(Raw, source_type="gptr:content", data=rest)
        text = content.get("report")
        if isinstance(text, str) and text.strip():
            yield self.ev(Report, text=text, **_citations(text, urls, warn))
        costs = content.get("costs")
        if costs is not None and costs != 0 and _cost(costs) is None:
            warn(W + "unreadable 'content.costs' (ignored)")
        cost = _cost(costs) or self.cost
        n_cands = sum(len(f) for f in self.frames)
        warn(W + "announced subquery never run (left undecided)", n_cands - len(self.expanded))
        yield self.ev(
            RunEnd,
            status="ok" if isinstance(text, str) and text.strip() else "incomplete",
            totals={
                "nodes": len(self.expanded),
                "retrieval_calls": len(self.expanded),
                "candidates": n_cands,
                "sources": len(urls),
                "cost_usd": cost,
            },
        )


def _citations(text: str, urls: set[str], warn) -> dict:
    """The URLs a report cites, and the evidence ids (= logged source URLs) they are."""
    cited = cited_urls(text)
    if not cited:
        if NUMBERED.search(text):
            warn(W + "report cites by number ([n]) without URLs (citations not mapped)")
        return {}
    ids, unmapped = map_urls(cited, {u: [u] for u in urls})
    warn(W + "cited URL that no log names as a source (not mapped)", unmapped)
    warn(W + "cited source not tied to a branch (sources are not linked to subqueries)", len(ids))
    return {"cited_ids": ids, "cited_sources": cited}


class _Announced:
    """The announced subqueries by query text, for the logs that run them (each lookup O(1)): ``run`` takes the
    first not yet run candidate with that query in the newest frame that has one; ``ran`` is the first run one
    in the newest frame that ran one."""

    def __init__(self):
        self.frames = 0
        self.open: dict[
            str, list[tuple[int, deque]]
        ] = {}  # query → (frame, candidates not yet run), oldest frame first
        self.first_ran: dict[str, tuple[int, Candidate]] = {}  # query → (newest frame that ran it, its first run one)

    def add(self, cands: list[Candidate]) -> None:
        groups: dict[str, deque] = {}
        for c in cands:
            groups.setdefault(c.query, deque()).append(c)
        for query, group in groups.items():
            self.open.setdefault(query, []).append((self.frames, group))
        self.frames += 1

    def run(self, query) -> Candidate | None:
        stack = self.open.get(query) if isinstance(query, str) else None
        if not stack:
            return None
        frame, group = stack[-1]  # only the newest frame's group is ever taken from: an empty one is the last
        cand = group.popleft()
        if not group:
            stack.pop()
        if query not in self.first_ran or self.first_ran[query][0] < frame:
            self.first_ran[query] = (frame, cand)
        return cand

    def ran(self, query) -> Candidate | None:
        return self.first_ran[query][1] if isinstance(query, str) and query in self.first_ran else None
