"""Canonical trace schema, version 2 (ARCHITECTURE.md, "Contracts", describes it in words).

A trace is JSON Lines, one event per line. Every event carries ``v`` (schema version), ``run_id``,
``seq`` (monotonic per run), ``ts`` (seconds since the epoch, may be null) and ``type``. Extra fields
are allowed and kept. Event types (each model below documents its fields):

- ``run_start``; ``frame_open`` (a decision point) and its ``candidate`` subqueries; ``decision`` (expand /
  prune / defer a candidate); ``retrieval`` (the evidence ids an expanded candidate brought in); ``evidence``
  (one document or passage); ``learning``, ``followup``; ``prune`` (by stage); ``llm_call``; ``report``;
  ``run_end``; ``raw`` (an event no reader could map, kept verbatim). These are version 1.
- Version 2 adds the read gate: ``results`` (the result list of an expanded candidate's search call, its
  ``hits`` with ``hit_id``, ``title``, ``snippet``, ``rank`` 0..n-1 and ``url``; written after the
  candidate's ``decision`` and before its ``retrieval``), ``read`` (one per hit: ``read`` / ``skip`` /
  ``defer``) and ``evidence.hit_id`` (the hit whose reading produced the evidence). ``retrieval`` then
  lists the evidence of the hits read (without a read stage: every hit, as in version 1).

Writers write the newest version (``SCHEMA_VERSION``); every older version still reads as it did. Reading
one decoded line (``parse_event``):

- ``v`` missing, not an integer, or < 1 → ``InputError`` (a bad record: skipped and reported, or the
  first failure under ``--strict``);
- ``v`` newer than ``SCHEMA_VERSION`` → ``SchemaVersionError``, always fatal (upgrade branchgate);
- unknown ``type``, or a type newer than the event's ``v`` (a ``v`` 1 ``results`` / ``read``, unknown to
  version 1) → kept verbatim as a ``raw`` event (``source_type`` = the type, ``data`` = the object);
- missing/invalid field → ``InputError`` naming the field (also: two hits of one ``results`` event with
  the same ``hit_id``, "field 'hits'"; a count — ``depth``, ``order``, ``rank``, any ``tokens`` field — below 0
  or above ``branchgate.limits.MAX_COUNT``).

``trace.schema.json`` next to this file is ``json_schema()`` written out; regenerate it with
``python3 scripts/write_trace_schema.py`` (a test checks it is current).
"""

from __future__ import annotations

import hashlib
import json
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from branchgate.errors import InputError
from branchgate.limits import MAX_COUNT

SCHEMA_VERSION = 2


class SchemaVersionError(InputError):
    """The trace was written by a newer branchgate; never skipped, always reported as an error."""


def _require_envelope(schema: dict, cls) -> None:
    # ``v`` and ``type`` have Python defaults for convenience, but every line on disk carries them.
    required = schema.setdefault("required", [])
    for key in ("v", "type"):
        if key in schema.get("properties", {}) and key not in required:
            required.insert(0, key)


