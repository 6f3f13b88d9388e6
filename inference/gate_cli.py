"""`branchgate gate`: gate one decision read as JSON on stdin with an ONNX controller (no torch needed).

Input:  {"state": {"root_query", "frame_query", "parent_goal", "retained": [...], "depth"},
         "candidates": [{"query", "goal"}, ...], "tau": optional, "root_tau": optional, "max_keep": optional}
(``tau`` alone applies at every depth, ``root_tau`` at depth 0; neither: the model's own, ``Gate.thresholds``;
candidates may also be texts or [query, goal] pairs: the Gate's one rule, ``inputs.as_candidates``)
Output: {"kept": [indices], "p_keep": [...], "utility": [...], "fallback": bool, "out_of_range": [features]}
(``out_of_range`` only when the decision's structured features lie outside the model's training range).
With --jsonl, every input line is a decision and every output line its answer. The input (stdin or
--input) is read whole up to ``fileio.MAX_READ_BYTES`` and must be UTF-8 (``fileio.decode_text``).

A read controller (metadata ``stage`` = ``read``: which hits of a search to read; ``inference/gate.py``) takes
Input:  {"state": {"root_query", "query", "goal", "read": [texts or hits], "read_ids": [...], "depth"},
         "hits": [{"title", "snippet", "id", "url", "rank"}, ...] (or "items"; not both), "tau", "root_tau", "max_keep",
         "floor": optional ("root": keep the top hit at depth 0 when none passes τ; also --floor root)}
Output: as above plus "stage": "read", and "not_new": [indices of hits already read] when there are any (their
p_keep and utility are null); "kept" may be empty. A read controller has no budgeted runs (no "run_id").

Budgeted runs (``inference/run_gate.py``): a decision carrying ``"run_id"`` belongs to that run, whose budget
and deferred candidates are kept across calls in a state file (``--state FILE``, else
``<cache>/gate_runs/<hash of run_id>.json``; read-modify-write under a lock, written atomically). Optional
fields: ``budget_nodes``, ``budget_tokens``, ``defer`` (the first call of a run sets them; later calls may
repeat them but not change them), ``costs`` (one token estimate per candidate), ``spend`` (tokens the
expansions since the last call really used: a number or a list, one per expansion), ``revisit: true`` (no
candidates needed: which deferred candidates to expand now, re-scored against ``state``; the answer's
``revisited`` lists them with their first decision) and ``end_run: true`` (forget the run after this call;
the answer's ``never_expanded`` lists its pending deferred candidates). The answer adds ``run_id``,
``budget`` (spent / remaining / price), and when set ``deferred``, ``dropped_by_budget``, ``exhausted``.
A run starts with a call that gates candidates: ``spend`` or ``revisit`` for a run that is not open (never
started, or ended) is an error, as is ``end_run`` with no candidates. An ended run is not reopened silently:
a later call with its ``run_id`` is an error unless it sets the run's budget anew (``budget_nodes``,
``budget_tokens`` or ``defer``); the state file keeps the ended ids for this (``"ended"``). The state file
must be a regular file (or not exist yet; an empty one holds no runs) in a folder the gate can write.

Bounds (``branchgate.limits``, by the Gate's input rules in ``inference/inputs.py``): a decision's lists hold at most
``MAX_ITEMS`` items (candidates, hits, state lists, ``costs``, ``spend``), and every count (``state.depth``, a
hit's ``rank``, ``budget_nodes``, ``budget_tokens``, ``costs``, ``spend``) is an integer from 0 to ``MAX_COUNT``;
a state file holding a number past ``MAX_TOTAL`` (or a non-finite one) is refused, naming the file and the field.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

from branchgate.errors import InputError, LimitError
from branchgate.fileio import atomic_write_json, decode_text, default_cache_dir, load_json, locked, read_bounded
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import (
    READ_STATE_FIELDS,
    as_count,
    as_decision,
    as_floor,
    as_max_keep,
    as_read_decision,
    as_tau,
    as_threads,
    bounded_list,
    check_numbers,
)
from branchgate.inference.inputs import STATE_FIELDS as STATE_KEYS
from branchgate.inference.model_file import read_stage
from branchgate.inference.options import chosen_controller, controller_options
from branchgate.inference.run_gate import RunGate, apply_decision

NO_ROOT_TAU_IN_RUNS = "root_tau and a budgeted run do not combine (the run admits by its own price)"
HIT_KEYS = ("hits", "items")  # a read decision's hit list: the first of these keys present
RUN_KEYS = ("run_id", "revisit", "budget_nodes", "budget_tokens", "defer", "costs", "spend", "end_run")


def configure(parser: argparse.ArgumentParser) -> None:
    controller_options(parser)  # --pre PATH or --read PATH (inference/options.py)
    parser.add_argument("--input", default="-", help="read from this file instead of stdin")
    parser.add_argument("--jsonl", action="store_true", help="one decision per input line, one answer per output line")
    parser.add_argument("--tau", type=float, default=None, help="keep threshold (default: the model's calibrated τ)")
    parser.add_argument(
        "--root-tau",
        type=float,
        default=None,
        help="keep threshold at the root frame, depth 0 (default: the model's root τ if it has one)",
    )
    parser.add_argument("--max-keep", type=int, default=None, help="keep at most this many candidates")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads for the Gate (default: all cores; at most 4 per core)"
    )
    parser.add_argument("--expect-encoder", default=None, help="fail unless the model was built on this encoder id")
    parser.add_argument(
        "--state", default=None, help="budgeted runs' state file (default: under the cache folder, one file per run_id)"
    )
    parser.add_argument(
        "--floor",
        choices=["root"],
        default=None,
        help="read controllers: keep the top hit at the root frame (depth 0) when none passes τ (default: none kept)",
    )


def parse_decision(obj, where: str = "input", stage: str = "pre") -> dict:
    """Validate one decision object for a controller of ``stage``; raises ``InputError`` naming the field."""
    if not isinstance(obj, Mapping):
        raise InputError(f"a decision must be a JSON object, got {type(obj).__name__}", where)
    if "state" not in obj:
        raise InputError("missing field 'state'", where)
    if stage == "read":
        return parse_read_decision(obj, where)
    revisit = obj.get("revisit", False)
    if not isinstance(revisit, bool):
        raise InputError("field 'revisit' must be true or false", where)
    if revisit and obj.get("run_id") is None:
        raise InputError("field 'revisit' needs a 'run_id'", where)
    if "candidates" not in obj and "hits" in obj and not revisit:
        raise InputError(
            "field 'hits': this is a pre-retrieval controller (metadata stage=pre): a decision gives 'candidates' "
            "(sub-queries {query, goal}); a search's hits go to a read controller (stage=read)",
            where,
        )
    if "candidates" not in obj and not revisit:
        raise InputError("missing field 'candidates'", where)
    state = obj["state"]
    if not isinstance(state, Mapping):
        raise InputError(f"field 'state' must be an object, got {type(state).__name__}", where)
    if "root_query" not in state:
        raise InputError("missing field 'state.root_query'", where)
    unknown = sorted(set(state) - set(STATE_KEYS))
    if unknown:
        raise InputError(
            f"unknown field(s) {', '.join('state.' + k for k in unknown)} (expected {', '.join(STATE_KEYS)})", where
        )
    for key in ("root_query", "frame_query", "parent_goal"):
        if state.get(key) is not None and not isinstance(state[key], str):
            raise InputError(f"field 'state.{key}' must be a string", where)
    retained = state.get("retained", [])
    if retained is not None and not isinstance(retained, list):
        raise InputError("field 'state.retained' must be a list", where)
    depth = state.get("depth", 0)
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise InputError("field 'state.depth' must be a non-negative integer", where)
    cands = obj.get("candidates", [])
    try:  # the Gate's own rule for the candidates and the rest of the state
        as_decision(state, cands)
    except InputError as exc:
        raise _in_field(exc, where) from None
    if revisit and cands:
        raise InputError("field 'candidates': a revisit call re-scores the run's deferred candidates; give none", where)
    tau = None if obj.get("tau") is None else as_tau(obj["tau"], f"{where}: field 'tau'")
    root_tau = None if obj.get("root_tau") is None else as_tau(obj["root_tau"], f"{where}: field 'root_tau'")
    max_keep = as_max_keep(obj.get("max_keep"), f"{where}: field 'max_keep'")
    fields = run_fields(obj, len(cands), where)
    if root_tau is not None and fields["run_id"] is not None:
        raise InputError(NO_ROOT_TAU_IN_RUNS, f"{where}: field 'root_tau'")
    return {
        "state": dict(state),
        "candidates": list(cands),
        "tau": tau,
        "root_tau": root_tau,
        "max_keep": max_keep,
        "where": where,
        **fields,
    }


def parse_read_decision(obj: Mapping, where: str = "input") -> dict:
    """Validate one read decision (the module docstring) by the Gate's own rule (``inputs.as_read_decision``)."""
    key = next((k for k in HIT_KEYS if k in obj), None)
    if all(k in obj for k in HIT_KEYS):
        raise InputError(
            f"fields {' and '.join(repr(k) for k in HIT_KEYS)}: give the search's hits once, under one of them", where
        )
    if key is None and "candidates" in obj:
        raise InputError(
            "field 'candidates': this is a read controller (metadata stage=read): a decision gives 'hits' (the "
            "search's hits, each {title, snippet, id, rank}); candidate sub-queries go to a pre-retrieval controller",
            where,
        )
    if key is None:
        raise InputError("missing field 'hits'", where)
    run = run_field(obj)
    if run is not None:
        raise InputError(f"field '{run}': budgeted runs need a pre-retrieval controller (this is a read one)", where)
    state = obj["state"]
    if not isinstance(state, Mapping):
        raise InputError(f"field 'state' must be an object, got {type(state).__name__}", where)
    unknown = sorted(set(state) - set(READ_STATE_FIELDS))
    if unknown:
        raise InputError(
            f"unknown field(s) {', '.join('state.' + k for k in unknown)} (a read controller's state has "
            f"{', '.join(READ_STATE_FIELDS)})",
            where,
        )
    try:  # the Gate's own rule for the state and the hits
        as_read_decision(state, obj[key], key)
    except InputError as exc:
        raise _in_field(exc, where) from None
    return {
        "state": dict(state),
        "hits": list(obj[key]),
        "tau": None if obj.get("tau") is None else as_tau(obj["tau"], f"{where}: field 'tau'"),
        "root_tau": None if obj.get("root_tau") is None else as_tau(obj["root_tau"], f"{where}: field 'root_tau'"),
        "max_keep": as_max_keep(obj.get("max_keep"), f"{where}: field 'max_keep'"),
        "floor": as_floor(obj.get("floor"), f"{where}: field 'floor'"),
        "run_id": None,
        "where": where,
    }


