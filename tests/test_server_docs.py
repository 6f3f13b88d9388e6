"""Issue 63: every example of docs/use/serve.md runs as shown against a real server started as shown, with the
pretrained controllers a new user has, and answers what the page shows (numbers within 1e-4: int8 kernels differ
slightly between CPUs). ``/docs`` serves Swagger UI from the installed package, never from a CDN.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install 'branchgate[serve]')")

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "use" / "serve.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
SHOWN = "localhost:8000"


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def examples(text: str) -> list[tuple[str, str, str | None]]:
    """``(kind, command, shown answer)`` in page order: ``serve`` (a block with a ``branchgate serve`` line) or
    ``curl`` (a block that is a curl command, and the json block after it)."""
    out, found = [], blocks(text)
    for i, (lang, body) in enumerate(found):
        if lang != "sh":
            continue
        lines = body.strip().splitlines() or [""]
        first, serve = lines[0], [x for x in lines if x.startswith("branchgate serve")]
        if serve:  # an install line before it is not run (the test runs in this environment)
            out.append(("serve", serve[0], None))
        elif first.startswith("curl "):
            assert i + 1 < len(found) and found[i + 1][0] == "json", f"no answer shown after: {first}"
            out.append(("curl", body.strip(), found[i + 1][1].strip()))
    return out


def run_page(text: str, cwd: Path, bench) -> list[tuple[str, str]]:
    """Run the page's examples in order: each ``branchgate serve`` starts a server (on a free port), each curl goes
    to the newest one. → ``(shown answer, printed answer)`` per curl."""
    servers, url, got = [], None, []
    try:
        for kind, command, shown in examples(text):
            if kind == "serve":
                argv = shlex.split(command)[2:]
                proc, url, _ = bench.start_server([*argv, "--no-access-log"], cwd=cwd)
                servers.append(proc)
                continue
            assert url is not None, "a curl before any branchgate serve"
            line = command.replace(SHOWN, url.removeprefix("http://"))
            done = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            got.append((shown, done.stdout.strip()))
    finally:
        for proc in servers:
            bench.stop_server(proc)
    return got


def alike(got, want, path: str = "") -> None:
    if isinstance(want, float) or isinstance(got, float):
        assert abs(float(got) - float(want)) <= 1e-4, (path, got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (path, got, want)
        for k in want:
            alike(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (path, got, want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            alike(g, w, f"{path}[{i}]")
    else:
        assert got == want, (path, got, want)


def bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "benchmarks" / "bench_serve.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_page_shows_an_answer_after_every_call_and_starts_a_server_first():
    found = examples(PAGE.read_text(encoding="utf-8"))
    assert found[0][0] == "serve" and "pretrained:pre" in found[0][1]
    assert sum(k == "curl" for k, _, _ in found) >= 8
    assert all(shown and shown != "RESULT" for k, _, shown in found if k == "curl")


@pytest.mark.slow
def test_every_example_on_the_serve_page_runs_as_shown(tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("curl is not on PATH (the page's examples are curl commands)")
    for shown, printed in run_page(PAGE.read_text(encoding="utf-8"), tmp_path, bench_module()):
        alike(json.loads(printed), json.loads(shown))


def test_swagger_ui_is_served_from_the_installed_package():
    from fastapi.testclient import TestClient

    from branchgate.inference.gate import Gate
    from branchgate.inference.server.app import create_app, swagger_assets

    assert swagger_assets() is not None, "swagger-ui-bundle (the serve extra) is not installed"
    client = TestClient(create_app(read=Gate.load("pretrained:read", threads=1)))
    page = client.get("/docs").text
    assets = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page)
    assert assets and all(a.startswith("/docs-assets/") for a in assets), assets
    for asset in assets:
        assert client.get(asset).status_code == 200, asset
