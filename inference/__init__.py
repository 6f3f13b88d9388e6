"""Ship the controller: ONNX export (torch side) and the torch-free Gate with its plug-ins.

- ``gate``: ``Gate.load(path)`` → ``select(state, candidates)``; core install only (numpy, onnxruntime, tokenizers).
- ``adapters``: ``gated(fn, gate)`` wraps any sync/async candidate-generating function.
- ``gpt_researcher``: ``gate_deep_research(researcher, gate, trace)`` for GPT-Researcher's deep research.
- ``export`` (needs the train extra): ``export_controller(ckpt, out, int8=True, parity_dataset=None, force=False)``.
- ``bench``: latency of torch vs ONNX fp32/int8 on identical decisions (``branchgate bench-gate``).
"""
