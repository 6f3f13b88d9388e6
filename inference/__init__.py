"""The core runtime: the torch-free Gate and its plug-ins (numpy, onnxruntime, tokenizers only).

- ``gate``: ``Gate.load(path)`` → ``select(state, candidates)`` (a read controller: ``select(read_state, hits)``);
  ``inputs``: what a decision is and how loose inputs become one; ``metadata``: the ONNX metadata contract;
  ``schedule``: text groups and length buckets; ``wordpiece``: the ASCII tokeniser fast path; ``model_file``: reads
  an ONNX file's metadata without loading it.
- ``adapters``: ``gated(fn, gate)`` wraps any sync/async candidate-generating function.
- ``gpt_researcher``: ``gate_research(researcher, gate, trace)`` for GPT-Researcher (standard and deep mode);
  ``open_deep_research``: ``gate_open_deep_research(gate, trace)`` for LangChain's open_deep_research;
  ``recorder``: the trace writing both share.

Exporting a controller (torch side) lives in ``branchgate.export``.
"""

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")