def _in_field(exc: InputError, where: str) -> InputError:
    """The Gate's error about field ``exc.file``, as an error of the decision at ``where`` (same class)."""
    return type(exc)(f"field '{exc.file}': {exc.reason}", where)


def _count(value, key: str, where: str) -> int:
    """A budget field's count (``inputs.as_count``), its error naming the decision and the field."""
    try:
        return as_count(value, key)
    except InputError as exc:
        raise _in_field(exc, where) from None


def run_field(obj: Mapping) -> str | None:
    """The first budgeted-run field (``RUN_KEYS``) a decision object sets, or None."""
    return next((k for k in RUN_KEYS if obj.get(k) not in (None, False)), None)


def run_fields(obj, k: int, where: str) -> dict:
    """The budgeted-run fields of a decision (see the module docstring), checked."""
    out = {"run_id": obj.get("run_id"), "revisit": bool(obj.get("revisit", False))}
    if out["run_id"] is not None and (not isinstance(out["run_id"], str) or not out["run_id"]):
        raise InputError("field 'run_id' must be a non-empty string", where)
    for key in ("budget_nodes", "budget_tokens"):
        v = obj.get(key)
        out[key] = None if v is None else _count(v, key, where)
    for key in ("defer", "end_run"):
        v = obj.get(key)
        if v is not None and not isinstance(v, bool):
            raise InputError(f"field '{key}' must be true or false", where)
        out[key] = v
    costs = obj.get("costs")
    if costs is not None and (not isinstance(costs, list) or len(costs) != k):
        raise InputError(f"field 'costs' must be a list of {k} integers ≥ 0 (one per candidate)", where)
    out["costs"] = None if costs is None else [_count(c, f"costs[{i}]", where) for i, c in enumerate(costs)]
    spend = obj.get("spend")
    spends = [spend] if isinstance(spend, int) and not isinstance(spend, bool) else spend
    if spends is not None and not isinstance(spends, list):
        raise InputError("field 'spend' must be an integer ≥ 0 or a list of them", where)
    try:
        spends = bounded_list(spends or [], "spend", "spends")
    except LimitError as exc:
        raise _in_field(exc, where) from None
    single = not isinstance(spend, list)
    out["spend"] = [_count(c, "spend" if single else f"spend[{i}]", where) for i, c in enumerate(spends)]
    budgeted = (
        any(out[key] is not None for key in ("budget_nodes", "budget_tokens", "defer", "costs", "end_run"))
        or out["spend"]
        or out["revisit"]
    )
    if budgeted and out["run_id"] is None:
        raise InputError("budget fields need a 'run_id' (the run whose budget they belong to)", where)
    return out


