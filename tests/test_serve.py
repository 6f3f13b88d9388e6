"""`branchgate serve` (``inference/server/app.py``): both stages and budgeted runs over HTTP/JSON.

Answers equal ``Gate.select(...).to_json()`` for the same input; every class of bad input is a 4xx JSON error
naming the field, never a traceback; size and list limits; runs (open, select, spend, revisit, close) as an
in-process ``RunGate`` decides them; many concurrent clients on one run of a real server never exceed its budget;
the JavaScript client of the docs runs with node.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install 'branchgate[serve]')")

from export_support import exported, exported_read  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from branchgate.cli import install_hint, main  # noqa: E402
from branchgate.export.samples import sample_decisions, sample_read_decisions  # noqa: E402
from branchgate.inference.gate import Gate  # noqa: E402
from branchgate.inference.server.app import ApiError, Limits, create_app, read_body  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*decision outside the training range")
REPO = Path(__file__).resolve().parents[1]
CLIENT_JS = REPO / "docs" / "use" / "serve-client.mjs"
DECISIONS = sample_decisions()
READS = sample_read_decisions()


@pytest.fixture(scope="module")
def models(encoder) -> dict:
    return {"pre": exported(encoder)["files"]["fp32"], "read": exported_read(encoder)["files"]["fp32"]}


@pytest.fixture(scope="module")
def gates(models) -> dict:
    return {stage: Gate.load(path, threads=1) for stage, path in models.items()}


@pytest.fixture(scope="module")
def client(gates) -> TestClient:
    return TestClient(create_app(**gates))


def _same(got: dict, want: dict) -> None:
    """Two answers alike: the same keys and decisions, scores within 1e-6 (the JSON of float32 values)."""
    assert got.keys() == want.keys()
    for key, value in want.items():
        if key in ("p_keep", "utility"):
            assert [v is None for v in got[key]] == [v is None for v in value]
            np.testing.assert_allclose(
                [v for v in got[key] if v is not None], [v for v in value if v is not None], atol=1e-6
            )
        else:
            assert got[key] == value, key


def _error(response, status: int, field: str | None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert "Traceback" not in response.text and 'File "' not in response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    assert error["message"]
    return error


# -- answers ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("i", range(0, len(DECISIONS), 3))
@pytest.mark.parametrize("options", [{}, {"tau": 0.3, "max_keep": 2}, {"root_tau": 0.9}])
def test_select_answers_what_the_gate_answers(client, models, i, options):
    state, cands = DECISIONS[i]
    got = client.post("/v1/select", json={"state": state, "candidates": cands, **options})
    assert got.status_code == 200, got.text
    want = Gate.load(models["pre"], threads=1).select(state, cands, **options).to_json()
    _same(got.json(), want)


@pytest.mark.parametrize("i", [0, 3])
@pytest.mark.parametrize("options", [{}, {"tau": 0.2, "max_keep": 3}, {"floor": "root", "tau": 1.0}])
def test_read_answers_what_the_read_gate_answers(client, models, i, options):
    state, hits = READS[i]
    state = {**state, "read_ids": [*state["read_ids"], hits[2]["id"]], "depth": 0}
    got = client.post("/v1/read", json={"state": state, "hits": hits, **options})
    assert got.status_code == 200, got.text
    want = Gate.load(models["read"], threads=1).select(state, hits, **options).to_json()
    assert got.json()["not_new"] == [2]
    _same(got.json(), {**want, "stage": "read"})


# -- bad input ----------------------------------------------------------------------------------------------------
STATE = {"root_query": "Why are honeybee colonies collapsing?", "frame_query": "", "depth": 0}
CANDS = [{"query": "neonicotinoid field studies", "goal": "pesticides"}, "honey prices"]
READ_STATE = {"root_query": "bees", "query": "varroa mites", "read": [], "depth": 1}
JSON = {"content-type": "application/json"}
HITS = [{"title": "Varroa review", "snippet": "mites spread viruses", "id": "u1"}]


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/select", {"candidates": CANDS}, "state"),
        ("/v1/select", {"state": STATE}, "candidates"),
        ("/v1/select", {"state": {**STATE, "depth": -1}, "candidates": CANDS}, "state.depth"),
        ("/v1/select", {"state": {**STATE, "colour": "red"}, "candidates": CANDS}, "state.colour"),
        ("/v1/select", {"state": {"frame_query": "x"}, "candidates": CANDS}, "state.root_query"),
        ("/v1/select", {"state": STATE, "candidates": "a; b"}, "candidates"),
        ("/v1/select", {"state": STATE, "candidates": [{"goal": "no query"}]}, "candidates[0].query"),
        ("/v1/select", {"state": STATE, "candidates": [3]}, "candidates[0]"),
        ("/v1/select", {"state": STATE, "candidates": CANDS, "tau": 2}, "tau"),
        ("/v1/select", {"state": STATE, "candidates": CANDS, "tau": "0.5"}, "tau"),
        ("/v1/select", {"state": STATE, "candidates": CANDS, "max_keep": 0}, "max_keep"),
        ("/v1/select", {"state": STATE, "hits": HITS}, "hits"),
        ("/v1/select", {"state": STATE, "candidates": HITS}, "candidates[0]"),
        ("/v1/select", {"state": STATE, "candidates": CANDS, "run_id": "r1"}, "run_id"),
        ("/v1/select", {"state": STATE, "candidates": CANDS, "candidate": []}, "candidate"),
        ("/v1/read", {"state": READ_STATE, "candidates": CANDS}, "candidates"),
        ("/v1/read", {"state": STATE, "hits": HITS}, "state.frame_query"),
        ("/v1/read", {"state": READ_STATE, "hits": [{"url": "u"}]}, "hits[0].title"),
        ("/v1/read", {"state": READ_STATE, "hits": HITS, "floor": "top"}, "floor"),
        ("/v1/read", {"state": {**READ_STATE, "read_ids": "u1"}, "hits": HITS}, "state.read_ids"),
        ("/v1/runs", {"budget_nodes": -1}, "budget_nodes"),
        ("/v1/runs", {"defer": "yes"}, "defer"),
        ("/v1/runs", {"run_id": "a/b"}, "run_id"),
        ("/v1/runs", {"run_id": 7}, "run_id"),
        ("/v1/runs", {"budget": 3}, "budget"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(client, path, body, field):
    error = _error(client.post(path, json=body), 422, field)
    assert not error["message"].startswith("body:")


def test_the_server_validates_with_its_models_and_imports_no_cli_module():
    """Issue 64: one pydantic model per body validates it; the field comes from the model's error location; no
    module of the server imports a CLI module (``gate_cli``, ``cli``)."""
    import ast

    from branchgate.inference.server import schema

    for path in (REPO / "inference" / "server").glob("*.py"):
        if path.name == "cli.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.endswith(("gate_cli", ".cli", "build_cli"))], path.name
    with pytest.raises(Exception) as refused:
        schema.SelectRequest.model_validate({"state": {**STATE, "depth": 1.5}, "candidates": CANDS})
    assert refused.value.errors()[0]["loc"] == ("state", "depth")


@pytest.mark.parametrize(
    "content, headers, status",
    [
        (b'{"state": {', {"content-type": "application/json"}, 400),
        (b"[" * 200 + b"]" * 200, {"content-type": "application/json"}, 400),
        (b"", {"content-type": "application/json"}, 400),
        (b'{"state": {}}', {"content-type": "text/plain"}, 415),
        (b'{"state": {}}', {}, 415),
        (b"state=x", {"content-type": "application/x-www-form-urlencoded"}, 415),
    ],
)
def test_malformed_json_empty_bodies_and_other_content_types(client, content, headers, status):
    _error(client.post("/v1/select", content=content, headers=headers), status, None)


def test_a_body_that_is_not_an_object_is_a_422(client):
    _error(client.post("/v1/select", json=[STATE, CANDS]), 422, None)


def test_bodies_over_the_size_limit_are_413_before_being_read_whole(gates):
    limited = TestClient(create_app(**gates, limits=Limits(max_body_bytes=2000)))
    big = {"state": STATE, "candidates": ["x" * 100] * 30}
    _error(limited.post("/v1/select", json=big), 413, None)
    assert limited.post("/v1/select", json={"state": STATE, "candidates": CANDS}).status_code == 200
    _error(limited.post("/v1/select", content=iter([b" " * 100] * 30), headers=JSON), 413, None)  # no Content-Length
    _error(limited.post("/v1/select", content=b"{}", headers={**JSON, "content-length": "9999"}), 413, None)


def test_a_streamed_body_is_refused_as_it_passes_the_limit_not_read_whole():
    """No Content-Length: ``read_body`` counts the chunks as they arrive and stops at the limit."""
    import anyio
    from starlette.requests import Request

    served = []

    async def receive():
        served.append(1)
        return {"type": "http.request", "body": b" " * 100, "more_body": len(served) < 1000}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/select",
        "headers": [(b"content-type", b"application/json")],
    }
    with pytest.raises(ApiError) as refused:
        anyio.run(read_body, Request(scope, receive), Limits(max_body_bytes=2000))
    assert refused.value.status == 413 and len(served) == 21  # 2100 bytes read of 100,000


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/select", {"state": STATE, "candidates": ["q"] * 5}, "candidates"),
        ("/v1/select", {"state": {**STATE, "retained": ["r"] * 5}, "candidates": CANDS}, "state.retained"),
        ("/v1/read", {"state": READ_STATE, "hits": HITS * 5}, "hits"),
        ("/v1/read", {"state": {**READ_STATE, "read_ids": ["a"] * 5}, "hits": HITS}, "state.read_ids"),
    ],
)
def test_lists_over_the_item_limit_are_413_naming_them(gates, path, body, field):
    limited = TestClient(create_app(**gates, limits=Limits(max_items=4)))
    assert "at most 4" in _error(limited.post(path, json=body), 413, field)["message"]


def test_a_stage_without_a_controller_is_a_404_naming_the_stage(gates):
    pre_only, read_only = TestClient(create_app(pre=gates["pre"])), TestClient(create_app(read=gates["read"]))
    assert (
        "--read" in _error(pre_only.post("/v1/read", json={"state": READ_STATE, "hits": HITS}), 404, "stage")["message"]
    )
    _error(read_only.post("/v1/select", json={"state": STATE, "candidates": CANDS}), 404, "stage")
    _error(read_only.post("/v1/runs", json={}), 404, "stage")
    assert pre_only.get("/health").json()["stages"] == ["pre"]
    with pytest.raises(Exception, match="--pre"):
        create_app(pre=gates["read"])


def test_an_unexpected_failure_is_a_500_without_details(gates, monkeypatch, caplog):
    app_client = TestClient(create_app(pre=gates["pre"]))

    def broken(*args, **kwargs):
        raise RuntimeError("secret detail of the server")

    monkeypatch.setattr(gates["pre"], "select", broken)
    with caplog.at_level("ERROR", logger="branchgate.serve"):
        response = app_client.post("/v1/select", json={"state": STATE, "candidates": CANDS})
    assert response.status_code == 500 and response.json() == {"error": {"field": None, "message": "internal error"}}
    assert "secret" not in response.text and "secret detail" in caplog.text  # logged on the server's side


def test_unknown_paths_and_methods_answer_json(client):
    assert client.get("/v1/nothing").status_code == 404 and "error" in client.get("/v1/nothing").json()
    assert client.get("/v1/select").status_code == 405 and "error" in client.get("/v1/select").json()


# -- health, models, schema ---------------------------------------------------------------------------------------
def test_health_models_and_openapi(client, models, gates):
    assert client.get("/health").json() == {"status": "ok", "stages": ["pre", "read"], "open_runs": 0}
    listed = client.get("/v1/models").json()
    assert [m["stage"] for m in listed["models"]] == ["pre", "read"]
    for m in listed["models"]:
        path = models[m["stage"]]
        assert m["sha256"] == hashlib.sha256(Path(path).read_bytes()).hexdigest()
        assert m["encoder"] == gates[m["stage"]].encoder and m["tau"] == gates[m["stage"]].tau
        assert m["precision"] == "fp32" and m["branchgate_version"] and m["file"] == Path(path).name
    spec = client.get("/openapi.json").json()
    paths = {"/health", "/v1/models", "/v1/select", "/v1/read", "/v1/runs", "/v1/runs/{run_id}"}
    paths |= {f"/v1/runs/{{run_id}}/{verb}" for verb in ("select", "spend", "revisit", "close")}
    assert paths <= set(spec["paths"])
    ref = spec["paths"]["/v1/select"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert body["required"] == ["state", "candidates"]
    assert "422" in spec["paths"]["/v1/select"]["post"]["responses"]
    for path, ops in spec["paths"].items():  # every endpoint answers with a schema (issue 64)
        for method, op in ops.items():
            ok = next(v for k, v in op["responses"].items() if k.startswith("2"))
            assert "$ref" in ok["content"]["application/json"]["schema"], (method, path)
    selection = spec["components"]["schemas"]["Selection"]
    assert {"kept", "p_keep", "utility", "fallback"} <= set(selection["properties"])
    assert all(m["feature_names"] is None or isinstance(m["feature_names"], list) for m in listed["models"])
    page = client.get("/docs")  # Swagger UI's files come from the installed swagger-ui-bundle, not a CDN
    assert page.status_code == 200 and "/docs-assets/swagger-ui-bundle.js" in page.text and "cdn" not in page.text
    assert client.get("/docs-assets/swagger-ui-bundle.js").status_code == 200


# -- budgeted runs ------------------------------------------------------------------------------------------------
def test_a_budgeted_run_decides_as_an_in_process_run(client, models):
    """open, select ×3 (with costs and spend), spend, revisit, status, close: each answer is what a ``RunGate``
    given the same calls answers."""
    opened = client.post("/v1/runs", json={"run_id": "run-1", "budget_nodes": 4, "budget_tokens": 5000, "defer": True})
    assert opened.status_code == 201, opened.text
    assert opened.json()["limit"] == {"nodes": 4, "tokens": 5000} and opened.json()["spent_nodes"] == 0
    local = Gate.load(models["pre"], threads=1).run(budget_nodes=4, budget_tokens=5000, defer=True, run_id="run-1")
    for i, extra in ((0, {}), (1, {"costs": [700] * len(DECISIONS[1][1]), "spend": 900}), (2, {"spend": [800]})):
        state, cands = DECISIONS[i]
        got = client.post("/v1/runs/run-1/select", json={"state": state, "candidates": cands, **extra})
        assert got.status_code == 200, got.text
        for tokens in [extra["spend"]] if isinstance(extra.get("spend"), int) else extra.get("spend", []):
            local.spend(tokens)
        want = local.select(state, cands, costs=extra.get("costs")).to_json()
        _same(got.json(), {**want, "run_id": "run-1"})
    spent = client.post("/v1/runs/run-1/spend", json={"spend": [600, 650]})
    local.spend(600), local.spend(650)
    assert spent.status_code == 200 and spent.json()["spent_tokens"] == local.budget.spent_tokens
    revisit = client.post("/v1/runs/run-1/revisit", json={"state": DECISIONS[3][0]})
    want = local.revisit(DECISIONS[3][0])
    assert revisit.status_code == 200 and revisit.json()["kept"] == want.kept
    assert revisit.json()["revisited"] == [r.to_json() for r in want.revisited]
    status = client.get("/v1/runs/run-1").json()
    assert status["spent_nodes"] == local.budget.spent_nodes and status["decisions"] == local.decisions
    assert status["deferred"] == [d.to_json() for d in local.deferred]
    closed = client.post("/v1/runs/run-1/close")
    assert closed.status_code == 200 and closed.json()["never_expanded"] == [d.to_json() for d in local.drop_deferred()]
    _error(client.get("/v1/runs/run-1"), 404, "run_id")
    assert client.post("/v1/runs", json={"run_id": "run-1", "budget_nodes": 1}).status_code == 201  # opened anew
    assert client.post("/v1/runs/run-1/close", json={}).status_code == 200


def test_run_errors_name_their_field(client):
    _error(client.post("/v1/runs/none-such/select", json={"state": STATE, "candidates": CANDS}), 404, "run_id")
    _error(client.get("/v1/runs/none-such"), 404, "run_id")
    _error(client.post("/v1/runs/none-such/close"), 404, "run_id")
    made = client.post("/v1/runs", json={"budget_nodes": 2})
    run_id = made.json()["run_id"]
    assert made.status_code == 201 and len(run_id) == 32  # made for the caller
    _error(client.post("/v1/runs", json={"run_id": run_id}), 409, "run_id")
    url = f"/v1/runs/{run_id}"
    _error(client.post(f"{url}/select", json={"state": STATE, "candidates": CANDS, "costs": [1]}), 422, "costs")
    _error(client.post(f"{url}/select", json={"state": STATE, "candidates": CANDS, "root_tau": 0.5}), 422, "root_tau")
    _error(
        client.post(f"{url}/select", json={"state": STATE, "candidates": CANDS, "budget_nodes": 9}), 422, "budget_nodes"
    )
    _error(client.post(f"{url}/spend", json={"spend": -3}), 422, "spend[0]")
    _error(client.post(f"{url}/spend", json={}), 422, "spend")
    _error(client.post(f"{url}/revisit", json={"state": STATE, "candidates": CANDS}), 422, "candidates")
    assert client.post(f"{url}/close").status_code == 200


def test_open_runs_are_capped(gates):
    capped = TestClient(create_app(pre=gates["pre"], limits=Limits(max_runs=2)))
    assert [capped.post("/v1/runs", json={}).status_code for _ in range(2)] == [201, 201]
    _error(capped.post("/v1/runs", json={}), 429, None)
    idle = TestClient(create_app(pre=gates["pre"], limits=Limits(max_runs=1, run_ttl=1e-6)))
    first = idle.post("/v1/runs", json={}).json()["run_id"]
    assert idle.post("/v1/runs", json={}).status_code == 201  # the idle run made room
    _error(idle.get(f"/v1/runs/{first}"), 404, "run_id")


# -- the command --------------------------------------------------------------------------------------------------
def test_serve_command_builds_the_app_on_loopback_and_checks_stages(models, monkeypatch, capsys, caplog):
    import uvicorn

    calls = []

    def served(self, sockets=None):
        calls.append((self.config, sockets[0].getsockname()))
        sockets[0].close()

    monkeypatch.setattr(uvicorn.Server, "run", served)
    assert main(["serve", "--pre", models["pre"], "--read", models["read"], "--threads", "1", "--port", "0"]) == 0
    config, address = calls[0]
    assert address[0] == "127.0.0.1" and address[1] > 0 and config.port == address[1]
    assert TestClient(config.app).get("/health").json()["stages"] == ["pre", "read"]
    assert main(["serve", "--pre", models["pre"], "--threads", "1", "--port", "0"]) == 0  # the old name, one release
    assert TestClient(calls[1][0].app).get("/health").json()["stages"] == ["pre"]
    with caplog.at_level("WARNING", logger="branchgate.serve"):
        assert main(["serve", "--read", models["read"], "--host", "0.0.0.0", "--threads", "1", "--port", "0"]) == 0
    assert "without API keys" in caplog.text and calls[2][1][0] == "0.0.0.0"
    assert main(["serve", "--pre", models["read"]]) == 2
    assert "--pre" in capsys.readouterr().err
    assert main(["serve"]) == 2 and main(["serve", "--pre", models["pre"], "--max-items", "0"]) == 2
    assert install_hint("fastapi") == "pip install 'branchgate[serve]'" and install_hint("torch").endswith("[train]'")


# -- a real server ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(models):
    """A real server (``branchgate serve`` in a subprocess, started by the benchmark's ``start_server``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "benchmarks" / "bench_serve.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    proc, url, _ = bench.start_server(["--pre", models["pre"], "--read", models["read"], "--no-access-log"])
    yield url
    bench.stop_server(proc)


@pytest.mark.slow
def test_many_clients_on_one_run_never_exceed_its_budget(live):
    """64 selects from 16 threads on one run of budget_nodes=10 (each could keep several): 10 kept in all,
    every decision applied once (ids 0..63), and the run's spent nodes are the kept ones."""
    import httpx

    budget, n, threads = 10, 64, 16
    with httpx.Client(base_url=live, timeout=120) as http:
        run_id = http.post("/v1/runs", json={"budget_nodes": budget}).json()["run_id"]
    answers, lock = [], threading.Lock()

    def worker(k: int):
        with httpx.Client(base_url=live, timeout=120) as http:
            for i in range(k, n, threads):
                state, cands = DECISIONS[i % len(DECISIONS)]
                body = {"state": state, "candidates": cands, "tau": 0.0}  # every candidate passes τ
                r = http.post(f"/v1/runs/{run_id}/select", json=body)
                with lock:
                    answers.append((r.status_code, r.json()))

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert [s for s, _ in answers] == [200] * n
    kept = sum(len(a["kept"]) for _, a in answers)
    assert kept == budget and sorted(a["budget"]["decision"] for _, a in answers) == list(range(n))
    assert sum(bool(a.get("exhausted")) for _, a in answers) >= n - budget
    with httpx.Client(base_url=live, timeout=120) as http:
        status = http.get(f"/v1/runs/{run_id}").json()
    assert status["spent_nodes"] == kept == budget and status["remaining"]["nodes"] == 0


@pytest.mark.slow
def test_the_javascript_client_in_the_docs_runs_with_node(live, models):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH (the docs' JavaScript client needs Node ≥ 18)")
    run = subprocess.run(
        [node, str(CLIENT_JS)], capture_output=True, text=True, timeout=120, env={**os.environ, "BRANCHGATE_URL": live}
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    decision = json.loads(CLIENT_JS.read_text().split("const decision = ", 1)[1].split(";\n", 1)[0])
    search = json.loads(CLIENT_JS.read_text().split("const search = ", 1)[1].split(";\n", 1)[0])
    sel = Gate.load(models["pre"], threads=1).select(decision["state"], decision["candidates"])
    read = Gate.load(models["read"], threads=1).select(search["state"], search["hits"])
    assert [x for x in lines if x.startswith("search: ")] == [
        f"search: {decision['candidates'][i]['query']}" for i in sel.kept
    ]
    assert [x for x in lines if x.startswith("read: ")] == [f"read: {search['hits'][i]['title']}" for i in read.kept]


def test_the_docs_show_the_javascript_client_verbatim():
    page = (REPO / "docs" / "use" / "serve.md").read_text(encoding="utf-8")
    assert "```js\n" + CLIENT_JS.read_text(encoding="utf-8") + "```" in page


def test_the_pretrained_defaults_serve_and_refuse_budgets_with_a_pointer():
    """``--pre pretrained:pre --read pretrained:read`` (teacher defaults): both stages answer as in-process; a
    budgeted run is a 422 naming the learned controller to use instead."""
    pre, read = Gate.load("pretrained:pre", threads=1), Gate.load("pretrained:read", threads=1)
    c = TestClient(create_app(pre=pre, read=read))
    models = {m["stage"]: m for m in c.get("/v1/models").json()["models"]}
    assert models["pre"]["teacher"] == "dpp" and models["read"]["dim"] == read.dim
    state, cands = DECISIONS[0]
    _same(c.post("/v1/select", json={"state": state, "candidates": cands}).json(), pre.select(state, cands).to_json())
    state, hits = READS[0]
    got = c.post("/v1/read", json={"state": state, "hits": hits}).json()
    assert got["kept"] == read.select(state, hits).kept
    assert "pretrained:pre-model" in _error(c.post("/v1/runs", json={"budget_tokens": 1000}), 422, None)["message"]
