"""Gate latency benchmark: torch fp32 vs ONNX fp32 vs ONNX int8 on identical decisions (prints figures).

    python benchmarks/bench_gate.py                        # untrained controller on the packaged encoder
    python benchmarks/bench_gate.py --checkpoint CKPT      # a trained one (exported next to --out)

Latency does not depend on the weights, so without a checkpoint an untrained ValueNet is exported.
Same as `branchgate bench-gate`, plus the export step.
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
    args = parser.parse_args()

    from branchgate.inference.bench import run_bench
    from branchgate.inference.export import export_controller

    out = Path(args.out or tempfile.mkdtemp(prefix="bench-gate-"))
    ckpt = args.checkpoint
    if ckpt is None:
        import torch

        from branchgate.models.encoder import Encoder
        from branchgate.models.value_model import ValueNet
        from branchgate.training.checkpoint import make_meta, save_controller

        torch.manual_seed(0)
        encoder = Encoder.load("packaged")
        ckpt = str(save_controller(out / "untrained.ckpt", ValueNet(encoder.dim).eval(), make_meta(encoder, tau=0.5)))
    model = out / "controller.onnx"
    report = export_controller(ckpt, model, int8=True)
    print(f"export parity: {json.dumps(report['parity'])}", file=sys.stderr)
    res = run_bench(str(model), ckpt, threads=args.threads, reps=args.reps)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
