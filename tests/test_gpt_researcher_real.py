"""The GPT-Researcher drop-in on the real ``gpt_researcher`` package, standard and deep mode, fully offline.

Everything GPT-Researcher does runs as shipped: its LLM calls go over HTTP (``ChatOpenAI``) to a stub
OpenAI-compatible server on 127.0.0.1, which also serves its embeddings (``EMBEDDING=custom:...``, computed
with branchgate's own encoder) and its web search (``RETRIEVER=custom``: BM25 over the bundled sample
environment, pages at ``http://127.0.0.1:PORT/doc/<passage id>``). One call is replaced: its cost estimate
(``estimate_llm_cost`` / ``estimate_embedding_cost``) counts tokens with tiktoken, which downloads its BPE
file from the internet on first use; here it counts words.

The run log ``outputs/task_*.json`` is written by GPT-Researcher's own server handler
(``backend.server.server_utils.CustomLogsHandler``, passed as the researcher's websocket, as its server
does); its wheel ships ``backend`` without the repository's top-level ``utils`` package that module imports,
so a stand-in module of that name is put in ``sys.modules`` first (the three report writers it names are
unused here).

Skipped where gpt-researcher is not installed: ``.ci/run`` installs it (``.ci/integrations/gptr.txt``) in a
separate virtualenv, since it pins numpy < 2.3 and moves other packages, and runs this file there.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from export_support import exported, exported_read, read_controller_from, runs_in_every_split

from branchgate.inference.agents.gpt_researcher import gate_research
from branchgate.inference.gate import Gate
from branchgate.logs_to_dataset.build import build
from branchgate.logs_to_dataset.traces import read_events

gptr = pytest.importorskip("gpt_researcher", reason="gpt-researcher is not installed (.ci/run installs it in a venv)")

FILLERS = ["history of {t}", "{t} overview", "{t} definition", "famous trivia about {t}", "{t} in popular culture"]


class Stub:
    """LLM, embeddings and search for GPT-Researcher on 127.0.0.1 (see the module docstring)."""

    def __init__(self, env, encoder):
        self.env, self.encoder = env, encoder
        self.prompts: list[str] = []
        self.unknown: list[str] = []
        self.searches: list[str] = []
        self.fetched: list[str] = []  # page URLs fetched (scraped) from /doc/
        self.snippets = False  # search results as a web search engine gives them: title and a short snippet
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 30

            def do_GET(self):
                url = urlparse(self.path)
                if url.path == "/search":
                    query = parse_qs(url.query).get("query", [""])[0]
                    stub.searches.append(query)
                    self._json(stub.search(query))
                elif url.path.startswith("/doc/"):
                    stub.fetched.append(f"{stub.url}{url.path}")
                    i = stub.env.index_of.get(url.path[len("/doc/") :])
                    if i is None:
                        self.send_error(404)
                        return
                    self._send(f"<html><body><p>{stub.env.texts[i]}</p></body></html>".encode(), "text/html")
                else:
                    self.send_error(404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/embeddings"):
                    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    with stub.lock:
                        vecs = stub.encoder.encode([str(t) for t in texts])
                    self._json(
                        {
                            "object": "list",
                            "model": body.get("model"),
                            "data": [
                                {"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
                                for i, v in enumerate(vecs)
                            ],
                            "usage": {"prompt_tokens": 1, "total_tokens": 1},
                        }
                    )
                    return
                prompt = "\n".join(str(m.get("content")) for m in body["messages"])
                stub.prompts.append(prompt)
                content = stub.answer(prompt)
                if body.get("stream"):  # server-sent events, as the OpenAI API streams (the report is streamed)
                    words = re.findall(r"\S+\s*", content) or [""]
                    chunks = [
                        {
                            "id": "stub",
                            "object": "chat.completion.chunk",
                            "model": body.get("model"),
                            "choices": [
                                {"index": 0, "delta": {"role": "assistant", "content": w}, "finish_reason": None}
                            ],
                        }
                        for w in words
                    ]
                    chunks[-1]["choices"][0]["finish_reason"] = "stop"
                    data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                    self._send(data.encode(), "text/event-stream")
                    return
                self._json(
                    {
                        "id": "stub",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                        ],
                        "usage": {
                            "prompt_tokens": len(prompt) // 4,
                            "completion_tokens": len(content) // 4,
                            "total_tokens": (len(prompt) + len(content)) // 4,
                        },
                    }
                )

            def _json(self, obj):
                self._send(json.dumps(obj).encode(), "application/json")

            def _send(self, data, kind):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def search(self, query: str) -> list[dict]:
        if self.snippets:  # under GPT-Researcher's 100 characters: it fetches (scrapes) the page of each URL it keeps
            return [
                {"href": f"{self.url}/doc/{self.env.ids[i]}", "title": self.env.docs[i], "body": self.opening(i)}
                for i, _ in self.env.bm25.search(query, 3)
            ]
        return [
            {"url": f"{self.url}/doc/{self.env.ids[i]}", "title": self.env.docs[i], "raw_content": self.env.texts[i]}
            for i, _ in self.env.bm25.search(query, 3)
        ]

    def opening(self, i: int) -> str:
        words, out = self.env.texts[i].split(), ""
        for w in words:
            if len(out) + len(w) + 1 > 90:
                break
            out = f"{out} {w}" if out else w
        return out

    def subqueries(self, task: str, n: int) -> list[str]:
        q = next((q for q in self.env.queries if q.query in task), None)
        real = [d.replace("#1", "it").strip() for d in (q.meta.get("decomposition") or [])] if q else []
        topic = re.sub(r"\W+", " ", task).strip().split(" ")[-1] or "it"
        return (real + [f.format(t=topic) for f in FILLERS])[:n]

    def answer(self, prompt: str) -> str:
        if "server" in prompt and "agent_role_prompt" in prompt:  # choose_agent
            return json.dumps({"server": "Research Agent", "agent_role_prompt": "You are a research assistant."})
        if m := re.search(r"Write (\d+) search queries to research the following task: \"(.*?)\"", prompt, re.S):
            return json.dumps(self.subqueries(m.group(2), int(m.group(1))))
        if m := re.search(r"generate (\d+) unique search queries", prompt):
            lines = []
            for i, q in enumerate(self.subqueries(prompt, int(m.group(1)))):
                lines.append(f"Query: {q}")
                if i != 1:  # the second query comes without a goal: GPT-Researcher drops its results
                    lines.append(f"Goal: find out {q}")
            return "\n".join(lines)
        if "extract key learnings" in prompt:
            urls = re.findall(r"http://127\.0\.0\.1:\d+/doc/[^\s\)\]\"']+", prompt)[:1] or ["none"]
            return f"Learning [{urls[0]}]: a finding.\nQuestion: What else is known?"
        if "unique questions" in prompt or "follow-up questions" in prompt.lower():
            return "Question: Which facts matter most?\nQuestion: What is the evidence?"
        if "report" in prompt.lower():
            urls = list(dict.fromkeys(re.findall(r"http://127\.0\.0\.1:\d+/doc/[^\s\)\]\"'\\]+", prompt)))[:3]
            refs = "\n".join(f"- [{u.rsplit('/', 1)[-1]}]({u})" for u in urls)
            return f"# Report\n\nFindings drawn from the sources below.\n\n## References\n{refs}\n"
        self.unknown.append(prompt[:300])
        return "OK"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def stub(monkeypatch, tmp_path, encoder):
    from branchgate.pipeline import env as envmod

    s = Stub(envmod.load("sample"), encoder)
    for key, value in {
        "OPENAI_API_KEY": "sk-offline-test",
        "OPENAI_BASE_URL": f"{s.url}/v1",
        "RETRIEVER": "custom",
        "RETRIEVER_ENDPOINT": f"{s.url}/search",
        "FAST_LLM": "openai:stub-fast",
        "SMART_LLM": "openai:stub-smart",
        "STRATEGIC_LLM": "openai:stub-strategic",
        "EMBEDDING": "custom:stub-embed",
        "MAX_ITERATIONS": "4",
        # every context through GPT-Researcher's compression path, which keeps each page's URL (its
        # fast path for small contexts, under 8000 characters, prints "Source: None")
        "COMPRESSION_THRESHOLD": "0",
    }.items():
        monkeypatch.setenv(key, value)
    import gpt_researcher.context.compression as compression
    import gpt_researcher.utils.llm as llm

    monkeypatch.setattr(llm, "estimate_llm_cost", lambda a, b: 1e-6 * (len(str(a).split()) + len(str(b).split())))
    monkeypatch.setattr(compression, "estimate_embedding_cost", lambda model, docs: 1e-9 * len(docs))
    monkeypatch.chdir(tmp_path)  # GPT-Researcher writes outputs/ under the working directory
    yield s
    s.close()


def logs_handler(task: str):
    sys.modules.setdefault(
        "utils", types.SimpleNamespace(write_md_to_pdf=None, write_md_to_word=None, write_text_to_md=None)
    )
    from backend.server.server_utils import CustomLogsHandler

    return CustomLogsHandler(None, task)


def research(stub, trace, gate=None, report_type="research_report", max_keep=None, hook_options=None, **kw):
    query = stub.env.queries[kw.get("query", 0)].query
    handler = logs_handler("t")
    researcher = gptr.GPTResearcher(
        query=query,
        report_type=report_type,
        websocket=handler,
        verbose=True,
        agent="Research Agent",
        role="You are a research assistant.",
    )
    if report_type == "deep":
        researcher.deep_researcher.breadth, researcher.deep_researcher.depth = kw.get("breadth", 3), kw.get("depth", 2)
    hook = gate_research(researcher, gate, trace, max_keep=max_keep, **(hook_options or {}))

    async def go():
        await researcher.conduct_research()
        report = await researcher.write_report()
        await handler.send_json({"report": report})
        return report

    report = asyncio.run(go())
    hook.record_report(report)
    hook.close()
    return hook, list(read_events(trace, strict=True)), handler.log_file


def test_standard_mode_records_every_subquery(stub, tmp_path, encoder):
    hook, events, log_file = research(stub, tmp_path / "t" / "std.jsonl")
    assert not stub.unknown, stub.unknown
    frames = [e for e in events if e.type == "frame_open"]
    cands = [e for e in events if e.type == "candidate"]
    retrievals = {e.candidate_id: e for e in events if e.type == "retrieval"}
    assert len(frames) == 1 and frames[0].depth == 0 and frames[0].frame_query == stub.env.queries[0].query
    assert len(cands) == 4 and all(e.action == "expand" for e in events if e.type == "decision")
    assert set(retrievals) == {c.candidate_id for c in cands}
    assert sum(len(r.evidence_ids) for r in retrievals.values()) > 0
    sources = {e.source for e in events if e.type == "evidence"}
    assert sources and all(s.startswith(f"{stub.url}/doc/") for s in sources)
    report = next(e for e in events if e.type == "report")
    assert report.cited_sources and report.cited_ids  # the report's citations map to recorded evidence
    # searches: the plan's own, then the 4 sub-queries and the query GPT-Researcher appends
    assert len(stub.searches) == 1 + 4 + 1 and events[-1].type == "report"
    manifest = build(
        [tmp_path / "t"],
        tmp_path / "ds",
        encoder_obj=encoder,
        cache=tmp_path / "cache",
        progress=False,
        labels="citations",
    )
    assert manifest["n_decisions"]["total"] == 4
    # GPT-Researcher's own run log goes through the gptr reader
    log = json.loads(open(log_file).read())
    assert any(ev["data"].get("content") == "subqueries" for ev in log["events"])
    m2 = build(
        [tmp_path / "outputs"],
        tmp_path / "ds_log",
        encoder_obj=encoder,
        cache=tmp_path / "cache",
        progress=False,
        fmt="gptr",
    )
    assert m2["n_runs"]["total"] == 1 and m2["n_decisions"]["total"] == 4 + 1  # the log lists the appended query too


def test_standard_mode_gate_cuts_the_searches(stub, tmp_path, encoder):
    gate = Gate.load(exported(encoder)["files"]["int8"])
    hook, events, _ = research(stub, tmp_path / "g.jsonl", gate=gate, max_keep=2)
    decisions = [e for e in events if e.type == "decision"]
    kept = [d for d in decisions if d.action == "expand"]
    assert len(decisions) == 4 and all(d.actor == "controller:gate" and 0.0 <= d.p_keep <= 1.0 for d in decisions)
    assert len(kept) == 2 and hook.counts["expanded"] == 2 and hook.counts["pruned"] == 2
    assert len(stub.searches) == 1 + len(kept) + 1  # only the kept sub-queries were searched
    assert {e.candidate_id for e in events if e.type == "retrieval"} == {d.candidate_id for d in kept}
    print(f"\nstandard run: {len(decisions)} sub-queries generated, {len(kept)} expanded")


def test_deep_mode_records_both_levels(stub, tmp_path, encoder):
    gate = Gate.load(exported(encoder)["files"]["int8"])
    hook, events, _ = research(stub, tmp_path / "d" / "deep.jsonl", gate=gate, report_type="deep", breadth=3, depth=2)
    assert not stub.unknown, stub.unknown
    frames = {e.frame_id: e for e in events if e.type == "frame_open"}
    cands = {e.candidate_id: e for e in events if e.type == "candidate"}
    kept = {e.candidate_id for e in events if e.type == "decision" and e.action == "expand"}
    root = [f for f in frames.values() if f.parent_frame is None]
    assert len(root) == 1 and root[0].depth == 0
    # every kept deep branch is researched by a nested researcher whose plan is a frame below it
    plans = [
        f for f in frames.values() if f.parent_candidate in kept and f.frame_query == cands[f.parent_candidate].query
    ]
    root_kept = [c for c in kept if cands[c].frame_id == root[0].frame_id]
    assert root_kept and {cands[c].query for c in root_kept} <= {f.frame_query for f in plans}
    assert all(f.depth == frames[f.parent_frame].depth + 1 for f in plans)
    retr = {e.candidate_id: e for e in events if e.type == "retrieval"}
    for f in plans:  # the branch's retrieval is what its nested sub-queries found
        nested = [retr[c].evidence_ids for c, e in cands.items() if e.frame_id == f.frame_id and c in retr]
        assert set(retr[f.parent_candidate].evidence_ids) >= {i for ids in nested for i in ids}
    dropped = [e for e in events if e.type == "raw" and e.source_type == "gptr:dropped_without_goal"]
    plan_ids = {f.frame_id for f in plans}
    goalless = {c for c in kept if cands[c].frame_id not in plan_ids and cands[c].goal == ""}  # deep, no goal
    assert {d.data["candidate_id"] for d in dropped} == goalless and hook.counts["dropped_without_goal"] == len(
        goalless
    )
    print(
        f"\ndeep run: {len(frames)} frames ({len(plans)} nested plans), {len(cands)} candidates, {len(kept)} expanded, "
        f"{len(goalless)} researched then dropped for lack of a goal"
    )
    manifest = build([tmp_path / "d"], tmp_path / "ds", encoder_obj=encoder, cache=tmp_path / "cache", progress=False)
    assert manifest["n_decisions"]["total"] == len(cands)


# -- budgets (issue 25) -------------------------------------------------------------------------------------
class Squeezed:
    """The test controller's p_keep (nearly 0 or 1) squeezed into [0.3, 0.62], so a run's rising admission
    price defers candidates instead of keeping all of them."""

    def __init__(self, gate):
        self.gate, self.tau, self.name, self.path = gate, 0.5, "gate", gate.path

    def predict(self, state, texts):
        p, u = self.gate.predict(state, texts)
        return (0.3 + 0.32 * p).astype("float32"), u


def test_standard_mode_budget_defers_then_researches_the_best_deferred(stub, tmp_path, encoder):
    from branchgate.inference.run_gate import Budget, RunGate

    run = RunGate(
        Squeezed(Gate.load(exported(encoder)["files"]["fp32"])),
        Budget(nodes=3),
        defer=True,
        price_start=0.6,
        defer_margin=0.35,
    )
    hook, events, _ = research(stub, tmp_path / "b.jsonl", gate=run)
    decisions = [e for e in events if e.type == "decision"]
    first = decisions[:4]
    assert sum(d.action == "expand" for d in first) == 1 and sum(d.action == "defer" for d in first) == 3
    late = [d for d in decisions[4:] if d.action == "expand"]
    defers = {d.candidate_id: d.seq for d in first if d.action == "defer"}
    assert len(late) == 2 and all(d.deferred_from == defers[d.candidate_id] for d in late)
    assert run.budget.spent_nodes == 3 and hook.counts["revisited"] == 2
    # the revisited sub-queries were really searched, and their evidence recorded as their retrieval
    assert len(stub.searches) == 1 + 1 + 1 + 2
    retrieved = {e.candidate_id for e in events if e.type == "retrieval"}
    assert {d.candidate_id for d in late} <= retrieved
    assert events[0].config["budget"]["budget_nodes"] == 3 and events[-1].type == "report"
    assert isinstance(hook.researcher.context, str) and hook.researcher.context


def test_deep_mode_stops_expanding_when_the_budget_is_spent(stub, tmp_path, encoder):
    gate = Gate.load(exported(encoder)["files"]["int8"])
    hook, events, _ = research(
        stub, tmp_path / "db.jsonl", gate=gate, report_type="deep", breadth=3, depth=2, hook_options={"budget_nodes": 3}
    )
    decisions = [e for e in events if e.type == "decision"]
    assert sum(d.action == "expand" for d in decisions) <= 3 and hook.counts["expanded"] <= 3
    assert any(d.actor == "budget" for d in decisions) and hook.counts["exhausted"] >= 1
    assert all(d.remaining["nodes"] >= 0 for d in decisions)
    assert next(e for e in events if e.type == "run_end").status == "ok"


# -- the read gate (issue 51) -------------------------------------------------------------------------------
READ_TAU = 0.95  # the test controller reads most of the stub's hits at 0.5 (p_keep 0.53 to 1.0 on the standard run)


def _reads(events):
    results = [e for e in events if e.type == "results"]
    reads = [e for e in events if e.type == "read"]
    return (
        results,
        reads,
        {r.hit_id for r in reads if r.action == "read"},
        {r.hit_id for r in reads if r.action == "skip"},
    )


def test_read_stage_is_recorded_without_gating(stub, tmp_path, encoder):
    """``read=None``: every result list and a ``read`` per hit are recorded, everything is fetched as before, and
    the evidence read from a hit points back to it."""
    stub.snippets = True
    hook, events, _ = research(stub, tmp_path / "r" / "rec.jsonl")
    results, reads, read, skipped = _reads(events)
    assert len(results) == 4 + 1 and not skipped  # the 4 sub-queries' searches and the query GPT-Researcher adds
    assert len(reads) == sum(len(r.hits) for r in results) and all(r.actor == "default" for r in reads)
    own = [r for r in results if r.frame_id is not None]
    assert len(own) == 1 and own[0].query == stub.env.queries[0].query  # the added query: no candidate of its own
    assert set(stub.fetched) == read  # GPT-Researcher fetched every result, each once
    hit_ids = {e.hit_id for e in events if e.type == "evidence" and e.hit_id}
    assert hit_ids and hit_ids <= read
    assert all(len(h.snippet) <= 90 and h.title for r in results for h in r.hits)
    assert hook.counts["hits_read"] == hook.counts["hits"] == len(reads) and hook.counts["searches"] == 5
    m = build(
        [tmp_path / "r"],
        tmp_path / "ds",
        encoder_obj=encoder,
        cache=tmp_path / "cache",
        progress=False,
        stage="read",
        labels="citations",
    )
    assert m["stage"] == "read" and m["read"]["hits"] == len(reads) and m["n_decisions"]["total"] == len(read)
    assert m["run_problems"] == {}


def test_read_gate_skipped_results_are_never_fetched(stub, tmp_path, encoder):
    """With a read controller, a skipped URL is never fetched; the stub's fetch counter shows the saving."""
    stub.snippets = True
    research(stub, tmp_path / "all.jsonl")
    fetched_all = len(stub.fetched)
    stub.fetched.clear()
    gate = Gate.load(exported_read(encoder)["files"]["fp32"])
    hook, events, _ = research(stub, tmp_path / "g.jsonl", hook_options={"read": gate, "read_tau": READ_TAU})
    results, reads, read, skipped = _reads(events)
    assert read and skipped - read, (read, skipped)
    assert set(stub.fetched) == read and not (skipped - read) & set(stub.fetched)
    assert all(r.actor == f"controller:{gate.name}" or r.actor == "seen" and r.action == "skip" for r in reads)
    assert all(0.0 <= r.p_keep <= 1.0 for r in reads if r.actor != "seen")
    assert hook.counts["hits_skipped"] == sum(r.action == "skip" for r in reads) > 0
    assert len(stub.fetched) < fetched_all
    print(f"\nstandard run: {fetched_all} pages fetched without the read gate, {len(stub.fetched)} with it")


