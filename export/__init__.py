"""Ship a trained controller as ONNX (needs the ``train`` extra: torch, onnx).

- ``controller``: ``export_controller(checkpoint, out, int8=True, parity_dataset=None, force=False)``;
- ``graph``, ``packed_tower``, ``parts``: the exported graph (text tower + value network), its packed BERT
  tower, and the rewrite that makes tower and head skippable;
- ``parity``: the checks an export must pass; ``torch_ref``: the torch reference of one decision;
- ``card``: the model card, rendered from ``card.md``; ``samples``: built-in decisions;
- ``latency`` / ``latency_cli``: latency of torch vs ONNX fp32/int8 on identical decisions (``branchgate bench-gate``);
- ``onnx_encoder`` / ``onnx_tower``: the dataset build's ONNX text tower (exported once per encoder, checked
  against torch).
"""

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")
