"""LangChain drop-in: a read controller as a ``BaseDocumentCompressor``, where ``CrossEncoderReranker``,
``FlashrankRerank`` and ``EmbeddingsFilter`` plug into a ``ContextualCompressionRetriever`` (or a
``DocumentCompressorPipeline``).

    from langchain_classic.retrievers import ContextualCompressionRetriever
    from branchgate.inference.agents.langchain import ReadGateCompressor

    compressor = ReadGateCompressor("pretrained:read", trace="traces/reads.jsonl", budget_docs=20)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=my_retriever)
    docs = retriever.invoke("why do honeybee colonies collapse?")
    with compressor.run("Why do honeybee colonies collapse?"):   # an agent's searches for one question: one run
        retriever.invoke("varroa mites")
        retriever.invoke("neonicotinoids and bees")

``compress_documents(documents, query, callbacks)`` passes on the documents the read controller reads, in their
order, unchanged (a filter, not a reranker); ``acompress_documents`` is langchain-core's (the same call in an
executor, which carries the current run along). A ``Document`` is a hit by ``doc_gate.doc_of``: its metadata's
``title`` and ``url`` / ``source``, and its ``page_content``. τ, the floor, run budgets, runs and the traces the
user's own runs leave for ``branchgate dataset build --stage read``: ``doc_gate.py``.

Checked against langchain-core 1.8.3 and langchain-classic 1.0.8 (``.ci/integrations/langchain.txt``); needs the
``langchain`` extra (``pip install 'branchgate[langchain]'``).
"""

from __future__ import annotations

from collections.abc import Sequence

try:
    from langchain_core.documents import BaseDocumentCompressor, Document
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("the LangChain drop-in needs langchain-core: pip install 'branchgate[langchain]'") from exc
from pydantic import PrivateAttr

from branchgate.inference.agents.doc_gate import DocumentGate, doc_of


class ReadGateCompressor(BaseDocumentCompressor):
    """A read controller as a LangChain document compressor (module docstring). Arguments: ``DocumentGate``'s
    (``read``: a read controller's ``.onnx``, its folder, ``pretrained:read`` or a loaded Gate; ``trace``; ``tau``;
    ``floor``; ``budget_docs``; ``budget_tokens``)."""

    _gate: DocumentGate = PrivateAttr()

    def __init__(self, read="pretrained:read", trace=None, **options):
        super().__init__()
        self._gate = DocumentGate(read, trace, system="langchain", **options)

    @property
    def gate(self) -> DocumentGate:
        return self._gate

    def run(self, question: str | None = None, **options):
        """``with compressor.run(question):`` the retrievals inside are one run (``DocumentGate.run``)."""
        return self._gate.run(question, **options)

    def compress_documents(self, documents: Sequence[Document], query: str, callbacks=None) -> Sequence[Document]:
        documents = list(documents)
        kept = self._gate.filter(query, [doc_of(d.page_content, d.metadata) for d in documents])
        return [documents[i] for i in kept]

    def close(self) -> None:
        self._gate.close()
