"""``branchgate serve``: both stages and run budgets over HTTP/JSON, for agents in any language (the ``serve``
extra: FastAPI under uvicorn; the core install does not import this module).

    app = create_app(pre=Gate.load("controller.onnx"), read=Gate.load("read/controller.onnx"))

Endpoints (JSON in and out; ``docs/use/serve.md`` shows each with an example; ``schema.py`` has one pydantic
model per body and per answer, which validate them and write ``/openapi.json``):

- ``POST /v1/select`` — a pre-retrieval decision; the answer is ``Selection.to_json()``. ``POST /v1/read`` — a
  read decision (state + hits): the same, plus ``"stage": "read"``.
- ``POST /v1/runs`` opens a budgeted run (``run_id`` optional: one is made); ``POST /v1/runs/{run_id}/select``,
  ``/spend``, ``/revisit`` and ``/close``, ``GET /v1/runs/{run_id}`` (its budget now). Runs live in a store
  (``runs.py``: memory, SQLite or Redis), each request applied once by compare-and-set.
- ``GET /health``, ``GET /v1/models``, ``/openapi.json``, ``/docs`` (Swagger UI from the installed
  ``swagger-ui-bundle`` package, never from the network).

A body is read under the size limit, checked for lists over ``max_items``, validated by its model, then its
candidates or hits by the Gate's own rule (``inputs.py``). Then its tokens are counted with the controller's
tokenizer (each text at most the controller's ``max_length``, as the Gate cuts it), and a request over
``max_request_tokens`` is refused; at most ``max_encodes`` requests encode at once, and one that waits
``encode_wait`` seconds for a slot is answered 429: a request's memory is bounded, and so is the server's.

Errors are ``{"error": {"field": ..., "message": ...}}``: 400 malformed JSON, 401 no or an unknown API key, 403 a run
of another key, 404 an unknown run or a stage this server has no controller for, 409 a run id already open, 413
a body, a list or the tokens over a limit, 415 not JSON, 422 an invalid field (named from the validator's
location, never from error text), 429 ``max_runs`` runs open, a key over its rate limit or no encoder slot free
(with ``Retry-After``); anything else a 500 that says only ``internal error`` (the traceback goes to the log).
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import functools
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.staticfiles import StaticFiles

from branchgate import __version__
from branchgate.errors import BranchgateError, InputError
from branchgate.fileio import load_json
from branchgate.inference.gate_texts import CHARS_PER_TOKEN_LIMIT
from branchgate.inference.inputs import as_decision, as_read_decision, decision_texts
from branchgate.inference.run_gate import apply_decision
from branchgate.inference.server import schema
from branchgate.inference.server.runs import MemoryStore, Runs, StoreError
from branchgate.limits import MAX_ITEMS  # items of any list in a body (candidates, hits, state.retained, ...)

log = logging.getLogger("branchgate.serve")
MAX_BODY_BYTES = 1 << 20  # a request body (JSON); larger ones are refused with 413 before being read whole
MAX_RUNS = 10_000  # open budgeted runs per store
RUN_TTL = 3600.0  # seconds: an idle run may be dropped after this when the store needs room for a new one
MAX_REQUEST_TOKENS = 8192  # tokens one request may make the Gate encode (about 0.3 GB at 256 tokens a text)
MAX_ENCODES = 2  # requests encoding at once (each up to MAX_REQUEST_TOKENS)
ENCODE_WAIT = 30.0  # seconds a request waits for an encoder slot before a 429
WHERE = "body"  # what errors call the request body
HINTS = {  # a field an endpoint does not take, and where it belongs
    ("select", "hits"): "a search's hits go to POST /v1/read (a read controller)",
    ("read", "candidates"): "candidate sub-queries go to POST /v1/select (a pre-retrieval controller)",
    ("run_select", "root_tau"): "root_tau and a budgeted run do not combine (the run admits by its own price)",
    **{
        ("read", k): "a pre-retrieval state's field: a read state has root_query, query, goal, read, read_ids, depth"
        for k in ("frame_query", "parent_goal", "retained")
    },
}
RUN_FIELDS = ("run_id", "budget_nodes", "budget_tokens", "defer", "costs", "spend", "revisit", "end_run")


class ApiError(Exception):
    """A request the server refuses: an HTTP status, a message, the field at fault (or None) and headers."""

    def __init__(self, status: int, message: str, field: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers


def error_response(status: int, message: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"field": field, "message": message}}, status_code=status, headers=headers)


@dataclass
class Limits:
    """What one request, a key and the server's runs may use (``create_app``)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_items: int = MAX_ITEMS
    max_runs: int = MAX_RUNS
    run_ttl: float = RUN_TTL
    max_request_tokens: int = MAX_REQUEST_TOKENS
    max_encodes: int = MAX_ENCODES
    encode_wait: float = ENCODE_WAIT
    rate_limit: int | None = None  # requests per minute per API key (per client address without keys); None: none