def read_decisions(path: str, jsonl: bool = True, stage: str = "pre") -> list[dict]:
    """Decisions for a controller of ``stage`` from a file (``-``: stdin): ``read_json`` then ``parse_decision``."""
    return [parse_decision(obj, where, stage) for obj, where in read_json(path, jsonl)]


def read_json(path: str, jsonl: bool = True) -> list[tuple[object, str]]:
    """``(JSON value, where)`` of each decision in a file (``-``: stdin), read whole but bounded
    (``fileio.read_bounded``) as UTF-8: one per line with ``jsonl`` (blank lines skipped), else one JSON document;
    errors name the file and line."""
    name = "<stdin>" if path == "-" else path
    source = getattr(sys.stdin, "buffer", sys.stdin) if path == "-" else path
    if source is None:
        raise InputError("no standard input (it is closed)", name)
    text = decode_text(read_bounded(source, name), name)
    lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()] if jsonl else [(None, text)]
    return [(load_json(line, name, n), name if n is None else f"{name}:{n}") for n, line in lines]


def _check_flags(args) -> None:
    """The flags' ranges, by the rules of the JSON fields and ``Gate.load`` (``inputs.as_tau``, ``as_max_keep``,
    ``as_threads``)."""
    for flag, value in (("--tau", args.tau), ("--root-tau", args.root_tau)):
        if value is not None:
            as_tau(value, flag)
    as_max_keep(args.max_keep, "--max-keep")
    as_threads(args.threads, "--threads")


