"""The read gate over retrieved documents (``inference/agents/doc_gate.py``), which the LangChain and LlamaIndex
drop-ins wrap; without either package: documents in, the documents to read out, and the traces a read dataset is
built from."""

from __future__ import annotations

import pytest
from doc_gate_support import CORPUS, QUERIES, QUESTION, read_dataset
from export_support import exported, exported_read

from branchgate.errors import InputError
from branchgate.inference.agents.doc_gate import MAX_TEXT_CHARS, DocumentGate, doc_of
from branchgate.inference.gate import Gate
from branchgate.logs_to_dataset.traces import read_events
from branchgate.texts import SNIPPET_WORDS

DOCS = [doc_of(text, meta) for text, meta in CORPUS]


def events(path, type_):
    return [e for e in read_events(path, strict=True) if e.type == type_]


def test_a_document_is_a_hit_with_a_title_a_snippet_and_an_id_per_chunk():
    d = DOCS[0]
    assert (d.title, d.url) == ("Varroa mites and colony losses", "https://bees.example/varroa")
    assert d.snippet == " ".join(CORPUS[0][0].split()[:SNIPPET_WORDS]) and d.id.startswith(d.url + "#")
    assert DOCS[1].url == "https://bees.example/neonicotinoids"  # metadata "url"
    assert DOCS[4].title.startswith("Recipe: honey glazed") and DOCS[5].id.startswith("sha256:") and not DOCS[5].url
    other_chunk = doc_of("Another chunk of the varroa page.", CORPUS[0][1])
    assert other_chunk.url == d.url and other_chunk.id != d.id  # chunks of one page are hits of their own
    assert doc_of(CORPUS[0][0], CORPUS[0][1]) == d  # the same chunk, the same id


def test_each_call_outside_a_run_is_a_run_of_its_own_and_the_trace_says_what_was_read(tmp_path):
    path = tmp_path / "reads.jsonl"
    gate = DocumentGate("pretrained:read", path)
    kept = [gate.filter(q, DOCS) for q in QUERIES]
    gate.close()
    starts, reads = events(path, "run_start"), events(path, "read")
    assert [s.root_query for s in starts] == QUERIES and len({s.run_id for s in starts}) == 3
    assert len(events(path, "run_end")) == 3 and len(reads) == 3 * len(DOCS)
    for start, k in zip(starts, kept):
        mine = [r for r in reads if r.run_id == start.run_id]
        assert [i for i, r in enumerate(mine) if r.action == "read"] == k and 0 < len(k) < len(DOCS)
        assert {r.actor for r in mine} == {"controller:teacher:dpp"} and all(0 <= r.p_keep <= 1 for r in mine)
    evidence = events(path, "evidence")
    assert {e.hit_id for e in evidence} == {d.id for d in DOCS}  # skipped documents' texts too (their labels)
    (retrieval, *_) = events(path, "retrieval")
    assert len(retrieval.evidence_ids) == len(kept[0])


def test_tau_and_the_floor(tmp_path, encoder):
    gate = Gate.load(exported_read(encoder)["files"]["fp32"])  # a trained read controller (fp32 ONNX)
    assert DocumentGate(gate, tau=0.0).filter(QUERIES[0], DOCS) == list(range(len(DOCS)))
    assert DocumentGate(gate, tau=1.0, floor=None).filter(QUERIES[0], DOCS) == []
    p = gate.select({"root_query": QUERIES[0], "query": QUERIES[0]}, [vars(d) for d in DOCS]).p_keep
    assert DocumentGate(gate, tau=1.0).filter(QUERIES[0], DOCS) == [int(p.argmax())]  # floor "root": the best one


def test_in_a_run_a_document_read_before_is_not_read_again(tmp_path):
    path = tmp_path / "reads.jsonl"
    gate = DocumentGate("pretrained:read", path, tau=0.0)
    with gate.run(QUESTION) as run:
        assert gate.current_run is run
        first, again = gate.filter(QUERIES[0], DOCS), gate.filter(QUERIES[1], DOCS[:3])
    assert gate.current_run is None and first == list(range(len(DOCS))) and again == []
    (start,) = events(path, "run_start")
    assert start.root_query == QUESTION and start.config["tau"] == 0.0
    reads = events(path, "read")
    assert [r.actor for r in reads[len(DOCS) :]] == ["seen"] * 3 and all(r.p_keep is None for r in reads[len(DOCS) :])
    assert run.counts["searches"] == 2 and run.counts["hits_read"] == len(DOCS)


def test_a_run_budget_is_never_exceeded_and_its_cuts_are_recorded(tmp_path):
    path = tmp_path / "reads.jsonl"
    gate = DocumentGate("pretrained:read", path, tau=0.0, budget_docs=4)
    with gate.run(QUESTION) as run:
        kept = [gate.filter(q, DOCS) for q in (*QUERIES, "bees")]  # 4 read; 2 left over, cut in each search
    assert sum(map(len, kept)) == 4 == run.budget.spent_nodes and kept[-1] == []
    over = [r for r in events(path, "read") if r.actor == "budget"]
    assert len(over) == run.counts["hits_over_budget"] == 2 * 4 and {r.action for r in over} == {"skip"}
    words = sorted(len(t.split()) for t, _ in CORPUS)
    with DocumentGate("pretrained:read", tau=0.0, budget_tokens=words[0] + words[1]).run() as run:
        run.filter(QUERIES[0], DOCS)
    assert run.budget.spent_tokens <= words[0] + words[1] and run.budget.spent_nodes >= 1


def test_bad_inputs_are_clear_errors(tmp_path, encoder):
    with pytest.raises(InputError, match="read controller"):
        DocumentGate(exported(encoder)["files"]["fp32"])
    with pytest.raises(InputError, match="budget_docs"):
        DocumentGate("pretrained:read", budget_docs=-1)
    with pytest.raises(InputError, match="query"):
        DocumentGate("pretrained:read").filter(None, DOCS)
    empty = doc_of("", {"source": "https://x.example"})
    assert DocumentGate("pretrained:read").filter("q", [empty]) == [0]  # nothing to score: passed on
    long = doc_of("word " * (2 * MAX_TEXT_CHARS), {"title": "Long"})
    path = tmp_path / "t.jsonl"
    DocumentGate("pretrained:read", path).filter("q", [long])
    assert len(events(path, "evidence")[0].text) == MAX_TEXT_CHARS


def test_the_traces_build_a_read_dataset_with_teacher_labels(tmp_path):
    gate = DocumentGate("pretrained:read", tmp_path / "traces" / "reads.jsonl")
    with gate.run(QUESTION):
        for q in QUERIES:
            gate.filter(q, DOCS)
    gate.filter(QUERIES[0], DOCS)
    gate.close()
    manifest = read_dataset(tmp_path / "traces", tmp_path)
    assert manifest["stage"] == "read" and manifest["label_kind"] == "teacher:dpp"
    assert manifest["n_runs"]["total"] == 2 and manifest["read"]["read_points"] == 4
    assert manifest["read"]["unlabelled_hits"] == 0 and manifest["n_decisions"]["total"] == manifest["read"]["new_hits"]
