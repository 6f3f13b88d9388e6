"""The LangChain drop-in (``inference/agents/langchain.py``) against the real langchain-core and langchain-classic
(``.ci/integrations/langchain.txt``, run by ``bash .ci/integration langchain``): the read gate as a
``BaseDocumentCompressor`` inside a ``ContextualCompressionRetriever`` and a ``DocumentCompressorPipeline``, its
runs and budget, its traces through ``dataset build --stage read``, and the docs page's blocks as shown."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core", reason="langchain-core is not installed (bash .ci/integration langchain)")
pytest.importorskip("langchain_classic", reason="langchain-classic is not installed (bash .ci/integration langchain)")

from doc_gate_support import CORPUS, QUERIES, QUESTION, page_blocks, read_dataset, run_page_commands  # noqa: E402
from langchain_classic.retrievers import ContextualCompressionRetriever  # noqa: E402
from langchain_classic.retrievers.document_compressors import DocumentCompressorPipeline  # noqa: E402
from langchain_core.documents import BaseDocumentCompressor, Document  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402

from branchgate.inference.agents.langchain import ReadGateCompressor  # noqa: E402
from branchgate.logs_to_dataset.traces import read_events  # noqa: E402

DOCS = [Document(page_content=text, metadata=meta) for text, meta in CORPUS]
SEARCH = RunnableLambda(lambda query: list(DOCS))  # a retriever: every document, for any query


def reads(path):
    return [e for e in read_events(path, strict=True) if e.type == "read"]


def test_the_compressor_filters_a_retrievers_documents_as_its_trace_says(tmp_path):
    path = tmp_path / "reads.jsonl"
    compressor = ReadGateCompressor("pretrained:read", trace=path)
    assert isinstance(compressor, BaseDocumentCompressor)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=SEARCH)
    out = retriever.invoke(QUERIES[0])
    compressor.close()
    assert 0 < len(out) < len(DOCS) and all(any(d is o for o in DOCS) for d in out)  # the documents themselves
    read = [DOCS[i] for i, r in enumerate(reads(path)) if r.action == "read"]
    assert out == read and [d.metadata for d in out] == [d.metadata for d in read]


def test_async_retrieval_in_a_run_and_a_budget_never_exceeded(tmp_path):
    path = tmp_path / "reads.jsonl"
    compressor = ReadGateCompressor("pretrained:read", trace=path, tau=0.0, budget_docs=4)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=SEARCH)

    async def research():
        with compressor.run(QUESTION) as run:
            found = [await retriever.ainvoke(q) for q in QUERIES]
        return run, found

    run, found = asyncio.run(research())
    assert sum(map(len, found)) == 4 == run.budget.spent_nodes  # 6 documents pass τ 0; the budget admits 4
    events = list(read_events(path, strict=True))
    assert {e.run_id for e in events} == {run.run_id} and [e.type for e in events].count("results") == 3
    assert {r.actor for r in reads(path)} >= {"budget", "seen", "controller:teacher:dpp"}


def test_in_a_compressor_pipeline_with_a_trained_read_controller(tmp_path, encoder):
    from export_support import exported_read

    onnx = exported_read(encoder)["files"]["fp32"]
    pipeline = DocumentCompressorPipeline(transformers=[ReadGateCompressor(onnx, tau=0.0)])
    assert pipeline.compress_documents(DOCS, QUERIES[1]) == DOCS
    strict = ContextualCompressionRetriever(
        base_compressor=ReadGateCompressor(onnx, tau=1.0, floor=None), base_retriever=SEARCH
    )
    assert strict.invoke(QUERIES[1]) == []


def test_the_traces_build_a_read_dataset(tmp_path):
    compressor = ReadGateCompressor("pretrained:read", trace=tmp_path / "traces" / "reads.jsonl")
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=SEARCH)
    with compressor.run(QUESTION):
        for q in QUERIES:
            retriever.invoke(q)
    compressor.close()
    manifest = read_dataset(tmp_path / "traces", tmp_path)
    assert manifest["label_kind"] == "teacher:dpp" and manifest["read"]["read_points"] == 3
    assert manifest["n_decisions"]["total"] == manifest["read"]["new_hits"] > 0


def test_the_docs_page_runs_as_shown(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    blocks = page_blocks("langchain.md", "python")
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "docs/use/langchain.md", "exec"), scope)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "Varroa mites and colony losses" and "read of" in printed[-1]
    assert run_page_commands("langchain.md") and (tmp_path / "read_ds" / "manifest.json").is_file()