def test_read_gate_in_deep_mode_gates_the_nested_researchers(stub, tmp_path, encoder):
    stub.snippets = True
    gate = Gate.load(exported_read(encoder)["files"]["fp32"])
    pre = Gate.load(exported(encoder)["files"]["int8"])
    hook, events, _ = research(
        stub,
        tmp_path / "d.jsonl",
        gate=pre,
        report_type="deep",
        breadth=3,
        depth=2,
        hook_options={"read": gate, "read_tau": READ_TAU},
    )
    frames = {e.frame_id: e for e in events if e.type == "frame_open"}
    cands = {e.candidate_id: e.frame_id for e in events if e.type == "candidate"}
    results, reads, read, skipped = _reads(events)
    depths = {frames[cands.get(r.candidate_id) or r.frame_id].depth for r in results}
    assert results and min(depths) >= 1 and max(depths) >= 2  # every search is a nested researcher's
    assert set(stub.fetched) == read and skipped
    assert next(e for e in events if e.type == "run_end").status == "ok"
    print(f"\ndeep run: {len(results)} searches, {len(read)} pages read, {len(skipped - read)} skipped")


def test_recorded_read_stage_trains_and_exports_a_read_controller(stub, tmp_path, encoder):
    """The traces the hook writes with ``read=None`` are a read dataset (citations labels) that ``branchgate
    train`` and ``export`` turn into a read controller, which then gates a run."""
    stub.snippets = True
    for i, run_id in enumerate(runs_in_every_split("gptr-read")):
        research(stub, tmp_path / "logs" / f"{run_id}.jsonl", query=i, hook_options={"run_id": run_id})
    gate = Gate.load(read_controller_from(tmp_path / "logs", tmp_path))
    assert gate.stage == "read"
    stub.fetched.clear()
    hook, events, _ = research(stub, tmp_path / "gated.jsonl", query=5, hook_options={"read": gate})
    results, reads, read, _ = _reads(events)
    assert results and all(r.actor.startswith("controller:") or r.actor == "seen" for r in reads)
    assert set(stub.fetched) == read
