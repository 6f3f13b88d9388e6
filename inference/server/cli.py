"""`branchgate serve`: serve a pre-retrieval and/or a read controller over HTTP/JSON (``inference/server/app.py``).

    branchgate serve --pre PRE.onnx --read READ.onnx [--host 127.0.0.1] [--port 8000] [--threads N]

Needs the ``serve`` extra (``pip install 'branchgate[serve]'``: FastAPI and uvicorn), imported only when the
command runs. The default host is 127.0.0.1: the API has no authentication, so another host (``0.0.0.0`` to be
reachable from other machines) is allowed with a warning; put it behind your own gateway then.
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import argparse
import ipaddress
import logging

from branchgate.errors import BranchgateError, InputError

log = logging.getLogger("branchgate.serve")
LOOPBACK_NAMES = ("localhost",)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pre", default=None, help="pre-retrieval controller (controller.onnx or its folder)")
    parser.add_argument("--read", default=None, help="read controller (metadata stage=read)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other is warned about)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads of each Gate (default: all cores; at most 4 per core)"
    )
    parser.add_argument(
        "--access-log", action=argparse.BooleanOptionalAction, default=True, help="log each request (default: on)"
    )
    parser.add_argument("--expect-encoder", default=None, help="fail unless the models were built on this encoder id")
    parser.add_argument(
        "--max-body-bytes", type=int, default=None, help="largest request body (default 1 MiB; larger: 413)"
    )
    parser.add_argument(
        "--max-items", type=int, default=None, help="most items in any list of a request (default 256; more: 413)"
    )
    parser.add_argument("--max-runs", type=int, default=None, help="most budgeted runs open at once (default 10000)")
    parser.add_argument(
        "--run-ttl",
        type=float,
        default=None,
        help="seconds after which an idle run may be dropped to make room for a new one (default 3600)",
    )


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def limits_of(args):
    """The server's ``Limits`` from the flags (each an integer ≥ 1; unset: the default)."""
    from branchgate.inference.server.app import Limits

    limits = Limits()
    for name in ("max_body_bytes", "max_items", "max_runs"):
        value, flag = getattr(args, name), "--" + name.replace("_", "-")
        if value is not None:
            if value < 1:
                raise InputError(f"must be ≥ 1, got {value}", flag)
            setattr(limits, name, value)
    if args.run_ttl is not None:
        if not args.run_ttl > 0:
            raise InputError(f"must be > 0, got {args.run_ttl}", "--run-ttl")
        limits.run_ttl = float(args.run_ttl)
    return limits


def load_gates(args) -> dict:
    """``{"pre": Gate | None, "read": Gate | None}``: each file's stage is checked from its metadata first."""
    from branchgate.inference.gate import Gate
    from branchgate.inference.inputs import as_threads
    from branchgate.inference.model_file import read_stage

    if args.pre is None and args.read is None:
        raise InputError("give --pre PRE.onnx, --read READ.onnx or both", "--pre/--read")
    threads = as_threads(args.threads, "--threads")
    gates = {}
    for stage in ("pre", "read"):
        path = getattr(args, stage)
        found = None if path is None else read_stage(path)
        if found not in (None, stage):
            raise InputError(f"{path} is a {found} controller (metadata stage), not a {stage} one", f"--{stage}")
        gates[stage] = None if path is None else Gate.load(path, expected_encoder=args.expect_encoder, threads=threads)
    return gates


def run(args) -> int:
    from branchgate.cli import install_hint

    try:
        import uvicorn

        from branchgate.inference.server.app import create_app
    except ModuleNotFoundError as exc:
        raise BranchgateError(f"{exc.name} is not installed ({install_hint(exc.name)})") from None
    if not 0 <= args.port <= 65535:
        raise InputError(f"must be 0..65535, got {args.port}", "--port")
    limits = limits_of(args)
    if not is_loopback(args.host):
        log.warning(
            "listening on %s: the API has no authentication; anyone who can reach this address can use it", args.host
        )
    app = create_app(**load_gates(args), limits=limits)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", access_log=args.access_log)
    return 0
