"""Issue 62 (items 5 and 6, and two minor ones) for ``branchgate serve``: the work of a request is bounded (tokens
counted with the controller's tokenizer, encoder slots), huge numbers are a 422 naming the field and leave the run
usable and closable (the CLI's ``gate --state`` too), a busy port is exit 2, and a read request with both ``hits``
and ``items`` is refused. The load test sends requests at the limits to a real server and bounds its memory.
"""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install 'branchgate[serve]')")

from fastapi.testclient import TestClient  # noqa: E402

from branchgate.cli import main  # noqa: E402
from branchgate.errors import InputError  # noqa: E402
from branchgate.inference.gate import Gate  # noqa: E402
from branchgate.inference.server.app import Limits, create_app  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*decision outside the training range")
REPO = Path(__file__).resolve().parents[1]
STATE = {"root_query": "Why are honeybee colonies collapsing?", "frame_query": "", "depth": 0}
READ_STATE = {"root_query": "bees", "query": "varroa mites", "read": [], "depth": 1}
HITS = [{"title": "Varroa review", "snippet": "mites spread viruses", "id": "u1"}]
HUGE = "1" + "0" * 400  # 10**400 as a JSON integer


def huge(body: dict) -> str:
    """``body`` as JSON with every ``"HUGE"`` string replaced by 10**400 (a JSON integer Python's json can hold)."""
    return json.dumps(body).replace('"HUGE"', HUGE)


JSON = {"content-type": "application/json"}


