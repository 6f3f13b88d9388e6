"""Shared fixtures. Tests use real components on small data and never need the network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BRANCHGATE_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared_path(*parts: str) -> Path:
    """A path under ../shared/data, or skip the test (a user's fresh clone has no ../shared)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path} (../shared/data is not present in this checkout)")
    return path


@pytest.fixture
def shared():
    """``shared("drgym", "key_point")``: a path under ../shared/data, or the test is skipped (tests import only
    ``branchgate.*``, so they take this helper as a fixture rather than importing conftest)."""
    return shared_path


def developer_script(name: str):
    """The module ``scripts/<name>.py`` or ``benchmarks/<name>.py`` (developer tools and harnesses, not
    installed), loaded from its file."""
    import importlib.util

    (path,) = [p for p in (REPO / "scripts" / f"{name}.py", REPO / "benchmarks" / f"{name}.py") if p.is_file()]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def harness():
    """``harness("readme_results")``: a scripts/ or benchmarks/ file as a module (``developer_script``; not named
    ``benchmark``, which is pytest-benchmark's fixture). The research probes are a package: their tests, in
    research/tests, import them."""
    return developer_script


@pytest.fixture(scope="session")
def encoder():
    """The packaged all-MiniLM-L6-v2 encoder (real weights, offline)."""
    from branchgate.models.encoder import Encoder

    return Encoder.load("packaged")


@pytest.fixture(scope="session")
def embed(encoder):
    return encoder.encode


@pytest.fixture
def chat_stub():
    """Stub OpenAI-compatible ``/chat/completions`` servers on 127.0.0.1 (a free port each), stopped at teardown.

    ``stub = chat_stub(answer)`` where ``answer(body)`` gets the request's JSON and returns the reply's content
    (str), an HTTP error status (int), or ``(content, usage)``; the default usage is 1 token per 4 characters of
    the messages and of the content. ``stub.url`` is the base URL (``…/v1``); ``stub.requests`` and
    ``stub.headers`` hold the bodies and headers received, ``stub.usage`` the usage sent. Requests are served in
    threads, each socket bounded by 30 s.
    """
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    servers = []

    def start(answer):
        stub = SimpleNamespace(requests=[], headers=[], usage=[], answer=answer)

        class Handler(BaseHTTPRequestHandler):
            timeout = 30

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                stub.headers.append(dict(self.headers))
                got = stub.answer(body)
                if isinstance(got, int):
                    self.send_error(got)
                    return
                content, usage = got if isinstance(got, tuple) else (got, None)
                if usage is None:
                    chars = sum(len(m["content"]) for m in body["messages"])
                    usage = {"prompt_tokens": chars // 4, "completion_tokens": len(content) // 4}
                stub.usage.append(usage)
                data = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": content}}], "usage": usage}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    pass

            def log_message(self, *args):
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads, srv.block_on_close = True, False
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        stub.url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
        return stub

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


try:  # property-based tests (tests/test_fuzz.py): small by default, `--hypothesis-profile long` for a long run
    from hypothesis import HealthCheck, settings

    _FUZZ = dict(
        deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], database=None
    )
    settings.register_profile("fast", max_examples=30, **_FUZZ)
    settings.register_profile("long", max_examples=1000, **_FUZZ)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))
except ImportError:  # hypothesis is in the dev extra; without it test_fuzz.py is skipped
    pass


@pytest.fixture(autouse=True)
def _lightning_logs_to_this_tests_stderr():
    """Lightning adds a stderr handler when it is first imported; imported inside one test, that handler keeps
    the test's captured stream, closed once the test ends, and a later test's Lightning log line would print a
    logging error. Point those handlers at the current stderr before each test."""
    import logging
    import sys

    for name in ("lightning", "lightning.fabric", "lightning.pytorch"):
        for handler in logging.getLogger(name).handlers:
            if type(handler) is logging.StreamHandler:
                handler.stream = sys.stderr  # not setStream: it flushes the old, perhaps closed, stream
    yield
