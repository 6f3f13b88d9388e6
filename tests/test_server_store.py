"""Issue 67 (server): run state in a store (SQLite by default for restarts, Redis for several workers), each request
applied once by compare-and-set; API keys (401, 403) and rate limits per key (429).

The restart test kills a real server (SIGKILL) in the middle of a run and restarts it on the same SQLite file; the
Redis test starts a real ``redis-server`` (Debian's package) on 127.0.0.1 and a server with two uvicorn workers on
one run under 32 concurrent clients. Both check that no run spends past its budget.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install 'branchgate[serve]')")

from fastapi.testclient import TestClient  # noqa: E402

from branchgate.errors import InputError  # noqa: E402
from branchgate.inference.gate import Gate  # noqa: E402
from branchgate.inference.server.app import Limits, create_app  # noqa: E402
from branchgate.inference.server.runs import Runs, SqliteStore, open_store  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*decision outside the training range")
REPO = Path(__file__).resolve().parents[1]
STATE = {"root_query": "Why are honeybee colonies collapsing?", "depth": 0}
CANDS = ["varroa mites", "neonicotinoid field studies", "honey prices", "colony collapse review"]
KEYS = ["alpha-key-0123456789", "bravo-key-0123456789"]


@pytest.fixture(scope="module")
def pre() -> Gate:
    return Gate.load("pretrained:pre-model", threads=1)


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "benchmarks" / "bench_serve.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _select(i: int) -> dict:
    return {"state": STATE, "candidates": [f"{c} #{i}" for c in CANDS], "tau": 0.0}  # every candidate passes τ


# -- stores -------------------------------------------------------------------------------------------------------
def test_two_processes_worth_of_runs_on_one_sqlite_file_never_overspend(pre, tmp_path):
    """Two ``Runs`` on one file (as two workers have) and 8 threads: every decision applied once, 5 nodes kept."""
    path = tmp_path / "runs.db"
    a, b = Runs(pre, SqliteStore(path)), Runs(pre, SqliteStore(path))
    a.open("r1", 5, None, False)
    answers, lock = [], threading.Lock()

    def worker(k: int):
        runs = (a, b)[k % 2]
        for i in range(k, 32, 8):
            out = runs.call("r1", lambda run, i=i: run.select(STATE, [f"{c} {i}" for c in CANDS], tau=0.0).to_json())
            with lock:
                answers.append(out)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert sum(len(x["kept"]) for x in answers) == 5
    assert sorted(x["budget"]["decision"] for x in answers) == list(range(32))
    assert b.call("r1", lambda run: run.status())["spent_nodes"] == 5


def test_a_store_never_takes_over_a_file_it_did_not_write(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE mine (x)")
    before = other.read_bytes()
    for path in (notes, other, tmp_path):
        with pytest.raises(InputError):
            open_store(f"sqlite:{path}")
    assert notes.read_text() == "my notes\n" and other.read_bytes() == before
    with pytest.raises(InputError, match="--store"):
        open_store("postgres://x")
    ours = tmp_path / "runs.db"
    open_store(f"sqlite:{ours}")
    open_store(f"sqlite:{ours}")  # its own file opens again


# -- keys and rates -----------------------------------------------------------------------------------------------
def test_api_keys_401_without_or_with_an_unknown_key_and_403_on_another_keys_run(pre):
    client = TestClient(create_app(pre=pre, api_keys=KEYS))
    body = {"state": STATE, "candidates": CANDS}
    for headers in ({}, {"x-api-key": "wrong-key-0123456789"}, {"authorization": "Bearer nope"}):
        r = client.post("/v1/select", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["message"], r.text
    assert client.get("/v1/models").status_code == 401 and client.get("/health").status_code == 200
    alpha, bravo = {"x-api-key": KEYS[0]}, {"authorization": f"Bearer {KEYS[1]}"}
    assert client.post("/v1/select", json=body, headers=alpha).status_code == 200
    run_id = client.post("/v1/runs", json={"budget_nodes": 2}, headers=alpha).json()["run_id"]
    other = client.post(f"/v1/runs/{run_id}/select", json=body, headers=bravo)
    assert other.status_code == 403 and other.json()["error"]["field"] == "run_id"
    assert client.get(f"/v1/runs/{run_id}", headers=bravo).status_code == 403
    assert client.post(f"/v1/runs/{run_id}/select", json=body, headers=alpha).status_code == 200
    spec = client.get("/openapi.json").json()
    assert {"401", "403"} <= set(spec["paths"]["/v1/runs/{run_id}/select"]["post"]["responses"])


def test_keys_come_from_a_file_or_the_environment_and_short_ones_are_refused(tmp_path, monkeypatch):
    import argparse

    from branchgate.inference.server.cli import api_keys

    keys = tmp_path / "keys.txt"
    keys.write_text(f"# ours\n{KEYS[0]}\n\n{KEYS[1]}\n")
    assert api_keys(argparse.Namespace(api_keys=str(keys))) == KEYS
    monkeypatch.setenv("BRANCHGATE_API_KEYS", ",".join(KEYS))
    assert api_keys(argparse.Namespace(api_keys=None)) == KEYS
    monkeypatch.setenv("BRANCHGATE_API_KEYS", "short")
    with pytest.raises(InputError, match="16 characters"):
        api_keys(argparse.Namespace(api_keys=None))
    monkeypatch.delenv("BRANCHGATE_API_KEYS")
    assert api_keys(argparse.Namespace(api_keys=None)) is None


def test_a_key_over_its_rate_limit_is_a_429_with_retry_after_and_other_keys_go_on(pre):
    client = TestClient(create_app(pre=pre, api_keys=KEYS, limits=Limits(rate_limit=3)))
    alpha, bravo = {"x-api-key": KEYS[0]}, {"x-api-key": KEYS[1]}
    codes = [client.get("/v1/models", headers=alpha).status_code for _ in range(4)]
    if codes != [200, 200, 200, 429] and int(time.time()) % 60 == 0:  # the minute turned over in between
        codes = [client.get("/v1/models", headers=alpha).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    limited = client.get("/v1/models", headers=alpha)
    assert limited.status_code == 429 and 1 <= int(limited.headers["retry-after"]) <= 60
    assert client.get("/v1/models", headers=bravo).status_code == 200


# -- real servers -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_server_killed_mid_run_carries_on_after_restart_and_never_overspends(tmp_path):
    """16 clients select on one run of 40 nodes (one kept per decision); the server is SIGKILLed while requests
    are in flight and started again on the same SQLite file; then the run goes on to its end. Every keep answered
    before the kill is still spent after it, and the run's spending never passes its budget."""
    import httpx

    bench = _bench()
    store = f"sqlite:{tmp_path / 'runs.db'}"
    argv = ["--pre", "pretrained:pre-model", "--threads", "1", "--store", store, "--no-access-log"]
    proc, url, _ = bench.start_server(argv)
    budget = 40
    answered: list[dict] = []
    lock = threading.Lock()
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.post("/v1/runs", json={"run_id": "kill-me", "budget_nodes": budget}).status_code == 201
        stop = threading.Event()

        def client(k: int, base: str):
            with httpx.Client(base_url=base, timeout=60) as http:
                for i in range(k, 10_000, 16):
                    if stop.is_set():
                        return
                    try:
                        r = http.post("/v1/runs/kill-me/select", json={**_select(i), "max_keep": 1})
                    except httpx.HTTPError:
                        return  # the server died under this request
                    if r.status_code == 200:
                        with lock:
                            answered.append(r.json())

        pool = [threading.Thread(target=client, args=(k, url)) for k in range(16)]
        for t in pool:
            t.start()
        deadline = time.monotonic() + 120
        while len(answered) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # mid-run: other requests are in flight
        proc.wait(30)
        stop.set()
        for t in pool:
            t.join(60)
        before = sum(len(a["kept"]) for a in answered)
        assert 0 < before < budget  # killed mid-run
        proc, url, _ = bench.start_server(argv)
        with httpx.Client(base_url=url, timeout=60) as http:
            status = http.get("/v1/runs/kill-me").json()
            assert before <= status["spent_nodes"] <= budget  # nothing answered was lost, nothing spent twice
            more = budget - status["spent_nodes"] + 2  # one keep each: the budget's end, then two past it
            after = [http.post("/v1/runs/kill-me/select", json=_select(20_000 + i)).json() for i in range(more)]
            final = http.get("/v1/runs/kill-me").json()
    finally:
        bench.stop_server(proc)
    kept_after = sum(len(a["kept"]) for a in after)
    assert final["spent_nodes"] == status["spent_nodes"] + kept_after == budget
    assert all(a.get("exhausted") for a in after[-2:])
    print(f"restart: {before} kept before the kill, {status['spent_nodes']} spent at restart, budget {budget}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    """A real redis-server on 127.0.0.1 at a free port, no persistence, stopped after the test."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/install does it)")
    pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'branchgate[redis]')")
    import redis

    port = _free_port()
    cmd = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*cmd, "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("redis-server did not start")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_redis_store_is_a_store(pre, redis_url):
    a, b = Runs(pre, open_store(redis_url), max_runs=2), Runs(pre, open_store(redis_url), max_runs=2)
    a.open("r1", 2, None, False)
    with pytest.raises(Exception, match="already open"):
        b.open("r1", 2, None, False)
    out = b.call("r1", lambda run: run.select(STATE, CANDS, tau=0.0).to_json())
    assert len(out["kept"]) == 2 and a.call("r1", lambda run: run.status())["spent_nodes"] == 2
    a.open("r2", 1, None, False)
    with pytest.raises(Exception, match="runs are open"):
        a.open("r3", 1, None, False)
    a.call("r2", lambda run: None, close=True)
    a.open("r3", 1, None, False)
    assert len(a) == 2 and a.store.hit("k", 1) == 1 and b.store.hit("k", 1) == 2


