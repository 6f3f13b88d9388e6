"""OpenInference / OpenTelemetry span exports: agent traces as decision points.

Files (``--format openinference``; auto-detected by a peek at the head, before the canonical reader):

- OTLP JSON: one ``{"resourceSpans": [{resource, scopeSpans: [{scope, spans: [...]}]}]}`` document, or JSON
  Lines of them (the collector's file exporter). Spans have ``traceId`` / ``spanId`` / ``parentSpanId`` (hex,
  or base64 as protobuf's JSON mapping writes bytes), ``name``, ``startTimeUnixNano`` / ``endTimeUnixNano``,
  ``status`` and ``attributes`` as ``{key, value: {stringValue|intValue|doubleValue|boolValue|arrayValue|
  kvlistValue}}`` lists.
- Phoenix span exports: a JSON list of spans, ``{"data": [...]}`` (its REST API), or JSON Lines of spans, each
  ``{name, context: {trace_id, span_id}, parent_id, span_kind, start_time, end_time, status_code, attributes}``
  with ISO times and ``attributes`` flat (dotted keys) or nested (flattened here).

Span kinds come from ``openinference.span.kind``, else the GenAI conventions' ``gen_ai.operation.name``
(chat / text_completion / generate_content → LLM, execute_tool → TOOL, invoke_agent / create_agent /
invoke_workflow → AGENT, retrieval → RETRIEVER, embeddings → EMBEDDING). A run is one trace (run_id = trace
id, system = the resource's ``service.name`` or "openinference"); its events are ordered by span time:

| spans | canonical |
|---|---|
| earliest root span's ``input.value`` (text, or the first user message of a JSON ``messages`` list) \
| ``run_start.root_query`` (else the first decision's user message) |
| an LLM span whose output carries tool calls (``llm.output_messages.i.message.tool_calls.j.tool_call.{id, \
function.name, function.arguments}``, or ``gen_ai.output.messages`` parts of type ``tool_call``) \
| ``frame_open`` at its end (frame_query = its last user input message, ``llm.input_messages`` or \
``gen_ai.input.messages``) + one ``candidate`` per call (query = the call's text arguments, strings and string list \
items joined by newlines, else its name and JSON arguments; ``tool`` and ``tool_call_id`` kept) |
| the TOOL / CHAIN / AGENT span that ran a call | ``decision`` expand (actor default) at its start; a frame below it \
is a child (depth + 1) of that candidate |
| what that span found: ``retrieval.documents.k.document.{id, content, metadata}`` / ``gen_ai.retrieval.documents`` \
of the retriever spans in its subtree, else the tool's ``output.value`` / ``gen_ai.tool.call.result``, else (a CHAIN) \
the outputs of the tools below it | ``evidence`` (id = document id, else a hash of the text) + ``retrieval`` at its \
end |
| a result list among those (a retriever span's documents, or a tool output that is a JSON list of results or an \
object with a ``results`` list, each with ``url`` / ``href``) | ``results`` (hits: id = document id, else URL, else \
text hash; ``texts.hit_of`` title and snippet) + ``read`` (actor agent) per hit, before the evidence: ``read`` for a \
document the agent was given whole (a retriever's, a result with its ``raw_content``), and for a snippet-only result \
whose URL a later TOOL span's input names (the agent fetched it), else ``skip``; each document's evidence carries \
its ``hit_id`` |

Which span ran a call: one carrying the call's id (``tool.id``, ``tool_call.id``, ``gen_ai.tool.call.id``);
else — OpenInference TOOL spans carry no call id — a TOOL span with the call's tool name whose arguments
(``input.value`` / ``gen_ai.tool.call.arguments``) equal the call's (or its one argument's value), or keep a
sub-list of a list argument (a gated call); else a CHAIN / AGENT span whose JSON input holds every argument of
the call at its top level (a sub-agent invoked with them). Among those (not yet claimed, started after the LLM
span, outside it), the one whose lowest common ancestor with the LLM span is deepest (its closest scope: the
same parent, then the grandparent's subtree...), then the earliest. A call no span ran is a candidate without a
decision.

Not decisions: an LLM span that forces its one bound tool (``llm.invocation_parameters`` ``tool_choice``
any / required / that tool) and calls it once — structured output — is counted and skipped. What spans cannot
say is counted in the report's warnings ("openinference: ..."), never invented: no goals (""), no report.

Malformed input: binary, empty, not UTF-8, or JSON that does not parse (a truncated export: "truncated JSON",
with the line) → the file or that line is skipped; a span without trace/span id or start time, a tool call
without a function name, a span kind that is not OpenInference's → that record is skipped, named by its
position (``resourceSpans[0].scopeSpans[0].spans[3]`` or ``line 7``) and field; a trace whose parent links
loop (a span its own parent, two spans each other's) → every span of that trace is skipped, each named, and
the file's other traces are read; tool calls past the first ``decisions.MAX_CANDIDATES`` of one LLM span are
left out and counted; under ``strict`` the first of these raises ``InputError``. Attribute values cut off by an
SDK length limit (JSON that does not parse) are used as text and counted. Nothing is executed: JSON only.

Over 450 lines: one trace format's reader, for both stages (its decision points and its result lists share the span
matching); what a span's attributes say is apart (``span_attributes.py``).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path

from branchgate.logs_to_dataset.decision_points import MAX_CANDIDATES
from branchgate.logs_to_dataset.otel_spans import Span, W, at, load_spans
from branchgate.logs_to_dataset.span_attributes import (
    call_text,
    cut_json,
    documents,
    forced,
    last_user,
    parse_json,
    result_list,
    root_text,
    tool_args,
    tool_calls,
    tool_output,
)
from branchgate.logs_to_dataset.trace_schema import (
    Candidate,
    Decision,
    Evidence,
    FrameOpen,
    Hit,
    Read,
    Results,
    Retrieval,
    RunEnd,
    RunStart,
    text_evidence_id,
)
from branchgate.logs_to_dataset.traces import ReadReport, Run
from branchgate.texts import hit_of

RUNNERS = ("TOOL", "CHAIN", "AGENT")
CALL_IDS = ("tool.id", "tool_call.id", "gen_ai.tool.call.id")


class OpenInferenceReader:
    name = "openinference"

    def detect(self, path: Path) -> bool:
        if path.suffix.lower() not in (".json", ".jsonl"):
            return False
        with open(path, "rb") as fh:
            head = fh.read(4096)
            if b'"resourceSpans"' in head:
                return True
            if b'"span_kind"' not in head or b'"context"' not in head:
                return False
            if path.suffix.lower() == ".json":
                return True
            fh.seek(0)
            first = fh.readline(1 << 22)  # a Phoenix line is one span; a canonical trace line has "v" and "run_id"
        try:
            obj = json.loads(first)
        except ValueError:
            return False
        return isinstance(obj, dict) and isinstance(obj.get("context"), dict) and "v" not in obj

    def read(self, path: Path, strict: bool, report: ReadReport) -> Iterator[Run]:
        spans = load_spans(path, strict, report)
        traces: dict[str, list[Span]] = {}
        for s in spans:
            traces.setdefault(s.trace_id, []).append(s)
        for trace_id, group in traces.items():
            group.sort(key=lambda s: (s.start, s.span_id))
            loop = link(group)
            if loop is not None:
                for s in group:
                    report.skip(
                        path,
                        s.line,
                        at(
                            s.where,
                            f"span of trace {trace_id[:64]!r}, whose parent links form a "
                            f"cycle (span {loop.span_id[:64]!r} is its own ancestor): trace "
                            "skipped",
                        ),
                        strict,
                    )
                continue
            events = TraceMapper(path, group, strict, report).events()
            report.events += len(events)
            yield Run(trace_id, events, str(path), "openinference")


# -- spans → canonical events (what one span's attributes say: logs_to_dataset/span_attributes.py) --------
def link(spans: list[Span]) -> Span | None:
    """Set each span's ``parent`` (the span of ``spans`` its ``parent_id`` names; the last of a repeated id, else
    None); a span on a cycle of parent links when they loop, else None. One pass: each span is walked up once."""
    by_id = {s.span_id: s for s in spans}
    for s in spans:
        s.parent = by_id.get(s.parent_id) if s.parent_id else None
    done: set[int] = set()
    for s in spans:
        path: set[int] = set()
        a = s
        while a is not None and id(a) not in done:
            if id(a) in path:
                return a
            path.add(id(a))
            a = a.parent
        done |= path
    return None


class TraceMapper:
    """The canonical events of one trace (see the module docstring): ``spans`` sorted by start and linked by
    ``link``, without a cycle."""

    def __init__(self, path: Path, spans: list[Span], strict: bool, report: ReadReport):
        self.path, self.strict, self.report, self.warn = path, strict, report, report.warn
        self.spans = spans
        self.roots = []
        for s in self.spans:
            if s.parent is None:
                self.roots.append(s)
                if s.parent_id:
                    self.warn(W + "parent span not in the file (span read as a root)")
            else:
                s.parent.children.append(s)
            cut = sum(1 for k in ("input.value", "output.value") if cut_json(s.attrs.get(k)))
            self.warn(W + "input/output value that is cut-off JSON (an attribute length limit; used as text)", cut)
        self.timed: list[tuple[int, int, type, dict]] = []  # (ns, order, event class, fields)
        self.runner_of: dict[str, str] = {}  # executing span id → candidate id
        self.claimed: set[str] = set()
        self.evidence: set[str] = set()
        self.counts = {"decisions": 0, "candidates": 0, "expanded": 0}
        self.depths: dict[str, int] = {}
        self.runnable = [s for s in self.spans if s.kind in RUNNERS]  # spans that may run a call, by start
        self.inputs: dict[int, object] = {}  # id(span) → its parsed arguments (``_input``), parsed once
        self.call_ids = {
            v for s in self.runnable for k in CALL_IDS for v in [s.attrs.get(k)] if isinstance(v, (str, int))
        }

    def events(self) -> list:
        root = self.roots[0]
        frames = []
        for s in self.spans:
            if s.kind == "LLM":
                calls = self._calls(s)
                if calls:
                    frames.append((s, calls))
        root_query = root_text(root.attrs.get("input.value"))
        if not root_query and frames:
            root_query = last_user(frames[0][0].attrs)
            self.warn(W + "root query taken from the first decision's user message")
        for i, (span, calls) in enumerate(frames):
            self._frame(f"f{i}", span, calls, root_query)
        self.warn(W + "research goals are not in spans (goal left empty)", self.counts["candidates"])
        seq = iter(range(1 << 30))
        run_id = root.trace_id
        start = RunStart(
            run_id=run_id,
            seq=next(seq),
            ts=root.start / 1e9,
            root_query=root_query,
            system=root.service or "openinference",
            config={"format": "openinference", "trace_id": run_id, "spans": len(self.spans)},
        )
        out = [start]
        for ns, _, cls, fields in sorted(self.timed, key=lambda t: (t[0], t[1])):
            out.append(cls(run_id=run_id, seq=next(seq), ts=ns / 1e9, **fields))
        end = max(s.end for s in self.spans)
        out.append(
            RunEnd(
                run_id=run_id,
                seq=next(seq),
                ts=end / 1e9,
                status="error" if root.error else "ok",
                totals=dict(self.counts, nodes=self.counts["expanded"], spans=len(self.spans)),
            )
        )
        return out

    def _add(self, ns: int, cls, **fields) -> None:
        self.timed.append((ns, len(self.timed), cls, fields))

    def _calls(self, span: Span) -> list[dict]:
        calls = tool_calls(span.attrs)
        good = []
        for c in calls:
            if not c.get("name"):
                self.report.skip(
                    self.path,
                    span.line,
                    at(span.where, f"tool call without a function name (field {c['field']})"),
                    self.strict,
                )
                continue
            good.append(c)
        if len(good) == 1 and forced(span.attrs, good[0]["name"]):
            self.warn(W + "structured output (a forced single tool call), not a decision")
            return []
        self.warn(
            W + f"tool call past the first {MAX_CANDIDATES} of one LLM span (left out)",
            max(0, len(good) - MAX_CANDIDATES),
        )
        return good[:MAX_CANDIDATES]

    def _frame(self, fid: str, span: Span, calls: list[dict], root_query: str) -> None:
        parent = next((a for a in _ancestors(span) if a.span_id in self.runner_of), None)
        parent_cand = self.runner_of[parent.span_id] if parent else None
        parent_frame = parent_cand.rsplit(".", 1)[0] if parent_cand else None
        depth = self.depths[parent_frame] + 1 if parent_frame else 0
        frame_query = last_user(span.attrs) or root_query
        self._add(
            span.end,
            FrameOpen,
            frame_id=fid,
            parent_frame=parent_frame,
            parent_candidate=parent_cand,
            depth=depth,
            frame_query=frame_query,
            parent_goal="",
            span_id=span.span_id,
        )
        self.depths[fid] = depth
        self.counts["decisions"] += 1
        for j, c in enumerate(calls):
            cid = f"{fid}.c{j}"
            self._add(
                span.end,
                Candidate,
                frame_id=fid,
                candidate_id=cid,
                order=j,
                query=call_text(c),
                goal="",
                tool=c["name"],
                tool_call_id=c.get("id"),
            )
            self.counts["candidates"] += 1
            runner = self._runner(span, c)
            if runner is None:
                self.warn(W + "tool call that no span ran (candidate left undecided)")
                continue
            self.claimed.add(runner.span_id)
            self.runner_of[runner.span_id] = cid
            self.counts["expanded"] += 1
            self._add(max(runner.start, span.end), Decision, candidate_id=cid, action="expand", actor="default")
            self._retrieval(runner, cid, c, span.end)

    def _runner(self, llm: Span, call: dict) -> Span | None:
        """The span that ran ``call`` (rules in the module docstring)."""
        up = {a.span_id: d for d, a in enumerate(_ancestors(llm))}  # ancestor → distance from the LLM span
        inside = {s.span_id for s in _subtree(llm)}
        best, best_key = None, None
        cid = call.get("id")
        may_id = isinstance(cid, (str, int)) and cid in self.call_ids  # else no span matches by id
        first = bisect_left(self.runnable, llm.start, key=lambda s: s.start)  # those started before it cannot
        for s in self.runnable[first:]:
            if s.span_id in self.claimed or s.span_id in inside:
                continue
            by_id = call.get("id") and any(s.attrs.get(k) == call["id"] for k in CALL_IDS)
            if not (by_id or _ran(s, call, self._input(s))):
                continue
            distance = next((up[a.span_id] for a in _ancestors(s) if a.span_id in up), len(up))
            key = (0 if by_id else 1, distance, s.start)
            if best_key is None or key < best_key:
                best, best_key = s, key
                if distance == 0 and (by_id or not may_id):  # no later span can rank before it
                    break
        return best

    def _input(self, span: Span):
        """What ``_ran`` compares a call's arguments with: a tool's arguments, another span's JSON input."""
        if id(span) not in self.inputs:
            attrs = span.attrs
            self.inputs[id(span)] = tool_args(attrs) if span.kind == "TOOL" else parse_json(attrs.get("input.value"))
        return self.inputs[id(span)]

    def _retrieval(self, runner: Span, cid: str, call: dict, after: int) -> None:
        """Evidence events (each when the span that found it ended) and the call's retrieval (when it ended); a
        result list (a retriever's documents, or a search tool's JSON results) is also a read decision point."""
        tools = [runner] if runner.kind == "TOOL" else [s for s in _subtree(runner) if s.kind == "TOOL"]
        lists = [
            (s, [(*d, True) for d in docs])
            for s in _subtree(runner)
            if s.kind == "RETRIEVER" or s is runner
            for docs in [documents(s.attrs)]
            if docs
        ]
        if not lists:
            lists = [(s, docs) for s in tools for docs in [result_list(tool_output(s.attrs))] if docs]
        for s, found in lists:
            self._results(s, cid, call, found, max(s.end, after))
        docs = [(d[:4], s.end, True) for s, found in lists for d in found]
        if not docs:
            docs = [(("", text, "", ""), s.end, False) for s in tools for text in [tool_output(s.attrs)] if text]
        if not docs:
            self.warn(W + "expanded call without a recorded output (evidence unknown)")
            return
        ids: dict[str, None] = {}  # a dict: membership in O(1)
        tokens = 0
        for (doc_id, text, source, _), ns, listed in docs:
            eid = doc_id or text_evidence_id(text)
            n = len(text.split())
            if eid not in self.evidence:
                self.evidence.add(eid)
                hit = {"hit_id": _hit_id(doc_id, source, text)} if listed else {}
                self._add(max(ns, after), Evidence, evidence_id=eid, text=text, source=source, tokens=n, **hit)
            if eid not in ids:
                ids[eid] = None
                tokens += n
        self._add(
            max(runner.end, after),
            Retrieval,
            candidate_id=cid,
            query=call_text(call),
            evidence_ids=list(ids),
            tokens=tokens,
        )

    def _results(self, span: Span, cid: str, call: dict, docs: list, ns: int) -> None:
        """One result list as a ``results`` event and a ``read`` per hit (actor agent): a document the agent was
        given whole (a retriever's, or a result with its page) is read; a result that came as a snippet only is
        read when a later span's input names its URL (the agent fetched it), else skipped. A hit's id is the
        document's id, else its URL, else a hash of its text."""
        hits: dict[str, Hit] = {}
        whole: dict[str, bool] = {}
        for doc_id, text, source, title, full in docs:
            hit_id = _hit_id(doc_id, source, text)
            if hit_id not in hits:
                head, snippet = hit_of(text, title)
                hits[hit_id] = Hit(hit_id=hit_id, title=head, snippet=snippet, rank=len(hits), url=source or None)
                whole[hit_id] = full
        self._add(ns, Results, candidate_id=cid, query=call_text(call), hits=list(hits.values()))
        later = [] if all(whole.values()) else self._later_inputs(span)
        for hit_id, hit in hits.items():
            read = whole[hit_id] or (hit.url is not None and any(hit.url in text for text in later))
            self._add(ns, Read, candidate_id=cid, hit_id=hit_id, action="read" if read else "skip", actor="agent")
        self.counts["hits"] = self.counts.get("hits", 0) + len(hits)

    def _later_inputs(self, search: Span) -> list[str]:
        """The inputs of the TOOL spans that started after ``search`` ended (where a fetch names its URL)."""
        first = bisect_left(self.runnable, search.end, key=lambda s: s.start)
        return [
            str(s.attrs.get("input.value") or tool_args(s.attrs) or "")
            for s in self.runnable[first:]
            if s.kind == "TOOL" and s is not search
        ]


