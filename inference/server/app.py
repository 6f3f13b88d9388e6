"""``branchgate serve``: both stages and run budgets over HTTP/JSON, for agents in any language (the ``serve``
extra: FastAPI under uvicorn; the core install does not import this module).

    app = create_app(pre=Gate.load("controller.onnx"), read=Gate.load("read/controller.onnx"))

Endpoints (JSON in and out; ``docs/use/serve.md`` shows each with an example):

- ``POST /v1/select`` — a pre-retrieval decision: ``branchgate gate``'s input without run fields; the answer is
  ``Selection.to_json()``. ``POST /v1/read`` — a read decision (state + hits): the same, plus ``"stage": "read"``.
- ``POST /v1/runs`` opens a budgeted run (``run_id`` optional: one is made; ``budget_nodes``, ``budget_tokens``,
  ``defer``); ``POST /v1/runs/{run_id}/select`` (``costs``, ``spend`` optional), ``/spend``, ``/revisit`` and
  ``/close`` (the answer's ``never_expanded``), ``GET /v1/runs/{run_id}`` (its budget now).
- ``GET /health``, ``GET /v1/models`` (each controller's metadata and file hash), ``/openapi.json``, ``/docs``.

Bodies are read as raw JSON (``fileio.load_json``) and validated by the CLI's own rules (``gate_cli``), so an
error names the field as ``branchgate gate`` does: ``{"error": {"field": ..., "message": ...}}`` with 422 for
an invalid field, 400 malformed JSON, 413 a body over ``max_body_bytes`` (refused from its Content-Length, or
as it streams past the limit) or a list over ``max_items``, 415 not JSON, 404 an unknown run or a stage this
server has no controller for, 409 a run id already open, 429 ``max_runs`` runs open; anything else is a 500
whose body says only ``internal error`` (the traceback goes to the server's log).

Runs live in this process's memory (``Runs``): each behind its own lock, so concurrent requests on one run are
applied one at a time and never spend past its budget; a run stays until closed, or until the server needs
room and it has been idle for ``run_ttl`` seconds. Gate calls run in the threadpool (the Gate is thread-safe).
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import functools
import hashlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from branchgate import __version__
from branchgate.errors import BranchgateError, InputError
from branchgate.fileio import load_json
from branchgate.inference.gate_cli import apply_decision, parse_decision, parse_read_decision, run_field, run_fields
from branchgate.inference.server.schema import error_responses, openapi_extra
from branchgate.logs_to_dataset.decision_points import MAX_CANDIDATES

log = logging.getLogger("branchgate.serve")
MAX_BODY_BYTES = 1 << 20  # a request body (JSON); larger ones are refused with 413 before being read whole
MAX_ITEMS = MAX_CANDIDATES  # items of any list in a body (candidates, hits, state.retained, ...): the dataset's cap
MAX_RUNS = 10_000  # open budgeted runs per server process
RUN_TTL = 3600.0  # seconds: an idle run may be dropped after this when the server needs room for a new one
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
WHERE = "body"  # what the CLI's validators call the request body in their messages
FIELD = re.compile(r"field(?:\(s\))? '?([A-Za-z_][\w.\[\]]*)")
FIELDS = {  # the fields each endpoint's body may have
    "select": ("state", "candidates", "tau", "root_tau", "max_keep"),
    "read": ("state", "hits", "items", "tau", "root_tau", "max_keep", "floor"),
    "open": ("run_id", "budget_nodes", "budget_tokens", "defer"),
    "run_select": ("state", "candidates", "tau", "root_tau", "max_keep", "costs", "spend"),
    "revisit": ("state", "max_keep", "spend"),
    "spend": ("spend",),
    "close": ("spend",),
}


class ApiError(Exception):
    """A request the server refuses: an HTTP status, a message and the field at fault (or None)."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def error_response(status: int, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"field": field, "message": message}}, status_code=status)


def input_error(exc: InputError) -> ApiError:
    """An ``InputError`` from the CLI's validators or the Gate as a 422 naming the field it names."""
    message = str(exc).removeprefix(f"{WHERE}: ")
    found = FIELD.search(str(exc))
    name = found.group(1) if found else (exc.file if exc.file not in (None, WHERE) else None)
    return ApiError(422, message, name)


