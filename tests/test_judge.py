"""The ``judge`` label source against a stub OpenAI-compatible server on 127.0.0.1 (the ``chat_stub`` fixture).

The stub judges deterministically from the prompt, as the prompt asks: each branch's key points are the
capitalised words of its evidence not in KNOWN BEFORE and not in ALREADY NAMED, whatever the other branches of the
request show, so every utility below is exact.
"""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from branchgate import llm
from branchgate.errors import BranchgateError
from branchgate.logs_to_dataset.decision_points import run_decisions
from branchgate.logs_to_dataset.judge import Judge, clip, parse_points
from branchgate.logs_to_dataset.traces import TraceWriter, read_events

CAP = re.compile(r"\b[A-Z][a-z]+\b")
# what the keypoints source would give with the capitalised words as ground-truth key points: siblings are
# credited independently (Beta to c0 and c1, Delta to g0 and g1), only what C_t covers is subtracted (Gamma for d0)
EXPECTED = {"c0": 2.0, "c1": 2.0, "d0": 1.0, "d1": 2.0, "d3": 0.0, "g0": 2.0, "g1": 1.0}


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(llm, "BACKOFF", 0.01)


def make_run(tmp_path):
    """F0: c0 (Alpha, Beta), c1 (Beta, Gamma: Beta is c0's too, both are credited), c2 pruned. F1 (C_t = e1, e2,
    the parent frame's kept branches): d0 (Gamma, known from e2; Delta), d1 (e4: Epsilon, Alpha, Zeta; e1 is in C_t,
    Alpha known), d2 (unknown evidence), d3 (retrieved nothing). e3 pruned after retrieval. F2 (C_t = e1, e2, e4):
    g0 (Delta, Eta; Delta was named for d0, but e3 is not in C_t), g1 (e3: Gamma known, Delta: g0's too)."""
    path = tmp_path / "run.jsonl"
    r = "run-1"
    with TraceWriter(path) as w:

        def ev(**kw):
            w.write(run_id=r, **kw)

        def expand(cid, ids, texts=()):
            ev(type="decision", candidate_id=cid, action="expand")
            for eid, text in texts:
                ev(type="evidence", evidence_id=eid, text=text)
            ev(type="retrieval", candidate_id=cid, query=f"query {cid}", evidence_ids=ids)

        def frame(fid, depth, cids):
            ev(type="frame_open", frame_id=fid, depth=depth, frame_query=f"frame {fid}")
            for i, cid in enumerate(cids):
                ev(type="candidate", frame_id=fid, candidate_id=cid, order=i, query=f"query {cid}")

        ev(type="run_start", root_query="What drives glaciers?")
        frame("F0", 0, ["c0", "c1", "c2"])
        expand("c0", ["e1"], [("e1", "Alpha and Beta shape the ice.")])
        expand("c1", ["e2"], [("e2", "Beta meets Gamma near the coast.")])
        ev(type="decision", candidate_id="c2", action="prune")
        frame("F1", 1, ["d0", "d1", "d2", "d3"])
        expand("d0", ["e3"], [("e3", "Gamma and Delta appear.")])
        expand("d1", ["e4", "e1"], [("e4", "then Epsilon joins Alpha and Zeta.")])
        expand("d2", ["never-emitted"])
        expand("d3", [])
        ev(type="prune", stage="post_retrieval", item_ids=["e3"])
        frame("F2", 1, ["g0", "g1"])
        expand("g0", ["e5"], [("e5", "Delta and Eta.")])
        expand("g1", ["e3"])
    return run_decisions(r, list(read_events(path, strict=True)))


def sections(prompt: str):
    known = prompt.split("KNOWN BEFORE:\n<<<\n", 1)[1].split("\n>>>", 1)[0]
    named = prompt.split("ALREADY NAMED:\n", 1)[1].split("\n\nBRANCH", 1)[0]
    branches = re.findall(r"BRANCH (\d+)\nQUERY: [^\n]*\nEVIDENCE:\n<<<\n(.*?)\n>>>", prompt, re.DOTALL)
    return known, [line[2:] for line in named.splitlines() if line.startswith("- ")], branches


def good(body, sloppy=False):
    """A careful judge; ``sloppy`` names every capitalised word of the evidence, known or not, each in three
    spellings."""
    known, named, branches = sections(body["messages"][0]["content"])
    seen = set() if sloppy else set(CAP.findall(known)) | set(named)
    out = {}
    for n, evidence in branches:
        points = [w for w in dict.fromkeys(CAP.findall(evidence)) if w not in seen]
        if sloppy:
            points = [p for w in points for p in (f"{w.upper()}.", f"  {w.lower()} ", w)]
        out[n] = points
    return "Here are the key points:\n```json\n" + json.dumps(out) + "\n```"


