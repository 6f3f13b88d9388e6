"""The core runtime, split by job (numpy, onnxruntime, tokenizers only):

- this folder: the torch-free Gate and run budgets. ``gate``: ``Gate.load(path)`` → ``select(state, candidates)``
  (a read controller: ``select(read_state, hits)``); ``run_gate``: ``RunGate``, a run under a budget, with its
  ``ledger``; ``inputs``: what a decision is and how loose inputs become one; ``metadata``: the ONNX metadata
  contract; ``schedule``: text groups and length buckets; ``wordpiece``: the ASCII tokeniser fast path;
  ``model_file``: reads an ONNX file's metadata without loading it; ``teacher_gate``: a teacher behind ``select``.
- ``agents/``: the agent integrations (``gated`` for any function, GPT-Researcher, open_deep_research, the trace
  recorder and the read hook they share).
- ``server/``: ``branchgate serve``, HTTP/JSON over both stages and run budgets (the serve extra).

Exporting a controller (torch side) lives in ``branchgate.export``.
"""

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")
