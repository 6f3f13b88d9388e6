"""The typed JavaScript/TypeScript client (``clients/js``) under node against a real ``branchgate serve`` on
127.0.0.1 (its devDependencies installed by ``.ci/install``: ``npm ci``, the npm registry only): its types
regenerated from the live ``/openapi.json`` (they must be the committed ``src/openapi.ts``), ``tsc`` compiling the
client against them, and ``node --test`` (every call, every answer checked against the live schema, the URL-list
example)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install 'branchgate[serve]')")

REPO = Path(__file__).resolve().parents[1]
CLIENT = REPO / "clients" / "js"
NODE, NPM = shutil.which("node"), shutil.which("npm")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NODE is None or NPM is None, reason="node and npm are not on PATH (the client needs Node ≥ 18)"),
]


def npm(folder: Path, *args: str, url: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"BRANCHGATE_URL": url} if url else {})}
    return subprocess.run([NPM, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def server():
    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "benchmarks" / "bench_serve.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    proc, url, _ = bench.start_server(["--pre", "pretrained:pre-model", "--read", "pretrained:read", "--no-access-log"])
    yield url
    bench.stop_server(proc)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A copy of the package (its sources; ``node_modules`` linked): its devDependencies are installed from the npm
    registry by ``.ci/install`` (``npm ci`` in clients/js), never by a test."""
    if not (CLIENT / "node_modules" / ".bin" / "tsc").exists():
        pytest.skip("clients/js has no node_modules: run `npm ci` there (.ci/install does)")
    folder = tmp_path_factory.mktemp("js") / "client"
    shutil.copytree(CLIENT, folder, ignore=shutil.ignore_patterns("node_modules", "dist"))
    (folder / "node_modules").symlink_to(CLIENT / "node_modules", target_is_directory=True)
    manifest = json.loads((folder / "package.json").read_text())  # no runtime dependencies: fetch is the runtime's
    assert manifest["devDependencies"].keys() == {"typescript", "openapi-typescript"} and "dependencies" not in manifest
    assert (folder / ".npmrc").read_text().strip() == "registry=https://registry.npmjs.org/"
    return folder


def test_the_committed_types_are_the_live_schemas(server, package):
    done = npm(package, "run", "gen", url=server)
    assert done.returncode == 0, done.stderr[-2000:]
    live = (package / "src" / "openapi.ts").read_text()
    assert live == (CLIENT / "src" / "openapi.ts").read_text(), (
        "clients/js/src/openapi.ts is not what the server's /openapi.json gives now: run `npm run gen` in clients/js "
        "against a running `branchgate serve` and check that `npm run build` still compiles"
    )


def test_the_client_compiles_against_the_live_schema_and_passes_its_node_tests(server, package):
    assert npm(package, "run", "gen", url=server).returncode == 0  # whatever the live schema says now
    built = npm(package, "run", "build")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-2000:]
    ran = subprocess.run(
        [NODE, "--test", "test/"],
        cwd=package,
        env={**os.environ, "BRANCHGATE_URL": server},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert "# pass 6" in ran.stdout and "# fail 0" in ran.stdout


def test_the_docs_page_shows_the_example_and_the_packages_scripts():
    page = (REPO / "docs" / "use" / "js-client.md").read_text(encoding="utf-8")
    assert "```js\n" + (CLIENT / "examples" / "gate-urls.mjs").read_text(encoding="utf-8") + "```" in page
    scripts = json.loads((CLIENT / "package.json").read_text())["scripts"]
    assert {"build", "gen"} <= scripts.keys() and "npm ci\nnpm run build" in page
