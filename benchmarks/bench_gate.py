"""Gate latency benchmark: torch fp32 vs ONNX fp32 vs ONNX int8 on identical decisions (prints figures).

    python benchmarks/bench_gate.py                                     # untrained controller on the packaged encoder
    python benchmarks/bench_gate.py --checkpoint RUN/controller.safetensors # a trained one (exported next to --out)
    python benchmarks/bench_gate.py --encoder bge-shape                 # untrained, on a stand-in shaped like bge-small

Latency does not depend on the weights, so without a checkpoint an untrained ValueNet is exported.
Same as `branchgate bench-gate`, plus the export step.

``bge-shape`` measures the default encoder's shape where BAAI/bge-small-en-v1.5 cannot be downloaded:
bge-small is all-MiniLM-L6-v2's architecture (BERT, 384 wide, 12 heads, 1536 FFN, same vocabulary) with
12 layers instead of 6 and CLS pooling, so the stand-in is the packaged model with each layer run twice
(the second copy scaled by 1.0001, so the weights stay distinct and all are quantised) and CLS pooling.
Its embeddings mean nothing; its speed is bge-small's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--out", default=None, help="directory for the exported model (default: a temp dir)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument(
        "--encoder",
        default="packaged",
        help="encoder of the untrained controller: a name, a local dir, or bge-shape (default packaged)",
    )
    args = parser.parse_args()

    from branchgate.export.controller import export_controller
    from branchgate.export.latency import measure_latency

    out = Path(args.out or tempfile.mkdtemp(prefix="bench-gate-"))
    ckpt = args.checkpoint
    if ckpt is None:
        import torch

        from branchgate.models.encoder import Encoder
        from branchgate.models.value_model import ValueNet
        from branchgate.training.checkpoint import make_meta, save_controller

        torch.manual_seed(0)
        encoder = Encoder.load(bge_shape(out / "bge-shape") if args.encoder == "bge-shape" else args.encoder)
        ckpt = str(
            save_controller(out / "untrained.safetensors", ValueNet(encoder.dim).eval(), make_meta(encoder, tau=0.5))
        )
    model = out / "controller.onnx"
    report = export_controller(ckpt, model, int8=True)
    print(f"export parity: {json.dumps(report['parity'])}", file=sys.stderr)
    res = measure_latency(str(model), ckpt, threads=args.threads, reps=args.reps)
    print(json.dumps(res, indent=2))
    return 0


def bge_shape(folder: Path) -> str:
    """Write the bge-small-shaped stand-in (see the module docstring) to ``folder``; returns its path."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from branchgate.models.encoder import packaged_path

    src = Path(packaged_path())
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "modules.json"):
        (folder / name).write_bytes((src / name).read_bytes())
    edits = {
        "config.json": {"num_hidden_layers": 12},
        "sentence_bert_config.json": {"max_seq_length": 512, "do_lower_case": True},
        "1_Pooling/config.json": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
    }
    for name, changes in edits.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(json.dumps({**json.loads((src / name).read_text()), **changes}, indent=2))
    weights = {}
    for key, value in load_file(str(src / "model.safetensors")).items():
        parts = key.split(".")
        if key.startswith("encoder.layer."):
            layer = int(parts[2])
            weights[".".join(parts[:2] + [str(2 * layer)] + parts[3:])] = value
            weights[".".join(parts[:2] + [str(2 * layer + 1)] + parts[3:])] = (value * np.float32(1.0001)).astype(
                value.dtype
            )
        else:
            weights[key] = value
    save_file(weights, str(folder / "model.safetensors"))
    return str(folder)


if __name__ == "__main__":
    raise SystemExit(main())