def test_utilities_are_exact_and_a_rerun_is_free(chat_stub, tmp_path):
    rd = make_run(tmp_path)
    stub = chat_stub(good)
    cache = tmp_path / "judge.sqlite"
    with Judge(stub.url, "stub-model", cache=cache) as judge:
        assert judge.utilities(rd) == EXPECTED
        first = judge.stats()
    assert len(stub.requests) == 3  # one request per frame (batch 8)
    assert all(b["model"] == "stub-model" and b["temperature"] == 0 for b in stub.requests)
    prompts = [b["messages"][0]["content"] for b in stub.requests]
    assert "even when another branch in this request shows it too" in prompts[0]
    assert sections(prompts[0])[:2] == ("(nothing yet)", [])
    known, named, branches = sections(prompts[1])
    assert known == "Alpha and Beta shape the ice.\n\nBeta meets Gamma near the coast." and named == [
        "Alpha",
        "Beta",
        "Gamma",
    ]
    assert branches[1][1] == "then Epsilon joins Alpha and Zeta."  # e1 ∈ C_t
    known, named, branches = sections(prompts[2])
    assert named == ["Alpha", "Beta", "Gamma", "Epsilon", "Zeta"]  # the points of C_t's branches (c0, c1, d1)
    assert "Delta" not in known  # d0 named it, but its e3 was pruned from C_t: not known before F2
    assert [ev for _, ev in branches] == ["Delta and Eta.", "Gamma and Delta appear."]
    assert first["calls"] == 3 and first["cached"] == 0 and first["failures"] == 0 and first["bad_replies"] == 0
    assert first["branches"] == 7 and first["key_points"] == 10 and first["runs"] == 1
    assert first["prompt_tokens"] == sum(u["prompt_tokens"] for u in stub.usage) > 0
    assert first["completion_tokens"] == sum(u["completion_tokens"] for u in stub.usage) > 0
    assert first["endpoint"] == stub.url + "/chat/completions" and first["seconds"] > 0

    with Judge(stub.url, "stub-model", cache=cache) as again:
        assert again.utilities(rd) == EXPECTED
        second = again.stats()
    assert len(stub.requests) == 3  # nothing new asked
    assert second["calls"] == 0 and second["cached"] == 3 and second["prompt_tokens"] == 0
    assert second["cached_prompt_tokens"] == first["prompt_tokens"]
    assert second["cached_completion_tokens"] == first["completion_tokens"]

    with Judge(stub.url, "another-model", cache=cache) as other:  # the model is part of the key
        other.utilities(rd)
    assert len(stub.requests) == 6


def test_batches_and_dedupe_within_a_branch(chat_stub, tmp_path):
    rd = make_run(tmp_path)
    stub = chat_stub(good)
    with Judge(stub.url, "m", cache=tmp_path / "one.sqlite", batch=1) as judge:
        assert judge.utilities(rd) == EXPECTED
    assert len(stub.requests) == 6  # one per branch that has evidence beyond C_t; siblings alone, same utilities
    assert sections(stub.requests[5]["messages"][0]["content"])[1] == ["Alpha", "Beta", "Gamma", "Epsilon", "Zeta"]
    sloppy = chat_stub(lambda body: (good(body, sloppy=True), {}))  # and reports no usage
    with Judge(sloppy.url, "m", cache=tmp_path / "sloppy.sqlite") as judge:
        assert judge.utilities(rd) == EXPECTED  # repeats (any case, punctuation) count once; known points none
        stats = judge.stats()
    assert stats["key_points"] == 10 and stats["usage_missing"] == 3 and stats["prompt_tokens"] == 0
    with Judge(sloppy.url, "m", cache=tmp_path / "sloppy.sqlite") as judge:  # state is per run
        assert judge.utilities(rd) == EXPECTED


def test_bad_replies_retry_once_then_fail(chat_stub, tmp_path):
    rd = make_run(tmp_path)
    garbage = chat_stub(lambda body: "I cannot help with that.")
    with Judge(garbage.url, "m", cache=tmp_path / "bad.sqlite") as judge:
        assert judge.utilities(rd) == {"d3": 0.0}  # the only utility that needs no judge
        stats = judge.stats()
    assert stats["failures"] == 6 and stats["bad_replies"] == 6 and stats["calls"] == 6
    retry = garbage.requests[1]["messages"]
    assert len(retry) == 3 and retry[1]["content"] == "I cannot help with that."
    assert "could not be read (no JSON object in the answer)" in retry[2]["content"]

    def second_time_lucky(body):
        return good(body) if len(body["messages"]) == 3 else '{"1": ["only one branch"]}'

    lucky = chat_stub(second_time_lucky)
    with Judge(lucky.url, "m", cache=tmp_path / "lucky.sqlite") as judge:
        assert judge.utilities(rd) == EXPECTED
        assert judge.stats()["bad_replies"] == 3 and judge.stats()["failures"] == 0
    assert "(no key 2)" in lucky.requests[1]["messages"][2]["content"]


def test_parse_points_and_clip():
    assert parse_points('```json\n{"1": [" a  b ", ""], "2": []}\n```', 2) == [["a b"], []]
    assert parse_points('["x", "y"]', 1) == [["x", "y"]]
    for bad, reason in [
        ('{"1": ["x"]}', "no key 2"),
        ('{"1": "x", "2": []}', "key 1 is not a list"),
        ('{"1": [3], "2": []}', "key 1 is not a list"),
        ("[]", "no JSON object"),
        ('{"1": [}', "invalid JSON object"),
    ]:
        with pytest.raises(ValueError, match=re.escape(reason)):
            parse_points(bad, 2)
    assert clip(["aaaa", "b" * 20, "  "], 12) == "aaaa\n\nbbbbbbbb…"  # the short one's unused share goes on
    assert clip(["x y", "z"], 100) == "x y\n\nz" and clip([], 10) == ""


