"""LlamaIndex drop-in: a read controller as a ``BaseNodePostprocessor``, where ``SentenceTransformerRerank`` goes
(``node_postprocessors=[...]`` of a query engine or a chat engine, or ``postprocess_nodes`` by hand).

    from branchgate.inference.agents.llamaindex import ReadGatePostprocessor

    gate = ReadGatePostprocessor("pretrained:read", trace="traces/reads.jsonl", budget_docs=20)
    engine = index.as_query_engine(similarity_top_k=10, node_postprocessors=[gate])
    nodes = gate.postprocess_nodes(retriever.retrieve(q), query_str=q)
    with gate.run("Why do honeybee colonies collapse?"):   # several retrievals for one question: one run
        ...

``_postprocess_nodes(nodes, query_bundle)`` passes on the nodes the read controller reads, in their order, with
their scores unchanged (a filter, not a reranker); ``apostprocess_nodes`` is llama-index-core's (the same call in
a thread, which carries the current run along). A node is a hit by ``doc_gate.doc_of``: its metadata's ``title``
and ``url`` / ``source``, and its text without metadata. τ, the floor, run budgets, runs and the traces the
user's own runs leave for ``branchgate dataset build --stage read``: ``doc_gate.py``.

Checked against llama-index-core 0.14.25 (``.ci/integrations/llamaindex.txt``); needs the ``llamaindex`` extra
(``pip install 'branchgate[llamaindex]'``).
"""

from __future__ import annotations

try:
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("the LlamaIndex drop-in needs llama-index-core: pip install 'branchgate[llamaindex]'") from exc

from branchgate.inference.agents.doc_gate import DocumentGate, doc_of


class ReadGatePostprocessor(BaseNodePostprocessor):
    """A read controller as a LlamaIndex node postprocessor (module docstring). Arguments: ``DocumentGate``'s
    (``read``: a read controller's ``.onnx``, its folder, ``pretrained:read`` or a loaded Gate; ``trace``; ``tau``;
    ``floor``; ``budget_docs``; ``budget_tokens``)."""

    _gate: DocumentGate = PrivateAttr()

    def __init__(self, read="pretrained:read", trace=None, **options):
        super().__init__()
        self._gate = DocumentGate(read, trace, system="llamaindex", **options)

    @classmethod
    def class_name(cls) -> str:
        return "ReadGatePostprocessor"

    @property
    def gate(self) -> DocumentGate:
        return self._gate

    def run(self, question: str | None = None, **options):
        """``with postprocessor.run(question):`` the retrievals inside are one run (``DocumentGate.run``)."""
        return self._gate.run(question, **options)

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None):
        if query_bundle is None:
            raise ValueError("ReadGatePostprocessor needs the query (query_bundle or query_str)")
        nodes = list(nodes)
        docs = [doc_of(n.node.get_content(metadata_mode=MetadataMode.NONE), n.node.metadata) for n in nodes]
        return [nodes[i] for i in self._gate.filter(query_bundle.query_str, docs)]

    def close(self) -> None:
        self._gate.close()