class Event(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=_require_envelope)
    v: int = Field(default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    run_id: str
    seq: int = Field(ge=0)
    ts: float | None = None


class RunStart(Event):
    type: Literal["run_start"] = "run_start"
    root_query: str
    system: str = "unknown"
    config: dict[str, Any] = Field(default_factory=dict)


class FrameOpen(Event):
    """A decision point: a set of candidate subqueries to choose among."""

    type: Literal["frame_open"] = "frame_open"
    frame_id: str
    parent_frame: str | None = None
    parent_candidate: str | None = None
    depth: int = Field(default=0, ge=0, le=MAX_COUNT)
    frame_query: str = ""
    parent_goal: str = ""


class Candidate(Event):
    type: Literal["candidate"] = "candidate"
    frame_id: str
    candidate_id: str
    order: int = Field(default=0, ge=0, le=MAX_COUNT)
    query: str
    goal: str = ""


class Decision(Event):
    """``actor`` "budget": pruned because the run's budget could not afford it (``inference/run_gate.py``). Extra
    fields a budgeted run writes (kept as extras, absent otherwise): ``spent`` / ``remaining`` (``{nodes,
    tokens}``, null = unlimited) and ``price``, the budget at this decision; ``deferred_from`` (on an
    ``expand``) the seq of the candidate's earlier ``defer`` decision."""

    type: Literal["decision"] = "decision"
    candidate_id: str
    action: Literal["expand", "prune", "defer"]
    actor: str = "default"
    score: float | None = None
    p_keep: float | None = None


class Hit(BaseModel):
    """One entry of a result list, as a search engine shows it before anything is read: ``hit_id`` (unique
    in its list; the id of the evidence reading it gives), ``title``, ``snippet``, ``rank`` (0 = first)."""

    model_config = ConfigDict(extra="allow")
    hit_id: str
    title: str = ""
    snippet: str = ""
    rank: int = Field(ge=0, le=MAX_COUNT)
    url: str | None = None


class Results(Event):
    """(v2) The result list an expanded candidate's search call returned, before any hit is read. Written after
    the candidate's ``decision`` and before its ``retrieval``; each hit then gets one ``read`` event. A search no
    declared candidate stands for (an agent's own query, such as the one GPT-Researcher adds to every plan) names
    the frame it belongs to in ``frame_id``, with a ``candidate_id`` of its own that no ``candidate`` declares."""

    type: Literal["results"] = "results"
    candidate_id: str
    query: str
    hits: list[Hit]
    frame_id: str | None = None

    @field_validator("hits")
    @classmethod
    def _unique_hit_ids(cls, hits: list[Hit]) -> list[Hit]:
        seen: set[str] = set()
        for hit in hits:
            if hit.hit_id in seen:
                raise ValueError(f"duplicate hit_id {hit.hit_id[:80]!r} (hit ids are unique within one results event)")
            seen.add(hit.hit_id)
        return hits


class Read(Event):
    """(v2) The read gate's choice for one hit of a ``results`` event: ``read`` (fetch it; its evidence follows),
    ``skip`` or ``defer`` (``deferred_from`` on a later ``read``: the seq of the hit's ``defer``). ``actor``,
    ``score`` and ``p_keep`` as on ``decision``."""

    type: Literal["read"] = "read"
    candidate_id: str
    hit_id: str
    action: Literal["read", "skip", "defer"]
    actor: str = "default"
    score: float | None = None
    p_keep: float | None = None
    deferred_from: int | None = Field(default=None, ge=0)


class Retrieval(Event):
    """The evidence ids an expanded candidate brought in (v2 with a read stage: those of the hits read; [] when
    none was read)."""

    type: Literal["retrieval"] = "retrieval"
    candidate_id: str
    query: str
    evidence_ids: list[str] = Field(default_factory=list)
    tokens: int = Field(default=0, ge=0, le=MAX_COUNT)


class Evidence(Event):
    """One document or passage. ``labels``: key-point ids it covers (ground truth, when known). ``hit_id`` (v2):
    the hit whose reading produced it."""

    type: Literal["evidence"] = "evidence"
    evidence_id: str
    text: str
    source: str = ""
    tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    labels: list[str] | None = None
    hit_id: str | None = None


class Learning(Event):
    type: Literal["learning"] = "learning"
    candidate_id: str | None = None
    text: str


class Followup(Event):
    type: Literal["followup"] = "followup"
    candidate_id: str | None = None
    text: str


class Prune(Event):
    type: Literal["prune"] = "prune"
    stage: Literal["pre_retrieval", "post_retrieval", "pre_synthesis"]
    item_ids: list[str] = Field(default_factory=list)
    tokens_before: int = Field(default=0, ge=0, le=MAX_COUNT)
    tokens_after: int = Field(default=0, ge=0, le=MAX_COUNT)
    actor: str = "default"


class LLMCall(Event):
    type: Literal["llm_call"] = "llm_call"
    purpose: str = ""
    model: str = ""
    in_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    out_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    cost_usd: float | None = None


class ReportSentence(BaseModel):
    """One sentence of a report and the evidence it was taken from."""

    model_config = ConfigDict(extra="allow")
    text: str
    evidence_ids: list[str] = Field(default_factory=list)


class Report(Event):
    """The final report. ``evidence_ids``: the evidence it was written from (e.g. the final context).
    ``cited_ids``: the evidence its text cites (None: the writer did not record citations; the ``citations``
    label source needs it). ``cited_sources``: citations as written in the text (e.g. URLs), mapped or not.
    ``sentences``: optional per-sentence mapping to evidence (the reference pipeline's extractive report)."""

    type: Literal["report"] = "report"
    text: str | None = None
    path: str | None = None
    evidence_ids: list[str] = Field(default_factory=list)
    cited_ids: list[str] | None = None
    cited_sources: list[str] = Field(default_factory=list)
    sentences: list[ReportSentence] = Field(default_factory=list)


class RunEnd(Event):
    type: Literal["run_end"] = "run_end"
    status: str = "ok"
    totals: dict[str, Any] = Field(default_factory=dict)


class Raw(Event):
    """Anything a reader could not map, kept verbatim so nothing is lost."""

    type: Literal["raw"] = "raw"
    source_type: str | None = None
    data: Any = None


AnyEvent = Annotated[
    RunStart
    | FrameOpen
    | Candidate
    | Decision
    | Results
    | Read
    | Retrieval
    | Evidence
    | Learning
    | Followup
    | Prune
    | LLMCall
    | Report
    | RunEnd
    | Raw,
    Field(discriminator="type"),
]
EVENT_TYPES: dict[str, type[Event]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        RunStart,
        FrameOpen,
        Candidate,
        Decision,
        Results,
        Read,
        Retrieval,
        Evidence,
        Learning,
        Followup,
        Prune,
        LLMCall,
        Report,
        RunEnd,
        Raw,
    )
}
# The version that introduced each type newer than version 1: an event of an older ``v`` with that type was
# unknown to its writer's schema and reads as ``raw``, as it always did.
TYPE_SINCE: dict[str, int] = {"results": 2, "read": 2}
_adapter: TypeAdapter = TypeAdapter(AnyEvent)


