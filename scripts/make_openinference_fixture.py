"""Regenerate tests/fixtures/openinference/ from a real, instrumented open_deep_research run.

    .ci/.venv-odr/bin/python scripts/make_openinference_fixture.py [--out tests/fixtures/openinference]

Each run is tests/odr_support.py's offline one (the package's real graph, a scripted chat model, a fake search),
shortened to one delegation turn and one search per researcher (``RUNS``: 4 topics of which 2 run, 3 queries;
and a smaller one, 2 topics of which 1 runs, 2 queries), gated by branchgate's open_deep_research hook with
``KeywordGate`` (a fixed rule, so no controller is needed), and traced by openinference-instrumentation-langchain
into an in-memory OpenTelemetry exporter. To keep the
fixture small, the package's prompt templates are replaced by one-line ones with the same placeholders
(``SHORT_PROMPTS``; the graph is unchanged), the instrumentor does not record tool schemas (its
``TraceConfig``), and the SDK cuts attribute values at ``MAX_ATTRIBUTE_CHARS`` (its span limits: the long
graph states in CHAIN spans' input/output become cut-off JSON, as in any deployment with that limit). Written:

- ``odr_run.otlp.json`` — the first run's spans as OTLP JSON (``resourceSpans`` → ``scopeSpans`` → ``spans``; ids
  in hex, int64 as strings, attributes as ``{key, value: {stringValue|intValue|...}}`` lists);
- ``odr_small.phoenix.jsonl`` — the second run's spans in Phoenix's span shape (``context``, ``span_kind``,
  ``parent_id``, ISO times, flat ``attributes``), one per line;
- ``<run>.hook.jsonl`` — the canonical trace the hook recorded during each run (what the run did).

Needs the integration venv (.ci/integrations/odr.txt). Nothing here is hand-written span data.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _odr_support():
    """tests/odr_support.py (the tests' offline run; tests/ is not a package), loaded from its file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("odr_support", REPO / "tests" / "odr_support.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["odr_support"] = module  # as an import would register it
    spec.loader.exec_module(module)
    return module


odr_support = _odr_support()
RESEARCH_QUERIES, SUPERVISOR_TOPICS = odr_support.RESEARCH_QUERIES, odr_support.SUPERVISOR_TOPICS

SHORT_PROMPTS = {
    "clarify_with_user_instructions": "Clarify if needed ({date}): {messages}",
    "transform_messages_into_research_topic_prompt": "Write a research brief ({date}) for: {messages}",
    "lead_researcher_prompt": "You are a research supervisor ({date}); delegate with ConductResearch, at most "
    "{max_concurrent_research_units} at a time, then call ResearchComplete.",
    "research_system_prompt": "You are a researcher ({date}); search the web for the topic.{mcp_prompt}",
    "compress_research_system_prompt": "Clean up the research findings ({date}).",
    "compress_research_simple_human_message": "Please clean up these findings.",
    "final_report_generation_prompt": "Write the final report ({date}) for: {research_brief}\nFindings:\n{findings}",
}
MAX_ATTRIBUTE_CHARS = 480  # the SDK's attribute length limit (OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT)
KINDS = {0: 1, 1: 2, 2: 3, 3: 4, 4: 5}  # opentelemetry SpanKind value -> OTLP enum (INTERNAL=1, ...)


class Patches:
    """``monkeypatch.setattr`` for a script: remembers originals and restores them."""

    def __init__(self):
        self.saved = []

    def setattr(self, target, name, value):
        self.saved.append((target, name, getattr(target, name)))
        setattr(target, name, value)

    def undo(self):
        for target, name, value in reversed(self.saved):
            setattr(target, name, value)


def otlp_value(v) -> dict:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [otlp_value(x) for x in v]}}
    return {"stringValue": str(v)}


def otlp_attributes(attrs) -> list[dict]:
    return [{"key": k, "value": otlp_value(v)} for k, v in (attrs or {}).items()]


