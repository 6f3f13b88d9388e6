"""The OpenAPI description of ``branchgate serve``'s request bodies and errors (``inference/server/app.py``).

The server reads each body as raw JSON and validates it with ``branchgate gate``'s own rules
(``inference/gate_cli.parse_decision``, ``parse_read_decision``, ``run_fields``), so these schemas only describe
the bodies for ``/openapi.json`` and ``/docs``: they are never used to validate. Core-safe (plain dicts).
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

STR = {"type": "string"}
INT0 = {"type": "integer", "minimum": 0}
PROB = {"type": "number", "minimum": 0, "maximum": 1}
BOOL = {"type": "boolean"}
SPEND = {
    "description": "tokens the expansions since the last call really used: one number or one per expansion",
    "oneOf": [INT0, {"type": "array", "items": INT0}],
}
PRE_STATE = {
    "type": "object",
    "required": ["root_query"],
    "additionalProperties": False,
    "properties": {
        "root_query": STR,
        "frame_query": STR,
        "parent_goal": STR,
        "retained": {"type": "array", "items": {}, "description": "texts (or candidates) of the branches kept"},
        "depth": INT0,
    },
}
CANDIDATE = {
    "description": "a text, a [query, goal] pair, or an object with a query field (query, q, question, "
    "search_query, text) and optionally a goal (goal, researchGoal, research_goal, rationale)",
    "oneOf": [
        STR,
        {"type": "array", "items": STR, "minItems": 1, "maxItems": 2},
        {"type": "object", "properties": {"query": STR, "goal": STR}},
    ],
}
HIT = {
    "type": "object",
    "description": "title and/or snippet (at least one non-empty); id (else url); rank: every hit or none",
    "properties": {"title": STR, "snippet": STR, "id": STR, "url": STR, "rank": INT0},
}
READ_STATE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "root_query": STR,
        "query": STR,
        "goal": STR,
        "read": {"type": "array", "items": {"oneOf": [STR, HIT]}},
        "read_ids": {"type": "array", "items": STR},
        "depth": INT0,
    },
}


def _object(required: list[str], **properties) -> dict:
    return {"type": "object", "required": required, "additionalProperties": False, "properties": properties}


BODIES = {
    "select": _object(
        ["state", "candidates"],
        state=PRE_STATE,
        candidates={"type": "array", "items": CANDIDATE},
        tau=PROB,
        root_tau=PROB,
        max_keep={"type": "integer", "minimum": 1},
    ),
    "read": _object(
        ["state", "hits"],
        state=READ_STATE,
        hits={"type": "array", "items": HIT},
        tau=PROB,
        root_tau=PROB,
        max_keep={"type": "integer", "minimum": 1},
        floor={"type": "string", "enum": ["root"]},
    ),
    "open": _object(
        [],
        run_id={"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
        budget_nodes=INT0,
        budget_tokens=INT0,
        defer=BOOL,
    ),
    "run_select": _object(
        ["state", "candidates"],
        state=PRE_STATE,
        candidates={"type": "array", "items": CANDIDATE},
        tau=PROB,
        max_keep={"type": "integer", "minimum": 1},
        costs={"type": "array", "items": INT0, "description": "one token estimate per candidate"},
        spend=SPEND,
    ),
    "revisit": _object(["state"], state=PRE_STATE, max_keep={"type": "integer", "minimum": 1}, spend=SPEND),
    "spend": _object(["spend"], spend=SPEND),
    "close": _object([], spend=SPEND),
}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message"],
            "properties": {
                "field": {"type": ["string", "null"], "description": "the request field at fault, when one is"},
                "message": STR,
            },
        }
    },
}
ERRORS = {
    400: "malformed JSON, or an empty body",
    404: "unknown run, or no controller of that stage on this server",
    409: "a run with this run_id is already open",
    413: "body over the size limit, or a list over the item limit",
    415: "Content-Type is not application/json",
    422: "a field is invalid (the error names it)",
    429: "too many open runs",
    500: "internal error (no details in the body; logged by the server)",
}


def openapi_extra(body: str | None, optional: bool = False) -> dict:
    """A route's ``openapi_extra``: its request body's schema (``BODIES[body]``)."""
    if body is None:
        return {}
    content = {"application/json": {"schema": BODIES[body]}}
    return {"requestBody": {"required": not optional, "content": content}}


def error_responses(*codes: int) -> dict:
    """A route's ``responses``: the error body (``ERROR``) for each status code it can answer with."""
    return {c: {"description": ERRORS[c], "content": {"application/json": {"schema": ERROR}}} for c in codes}
