"""The LlamaIndex drop-in (``inference/agents/llamaindex.py``) against the real llama-index-core
(``.ci/integrations/llamaindex.txt``, run by ``bash .ci/integration llamaindex``): the read gate as a
``BaseNodePostprocessor`` in a query engine (no LLM: ``response_mode="no_text"``) and by hand, its runs and
budget, its traces through ``dataset build --stage read``, and the docs page's blocks as shown."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed (bash .ci/integration llamaindex)")

from doc_gate_support import CORPUS, QUERIES, QUESTION, page_blocks, read_dataset, run_page_commands  # noqa: E402
from llama_index.core import Settings, SummaryIndex  # noqa: E402
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode  # noqa: E402

from branchgate.inference.agents.llamaindex import ReadGatePostprocessor  # noqa: E402
from branchgate.logs_to_dataset.traces import read_events  # noqa: E402

NODES = [TextNode(text=text, metadata=meta) for text, meta in CORPUS]


@pytest.fixture(autouse=True)
def no_llm():
    """LlamaIndex's own switch for "no LLM" (a MockLLM); these tests only retrieve."""
    Settings.llm = None


def scored():
    return [NodeWithScore(node=n, score=1.0 - i / 10) for i, n in enumerate(NODES)]


def reads(path):
    return [e for e in read_events(path, strict=True) if e.type == "read"]


def test_the_postprocessor_filters_nodes_in_a_query_engine_as_its_trace_says(tmp_path):
    path = tmp_path / "reads.jsonl"
    post = ReadGatePostprocessor("pretrained:read", trace=path)
    assert isinstance(post, BaseNodePostprocessor) and post.class_name() == "ReadGatePostprocessor"
    engine = SummaryIndex(NODES).as_query_engine(node_postprocessors=[post], response_mode="no_text")
    out = engine.query(QUERIES[0]).source_nodes
    post.close()
    read = [NODES[i].node_id for i, r in enumerate(reads(path)) if r.action == "read"]
    assert 0 < len(out) < len(NODES) and [n.node.node_id for n in out] == read


def test_by_hand_scores_are_kept_and_the_query_is_needed():
    post = ReadGatePostprocessor("pretrained:read", tau=0.0)
    nodes = scored()
    assert post.postprocess_nodes(nodes, QueryBundle(QUERIES[1])) == nodes  # τ 0: all, scores unchanged
    with pytest.raises(ValueError, match="needs the query"):
        post.postprocess_nodes(nodes)


def test_async_queries_in_a_run_and_a_budget_never_exceeded(tmp_path):
    path = tmp_path / "reads.jsonl"
    post = ReadGatePostprocessor("pretrained:read", trace=path, tau=0.0, budget_docs=4)
    engine = SummaryIndex(NODES).as_query_engine(node_postprocessors=[post], response_mode="no_text")

    async def research():
        with post.run(QUESTION) as run:
            found = [(await engine.aquery(q)).source_nodes for q in QUERIES]
        return run, found

    run, found = asyncio.run(research())
    assert sum(map(len, found)) == 4 == run.budget.spent_nodes
    events = list(read_events(path, strict=True))
    assert {e.run_id for e in events} == {run.run_id} and [e.type for e in events].count("results") == 3
    assert {r.actor for r in reads(path)} >= {"budget", "seen", "controller:teacher:dpp"}


def test_a_trained_read_controller_and_the_floor(encoder):
    from export_support import exported_read

    onnx = exported_read(encoder)["files"]["fp32"]
    assert ReadGatePostprocessor(onnx, tau=1.0, floor=None).postprocess_nodes(scored(), query_str="bees") == []
    assert len(ReadGatePostprocessor(onnx, tau=1.0).postprocess_nodes(scored(), query_str="bees")) == 1


def test_the_traces_build_a_read_dataset(tmp_path):
    post = ReadGatePostprocessor("pretrained:read", trace=tmp_path / "traces" / "reads.jsonl")
    retriever = SummaryIndex(NODES).as_retriever()
    with post.run(QUESTION):
        for q in QUERIES:
            post.postprocess_nodes(retriever.retrieve(q), query_str=q)
    post.close()
    manifest = read_dataset(tmp_path / "traces", tmp_path)
    assert manifest["label_kind"] == "teacher:dpp" and manifest["read"]["read_points"] == 3
    assert manifest["n_decisions"]["total"] == manifest["read"]["new_hits"] > 0


def test_the_docs_page_runs_as_shown(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    blocks = page_blocks("llamaindex.md", "python")
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "docs/use/llamaindex.md", "exec"), scope)
    printed = [ln for ln in capsys.readouterr().out.splitlines() if "MockLLM" not in ln]
    assert printed[0] == "Varroa mites and colony losses" and "read of" in printed[-1]
    assert run_page_commands("llamaindex.md") and (tmp_path / "read_ds" / "manifest.json").is_file()
