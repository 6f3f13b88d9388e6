"""The HTTP contract of ``branchgate serve`` (``inference/server/app.py``): one pydantic model per request body and
one per answer. The server validates every body with its model (``model_validate``: the field at fault is the
error's ``loc``) and answers through the answer's model; ``/openapi.json`` is written from the same models.

A request model checks the shape of a body: which fields it takes, their types and ranges. What a candidate or a
hit is (a text, a pair, ``{query, goal}``; ``{title, snippet, id, rank}``) is the Gate's own rule
(``inference/inputs.py``), applied after the model, so that ``Gate.select`` and the server accept the same items.
Core-safe (pydantic is in the core install).
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.json_schema import models_json_schema

from branchgate.limits import MAX_COUNT

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
STR = {"type": "string"}

Tau = Annotated[float, Field(ge=0, le=1)]
MaxKeep = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Amount = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Depth = Annotated[int, Field(ge=0, le=MAX_COUNT)]
AMOUNT = {"type": "integer", "minimum": 0, "maximum": MAX_COUNT}
Spend = Annotated[  # one number is taken as a list of one (so an error names spend[i], one place for the rule)
    list[Amount],
    BeforeValidator(lambda v: [v] if isinstance(v, (int, float)) and not isinstance(v, bool) else v),
    WithJsonSchema(
        {
            "description": "tokens the expansions since the last call really used: one number or one per expansion",
            "anyOf": [AMOUNT, {"type": "array", "items": AMOUNT}],
        }
    ),
]
Candidate = Annotated[
    Any,
    WithJsonSchema(
        {
            "description": "a text, a [query, goal] pair, or an object with a query field (query, q, question, "
            "search_query, text) and optionally a goal (goal, researchGoal, research_goal, rationale)",
            "anyOf": [
                STR,
                {"type": "array", "items": STR, "minItems": 1, "maxItems": 2},
                {"type": "object", "properties": {"query": STR, "goal": STR}},
            ],
        }
    ),
]
Hit = Annotated[
    Any,
    WithJsonSchema(
        {
            "type": "object",
            "description": "title and/or snippet (at least one non-empty); id (else url); rank: every hit or none",
            "properties": {"title": STR, "snippet": STR, "id": STR, "url": STR, "rank": {"type": "integer"}},
        }
    ),
]
ReadText = Annotated[Any, WithJsonSchema({"anyOf": [STR, Hit.__metadata__[0].json_schema]})]


class Request(BaseModel):
    """A request body: strict types (``true`` is not 1, ``"0.5"`` is not 0.5), no fields besides its own."""

    model_config = ConfigDict(extra="forbid", strict=True)


class PreState(Request):
    """A pre-retrieval decision's context (``inputs.STATE_FIELDS``)."""

    root_query: str
    frame_query: str | None = None
    parent_goal: str | None = None
    retained: list[Candidate] | None = Field(None, description="texts (or candidates) of the branches kept")
    depth: Depth | None = None


class ReadState(Request):
    """A read decision's context (``inputs.READ_STATE_FIELDS``)."""

    root_query: str | None = None
    query: str | None = None
    goal: str | None = None
    read: list[ReadText] | None = Field(None, description="what the run has read so far: texts or hits")
    read_ids: list[str] | None = Field(None, description="ids of the hits already read (not scored again)")
    depth: Depth | None = None


class SelectRequest(Request):
    """``POST /v1/select``: one pre-retrieval decision."""

    state: PreState
    candidates: list[Candidate]
    tau: Tau | None = None
    root_tau: Tau | None = None
    max_keep: MaxKeep | None = None


class ReadRequest(Request):
    """``POST /v1/read``: one read decision (``hits``, or its other name ``items``; not both)."""

    state: ReadState
    hits: list[Hit] | None = None
    items: list[Hit] | None = Field(None, description="another name for hits (give one of them)")
    tau: Tau | None = None
    root_tau: Tau | None = None
    max_keep: MaxKeep | None = None
    floor: Literal["root"] | None = Field(None, description='"root": keep the top hit at depth 0 when none passes τ')


class OpenRunRequest(Request):
    """``POST /v1/runs``: open a budgeted run (an empty body opens an unlimited one with a new id)."""

    run_id: Annotated[str, Field(pattern=RUN_ID_PATTERN)] | None = None
    budget_nodes: Amount | None = None
    budget_tokens: Amount | None = None
    defer: bool = False


class RunSelectRequest(Request):
    """``POST /v1/runs/{run_id}/select``: one decision within the run's budget."""

    state: PreState
    candidates: list[Candidate]
    tau: Tau | None = None
    max_keep: MaxKeep | None = None
    costs: list[Amount] | None = Field(None, description="one token estimate (upper bound) per candidate")
    spend: Spend | None = None


