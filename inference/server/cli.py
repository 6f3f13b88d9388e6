"""`branchgate serve`: serve a pre-retrieval and/or a read controller over HTTP/JSON (``inference/server/app.py``).

    branchgate serve --pre PRE.onnx --read READ.onnx [--host 127.0.0.1] [--port 8000] [--store sqlite:runs.db]

``--pre`` is the pre-retrieval controller and ``--read`` the read controller, as in every command
(``inference/options.py``; ``--model`` is a deprecated spelling of ``--pre``, kept for one release). Needs the
``serve`` extra (``pip install 'branchgate[serve]'``: FastAPI, uvicorn and Swagger UI's files), imported only when
the command runs. The default host is 127.0.0.1; another host (``0.0.0.0`` to be reachable from other machines) is
allowed with a warning unless API keys are required (``--api-keys FILE`` or ``BRANCHGATE_API_KEYS``). The socket is
bound here, before uvicorn starts: a busy port is a usage error (exit 2). With ``--workers N`` (N > 1) every worker
loads the controllers and shares the runs through ``--store`` (SQLite or Redis); the options reach the workers in
``BRANCHGATE_SERVE_OPTIONS`` (``app_from_env``).
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import argparse
import ipaddress
import json
import logging
import os
import socket

from branchgate.errors import BranchgateError, InputError
from branchgate.fileio import decode_text, default_cache_dir, read_bounded
from branchgate.inference.options import HELP, deprecated_alias
from branchgate.limits import MAX_COUNT, MAX_ITEMS

log = logging.getLogger("branchgate.serve")
LOOPBACK_NAMES = ("localhost",)
KEYS_ENV = "BRANCHGATE_API_KEYS"  # API keys, separated by commas or white space
OPTIONS_ENV = "BRANCHGATE_SERVE_OPTIONS"  # the options, as JSON, for the workers of --workers N
MAX_WORKERS = 16
MAX_KEYS_BYTES = 1 << 20
LIMIT_FLAGS = ("max_body_bytes", "max_items", "max_runs", "max_request_tokens", "max_encodes", "rate_limit")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pre", dest="model", default=None, metavar="PATH", help=HELP["pre"])
    deprecated_alias(parser, "--model", "--pre", "model")  # inference/options.py: the same names in every command
    parser.add_argument("--read", default=None, metavar="PATH", help=HELP["read"])
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other is warned about)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (more than 1: not --store memory)")
    parser.add_argument(
        "--store",
        default=None,
        help="where budgeted runs live: sqlite:PATH (default: serve/runs.db under the cache folder; kept across "
        "restarts), redis://HOST:PORT/DB (several workers or replicas), memory (this process only)",
    )
    parser.add_argument(
        "--api-keys", default=None, help=f"file of API keys, one a line (or {KEYS_ENV}); then every /v1 call needs one"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads of each Gate (default: all cores; at most 4 per core)"
    )
    parser.add_argument(
        "--access-log", action=argparse.BooleanOptionalAction, default=True, help="log each request (default: on)"
    )
    parser.add_argument("--expect-encoder", default=None, help="fail unless the models were built on this encoder id")
    limit = parser.add_argument
    limit("--max-body-bytes", type=int, default=None, help="largest request body (default 1 MiB; larger: 413)")
    limit("--max-items", type=int, default=None, help="most items in any list of a request (default 256; more: 413)")
    limit("--max-runs", type=int, default=None, help="most budgeted runs open at once (default 10000)")
    limit("--max-request-tokens", type=int, default=None, help="most tokens one request encodes (default 8192)")
    limit("--max-encodes", type=int, default=None, help="requests encoding at once (default 2; others wait)")
    limit("--rate-limit", type=int, default=None, help="requests a minute per API key (default: no limit)")
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
    for name in LIMIT_FLAGS:
        value, flag = getattr(args, name, None), "--" + name.replace("_", "-")
        most = MAX_ITEMS if name == "max_items" else MAX_COUNT  # no request holds more items than a decision may
        if value is not None:
            if not 1 <= value <= most:
                raise InputError(f"must be from 1 to {most}, got {value}", flag)
            setattr(limits, name, value)
    if args.run_ttl is not None:
        if not 0 < args.run_ttl <= 10**9:
            raise InputError(f"must be > 0 (seconds), got {args.run_ttl}", "--run-ttl")
        limits.run_ttl = float(args.run_ttl)
    return limits


def api_keys(args) -> list[str] | None:
    """The API keys: ``--api-keys FILE`` (one a line; blank lines and ``#`` comments skipped), else the
    ``BRANCHGATE_API_KEYS`` variable; None when neither is given (no key needed)."""
    if args.api_keys is not None:
        text = decode_text(read_bounded(args.api_keys, args.api_keys, MAX_KEYS_BYTES), args.api_keys)
        keys, where = [line.strip() for line in text.splitlines()], args.api_keys
        keys = [k for k in keys if k and not k.startswith("#")]
    elif os.environ.get(KEYS_ENV, "").strip():
        keys, where = os.environ[KEYS_ENV].replace(",", " ").split(), KEYS_ENV
    else:
        return None
    if not keys:
        raise InputError("holds no API key", where)
    short = [k for k in keys if len(k) < 16]
    if short:
        raise InputError(f"{len(short)} key(s) shorter than 16 characters: use long random keys", where)
    return keys


def load_gates(args) -> dict:
    """``{"pre": Gate | None, "read": Gate | None}``: each file's stage is checked from its metadata first."""
    from branchgate.inference.gate import Gate
    from branchgate.inference.inputs import as_threads
    from branchgate.inference.model_file import read_stage

    if args.model is None and args.read is None:
        raise InputError("give --pre PRE.onnx, --read READ.onnx or both", "--pre/--read")
    threads = as_threads(args.threads, "--threads")
    gates = {}
    for stage, flag, path in (("pre", "--pre", args.model), ("read", "--read", args.read)):
        found = None if path is None else read_stage(path)
        if found not in (None, stage):
            raise InputError(f"{path} is a {found} controller (metadata stage), not a {stage} one", flag)
        gates[stage] = None if path is None else Gate.load(path, expected_encoder=args.expect_encoder, threads=threads)
    return gates


def store_spec(args) -> str:
    """``--store``, or the default: a SQLite file under the cache folder (``fileio.default_cache_dir``)."""
    return args.store or f"sqlite:{default_cache_dir() / 'serve' / 'runs.db'}"


def build_app(args):
    """The app the options describe (in this process, or in each worker of ``--workers N``)."""
    from branchgate.inference.server.app import create_app
    from branchgate.inference.server.runs import open_store

    limits = limits_of(args)
    return create_app(**load_gates(args), limits=limits, store=open_store(store_spec(args)), api_keys=api_keys(args))


def app_from_env():
    """``--workers N``: each worker's app, from the options the command put in ``BRANCHGATE_SERVE_OPTIONS``."""
    return build_app(argparse.Namespace(**json.loads(os.environ[OPTIONS_ENV])))


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (bound here, so a busy port is a clear error, not uvicorn's exit code 3)."""
    if not 0 <= port <= 65535:
        raise InputError(f"must be 0..65535, got {port}", "--port")
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
    except OSError as exc:
        raise InputError(f"cannot listen on {host} ({exc.strerror or exc})", "--host") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise InputError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}: another server there?)", "--port"
        ) from None
    sock.set_inheritable(True)
    return sock