def _hit_id(doc_id: str, source: str, text: str) -> str:
    """A listed document's hit id: its own id, else its URL, else the id of its text."""
    return doc_id or source or text_evidence_id(text)


def _ran(span: Span, call: dict, got) -> bool:
    """Whether ``span``, whose parsed input is ``got`` (``TraceMapper._input``), ran ``call``."""
    args = call.get("args")
    if span.kind == "TOOL":
        name = span.attrs.get("tool.name") or span.attrs.get("gen_ai.tool.name") or span.name
        return name == call["name"] and _agree(got, args)
    return (
        isinstance(args, dict)
        and bool(args)
        and isinstance(got, dict)
        and all(k in got and got[k] == v for k, v in args.items())
    )


def _agree(got, want) -> bool:
    """Equal arguments, or the same with list arguments cut to a sub-list (a gated call)."""
    if got == want:
        return True
    if isinstance(got, str) and isinstance(want, dict) and len(want) == 1:  # a one-argument tool logs the bare value
        return got == next(iter(want.values()))
    if not (isinstance(got, dict) and isinstance(want, dict)) or set(got) != set(want):
        return False
    for k, v in want.items():
        g = got[k]
        if g != v and not (isinstance(g, list) and isinstance(v, list) and g and _sublist(g, v)):
            return False
    return True


def _sublist(part: list, whole: list) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


def _ancestors(span: Span) -> list[Span]:
    out, s = [], span.parent
    while s is not None:
        out.append(s)
        s = s.parent
    return out


def _subtree(span: Span) -> list[Span]:
    out, todo = [], [span]
    while todo:
        s = todo.pop()
        out.append(s)
        todo.extend(reversed(s.children))
    return out