def text_evidence_id(text: str) -> str:
    """The id of a piece of evidence that has none of its own: ``e`` and the first 16 hex digits of its text's
    SHA-256 (so a hook and a reader give the same text the same id)."""
    return f"e{hashlib.sha256(text.encode('utf-8', 'replace')).hexdigest()[:16]}"


def parse_event(obj: Any, file: str | None = None, line: int | None = None) -> Event:
    """Validate one decoded JSON object as an event (outcomes in the module docstring)."""
    if not isinstance(obj, dict):
        raise InputError(f"event must be a JSON object, got {type(obj).__name__}", file, line)
    if "v" not in obj:
        raise InputError("missing field 'v' (schema version)", file, line)
    version = obj["v"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InputError(f"field 'v' must be a schema version (integer >= 1), got {version!r}", file, line)
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"schema version {version} is newer than this branchgate understands ({SCHEMA_VERSION}); "
            "upgrade branchgate",
            file,
            line,
        )
    etype = obj.get("type")
    try:
        if etype not in EVENT_TYPES or version < TYPE_SINCE.get(etype, 1):
            envelope = {k: obj[k] for k in ("run_id", "seq", "ts") if k in obj}
            return Raw.model_validate(
                {
                    **envelope,
                    "v": version,
                    "type": "raw",
                    "source_type": None if etype is None else str(etype),
                    "data": obj,
                }
            )
        return _adapter.validate_python(obj)
    except (ValidationError, TypeError, ValueError) as exc:
        raise InputError(_describe(exc), file, line) from None


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors()[:3]:
            loc = ".".join(str(p) for p in err["loc"][1:] or err["loc"])
            parts.append(f"field '{loc}': {err['msg'].lower()}")
        return "invalid event: " + "; ".join(parts)
    return f"invalid event: {exc}"


def to_json(event: Event) -> str:
    return json.dumps(event.model_dump(mode="json", exclude_none=False), ensure_ascii=False, separators=(",", ":"))


def json_schema() -> dict:
    """The JSON Schema of one trace line (shipped as ``trace.schema.json``).

    A line is one of the event types of this version, or an event read as ``raw``: a type no version defines,
    or one newer than the line's ``v`` (``TYPE_SINCE``).
    """
    known = _adapter.json_schema(ref_template="#/$defs/{model}")
    defs = known.pop("$defs", {})
    envelope = Event.model_json_schema()
    as_raw: list[dict] = [{"properties": {"type": {"not": {"enum": sorted(EVENT_TYPES)}}}}]
    for since in sorted(set(TYPE_SINCE.values())):
        newer = sorted(t for t, v in TYPE_SINCE.items() if v == since)
        as_raw.append({"properties": {"v": {"maximum": since - 1}, "type": {"enum": newer}}})
    defs["UnknownEvent"] = {
        "title": "UnknownEvent",
        "description": "An event type this schema version does not define, or a type newer than the event's 'v'; "
        "readers keep it verbatim as 'raw'.",
        "type": "object",
        "additionalProperties": True,
        "properties": {**envelope["properties"], "type": {"type": "string"}},
        "required": ["v", "type", "run_id", "seq"],
        "anyOf": as_raw,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://branchgate.dev/schema/trace-v{SCHEMA_VERSION}.json",
        "title": f"branchgate canonical trace event, schema version {SCHEMA_VERSION}",
        "description": "One line of a canonical trace (JSON Lines). See ARCHITECTURE.md, 'Contracts'.",
        "anyOf": [known, {"$ref": "#/$defs/UnknownEvent"}],
        "$defs": defs,
    }


SCHEMA_FILE = Path(str(files("branchgate.logs_to_dataset") / "trace.schema.json"))


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, ensure_ascii=False, sort_keys=True) + "\n"
