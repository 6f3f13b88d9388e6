"""OpenTelemetry span files → ``Span`` objects: OTLP JSON and Phoenix span exports (read by
``logs_to_dataset/readers/openinference.py``, whose docstring describes both formats and every outcome).

``load_spans(path, strict, report)`` returns the spans of a file, attributes flattened to dotted keys; bad files
and bad records go to ``report`` (or raise ``InputError`` under ``strict``), positions named
(``resourceSpans[0].scopeSpans[0].spans[3]``, ``line 7``). JSON only: nothing is executed.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from branchgate.errors import InputError
from branchgate.fileio import load_json
from branchgate.logs_to_dataset.traces import ReadReport, text_problem

W = "openinference: "
KINDS = {
    "LLM",
    "TOOL",
    "CHAIN",
    "AGENT",
    "RETRIEVER",
    "EMBEDDING",
    "RERANKER",
    "GUARDRAIL",
    "EVALUATOR",
    "PROMPT",
    "UNKNOWN",
    "DECISION",
}
GENAI_KINDS = {
    "chat": "LLM",
    "text_completion": "LLM",
    "generate_content": "LLM",
    "execute_tool": "TOOL",
    "invoke_agent": "AGENT",
    "create_agent": "AGENT",
    "invoke_workflow": "AGENT",
    "retrieval": "RETRIEVER",
    "embeddings": "EMBEDDING",
}


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str
    start: int  # ns since the epoch
    end: int
    attrs: dict
    where: str  # position in the document ("" for a span that is a whole JSON line)
    line: int | None = None  # JSON Lines: the line
    error: bool = False
    service: str = ""
    children: list = field(default_factory=list)
    parent: Span | None = None


def load_spans(path: Path, strict: bool, report: ReadReport) -> list[Span]:
    problem = text_problem(path)
    if problem:
        report.skip(path, None, f"{problem}, not a span export", strict)
        return []
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        report.skip(path, None, f"not UTF-8 text (byte {exc.start})", strict)
        return []
    if not text.strip():
        report.skip(path, None, "empty file (no spans)", strict)
        return []
    try:
        docs = [(load_json(text, str(path)), None)]
    except InputError as exc:
        lines = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
        if len(lines) < 2 or not _parses(lines[0][1]):  # one document, broken
            cut = exc.reason.startswith("invalid JSON") and not text.rstrip().endswith(("}", "]"))
            col = re.search(r"at column \d+", exc.reason)
            what = "truncated JSON (the file ends early)" + (f" {col.group(0)}" if col else "")
            report.skip(path, exc.line, what if cut else exc.reason, strict)
            return []
        docs = []
        for i, ln in lines:
            try:
                docs.append((load_json(ln, str(path), i), i))
            except InputError as err:
                last = i == lines[-1][0] and not text.endswith("\n") and err.reason.startswith("invalid JSON")
                report.skip(path, i, "truncated last line" if last else err.reason, strict)
    spans = []
    for doc, line in docs:
        for where, item, service, otlp in _records(doc):
            span = _otlp_span(item, where) if otlp else _phoenix_span(item, where)
            if isinstance(span, str):
                report.skip(path, line, span, strict)
                continue
            span.service, span.line = service, line
            if span.kind and span.kind not in KINDS:
                report.skip(
                    path, line, at(where, f"unknown span kind {span.kind!r} (field openinference.span.kind)"), strict
                )
                continue
            if not span.kind:
                report.warn(W + "span without openinference.span.kind or gen_ai.operation.name (kept in the tree only)")
            spans.append(span)
    return spans


def _parses(line: str) -> bool:
    try:
        load_json(line)
        return True
    except InputError:
        return False


def at(where: str, message: str) -> str:
    """A reason naming the span's position when it has one."""
    return f"{where}: {message}" if where else message