def test_errors_name_the_endpoint(chat_stub, tmp_path):
    rd = make_run(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(
        BranchgateError, match=re.escape(f"cannot reach {dead}/chat/completions") + ".*after 2 attempts"
    ):
        Judge(dead, "m", cache=tmp_path / "dead.sqlite", retries=1).utilities(rd)

    failing = chat_stub(lambda body: 500)
    with pytest.raises(BranchgateError, match=re.escape(f"{failing.url}/chat/completions answered HTTP 500")):
        Judge(failing.url, "m", cache=tmp_path / "500.sqlite", retries=2).utilities(rd)
    assert len(failing.requests) == 3  # retried twice

    denied = chat_stub(lambda body: 401)
    with pytest.raises(BranchgateError, match="HTTP 401"):
        Judge(denied.url, "m", cache=tmp_path / "401.sqlite", retries=2).utilities(rd)
    assert len(denied.requests) == 1  # not retried

    def slow(body):
        time.sleep(1.5)
        return good(body)

    sleepy = chat_stub(slow)
    with pytest.raises(BranchgateError, match=re.escape(f"cannot reach {sleepy.url}/chat/completions") + ".*timed out"):
        Judge(sleepy.url, "m", cache=tmp_path / "slow.sqlite", timeout=0.3, retries=0).utilities(rd)


def test_an_interrupted_run_resumes(chat_stub, tmp_path):
    rd = make_run(tmp_path)
    cache = tmp_path / "judge.sqlite"
    flaky = chat_stub(lambda body: good(body) if len(flaky.requests) == 1 else 503)
    with pytest.raises(BranchgateError, match="HTTP 503"):
        Judge(flaky.url, "m", cache=cache, retries=1).utilities(rd)
    assert len(flaky.requests) == 3  # the first frame answered, the second failed twice

    blip = chat_stub(lambda body: 503 if len(blip.requests) == 1 else good(body))  # another endpoint, same cache
    with Judge(blip.url, "m", cache=cache, retries=1) as judge:
        assert judge.utilities(rd) == EXPECTED
        stats = judge.stats()
    assert stats["cached"] == 1 and stats["calls"] == 2 and stats["http_retries"] == 1
    assert len(blip.requests) == 3


def test_label_source_for_the_dataset_build(chat_stub, tmp_path, monkeypatch):
    from branchgate.logs_to_dataset.judge import label_source

    monkeypatch.setenv("OPENAI_API_KEY", "sk-stub")
    rd = make_run(tmp_path)
    stub = chat_stub(good)
    source = label_source(llm_url=stub.url, llm_model="m", cache=tmp_path / "judge.sqlite", batch=1)
    assert (source.kind, source.threshold, source.needs_vectors(rd), source.missing(rd, None)) == (
        "judge",
        1.0,
        False,
        None,
    )
    assert source.utilities(rd, None, None) == EXPECTED
    assert source.stats()["calls"] == 6 and stub.headers[0]["Authorization"] == "Bearer sk-stub"
    source.judge.close()


def test_dataset_build_with_judge_labels_end_to_end(chat_stub, tmp_path, encoder, monkeypatch):
    """`branchgate dataset build --labels judge` against the stub: rows carry the judge's utilities, labels are
    utility ≥ 1, the manifest holds the judge's token statistics, and a rebuild asks the LLM nothing."""
    import datasets

    from branchgate.logs_to_dataset.build import build

    monkeypatch.setenv("BRANCHGATE_CACHE", str(tmp_path / "cache"))
    make_run(tmp_path)
    stub = chat_stub(good)
    opts = {"llm_url": stub.url, "llm_model": "m"}
    manifest = build(
        [tmp_path / "run.jsonl"],
        tmp_path / "ds",
        labels="judge",
        label_options=opts,
        encoder_obj=encoder,
        cache=tmp_path / "emb.sqlite",
        progress=False,
    )
    rows = [r for split in datasets.load_from_disk(str(tmp_path / "ds")).values() for r in split]
    got = {r["candidate_id"]: r["utility"] for r in rows if r["label_source"] == "realized"}
    assert got == EXPECTED
    assert all(r["label"] == int(r["utility"] >= 1) for r in rows if r["label_source"] == "realized")
    assert {r["utility_kind"] for r in rows} == {"judge"}
    stats = manifest["label_source_stats"]
    assert stats["calls"] == len(stub.requests) > 0 and stats["prompt_tokens"] > 0
    calls = len(stub.requests)
    build(
        [tmp_path / "run.jsonl"],
        tmp_path / "ds2",
        labels="judge",
        label_options=opts,
        encoder_obj=encoder,
        cache=tmp_path / "emb.sqlite",
        progress=False,
    )
    assert len(stub.requests) == calls  # every reply came from the judge's cache