def run(args) -> int:
    _check_flags(args)
    args.model = chosen_controller(args)
    objects = read_json(args.input, args.jsonl)
    stage = read_stage(args.model)  # from the file's metadata: which kind of decision the input holds
    if args.floor is not None and stage != "read":
        raise InputError("applies to a read controller only (this is a pre-retrieval controller)", "--floor")
    decisions = [parse_decision(obj, where, stage) for obj, where in objects]
    if args.root_tau is not None and any(d["run_id"] is not None for d in decisions):
        raise InputError(NO_ROOT_TAU_IN_RUNS, "--root-tau")
    gate = Gate.load(args.model, expected_encoder=args.expect_encoder, threads=args.threads)
    out = sys.stdout
    for d in decisions:
        tau = d["tau"] if d["tau"] is not None else args.tau
        max_keep = d["max_keep"] if d["max_keep"] is not None else args.max_keep
        root_tau = d["root_tau"] if d["root_tau"] is not None else args.root_tau
        if stage == "read":
            floor = d["floor"] or args.floor
            sel = gate.select(d["state"], d["hits"], tau=tau, max_keep=max_keep, root_tau=root_tau, floor=floor)
            answer = {**sel.to_json(), "stage": stage}
        elif d["run_id"] is None:
            answer = gate.select(d["state"], d["candidates"], tau=tau, max_keep=max_keep, root_tau=root_tau).to_json()
        else:
            answer = run_decision(gate, d, tau, max_keep, args.state)
        out.write(json.dumps(answer, ensure_ascii=False) + "\n")
    out.flush()
    return 0


def state_file(run_id: str, state: str | None = None) -> Path:
    """Where a run's budget state lives: ``--state FILE`` (all runs in one file), else one file per run under
    the cache folder."""
    if state is not None:
        return Path(state)
    return (
        default_cache_dir() / "gate_runs" / f"{hashlib.sha256(run_id.encode('utf-8', 'replace')).hexdigest()[:24]}.json"
    )