def _records(doc):
    """(position, span object, service name, is OTLP) for every span of a decoded document."""
    if isinstance(doc, dict) and isinstance(doc.get("resourceSpans"), list):
        for r, rs in enumerate(doc["resourceSpans"]):
            rs = rs if isinstance(rs, dict) else {}
            service = str(_flat_otlp((rs.get("resource") or {}).get("attributes")).get("service.name") or "")
            for s, ss in enumerate(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []):
                for k, item in enumerate((ss if isinstance(ss, dict) else {}).get("spans") or []):
                    where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{k}]"
                    yield where, item if isinstance(item, dict) else {}, service, True
        return
    if isinstance(doc, list) or (isinstance(doc, dict) and isinstance(doc.get("data"), list)):
        items, name = (doc, "") if isinstance(doc, list) else (doc["data"], "data")
        for k, item in enumerate(items):
            yield f"{name}[{k}]", item if isinstance(item, dict) else {}, "", False
        return
    yield "", doc if isinstance(doc, dict) else {}, "", False


def _otlp_span(item: dict, where: str) -> Span | str:
    trace_id, span_id = _hex_id(item.get("traceId"), 16), _hex_id(item.get("spanId"), 8)
    if not trace_id or not span_id:
        return at(where, f"span without {'traceId' if not trace_id else 'spanId'}")
    start = _int(item.get("startTimeUnixNano"))
    if start is None:
        return at(where, "span without startTimeUnixNano")
    attrs = _flat_otlp(item.get("attributes"))
    end = _int(item.get("endTimeUnixNano"))
    code = (item.get("status") or {}).get("code")
    return Span(
        trace_id,
        span_id,
        _hex_id(item.get("parentSpanId"), 8) or None,
        str(item.get("name") or ""),
        _kind(attrs),
        start,
        end if end is not None else start,
        attrs,
        where,
        error=code in (2, "STATUS_CODE_ERROR"),
    )


def _phoenix_span(item: dict, where: str) -> Span | str:
    ctx = item.get("context") if isinstance(item.get("context"), dict) else {}
    trace_id, span_id = ctx.get("trace_id"), ctx.get("span_id")
    if not trace_id or not span_id:
        return at(where, f"span without context.{'trace_id' if not trace_id else 'span_id'}")
    start = _iso_ns(item.get("start_time"))
    if start is None:
        return at(where, "span without a start_time")
    attrs = _flatten(item.get("attributes") if isinstance(item.get("attributes"), dict) else {})
    kind = str(item.get("span_kind") or "").upper()
    if kind in ("", "UNKNOWN") and _kind(attrs):
        kind = _kind(attrs)
    end = _iso_ns(item.get("end_time"))
    return Span(
        str(trace_id),
        str(span_id),
        str(item["parent_id"]) if item.get("parent_id") else None,
        str(item.get("name") or ""),
        kind,
        start,
        end if end is not None else start,
        attrs,
        where,
        error=item.get("status_code") == "ERROR",
    )


def _kind(attrs: dict) -> str:
    kind = attrs.get("openinference.span.kind")
    if kind:
        return str(kind).upper()
    return GENAI_KINDS.get(str(attrs.get("gen_ai.operation.name") or ""), "")


def _hex_id(value, n_bytes: int) -> str:
    if not isinstance(value, str) or not value:
        return ""
    if re.fullmatch(r"[0-9a-fA-F]+", value) and len(value) == 2 * n_bytes:
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value
    return raw.hex() if len(raw) == n_bytes else value


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _iso_ns(value) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        return None


def _otlp_value(v):
    if not isinstance(v, dict):
        return None
    for key in ("stringValue", "boolValue", "doubleValue", "bytesValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return _int(v["intValue"])
    if "arrayValue" in v:
        return [_otlp_value(x) for x in (v["arrayValue"] or {}).get("values") or []]
    if "kvlistValue" in v:
        return _flat_otlp((v["kvlistValue"] or {}).get("values"))
    return None


def _flat_otlp(attributes) -> dict:
    out = {}
    for kv in attributes or []:
        if isinstance(kv, dict) and isinstance(kv.get("key"), str):
            out[kv["key"]] = _otlp_value(kv.get("value"))
    return _flatten(out)


def _flatten(obj: dict, prefix: str = "") -> dict:
    """Dotted keys for nested mappings and lists of mappings (Phoenix may nest what OTLP flattens)."""
    out = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                out.update(_flatten(x, f"{key}.{i}."))
        else:
            out[key] = v
    return out