def long_text(i: int, words: int = 800) -> str:
    return " ".join(f"colony{i} loss{j % 97} varroa{j % 13}" for j in range(words // 3))


@pytest.fixture(scope="module")
def gates() -> dict:
    return {"pre": Gate.load("pretrained:pre-model", threads=1), "read": Gate.load("pretrained:read-model", threads=1)}


@pytest.fixture(scope="module")
def client(gates) -> TestClient:
    return TestClient(create_app(**gates, limits=Limits(max_request_tokens=2000)))


def _error(response, status: int, field: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    return error


# -- the work of one request --------------------------------------------------------------------------------------
def test_a_request_over_the_token_limit_is_a_413_naming_its_list(client):
    """Each text counts up to max_length (256) tokens: 8 long candidates are ~2,000+ tokens, 4 are under 2,000."""
    over = {"state": STATE, "candidates": [long_text(i) for i in range(8)]}
    error = _error(client.post("/v1/select", json=over), 413, "candidates")
    assert "at most 2000" in error["message"] and "--max-request-tokens" in error["message"]
    under = {"state": STATE, "candidates": [long_text(i) for i in range(4)]}
    assert client.post("/v1/select", json=under).status_code == 200
    hits = [{"title": f"t{i}", "snippet": long_text(i)} for i in range(8)]
    _error(client.post("/v1/read", json={"state": READ_STATE, "hits": hits}), 413, "hits")
    run_id = client.post("/v1/runs", json={"budget_nodes": 3}).json()["run_id"]
    _error(client.post(f"/v1/runs/{run_id}/select", json=over), 413, "candidates")
    assert client.get(f"/v1/runs/{run_id}").json()["decisions"] == 0  # refused before the run saw it


def test_encoder_slots_bound_concurrent_encodes_and_answer_429_when_busy(gates, monkeypatch):
    """One slot: while a request holds it, another waits ``encode_wait`` and is answered 429 with Retry-After."""
    app = create_app(pre=gates["pre"], limits=Limits(max_encodes=1, encode_wait=0.2))
    inside, release, active, most = threading.Event(), threading.Event(), [0], [0]
    real = gates["pre"].select

    def slow(*args, **kw):
        active[0] += 1
        most[0] = max(most[0], active[0])
        inside.set()
        release.wait(10)
        active[0] -= 1
        return real(*args, **kw)

    monkeypatch.setattr(gates["pre"], "select", slow)
    body = {"state": STATE, "candidates": ["varroa mites", "honey prices"]}
    first: list = []
    holder = threading.Thread(target=lambda: first.append(TestClient(app).post("/v1/select", json=body)))
    holder.start()
    assert inside.wait(30)
    busy = TestClient(app).post("/v1/select", json=body)
    release.set()
    holder.join(30)
    _error(busy, 429, None)
    assert busy.headers["retry-after"] and first[0].status_code == 200 and most[0] == 1


def test_a_read_request_with_both_hits_and_items_is_refused(client):
    error = _error(client.post("/v1/read", json={"state": READ_STATE, "hits": HITS, "items": HITS}), 422, "items")
    assert "not both" in error["message"]
    assert client.post("/v1/read", json={"state": READ_STATE, "items": HITS}).status_code == 200


# -- huge numbers -------------------------------------------------------------------------------------------------
def test_huge_numbers_are_a_422_and_the_run_stays_usable_and_closable(client):
    run_id = client.post("/v1/runs", json={"budget_nodes": 3, "budget_tokens": 10_000}).json()["run_id"]
    url = f"/v1/runs/{run_id}"
    cands = ["varroa mites", "honey prices", "pesticide studies"]
    for path, raw, field in (
        ("/spend", huge({"spend": "HUGE"}), "spend[0]"),
        ("/spend", huge({"spend": [5, "HUGE"]}), "spend[1]"),
        ("/spend", '{"spend": 1e400}', "spend[0]"),
        ("/select", huge({"state": STATE, "candidates": cands, "costs": ["HUGE", 1, 1]}), "costs[0]"),
        ("/select", huge({"state": STATE, "candidates": cands, "spend": "HUGE"}), "spend[0]"),
    ):
        _error(client.post(url + path, content=raw, headers=JSON), 422, field)
    _error(client.post("/v1/runs", content=huge({"budget_tokens": "HUGE"}), headers=JSON), 422, "budget_tokens")
    status = client.get(url).json()
    assert status["spent_tokens"] == 0 and status["decisions"] == 0  # nothing of the refused calls was applied
    assert (
        client.post(url + "/select", json={"state": STATE, "candidates": cands, "costs": [100] * 3}).status_code == 200
    )
    assert client.post(url + "/spend", json={"spend": 120}).status_code == 200
    assert client.post(url + "/revisit", json={"state": STATE}).status_code == 200
    closed = client.post(url + "/close")
    assert closed.status_code == 200 and closed.json()["spent_tokens"] == 120


def test_huge_numbers_in_a_run_gate_and_the_clis_state_file(tmp_path, monkeypatch, capsys):
    gate = Gate.load("pretrained:pre-model", threads=1)
    run = gate.run(budget_tokens=5000)
    for call in (lambda: run.spend(10**400), lambda: run.select(STATE, ["a", "b"], costs=[10**400, 1])):
        with pytest.raises(InputError):
            call()
    assert run.select(STATE, ["a", "b"], costs=[10, 10]).kept and run.budget.spent_tokens == 0
    with pytest.raises(InputError, match="budget_tokens"):
        gate.run(budget_tokens=10**400)
    state = tmp_path / "runs.json"
    first = {"state": STATE, "candidates": ["a", "b"], "run_id": "r1", "budget_tokens": 5000}

    def gate_cli(decision: str) -> int:
        monkeypatch.setattr(sys, "stdin", io.StringIO(decision))
        return main(["gate", "--pre", "pretrained:pre-model", "--state", str(state)])

    assert gate_cli(json.dumps(first)) == 0
    saved = state.read_bytes()
    capsys.readouterr()
    bad = huge({"state": STATE, "candidates": ["c"], "run_id": "r1", "spend": "HUGE"})
    assert gate_cli(bad) == 2
    err = capsys.readouterr().err
    assert "spend" in err and "Traceback" not in err and state.read_bytes() == saved  # the run is as it was
    assert gate_cli(json.dumps({"state": STATE, "candidates": ["c"], "run_id": "r1", "end_run": True})) == 0


# -- the command --------------------------------------------------------------------------------------------------
def test_a_busy_port_is_a_usage_error_naming_the_port(capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        assert main(["serve", "--pre", "pretrained:pre", "--threads", "1", "--port", str(port)]) == 2
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert "--port" in err and str(port) in err and "Traceback" not in err


# -- a real server at its limits ----------------------------------------------------------------------------------
MEMORY_BOUND_MB = 1500  # the server's peak RSS (VmHWM) under the load below, stated in docs/use/serve.md


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no /proc/PID/status VmHWM on this system")


@pytest.mark.slow
def test_requests_at_the_limits_keep_a_real_server_under_its_memory_bound_with_no_5xx():
    """48 requests from 8 concurrent clients on 127.0.0.1: 1 MB bodies of 250 candidates of ~800 words (what took
    3.1 GB, and 5.1 GB three at once, before), read requests of 250 long hits, and requests just under the token
    limit. Every answer is 200, 413 or 429; the server's peak RSS stays under ``MEMORY_BOUND_MB``."""
    import httpx

    bench = _bench()
    proc, url, lines = bench.start_server(
        ["--pre", "pretrained:pre-model", "--read", "pretrained:read-model", "--threads", "1", "--no-access-log"]
    )
    try:
        bodies = []
        for i in range(48):
            kind = i % 3
            if kind == 0:  # the request: ~1 MB, 250 candidates of ~800 words
                bodies.append(
                    ("/v1/select", {"state": STATE, "candidates": [long_text(i * 1000 + j) for j in range(250)]})
                )
            elif kind == 1:
                hits = [{"title": f"t{j}", "snippet": long_text(i * 1000 + j), "id": f"u{j}"} for j in range(250)]
                bodies.append(("/v1/read", {"state": READ_STATE, "hits": hits}))
            else:  # just under the limit: 30 texts of 256 tokens (7,680) and the state's
                bodies.append(
                    ("/v1/select", {"state": STATE, "candidates": [long_text(i * 1000 + j) for j in range(30)]})
                )
        statuses: list[int] = []
        lock = threading.Lock()
        deadline = time.monotonic() + 600

        def client(k: int):
            with httpx.Client(base_url=url, timeout=300) as http:
                for path, body in bodies[k::8]:
                    if time.monotonic() > deadline:
                        return
                    r = http.post(path, json=body)
                    with lock:
                        statuses.append(r.status_code)

        pool = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        peak = _peak_rss_mb(proc.pid)
    finally:
        bench.stop_server(proc)
    assert len(statuses) == 48 and not [s for s in statuses if s >= 500], statuses
    assert set(statuses) <= {200, 413, 429} and statuses.count(200) >= 10 and statuses.count(413) >= 30
    assert peak < MEMORY_BOUND_MB, f"peak RSS {peak:.0f} MB"
    print(f"peak RSS {peak:.0f} MB; answers {sorted(set(statuses))}")


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "benchmarks" / "bench_serve.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_a_revisit_counts_the_runs_deferred_candidates_against_the_token_limit(gates):
    """A revisit re-scores every deferred candidate: when they are over the limit, a 413 naming them, and the
    run is as it was (its deferred candidates wait; close still lists them)."""
    from branchgate.inference.budget import Deferred
    from branchgate.inference.server.runs import MemoryStore, Runs

    store = MemoryStore()
    client = TestClient(create_app(pre=gates["pre"], store=store, limits=Limits(max_request_tokens=1200)))
    run_id = client.post("/v1/runs", json={"budget_nodes": 5, "defer": True}).json()["run_id"]
    waiting = [Deferred(long_text(i), long_text(i), 0, i, 0.4, 0.5) for i in range(8)]  # 8 × 256 tokens
    Runs(gates["pre"], store).call(run_id, lambda run: run.deferred.extend(waiting))
    url = f"/v1/runs/{run_id}"
    _error(client.post(url + "/revisit", json={"state": STATE}), 413, "deferred")
    status = client.get(url).json()
    assert len(status["deferred"]) == 8 and status["decisions"] == 0
    assert len(client.post(url + "/close").json()["never_expanded"]) == 8