# -- reading and validating a body --------------------------------------------------------------------------------
async def read_body(request: Request, limits: Limits, optional: bool = False) -> dict:
    """The request's JSON object, read under the size limit: 413 from a Content-Length over it or as the stream
    passes it (never read whole first), 415 not JSON, 400 malformed or (unless ``optional``) empty."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limits.max_body_bytes):
        raise ApiError(413, f"body over {limits.max_body_bytes} bytes (Content-Length {length[:20]})")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    json_type = media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
    if media and not json_type:
        raise ApiError(415, f"Content-Type {media!r}: send application/json")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise ApiError(413, f"body over {limits.max_body_bytes} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        if optional:
            return {}
        raise ApiError(400, "empty body: send a JSON object")
    if not media:
        raise ApiError(415, "no Content-Type: send application/json")
    try:
        obj = load_json(raw, WHERE)
    except InputError as exc:
        raise ApiError(400, exc.reason) from None
    if not isinstance(obj, dict):
        raise ApiError(422, f"the body must be a JSON object, got {type(obj).__name__}")
    return obj


def check_items(body: dict, max_items: int) -> None:
    """A list over ``max_items`` in the body or its ``state`` is a 413 naming it (before anything else reads it)."""
    state = body.get("state")
    nested = state.items() if isinstance(state, Mapping) else ()
    for key, value in [*body.items(), *((f"state.{k}", v) for k, v in nested)]:
        if isinstance(value, list) and len(value) > max_items:
            raise ApiError(413, f"field '{key}' has {len(value)} items (at most {max_items} per request)", key)


def field_name(loc) -> str | None:
    """A validator's location as the field's name: ``("state", "depth")`` → ``state.depth``,
    ``("candidates", 2, "query")`` → ``candidates[2].query``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def validation_error(exc: ValidationError, model: type[BaseModel], endpoint: str) -> ApiError:
    """A model's first validation error as a 422 naming its field (from the error's ``loc`` and ``type``); a field
    the body should not have comes first (``hits`` sent to /v1/select says so, not that candidates are missing)."""
    errors = exc.errors(include_url=False)
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    name = field_name(err["loc"])
    if err["type"] == "extra_forbidden":
        key = str(err["loc"][-1])
        takes = ", ".join(model.model_fields) if len(err["loc"]) == 1 else "its own fields"
        hint = HINTS.get((endpoint, key))
        if hint is None and endpoint in ("select", "read") and key in RUN_FIELDS:
            hint = "budgeted runs: POST /v1/runs, then POST /v1/runs/{run_id}/select"
        return ApiError(422, f"unknown field '{name}' here (this takes {takes})" + (f"; {hint}" if hint else ""), name)
    if err["type"] == "missing":
        return ApiError(422, f"missing field '{name}'", name)
    return ApiError(422, f"field '{name}': {err['msg']}", name)


def validate(body: dict, model: type[BaseModel], endpoint: str):
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc, model, endpoint) from None


def state_of(model: BaseModel) -> dict:
    """A validated state as the Gate takes it: the fields given."""
    return model.model_dump(exclude_none=True)