def otlp_span(s) -> dict:
    out = {
        "traceId": f"{s.context.trace_id:032x}",
        "spanId": f"{s.context.span_id:016x}",
        "parentSpanId": f"{s.parent.span_id:016x}" if s.parent else "",
        "name": s.name,
        "kind": KINDS.get(s.kind.value, 0),
        "startTimeUnixNano": str(s.start_time),
        "endTimeUnixNano": str(s.end_time),
        "attributes": otlp_attributes(s.attributes),
        "status": {"code": s.status.status_code.value},
    }
    if s.status.description:
        out["status"]["message"] = s.status.description
    if s.events:
        out["events"] = [
            {"name": e.name, "timeUnixNano": str(e.timestamp), "attributes": otlp_attributes(e.attributes)}
            for e in s.events
        ]
    return out


def otlp_document(spans) -> dict:
    groups: dict = {}
    for s in spans:
        res = tuple(sorted((s.resource.attributes or {}).items()))
        scope = (s.instrumentation_scope.name, s.instrumentation_scope.version or "")
        groups.setdefault(res, {}).setdefault(scope, []).append(s)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": otlp_attributes(dict(res))},
                "scopeSpans": [
                    {"scope": {"name": name, "version": version}, "spans": [otlp_span(s) for s in group]}
                    for (name, version), group in scopes.items()
                ],
            }
            for res, scopes in groups.items()
        ]
    }


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat()


def phoenix_span(s) -> dict:
    attrs = dict(s.attributes or {})
    return {
        "name": s.name,
        "context": {"trace_id": f"{s.context.trace_id:032x}", "span_id": f"{s.context.span_id:016x}"},
        "span_kind": attrs.get("openinference.span.kind", "UNKNOWN"),
        "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
        "start_time": iso(s.start_time),
        "end_time": iso(s.end_time),
        "status_code": s.status.status_code.name,
        "status_message": s.status.description or "",
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()},
        "events": [
            {"name": e.name, "timestamp": iso(e.timestamp), "attributes": dict(e.attributes or {})} for e in s.events
        ],
    }


RUNS = {  # name: (format, ScriptedChat script, graph config changes)
    "odr_run": ("otlp", {"topics": [SUPERVISOR_TOPICS[0], []], "queries": RESEARCH_QUERIES[:1]}, {}),
    "odr_small": (
        "phoenix",
        {"topics": [SUPERVISOR_TOPICS[0][1:3], []], "queries": [["{t} evidence", "{t} gossip"]]},
        {"max_concurrent_research_units": 1},
    ),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "openinference")
    args = parser.parse_args(argv)
    logging.getLogger("opentelemetry.attributes").setLevel(logging.ERROR)  # one "truncating" line per cut value

    import open_deep_research.deep_researcher as graph_module
    from openinference.instrumentation import TraceConfig
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from branchgate.inference.agents.open_deep_research import gate_open_deep_research

    CONFIG, KeywordGate = odr_support.CONFIG, odr_support.KeywordGate
    install_offline, run_graph = odr_support.install_offline, odr_support.run_graph

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "open-deep-research-offline"}),
        span_limits=SpanLimits(max_span_attribute_length=MAX_ATTRIBUTE_CHARS),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider, config=TraceConfig(hide_llm_tools=True))
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for name, (fmt, script, config) in RUNS.items():
            patches = Patches()
            for prompt, template in SHORT_PROMPTS.items():
                patches.setattr(graph_module, prompt, template)
            hook_trace = args.out / f"{name}.hook.jsonl"
            hook_trace.unlink(missing_ok=True)
            exporter.clear()
            try:
                install_offline(patches, **script)
                with gate_open_deep_research(KeywordGate(), trace=hook_trace, run_id=name) as hook:
                    state = run_graph(config={"configurable": {**CONFIG["configurable"], **config}})
                    hook.record_report(state["final_report"])
            finally:
                patches.undo()
            spans = sorted(exporter.get_finished_spans(), key=lambda s: (s.start_time, s.context.span_id))
            if fmt == "otlp":
                out = args.out / f"{name}.otlp.json"
                out.write_text(
                    json.dumps(otlp_document(spans), ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8"
                )
            else:
                out = args.out / f"{name}.phoenix.jsonl"
                out.write_text(
                    "".join(json.dumps(phoenix_span(s), ensure_ascii=False) + "\n" for s in spans), encoding="utf-8"
                )
            for f in (out, hook_trace):
                print(f"{f}: {f.stat().st_size / 1024:.1f} KiB")
            print(f"{name}: {len(spans)} spans; hook counts {hook.counts}")
    finally:
        instrumentor.uninstrument()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
