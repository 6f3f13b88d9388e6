"""What bounds the dataset build's embedding rate: the frozen encoder's own speed on the build's texts.

    python3 -m research.encoder_ceiling [--traces PATH | --runs 40] [--encoder packaged] [--threads 2]

Collects the texts ``dataset build`` embeds for these runs (a build whose encoder only records them), then
times, in this one process, on the same texts (after a warm-up):

- the fp32 ONNX tower in one session with one thread (``export.onnx_encoder.embed_texts``): what one build
  worker does;
- the torch encoder (sentence-transformers) with 1 and ``--threads`` threads: the old path's embedding;
- where the ONNX session spends its time (onnxruntime's profiler, share of node time per operator).

The ceiling of ``benchmarks/bench_build.py``'s ratio follows: ``--threads`` workers × the one-thread ONNX rate
over the torch rate at ``--threads`` threads (plus, for the torch path, its load time, which bench_build counts).
Without ``--traces`` the runs are simulated on the bundled sample, as bench_build does.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


class _Recorder:
    """An encoder stand-in for the build: remembers every text it is asked for, returns unit vectors."""

    def __init__(self, spec):
        self.spec, self.id, self.dim, self.max_length = spec, spec.id, 8, 256
        self.texts: list[str] = []

    def encode(self, texts, batch_size: int = 64, show_progress: bool = False):
        self.texts.extend(texts)
        v = np.ones((len(texts), self.dim), np.float32)
        return v / np.sqrt(self.dim)


def build_texts(traces: Path, encoder: str, work: Path) -> list[str]:
    from branchgate.logs_to_dataset.build import build
    from branchgate.models.encoder import resolve

    rec = _Recorder(resolve(encoder))
    build([traces], work / "ds", encoder_obj=rec, cache=work / "rec.sqlite", progress=False)
    return list(dict.fromkeys(rec.texts))


def rate(fn, texts: list[str]) -> float:
    fn(texts[:64])  # warm-up
    t = time.perf_counter()
    fn(texts)
    return len(texts) / (time.perf_counter() - t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default=None, help="folder of canonical traces (default: simulate the bundled sample)")
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--encoder", default="packaged")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="encoder_ceiling."))
    if a.traces:
        traces = Path(a.traces)
    else:
        from branchgate.pipeline.config import Config
        from branchgate.pipeline.simulate import simulate

        simulate("sample", Config(encoder=a.encoder), work / "sim", runs=a.runs, progress=False)
        traces = work / "sim" / "traces"
    texts = build_texts(traces, a.encoder, work)
    from branchgate.export.onnx_encoder import _runner, embed_texts, prepare_tower
    from branchgate.models.encoder import Encoder, resolve

    enc = Encoder(resolve(a.encoder))
    tower = prepare_tower(enc)
    r = _runner(tower)
    lengths = r.tokens(texts)["attention_mask"].sum(1)
    print(
        f"{len(texts)} distinct texts; tokens per text: median {np.median(lengths):.0f}, "
        f"90th percentile {np.percentile(lengths, 90):.0f}, max {lengths.max()}"
    )
    onnx1 = rate(lambda t: embed_texts(t, tower), texts)

    import torch

    torch_rates = {}
    for n in sorted({1, a.threads}):
        torch.set_num_threads(n)
        torch_rates[n] = rate(lambda t: enc.encode(t), texts)

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.enable_profiling = True
    opts.profile_file_prefix = str(work / "ort")
    sess = ort.InferenceSession(str(tower.onnx), opts, providers=["CPUExecutionProvider"])
    for _, ids, mask in r.batches(texts[:800]):
        sess.run(["text_emb"], {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)})
    ops: collections.Counter = collections.Counter()
    for ev in json.loads(Path(sess.end_profiling()).read_text()):
        if ev.get("cat") == "Node":
            ops[ev["args"].get("op_name")] += ev["dur"]
    total = sum(ops.values()) or 1

    print(f"onnx fp32, 1 session, 1 thread: {onnx1:.0f} texts/s")
    for n, v in torch_rates.items():
        print(f"torch, {n} thread(s): {v:.0f} texts/s")
    print("onnx node time: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in ops.most_common(4)))
    print(
        f"ceiling of the embedding ratio on {a.threads} cores (without torch's load time): "
        f"{a.threads * onnx1 / torch_rates[a.threads]:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