# -- bounding the work --------------------------------------------------------------------------------------------
class Encoder:
    """The work of one server: each request's tokens counted (the Gate's tokenizer, each text cut as the Gate cuts
    it) and at most ``max_encodes`` requests encoding at once."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.slots = threading.BoundedSemaphore(limits.max_encodes)

    def check(self, gate, texts: list[str], field: str) -> int:
        """The tokens of a decision's texts; over ``max_request_tokens`` a 413 naming ``field``."""
        tok = getattr(gate, "tokenizer", None) or gate.gate.tokenizer  # a Gate, or a TeacherGate's
        cut = gate.max_length * CHARS_PER_TOKEN_LIMIT
        n = sum(len(e.ids) for e in tok.encode_batch([t[:cut] for t in texts if t]))
        if n > self.limits.max_request_tokens:
            raise ApiError(
                413,
                f"the request's texts are {n} tokens (each counted up to the controller's max_length, "
                f"{gate.max_length}): at most {self.limits.max_request_tokens} per request (--max-request-tokens); "
                f"send fewer or shorter {field}",
                field,
            )
        return n

    def run(self, fn: Callable, *args, **kw):
        """``fn(*args, **kw)`` holding an encoder slot (called in a worker thread): a 429 after ``encode_wait``."""
        if not self.slots.acquire(timeout=self.limits.encode_wait):
            wait = max(1, int(self.limits.encode_wait))
            raise ApiError(429, "every encoder slot is busy: retry later", None, {"Retry-After": str(wait)})
        try:
            return fn(*args, **kw)
        finally:
            self.slots.release()