@dataclass
class Limits:
    """What one request and the server's runs may hold (``create_app``)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_items: int = MAX_ITEMS
    max_runs: int = MAX_RUNS
    run_ttl: float = RUN_TTL


@dataclass
class _Run:
    run: object  # RunGate
    lock: threading.Lock = field(default_factory=threading.Lock)
    used: float = field(default_factory=time.monotonic)
    open: bool = True


class Runs:
    """The open budgeted runs of one server process: at most ``max_runs``, each used under its own lock."""

    def __init__(self, gate, max_runs: int = MAX_RUNS, ttl: float = RUN_TTL):
        self.gate, self.max_runs, self.ttl = gate, int(max_runs), float(ttl)
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._runs)

    def open(self, run_id: str, budget_nodes, budget_tokens, defer: bool):
        run = self.gate.run(budget_nodes=budget_nodes, budget_tokens=budget_tokens, defer=defer, run_id=run_id)
        with self._lock:
            if run_id in self._runs:
                raise ApiError(409, f"run {run_id!r} is already open (close it, or open another run_id)", "run_id")
            if len(self._runs) >= self.max_runs and not self._evict_idle():
                raise ApiError(429, f"{self.max_runs} runs are open (the server's --max-runs): close some first")
            self._runs[run_id] = _Run(run)
        return run

    def _evict_idle(self) -> bool:
        """Drop the runs idle for longer than ``ttl`` that no request is using; True when any was dropped."""
        cutoff = time.monotonic() - self.ttl
        idle = [k for k, e in self._runs.items() if e.used < cutoff and e.lock.acquire(blocking=False)]
        for k in idle:
            entry = self._runs.pop(k)
            entry.open = False  # a request already waiting for its lock then answers 404
            entry.lock.release()
            log.info("run %r dropped after %.0f s idle", k, self.ttl)
        return bool(idle)

    def call(self, run_id: str, fn: Callable, close: bool = False):
        """``fn(run)`` under the run's lock (requests on one run are applied one at a time); with ``close`` the run
        is forgotten after it. An unknown or closed run is a 404 naming ``run_id``."""
        with self._lock:
            entry = self._runs.get(run_id)
        if entry is None:
            raise ApiError(404, f"no open run {run_id!r} (never opened, closed, or dropped)", "run_id")
        with entry.lock:
            if not entry.open:
                raise ApiError(404, f"no open run {run_id!r} (closed meanwhile)", "run_id")
            entry.used = time.monotonic()
            out = fn(entry.run)
            if close:
                entry.open = False
                with self._lock:
                    self._runs.pop(run_id, None)
            return out


def run_status(run) -> dict:
    """A run's budget now: limits, spent, reserved, remaining, the admission price, decisions, deferred entries."""
    b = run.budget
    return {
        "run_id": run.run_id,
        "limit": {"nodes": b.nodes, "tokens": b.tokens},
        "spent_nodes": b.spent_nodes,
        "spent_tokens": b.spent_tokens,
        "reserved_tokens": b.reserved_tokens,
        "remaining": b.remaining(),
        "exhausted": bool(b.exhausted),
        "price": round(run.price(), 6),
        "defer": run.defer,
        "decisions": run.decisions,
        "deferred": [d.to_json() for d in run.deferred],
    }


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
        raise ApiError(400, str(exc).removeprefix(f"{WHERE}: ")) from None
    if not isinstance(obj, dict):
        raise ApiError(422, f"the body must be a JSON object, got {type(obj).__name__}")
    return obj


