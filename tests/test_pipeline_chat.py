"""The OpenAI-compatible chat generator against a local stub server (127.0.0.1, stdlib only)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from branchgate.errors import BranchgateError
from branchgate.logs_to_dataset.traces import read_events
from branchgate.pipeline.config import Config
from branchgate.pipeline.generate import parse_candidates
from branchgate.pipeline.simulate import simulate


class Stub(BaseHTTPRequestHandler):
    requests: list = []
    answer = "fine"

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Stub.requests.append((self.path, body))
        if Stub.answer == "fine":
            k = 6 if "go deeper" not in body["messages"][0]["content"] else 3
            items = [{"query": f"stub query {len(Stub.requests)}.{i}", "research_goal": f"goal {i}"} for i in range(k)]
            content = "Here you go:\n```json\n" + json.dumps(items) + "\n```"
        else:
            content = "I cannot help with that."
        data = json.dumps(
            {
                "choices": [{"message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = HTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    Stub.requests, Stub.answer = [], "fine"
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_chat_generator_drives_the_tree(server, tmp_path):
    cfg = Config(depth=2, generator="chat")
    simulate("sample", cfg, tmp_path, runs=1, progress=False, gen_kw={"base_url": server, "model": "stub-model"})
    path = next((tmp_path / "traces").glob("*.jsonl"))
    evs = list(read_events(path, strict=True))
    queries = [e.query for e in evs if e.type == "candidate"]
    assert queries[:6] == [f"stub query 1.{i}" for i in range(6)]
    assert all(q.startswith("stub query") for q in queries)
    assert Stub.requests[0][0] == "/v1/chat/completions" and Stub.requests[0][1]["model"] == "stub-model"
    assert len(Stub.requests) == 1 + sum(1 for e in evs if e.type == "frame_open" and e.depth == 1)
    calls = [e for e in evs if e.type == "llm_call" and e.purpose in ("plan", "followups")]
    assert calls and all(e.model == "chat" and e.reported_usage["prompt_tokens"] == 100 for e in calls)


def test_chat_generator_errors_are_clear(server, tmp_path):
    Stub.answer = "refuse"
    with pytest.raises(BranchgateError, match="no JSON list"):
        simulate(
            "sample",
            Config(depth=1, generator="chat"),
            tmp_path / "a",
            runs=1,
            progress=False,
            gen_kw={"base_url": server, "model": "m"},
        )
    with pytest.raises(BranchgateError, match="cannot reach"):
        simulate(
            "sample",
            Config(depth=1, generator="chat"),
            tmp_path / "b",
            runs=1,
            progress=False,
            gen_kw={"base_url": "http://127.0.0.1:9/v1", "model": "m"},
        )
    with pytest.raises(BranchgateError, match="--llm-url"):
        simulate("sample", Config(depth=1, generator="chat"), tmp_path / "c", runs=1, progress=False)


def test_parse_candidates_variants():
    got = parse_candidates('```json\n[{"query": "a b", "goal": "g"}, "c d", {"query": "A B"}, 3]\n```')
    assert [(c.query, c.goal) for c in got] == [("a b", "g"), ("c d", "")]
    with pytest.raises(BranchgateError):
        parse_candidates("[]")