# -- keys and rates -----------------------------------------------------------------------------------------------
def key_id(key: str) -> str:
    """What the server keeps of an API key (the owner of a run, the rate counter's name): a hash, never the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class Gatekeeper:
    """API keys (optional) and the rate limit per key: ``who(request)`` is the key's id (None without keys)."""

    def __init__(self, keys, rate_limit: int | None, store):
        self.ids = None if keys is None else frozenset(key_id(k) for k in keys)
        self.rate_limit, self.store = rate_limit, store

    def who(self, request: Request) -> str | None:
        key = request.headers.get("x-api-key")
        auth = request.headers.get("authorization", "")
        if key is None and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        ident = None
        if self.ids is not None:
            if not key:
                raise ApiError(401, "no API key: send it in the X-API-Key header (or Authorization: Bearer KEY)")
            ident = key_id(key)
            if ident not in self.ids:
                raise ApiError(401, "unknown API key")
        if self.rate_limit is not None:
            name = ident or f"addr:{request.client.host if request.client else '-'}"
            now = time.time()
            if self.store.hit(name, int(now // 60)) > self.rate_limit:
                wait = str(max(1, 60 - int(now % 60)))
                raise ApiError(
                    429, f"over {self.rate_limit} requests a minute for this key", None, {"Retry-After": wait}
                )
        return ident


def guarded(handler, keeper: Gatekeeper | None):
    """A route's handler with every failure answered as JSON: ``ApiError`` and the store's as themselves,
    ``InputError`` 422 naming its field, other ``BranchgateError`` 422, anything else a 500 saying only
    ``internal error`` (logged here). With a ``keeper``, the key and the rate are checked first."""

    @functools.wraps(handler)
    async def route(request: Request):
        try:
            if keeper is not None:
                request.state.owner = keeper.who(request)
            return await handler(request)
        except (ApiError, StoreError) as exc:
            return error_response(exc.status, exc.message, exc.field, getattr(exc, "headers", None))
        except InputError as exc:
            field = exc.file if exc.file != WHERE else None
            message = f"field '{field}' {exc.reason}" if field else exc.reason
            return error_response(422, message, field)
        except BranchgateError as exc:
            return error_response(422, str(exc))
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(500, "internal error")

    return route


def model_info(gate) -> dict:
    """What ``GET /v1/models`` says of one controller: its metadata (``inference/metadata.py``) and file hash."""
    meta = gate.meta
    with open(gate.path, "rb") as f:  # streamed in blocks, never read whole
        digest = hashlib.file_digest(f, "sha256")
    names = meta.get("feature_names")
    return {
        "stage": gate.stage,
        "file": gate.path.name,
        "sha256": digest.hexdigest(),
        "encoder": gate.encoder,
        "tau": gate.tau,
        "root_tau": gate.root_tau,
        "precision": meta.get("precision"),
        "dim": gate.dim,
        "max_length": gate.max_length,
        "feature_names": None if names is None else list(json.loads(names)),  # checked at load (metadata.py)
        "teacher": meta.get("teacher"),
        "branchgate_version": meta.get("branchgate_version"),
        "trained_with": meta.get("trained_with"),
    }


def swagger_assets():
    """The folder of Swagger UI's files from the installed ``swagger-ui-bundle`` package, or None."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ModuleNotFoundError:
        return None
    return swagger_ui_path


# -- the app ------------------------------------------------------------------------------------------------------
def create_app(pre=None, read=None, *, limits: Limits | None = None, store=None, api_keys=None) -> FastAPI:
    """The FastAPI app over loaded Gates (``Gate.load``): ``pre`` a pre-retrieval controller, ``read`` a read
    controller, at least one of them. ``store``: where runs live (``runs.open_store``; default this process's
    memory); ``api_keys``: the keys accepted (None: no keys needed). Endpoints and errors: the module docstring."""
    if pre is None and read is None:
        raise InputError("give a pre-retrieval controller, a read controller or both", "--pre/--read")
    for name, flag, gate in (("pre", "--pre", pre), ("read", "--read", read)):
        if gate is not None and gate.stage != name:
            raise InputError(f"{gate.path} is a {gate.stage} controller (metadata stage={gate.stage})", flag)
    app = FastAPI(
        title="branchgate",
        version=__version__,
        description="Gate deep-research decisions over HTTP/JSON.",
        docs_url=None,
        redoc_url=None,
    )
    server = Server(app, pre, read, limits or Limits(), store if store is not None else MemoryStore(), api_keys)
    add_decision_routes(server)
    add_run_routes(server)
    add_docs(app)
    add_openapi_and_errors(app)
    return app


class Server:
    """What the routes share: the app, the Gates by stage, the limits, the runs, the encoder slots and the
    gatekeeper (API keys, rate limits)."""

    def __init__(self, app: FastAPI, pre, read, limits: Limits, store, api_keys):
        self.app, self.limits, self.api_keys = app, limits, api_keys
        self.gates = {"pre": pre, "read": read}
        self.runs = Runs(pre, store, limits.max_runs, limits.run_ttl) if pre is not None else None
        self.encoder = Encoder(limits)
        self.models = [model_info(g) for g in self.gates.values() if g is not None]
        self.keeper = Gatekeeper(api_keys, limits.rate_limit, store)

    def need(self, stage: str):
        """The Gate of ``stage``; a 404 naming the flag that loads one when the server has none."""
        if self.gates[stage] is None:
            flag = "--pre PRE.onnx" if stage == "pre" else "--read READ.onnx"
            raise ApiError(404, f"this server has no {stage} controller (start it with {flag})", "stage")
        return self.gates[stage]

    async def body_of(self, request: Request, model: type[BaseModel], endpoint: str, optional: bool = False):
        body = await read_body(request, self.limits, optional)
        check_items(body, self.limits.max_items)
        return validate(body, model, endpoint)

    def route(self, method, path, answer, body=None, *codes, optional=False, status=200, keyed=True):
        """A decorator adding the handler at ``path``, guarded by the gatekeeper when ``keyed``, with its answer
        model, its request body and its error codes in the OpenAPI description."""
        guarded_codes = keyed and (self.api_keys is not None or self.limits.rate_limit)
        codes = (*codes, 401, 429) if guarded_codes else codes
        kw = {
            "response_model": answer,
            "response_model_exclude_unset": True,
            "responses": schema.error_responses(*sorted(set(codes)), 500),
            "status_code": status,
        }
        if body is not None:
            kw["openapi_extra"] = schema.request_body(body, optional)
        add = getattr(self.app, method)
        return lambda fn: add(path, **kw)(guarded(fn, self.keeper if keyed else None))

    async def in_run(self, request: Request, fn: Callable, close: bool = False):
        self.need("pre")
        owner = getattr(request.state, "owner", None)
        return await run_in_threadpool(self.runs.call, request.path_params["run_id"], fn, owner, close)


def add_decision_routes(s: Server) -> None:
    """``/health``, ``/v1/models``, ``/v1/select`` and ``/v1/read``."""
    route, encoder = s.route, s.encoder

    @route("get", "/health", schema.Health, keyed=False)
    async def health(request: Request):
        """Liveness: the stages this server gates and the open runs in its store."""
        stages = [st for st, g in s.gates.items() if g is not None]
        count = None if s.runs is None else await run_in_threadpool(len, s.runs)
        return {"status": "ok", "stages": stages, "open_runs": count}

    @route("get", "/v1/models", schema.Models)
    async def list_models(request: Request):
        """Each loaded controller's stage, encoder, τ, precision, file hash and the branchgate that exported it."""
        return {"branchgate_version": __version__, "models": s.models}

    @route("post", "/v1/select", schema.Selection, schema.SelectRequest, 400, 404, 413, 415, 422, 429)
    async def select(request: Request):
        """Gate one pre-retrieval decision (which candidate sub-queries to expand)."""
        gate = s.need("pre")
        body = await s.body_of(request, schema.SelectRequest, "select")
        state = state_of(body.state)
        await run_in_threadpool(encoder.check, gate, decision_texts(*as_decision(state, body.candidates)), "candidates")
        kw = {"tau": body.tau, "max_keep": body.max_keep, "root_tau": body.root_tau}
        sel = await run_in_threadpool(encoder.run, gate.select, state, body.candidates, **kw)
        return sel.to_json()

    @route("post", "/v1/read", schema.ReadSelection, schema.ReadRequest, 400, 404, 413, 415, 422, 429)
    async def read_hits(request: Request):
        """Gate one read decision (which hits of a search to read)."""
        gate = s.need("read")
        body = await s.body_of(request, schema.ReadRequest, "read")
        if body.hits is not None and body.items is not None:
            raise ApiError(422, "give the hits once: 'hits' or 'items', not both", "items")
        key = "hits" if body.hits is not None or body.items is None else "items"
        hits = getattr(body, key)
        if hits is None:
            raise ApiError(422, "missing field 'hits'", "hits")
        state = state_of(body.state)
        d = as_read_decision(state, hits, key)
        await run_in_threadpool(encoder.check, gate, decision_texts(d.state, d.texts), key)
        kw = {"tau": body.tau, "max_keep": body.max_keep, "root_tau": body.root_tau, "floor": body.floor}
        sel = await run_in_threadpool(encoder.run, gate.select, state, hits, **kw)
        return {**sel.to_json(), "stage": "read"}


def add_run_routes(s: Server) -> None:
    """``/v1/runs`` and a run's ``select``, ``revisit``, ``spend`` and ``close``."""
    route, encoder = s.route, s.encoder

    @route("post", "/v1/runs", schema.RunStatus, schema.OpenRunRequest, 400, 403, 404, 409, 413, 415, 422, 429,
           optional=True, status=201)  # fmt: skip
    async def open_run(request: Request):
        """Open a budgeted run (``run_id`` optional: one is made)."""
        s.need("pre")
        body = await s.body_of(request, schema.OpenRunRequest, "open", optional=True)
        run_id = body.run_id or uuid.uuid4().hex
        owner = getattr(request.state, "owner", None)
        args = (run_id, body.budget_nodes, body.budget_tokens, body.defer, owner)
        return await run_in_threadpool(s.runs.open, *args)

    @route("get", "/v1/runs/{run_id}", schema.RunStatus, None, 403, 404)
    async def get_run(request: Request):
        """A run's budget now (spent, reserved, remaining, price, deferred candidates)."""
        return await s.in_run(request, lambda run: run.status())

    @route("post", "/v1/runs/{run_id}/select", schema.RunSelection, schema.RunSelectRequest,
           400, 403, 404, 413, 415, 422, 429)  # fmt: skip
    async def run_select(request: Request):
        """Gate one decision within the run's budget (``costs``: one token estimate per candidate)."""
        gate = s.need("pre")
        body = await s.body_of(request, schema.RunSelectRequest, "run_select")
        d = {**decision(body, request), "candidates": body.candidates, "costs": body.costs}
        await run_in_threadpool(encoder.check, gate, decision_texts(*as_decision(d["state"], d["candidates"])),
                                "candidates")  # fmt: skip
        return await s.in_run(request, lambda run: encoder.run(apply_decision, run, d, body.tau, body.max_keep))

    @route("post", "/v1/runs/{run_id}/revisit", schema.RunSelection, schema.RevisitRequest,
           400, 403, 404, 413, 415, 422, 429)  # fmt: skip
    async def run_revisit(request: Request):
        """Which deferred candidates to expand now, re-scored against ``state`` (answer: ``revisited``)."""
        gate = s.need("pre")
        body = await s.body_of(request, schema.RevisitRequest, "revisit")
        d = {**decision(body, request), "revisit": True}

        def revisit(run):  # the run's deferred candidates are re-scored: their tokens count too
            texts = decision_texts(*as_decision(d["state"], [x.text for x in run.deferred]))
            encoder.check(gate, texts, "deferred")
            return encoder.run(apply_decision, run, d, None, body.max_keep)

        return await s.in_run(request, revisit)

    @route("post", "/v1/runs/{run_id}/spend", schema.RunStatus, schema.SpendRequest, 400, 403, 404, 413, 415, 422)
    async def run_spend(request: Request):
        """Report the tokens expansions really used (settles their reservations)."""
        body = await s.body_of(request, schema.SpendRequest, "spend")
        return await s.in_run(request, functools.partial(spend_in, spends=spends_of(body.spend)))

    @route("post", "/v1/runs/{run_id}/close", schema.ClosedRun, schema.CloseRequest,
           400, 403, 404, 413, 415, 422, optional=True)  # fmt: skip
    async def run_close(request: Request):
        """Close the run: the answer lists its deferred candidates never expanded (``never_expanded``)."""
        body = await s.body_of(request, schema.CloseRequest, "close", optional=True)

        def close(run):
            status = spend_in(run, spends_of(body.spend))
            return {**status, "never_expanded": [x.to_json() for x in run.drop_deferred()], "deferred": []}

        return await s.in_run(request, close, close=True)


def add_openapi_and_errors(app: FastAPI) -> None:
    """The OpenAPI description with every request schema, and JSON errors for unknown paths, wrong methods and
    requests FastAPI itself refuses."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            spec.setdefault("components", {}).setdefault("schemas", {}).update(schema.request_schemas())
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # unknown paths, wrong methods
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def request_error(request: Request, exc: RequestValidationError):
        return error_response(422, "invalid request")


def add_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI with its files from the installed ``swagger-ui-bundle`` package (never from a CDN);
    without that package, ``/docs`` answers 404 saying what to install."""
    assets = swagger_assets()
    if assets is None:

        @app.get("/docs", include_in_schema=False)
        async def no_docs():
            return error_response(404, "Swagger UI is not installed (pip install swagger-ui-bundle); see /openapi.json")

        return
    app.mount("/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="branchgate",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon-32x32.png",
        )


def decision(body, request: Request) -> dict:
    """A run request as the decision ``run_gate.apply_decision`` takes."""
    return {
        "state": state_of(body.state),
        "candidates": [],
        "costs": None,
        "spend": spends_of(body.spend),
        "revisit": False,
        "end_run": False,
        "run_id": request.path_params["run_id"],
    }


def spends_of(spend) -> list[int]:
    return [] if spend is None else spend


def spend_in(run, spends: list[int]) -> dict:
    """Apply reported spends to the run; its status after."""
    for tokens in spends:
        run.spend(tokens)
    return run.status()