def check_body(body: dict, endpoint: str, max_items: int) -> dict:
    """Fields this endpoint does not take are a 422 naming them; a list over ``max_items`` a 413 naming it."""
    allowed = FIELDS[endpoint]
    for key in body:
        if key not in allowed:
            run = endpoint in ("select", "read") and run_field({key: True}) is not None
            hint = " (budgeted runs: POST /v1/runs, then POST /v1/runs/{run_id}/select)" if run else ""
            raise ApiError(422, f"unknown field '{key}' here (this endpoint takes {', '.join(allowed)}){hint}", key)
    state = body.get("state")
    nested = state.items() if isinstance(state, Mapping) else ()
    for key, value in [*body.items(), *((f"state.{k}", v) for k, v in nested)]:
        if isinstance(value, list) and len(value) > max_items:
            raise ApiError(413, f"field '{key}' has {len(value)} items (at most {max_items} per request)", key)
    return body


def guarded(handler):
    """A route's handler with every failure answered as JSON: ``ApiError`` as itself, ``InputError`` 422 naming
    the field, other ``BranchgateError`` 422, anything else a 500 saying only ``internal error`` (logged here)."""

    @functools.wraps(handler)
    async def route(request: Request):
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.field)
        except InputError as exc:
            err = input_error(exc)
            return error_response(err.status, err.message, err.field)
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
        "feature_names": meta.get("feature_names"),
        "teacher": meta.get("teacher"),  # a pretrained teacher default (inference/teacher_gate.py), else None
        "branchgate_version": meta.get("branchgate_version"),
        "trained_with": meta.get("trained_with"),
    }