def run(args) -> int:
    from branchgate.cli import install_hint

    try:
        import uvicorn

        import branchgate.inference.server.app  # noqa: F401  (the serve extra is installed)
    except ModuleNotFoundError as exc:
        raise BranchgateError(f"{exc.name} is not installed ({install_hint(exc.name)})") from None
    if not 1 <= args.workers <= MAX_WORKERS:
        raise InputError(f"must be from 1 to {MAX_WORKERS}, got {args.workers}", "--workers")
    args.store = store_spec(args)
    if args.workers > 1 and args.store == "memory":
        raise InputError(
            "several workers share runs through a store: sqlite:PATH or redis://..., not memory", "--store"
        )
    keys = api_keys(args)
    if not is_loopback(args.host) and keys is None:
        log.warning("listening on %s without API keys: anyone who can reach this address can use it", args.host)
    app = build_app(args)  # checks every option and loads the controllers before the port is taken
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.info("branchgate serve: listening on http://%s:%d (%d worker(s), store %s)", shown, port, args.workers,
             args.store)  # fmt: skip
    kw = {"host": host, "port": port, "log_level": "info", "access_log": args.access_log}
    if args.workers == 1:
        uvicorn.Server(uvicorn.Config(app, **kw)).run(sockets=[sock])
        return 0
    from uvicorn.supervisors import Multiprocess

    os.environ[OPTIONS_ENV] = json.dumps({k: v for k, v in vars(args).items() if not k.startswith("_")}, default=str)
    config = uvicorn.Config("branchgate.inference.server.cli:app_from_env", factory=True, workers=args.workers, **kw)
    Multiprocess(config, sockets=[sock]).run()
    return 0