@contextmanager
def locked_runs(path: Path):
    """The ``{"runs": {run_id: RunGate.to_json()}, "ended": {run_id: decisions}}`` held in ``path``, locked
    for a read-modify-write; the caller changes it, and it is written back atomically when the block succeeds.
    A path that is not a regular file (a folder, a device), lies under a file, or cannot be written is an
    ``InputError`` naming it; the file is read bounded (``fileio.read_bounded``)."""
    where = str(path)
    if path.exists() and not path.is_file():
        raise InputError("is not a regular file (a folder or a device): the run state is one file", where)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot keep the run state here ({_why(exc)})", where) from None
    with locked(path):  # its lock file is in the cache folder: nothing is left beside ``path``
        data = {"runs": {}, "ended": {}}
        raw = read_bounded(path, where) if path.exists() else b""
        if raw.strip():
            data = load_json(raw, where)
            check_numbers(data, where)  # a huge count would overflow the run's arithmetic later
            if (
                not isinstance(data, dict)
                or not isinstance(data.get("runs"), dict)
                or not isinstance(data.setdefault("ended", {}), dict)
            ):
                raise InputError('not a gate run state file (expected {"runs": {...}, "ended": {...}})', where)
        yield data
        try:
            atomic_write_json(path, data)
        except OSError as exc:
            raise InputError(f"cannot write the run state ({_why(exc)})", where) from None


def _why(exc: OSError) -> str:
    if isinstance(exc, (NotADirectoryError, FileExistsError)):
        return "a folder on its path is a file"
    if isinstance(exc, PermissionError):
        return "permission denied: a read-only folder?"
    return exc.strerror or str(exc)


def run_decision(gate, d: dict, tau, max_keep, state: str | None) -> dict:
    """One decision of a budgeted run: load the run (or start it), apply reported spends, decide, save."""
    run_id = d["run_id"]
    path = state_file(run_id, state)
    with locked_runs(path) as data:
        runs, ended = data["runs"], data["ended"]
        if run_id in runs:
            run = RunGate.from_json(runs[run_id], gate, f"{path}: run {run_id}")
            for key, have in (
                ("budget_nodes", run.budget.nodes),
                ("budget_tokens", run.budget.tokens),
                ("defer", run.defer),
            ):
                if d[key] is not None and d[key] != have:
                    raise InputError(
                        f"run {run_id!r} already has {key}={json.dumps(have)} (a run's budget is set by "
                        f"its first call)",
                        key,
                    )
        else:
            check_new_run(d, run_id in ended)
            ended.pop(run_id, None)
            run = gate.run(
                budget_nodes=d["budget_nodes"], budget_tokens=d["budget_tokens"], defer=bool(d["defer"]), run_id=run_id
            )
        answer = apply_decision(run, d, tau, max_keep)
        if d["end_run"]:
            runs.pop(run_id, None)
            ended[run_id] = run.decisions
        else:
            runs[run_id] = run.to_json()
    return answer


def check_new_run(d: dict, ended: bool) -> None:
    """A call for a run that is not open starts it: refused when it carries what only an open run has
    (``spend``, ``revisit``, ``end_run`` with no candidates), or when the run ended and the call does not set
    its budget anew (no silent reopening)."""
    run_id, where = d["run_id"], d.get("where", "input")
    state = "has ended (end_run)" if ended else "is not open (no earlier call started it)"
    for key, given in (
        ("spend", bool(d["spend"])),
        ("revisit", d["revisit"]),
        ("end_run", bool(d["end_run"]) and not d["candidates"]),
    ):
        if given:
            raise InputError(
                f"run {run_id!r} {state}: '{key}' needs an open run; a run starts with a call that gates candidates",
                f"{where}: field '{key}'",
            )
    if ended and all(d[key] is None for key in ("budget_nodes", "budget_tokens", "defer")):
        raise InputError(
            f"run {run_id!r} has ended (end_run) and is not reopened silently: use a new run_id, or "
            "start it again with budget_nodes, budget_tokens or defer",
            f"{where}: field 'run_id'",
        )