def _children(pid: int) -> list[int]:
    """The worker processes of ``pid`` (multiprocessing's spawned children, not its resource tracker)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            spawned = b"spawn_main" in (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and spawned:
            kids.append(int(stat.parent.name))
    return kids


@pytest.mark.slow
def test_two_workers_on_redis_share_one_run_under_32_clients_never_over_budget(redis_url):
    import httpx

    bench = _bench()
    argv = ["--pre", "pretrained:pre-model", "--threads", "1", "--workers", "2", "--store", redis_url]
    proc, url, _ = bench.start_server([*argv, "--no-access-log"])
    budget, n, clients = 20, 128, 32
    answers, lock = [], threading.Lock()
    try:
        deadline = time.monotonic() + 120
        while len(_children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = _children(proc.pid)
        with httpx.Client(base_url=url, timeout=120) as http:
            for _ in range(600):  # both workers up: their apps answer
                if http.get("/health").status_code == 200:
                    break
                time.sleep(0.2)
            assert http.post("/v1/runs", json={"run_id": "shared", "budget_nodes": budget}).status_code == 201

        def client(k: int):
            with httpx.Client(base_url=url, timeout=300) as http:
                for i in range(k, n, clients):
                    r = http.post("/v1/runs/shared/select", json=_select(i))
                    with lock:
                        answers.append((r.status_code, r.json()))

        pool = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        with httpx.Client(base_url=url, timeout=60) as http:
            status = http.get("/v1/runs/shared").json()
    finally:
        bench.stop_server(proc)
    assert len(workers) == 2, workers
    assert [s for s, _ in answers] == [200] * n, [a for a in answers if a[0] != 200][:3]
    kept = sum(len(a["kept"]) for _, a in answers)
    assert kept == status["spent_nodes"] == budget
    assert sorted(a["budget"]["decision"] for _, a in answers) == list(range(n))  # each applied exactly once
    print(f"two workers: {n} decisions, {kept} kept of {budget}, pids {workers}, os {os.getpid()}")


def test_the_commands_default_store_is_a_sqlite_file_under_the_cache_folder(tmp_path, monkeypatch):
    import uvicorn

    from branchgate.cli import main

    monkeypatch.setenv("BRANCHGATE_CACHE", str(tmp_path / "cache"))
    apps = []

    def served(self, sockets=None):
        apps.append(self.config.app)
        sockets[0].close()

    monkeypatch.setattr(uvicorn.Server, "run", served)
    for _ in range(2):  # a restart: the second server sees the first one's run
        assert main(["serve", "--pre", "pretrained:pre-model", "--threads", "1", "--port", "0"]) == 0
    first, second = (TestClient(app) for app in apps)
    assert first.post("/v1/runs", json={"run_id": "kept", "budget_nodes": 2}).status_code == 201
    assert second.get("/v1/runs/kept").json()["limit"]["nodes"] == 2
    assert (tmp_path / "cache" / "serve" / "runs.db").is_file()
    assert main(["serve", "--pre", "pretrained:pre-model", "--workers", "2", "--store", "memory"]) == 2


def test_every_new_dependency_is_an_extra_and_redis_missing_names_its_extra(monkeypatch):
    """The core install stays numpy, onnxruntime, tokenizers and pydantic: Redis is the ``redis`` extra and Swagger
    UI's files the ``serve`` extra's; the run store module imports only the standard library at load."""
    import ast
    import sys
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = sorted(d.split(">")[0] for d in project["dependencies"])
    assert core == ["numpy", "onnxruntime", "pydantic", "tokenizers"]
    extras = project["optional-dependencies"]
    assert any(d.startswith("redis") for d in extras["redis"])
    assert any(d.startswith("swagger-ui-bundle") for d in extras["serve"])
    tree = ast.parse((REPO / "inference" / "server" / "runs.py").read_text(encoding="utf-8"))
    top = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    top += [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert all(m.split(".")[0] in sys.stdlib_module_names | {"branchgate", "__future__"} for m in top), top
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(Exception, match=r"pip install 'branchgate\[redis\]'"):
        open_store("redis://127.0.0.1:1/0")
