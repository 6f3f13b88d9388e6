"""The core runtime, split by job (numpy, onnxruntime, tokenizers, pydantic only):

- this folder: the torch-free Gate and run budgets. ``gate``: ``Gate.load(path)`` → ``select(state, candidates)``
  (a read controller: ``select(read_state, hits)``); ``teacher_gate``: a teacher behind ``select``;
  ``read_state``: the read decision's state and keep rule (one for the hook, the simulator and replay);
  ``run_gate``: ``RunGate``, a run under a budget, with its ``budget`` (the ledger); ``inputs``: what a decision
  is and how loose inputs become one; ``selection``: the answer; ``metadata``: the ONNX metadata contract;
  ``model_file``: reads an ONNX file's metadata without loading it; ``gate_texts``, ``schedule``, ``wordpiece``:
  the text side (tokenising, length buckets, text groups); ``options``: the command line's controller names;
  ``gate_cli``: ``branchgate gate``.
- ``agents/``: the agent integrations (``gated`` for any function, GPT-Researcher, open_deep_research, LangChain,
  LlamaIndex, the trace recorder and the read hook they share).
- ``server/``: ``branchgate serve``, HTTP/JSON over both stages and run budgets (the serve extra).

Exporting a controller (torch side) lives in ``branchgate.export``.
"""

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")