class RevisitRequest(Request):
    """``POST /v1/runs/{run_id}/revisit``: which deferred candidates to expand now, re-scored against ``state``."""

    state: PreState
    max_keep: MaxKeep | None = None
    spend: Spend | None = None


class SpendRequest(Request):
    """``POST /v1/runs/{run_id}/spend``."""

    spend: Spend


class CloseRequest(Request):
    """``POST /v1/runs/{run_id}/close`` (the body is optional)."""

    spend: Spend | None = None


# -- answers ------------------------------------------------------------------------------------------------------
class Answer(BaseModel):
    """An answer; optional fields are left out when they do not apply (the server answers with exclude_unset)."""

    model_config = ConfigDict(extra="forbid")


class Selection(Answer):
    """``Selection.to_json()``: what ``Gate.select`` answers in process."""

    kept: list[int] = Field(description="indices (into your list) to expand or read")
    p_keep: list[float | None] = Field(description="per item; null for a hit already read (not_new)")
    utility: list[float | None]
    fallback: bool = Field(description="nothing passed τ and the top-1 was kept")
    out_of_range: list[str] | None = Field(None, description="structured features outside the training range")


class ReadSelection(Selection):
    """A read decision's answer."""

    stage: Literal["read"]
    not_new: list[int] | None = Field(None, description="hits whose id is in read_ids (null scores)")


class Limit(Answer):
    nodes: int | None
    tokens: int | None


class Spending(Answer):
    spent_nodes: int
    spent_tokens: int
    reserved_tokens: int
    remaining: Limit
    limit: Limit


class DecisionBudget(Spending):
    """A run decision's budget: its id, the price it began at and after it, and the spending after it."""

    decision: int
    price: float
    price_after: float


class DeferredItem(Answer):
    """A deferred candidate (``ledger.Deferred``)."""

    text: str
    decision: int
    index: int
    p_keep: float
    price: float
    key: Any = None
    candidate: Any = None


class RunSelection(Selection):
    """A decision of a budgeted run: a ``Selection`` plus the run's budget after it."""

    run_id: str
    budget: DecisionBudget
    deferred: list[int] | None = None
    dropped_by_budget: list[int] | None = None
    exhausted: bool | None = None
    revisited: list[DeferredItem] | None = Field(None, description="revisit: the deferred candidates admitted")


class RunStatus(Spending):
    """A run's budget now (``RunGate.status``)."""

    run_id: str
    exhausted: bool
    price: float
    defer: bool
    decisions: int
    deferred: list[DeferredItem]


class ClosedRun(RunStatus):
    never_expanded: list[DeferredItem]


class Health(Answer):
    status: Literal["ok"]
    stages: list[str]
    open_runs: int | None = Field(description="open budgeted runs in the store (null: no pre-retrieval controller)")


class ModelInfo(Answer):
    """One controller's metadata (``inference/metadata.py``) and file hash."""

    stage: Literal["pre", "read"]
    file: str
    sha256: str
    encoder: str
    tau: float
    root_tau: float | None
    precision: str | None
    dim: int
    max_length: int
    feature_names: list[str] | None
    teacher: str | None = Field(description="a pretrained teacher default (inference/teacher_gate.py), else null")
    branchgate_version: str | None
    trained_with: str | None


class Models(Answer):
    branchgate_version: str
    models: list[ModelInfo]


class ErrorDetail(Answer):
    field: str | None = Field(description="the request field at fault, when one is")
    message: str


class ErrorBody(Answer):
    error: ErrorDetail


ERRORS = {
    400: "malformed JSON, or an empty body",
    401: "no API key, or one the server does not know (servers started with --api-keys)",
    403: "the run belongs to another API key",
    404: "unknown run, or no controller of that stage on this server",
    409: "a run with this run_id is already open",
    413: "body, a list or the request's tokens over the server's limits",
    415: "Content-Type is not application/json",
    422: "a field is invalid (the error names it)",
    429: "too many open runs, requests over the key's rate limit, or every encoder slot busy (see Retry-After)",
    500: "internal error (no details in the body; logged by the server)",
}
REQUESTS = (
    SelectRequest,
    ReadRequest,
    OpenRunRequest,
    RunSelectRequest,
    RevisitRequest,
    SpendRequest,
    CloseRequest,
)


def error_responses(*codes: int) -> dict:
    """A route's ``responses``: the error body (``ErrorBody``) for each status code it can answer with."""
    return {c: {"description": ERRORS[c], "model": ErrorBody} for c in codes}


def request_body(model: type[Request], optional: bool = False) -> dict:
    """A route's ``openapi_extra``: its request body, a reference to ``model``'s schema (``components``)."""
    content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
    return {"requestBody": {"required": not optional, "content": content}}


def request_schemas() -> dict:
    """The request models' JSON schemas, keyed by name, with references into ``#/components/schemas``."""
    _, top = models_json_schema([(m, "validation") for m in REQUESTS], ref_template="#/components/schemas/{model}")
    return top["$defs"]