def create_app(pre=None, read=None, *, limits: Limits | None = None) -> FastAPI:
    """The FastAPI app over loaded Gates (``Gate.load``): ``pre`` a pre-retrieval controller, ``read`` a read
    controller, at least one of them. Endpoints and errors: the module docstring."""
    if pre is None and read is None:
        raise InputError("give a pre-retrieval controller, a read controller or both", "--pre/--read")
    for name, gate in (("pre", pre), ("read", read)):
        if gate is not None and gate.stage != name:
            raise InputError(f"{gate.path} is a {gate.stage} controller (metadata stage={gate.stage})", f"--{name}")
    limits = limits or Limits()
    gates = {"pre": pre, "read": read}
    runs = Runs(pre, limits.max_runs, limits.run_ttl) if pre is not None else None
    models = [model_info(g) for g in gates.values() if g is not None]
    app = FastAPI(title="branchgate", version=__version__, description="Gate deep-research decisions over HTTP/JSON.")

    def need(stage: str):
        if gates[stage] is None:
            flag = "--pre PRE.onnx" if stage == "pre" else "--read READ.onnx"
            raise ApiError(404, f"this server has no {stage} controller (start it with {flag})", "stage")
        return gates[stage]

    async def body_of(request: Request, endpoint: str, optional: bool = False) -> dict:
        return check_body(await read_body(request, limits, optional), endpoint, limits.max_items)

    def route(method: str, path: str, body: str | None, *codes: int, optional: bool = False, status: int = 200):
        extra = openapi_extra(body, optional)
        responses = error_responses(*codes, 500)
        add = getattr(app, method)
        return lambda fn: add(path, openapi_extra=extra, responses=responses, status_code=status)(guarded(fn))

    @route("get", "/health", None)
    async def health(request: Request):
        """Liveness: the stages this server gates and its open runs."""
        stages = [s for s, g in gates.items() if g is not None]
        return {"status": "ok", "stages": stages, "open_runs": 0 if runs is None else len(runs)}

    @route("get", "/v1/models", None)
    async def list_models(request: Request):
        """Each loaded controller's stage, encoder, τ, precision, file hash and the branchgate that exported it."""
        return {"branchgate_version": __version__, "models": models}

    @route("post", "/v1/select", "select", 400, 404, 413, 415, 422)
    async def select(request: Request):
        """Gate one pre-retrieval decision (which candidate sub-queries to expand)."""
        gate, body = need("pre"), await body_of(request, "select")
        d = parse_decision(body, WHERE, "pre")
        kw = {"tau": d["tau"], "max_keep": d["max_keep"], "root_tau": d["root_tau"]}
        sel = await run_in_threadpool(gate.select, d["state"], d["candidates"], **kw)
        return JSONResponse(sel.to_json())

    @route("post", "/v1/read", "read", 400, 404, 413, 415, 422)
    async def read_hits(request: Request):
        """Gate one read decision (which hits of a search to read)."""
        gate, body = need("read"), await body_of(request, "read")
        d = parse_read_decision(body, WHERE)
        kw = {"tau": d["tau"], "max_keep": d["max_keep"], "root_tau": d["root_tau"], "floor": d["floor"]}
        sel = await run_in_threadpool(gate.select, d["state"], d["hits"], **kw)
        return JSONResponse({**sel.to_json(), "stage": "read"})

    @route("post", "/v1/runs", "open", 400, 404, 409, 413, 415, 422, 429, optional=True, status=201)
    async def open_run(request: Request):
        """Open a budgeted run (``run_id`` optional: one is made)."""
        need("pre")
        body = await body_of(request, "open", optional=True)
        run_id = body.get("run_id")
        if run_id is not None and not (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
            why = "must be 1-128 letters, digits or . _ : - (the first a letter or digit)"
            raise ApiError(422, f"field 'run_id' {why}", "run_id")
        f = run_fields({**body, "run_id": run_id or uuid.uuid4().hex}, 0, WHERE)
        run = runs.open(f["run_id"], f["budget_nodes"], f["budget_tokens"], bool(f["defer"]))
        return JSONResponse(run_status(run), status_code=201)

    async def in_run(request: Request, endpoint: str, fn: Callable, optional: bool = False, close: bool = False):
        need("pre")
        run_id = request.path_params["run_id"]
        body = await body_of(request, endpoint, optional) if endpoint else {}
        return JSONResponse(await run_in_threadpool(runs.call, run_id, lambda run: fn(run, body, run_id), close))

    @route("get", "/v1/runs/{run_id}", None, 404)
    async def get_run(request: Request):
        """A run's budget now (spent, reserved, remaining, price, deferred candidates)."""
        return await in_run(request, "", lambda run, body, rid: run_status(run))

    @route("post", "/v1/runs/{run_id}/select", "run_select", 400, 404, 413, 415, 422)
    async def run_select(request: Request):
        """Gate one decision within the run's budget (``costs``: one token estimate per candidate)."""

        def decide(run, body, run_id):
            d = parse_decision({**body, "run_id": run_id}, WHERE, "pre")
            return apply_decision(run, d, d["tau"], d["max_keep"])

        return await in_run(request, "run_select", decide)

    @route("post", "/v1/runs/{run_id}/revisit", "revisit", 400, 404, 413, 415, 422)
    async def run_revisit(request: Request):
        """Which deferred candidates to expand now, re-scored against ``state`` (answer: ``revisited``)."""

        def revisit(run, body, run_id):
            d = parse_decision({**body, "run_id": run_id, "revisit": True}, WHERE, "pre")
            return apply_decision(run, d, None, d["max_keep"])

        return await in_run(request, "revisit", revisit)

    @route("post", "/v1/runs/{run_id}/spend", "spend", 400, 404, 413, 415, 422)
    async def run_spend(request: Request):
        """Report the tokens expansions really used (settles their reservations)."""
        return await in_run(request, "spend", functools.partial(spend_in, required=True))

    @route("post", "/v1/runs/{run_id}/close", "close", 400, 404, 413, 415, 422, optional=True)
    async def run_close(request: Request):
        """Close the run: the answer lists its deferred candidates never expanded (``never_expanded``)."""

        def close(run, body, run_id):
            status = spend_in(run, body, run_id)
            return {**status, "never_expanded": [x.to_json() for x in run.drop_deferred()], "deferred": []}

        return await in_run(request, "close", close, optional=True, close=True)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # unknown paths, wrong methods
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return error_response(422, "invalid request")

    return app


def spend_in(run, body: dict, run_id: str, required: bool = False) -> dict:
    """Apply a body's ``spend`` (checked as ``branchgate gate`` checks it) to the run; its status after."""
    if required and "spend" not in body:
        raise InputError("missing field 'spend'", WHERE)
    for tokens in run_fields({"spend": body.get("spend"), "run_id": run_id}, 0, WHERE)["spend"]:
        run.spend(tokens)
    return run_status(run)
