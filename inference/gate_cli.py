"""`branchgate gate`: gate one decision read as JSON on stdin with an ONNX controller (no torch needed).

Input:  {"state": {"root_query", "frame_query", "parent_goal", "retained": [...], "depth"},
         "candidates": [{"query", "goal"}, ...], "tau": optional, "max_keep": optional}
Output: {"kept": [indices], "p_keep": [...], "utility": [...], "fallback": bool, "out_of_range": [features]}
(``out_of_range`` only when the decision's structured features lie outside the model's training range).
With --jsonl, every input line is a decision and every output line its answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

from branchgate.errors import InputError
from branchgate.fileio import load_json
from branchgate.inference.inputs import STATE_FIELDS as STATE_KEYS
from branchgate.inference.inputs import as_max_keep, as_tau


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="controller.onnx (or controller.int8.onnx, or their directory)")
    parser.add_argument("--input", default="-", help="read from this file instead of stdin")
    parser.add_argument("--jsonl", action="store_true", help="one decision per input line, one answer per output line")
    parser.add_argument("--tau", type=float, default=None, help="keep threshold (default: the model's calibrated τ)")
    parser.add_argument("--max-keep", type=int, default=None, help="keep at most this many candidates")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for the Gate (default: all cores)")
    parser.add_argument("--expect-encoder", default=None, help="fail unless the model was built on this encoder id")


def parse_decision(obj, where: str = "input") -> dict:
    """Validate one decision object; raises ``InputError`` naming the field."""
    if not isinstance(obj, Mapping):
        raise InputError(f"a decision must be a JSON object, got {type(obj).__name__}", where)
    if "state" not in obj:
        raise InputError("missing field 'state'", where)
    if "candidates" not in obj:
        raise InputError("missing field 'candidates'", where)
    state = obj["state"]
    if not isinstance(state, Mapping):
        raise InputError(f"field 'state' must be an object, got {type(state).__name__}", where)
    if "root_query" not in state:
        raise InputError("missing field 'state.root_query'", where)
    unknown = sorted(set(state) - set(STATE_KEYS))
    if unknown:
        raise InputError(f"unknown field(s) {', '.join('state.' + k for k in unknown)} (expected {', '.join(STATE_KEYS)})", where)
    for key in ("root_query", "frame_query", "parent_goal"):
        if state.get(key) is not None and not isinstance(state[key], str):
            raise InputError(f"field 'state.{key}' must be a string", where)
    retained = state.get("retained", [])
    if retained is not None and not isinstance(retained, list):
        raise InputError("field 'state.retained' must be a list", where)
    depth = state.get("depth", 0)
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise InputError("field 'state.depth' must be a non-negative integer", where)
    cands = obj["candidates"]
    if not isinstance(cands, list):
        raise InputError("field 'candidates' must be a list", where)
    for i, c in enumerate(cands):
        if isinstance(c, str):
            continue
        if not isinstance(c, Mapping):
            raise InputError(f"field 'candidates[{i}]' must be an object {{query, goal}}", where)
        if "query" not in c:
            raise InputError(f"missing field 'candidates[{i}].query'", where)
        for key in ("query", "goal"):
            if c.get(key) is not None and not isinstance(c[key], str):
                raise InputError(f"field 'candidates[{i}].{key}' must be a string", where)
    tau = obj.get("tau")
    if tau is not None and (isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 <= tau <= 1.0):
        raise InputError("field 'tau' must be a number in [0, 1]", where)
    max_keep = obj.get("max_keep")
    if max_keep is not None and (isinstance(max_keep, bool) or not isinstance(max_keep, int) or max_keep < 1):
        raise InputError("field 'max_keep' must be an integer ≥ 1", where)
    return {"state": dict(state), "candidates": list(cands), "tau": tau, "max_keep": max_keep}


def read_decisions(path: str) -> list[dict]:
    """Decisions from a JSON Lines file (blank lines skipped); errors name the file and line."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            obj = load_json(line, path, n)
            out.append(parse_decision(obj, f"{path}:{n}"))
    return out


def _check_flags(args) -> None:
    """The flags' ranges, by the rules of the JSON fields (``inputs.as_tau``, ``as_max_keep``); --threads ≥ 1."""
    if args.tau is not None:
        as_tau(args.tau, "--tau")
    as_max_keep(args.max_keep, "--max-keep")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"must be ≥ 1, got {args.threads}", "--threads")


def run(args) -> int:
    from branchgate.inference.gate import Gate

    _check_flags(args)
    name = "<stdin>" if args.input == "-" else args.input
    try:
        text = sys.stdin.read() if args.input == "-" else open(args.input, encoding="utf-8").read()
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror})", name) from None
    if args.jsonl:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        lines = [(None, text)]
    decisions = []
    for n, line in lines:
        where = name if n is None else f"{name}:{n}"
        decisions.append(parse_decision(load_json(line, name, n), where))
    gate = Gate.load(args.model, expected_encoder=args.expect_encoder, threads=args.threads)
    out = sys.stdout
    for d in decisions:
        tau = d["tau"] if d["tau"] is not None else args.tau
        max_keep = d["max_keep"] if d["max_keep"] is not None else args.max_keep
        sel = gate.select(d["state"], d["candidates"], tau=tau, max_keep=max_keep)
        out.write(json.dumps(sel.to_json(), ensure_ascii=False) + "\n")
    out.flush()
    return 0
