"""What a second core buys the ONNX Gate, fp32 vs int8 (prints figures).

    python3 -m research.int8_threads --model DIR/controller.onnx [--reps 15]

Feeds the graph exactly what the Gate feeds it for the built-in sample decisions (cold cache) and times,
in one process with the order of configurations rotating each round (p50 ms per decision):

- the whole graph and its text tower alone (the head part skipped: no candidates), fp32 and int8, on 1
  and 2 intra-op threads; the ratio 1-thread / 2-thread is what the second core buys inside one run;
- the same tower run as two halves of the texts at once, from two threads through one 1-thread session
  (data parallel instead of intra-op parallel: what the Gate does);
- one int8 and one fp32 matrix product the size of a feed-forward layer on these decisions
  (256 × 384 · 384 × 1536), alone, on 2 intra-op threads, and as two concurrent 1-thread runs, to show
  whether the cores themselves scale.

Needs a controller exported with skippable parts (metadata ``parts``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def gate_feeds(model: Path) -> list[dict]:
    """The graph inputs the Gate builds for the sample decisions, each with an empty cache."""
    from branchgate.export.samples import sample_decisions
    from branchgate.inference.gate import Gate
    from branchgate.inference.inputs import as_decision

    gate = Gate.load(model, threads=1)
    session, feeds = gate.session, []

    class Recorder:
        def run(self, names, feed):
            feeds.append(dict(feed))
            return session.run(names, feed)

    gate.session = Recorder()
    for state, cands in (as_decision(s, c) for s, c in sample_decisions()):
        gate.clear_cache()
        gate.predict(state, cands)
    return feeds


def session(path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def halves(feed: dict) -> list[dict]:
    """The texts of one feed in two groups of about equal token counts, as the Gate splits them."""
    from branchgate.inference.schedule import balanced_groups

    lengths = feed["attention_mask"].sum(1)

    def take(rows):
        width = int(lengths[rows].max())
        return dict(
            feed, input_ids=feed["input_ids"][rows, :width], attention_mask=feed["attention_mask"][rows, :width]
        )

    return [take(rows) for rows in balanced_groups(lengths, 2)]


class Pair:
    """One 1-thread session run from two threads; ``run`` computes two feeds at once (the second on a
    standing worker thread, so no thread is started per call)."""

    def __init__(self, path):
        self.session = session(path, 1)
        self.go, self.done, self.feed = threading.Event(), threading.Event(), None
        threading.Thread(target=self._work, daemon=True).start()

    def _work(self):
        while True:
            self.go.wait()
            self.go.clear()
            self.session.run(None, self.feed)
            self.done.set()

    def run(self, feeds):
        self.feed = feeds[1]
        self.done.clear()
        self.go.set()
        self.session.run(None, feeds[0])
        self.done.wait()


def matmul_models(tmp: Path) -> dict[str, Path]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    k, n = 384, 1536
    w = (np.random.default_rng(0).standard_normal((k, n)) * 0.05).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp / "mm_fp32.onnx"))
    quantize_dynamic(
        str(tmp / "mm_fp32.onnx"), str(tmp / "mm_int8.onnx"), weight_type=QuantType.QInt8, per_channel=True
    )
    return {"fp32": tmp / "mm_fp32.onnx", "int8": tmp / "mm_int8.onnx"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help="controller.onnx (its .int8.onnx twin is used too) or its directory"
    )
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()

    from branchgate.export.controller import paths_for

    fp32 = Path(args.model)
    fp32 = fp32 / "controller.onnx" if fp32.is_dir() else fp32
    models = {"fp32": fp32, "int8": paths_for(fp32)["int8"]}
    if not models["int8"].is_file():
        raise SystemExit(f"{models['int8']}: missing (export with --int8)")
    from branchgate.export.parts import PARTS
    from branchgate.inference.model_file import read_metadata

    if read_metadata(fp32).get("parts") != PARTS:
        raise SystemExit(f"{fp32}: exported without skippable parts; re-export it with this branchgate")
    feeds = gate_feeds(models["fp32"])
    no_head = {"cand_idx": np.zeros(0, np.int64), "features": np.zeros((0, feeds[0]["features"].shape[1]), np.float32)}
    tower_feeds = [dict(f, **no_head) for f in feeds]
    split_feeds = [halves(f) for f in tower_feeds]
    x = np.random.default_rng(1).standard_normal((256, 384)).astype(np.float32)

    cases = {}  # name -> (callable(i) for decision i, number of calls per round)
    for prec, path in models.items():
        for threads in (1, 2):
            whole = session(path, threads)
            cases[f"{prec} graph, {threads} thread(s)"] = (lambda i, s=whole: s.run(None, feeds[i]), len(feeds))
            cases[f"{prec} tower, {threads} thread(s)"] = (lambda i, s=whole: s.run(None, tower_feeds[i]), len(feeds))
        pair = Pair(path)
        cases[f"{prec} tower, two halves at once"] = (lambda i, p=pair: p.run(split_feeds[i]), len(feeds))
    with tempfile.TemporaryDirectory(prefix="int8-threads-") as tmp:  # sessions hold the models once loaded
        for prec, path in matmul_models(Path(tmp)).items():
            one, pair = session(path, 1), Pair(path)
            two = session(path, 2)
            cases[f"{prec} 256x384x1536 matmul, 1 thread"] = (lambda i, s=one: s.run(None, {"x": x}), 20)
            cases[f"{prec} 256x384x1536 matmul, 2 threads"] = (lambda i, s=two: s.run(None, {"x": x}), 20)
            cases[f"{prec} 256x384x1536 matmul, two at once on 1 thread each"] = (
                lambda i, p=pair: p.run([{"x": x}, {"x": x}]),
                20,
            )

    names = list(cases)
    times = {name: [] for name in names}
    for r in range(args.reps):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            call, n = cases[name]
            time.sleep(0.05)  # lets the previous configuration's threads stop spinning
            call(0)  # untimed: wakes this configuration's threads
            for i in range(n):
                t = time.perf_counter()
                call(i % len(feeds))
                times[name].append((time.perf_counter() - t) * 1000.0)
    p50 = {name: float(np.median(ts)) for name, ts in times.items()}
    print(
        f"{len(feeds)} decisions, {int(np.mean([f['attention_mask'].sum() for f in feeds]))} tokens each on average, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    for name in names:
        print(f"{p50[name]:8.3f} ms  {name}")
    for prec in models:
        print(
            f"{prec}: second core speeds the graph up "
            f"{p50[f'{prec} graph, 1 thread(s)'] / p50[f'{prec} graph, 2 thread(s)']:.2f}x, "
            f"the tower {p50[f'{prec} tower, 1 thread(s)'] / p50[f'{prec} tower, 2 thread(s)']:.2f}x, "
            "two halves at once "
            f"{p50[f'{prec} tower, 1 thread(s)'] / p50[f'{prec} tower, two halves at once']:.2f}x; "
            "the tower is "
            f"{100 * p50[f'{prec} tower, 2 thread(s)'] / p50[f'{prec} graph, 2 thread(s)']:.0f}% of the graph"
        )
        mm = f"{prec} 256x384x1536 matmul"
        print(
            f"{prec} matmul: 2 threads {p50[mm + ', 1 thread'] / p50[mm + ', 2 threads']:.2f}x, "
            "two concurrent 1-thread runs "
            f"{2 * p50[mm + ', 1 thread'] / p50[mm + ', two at once on 1 thread each']:.2f}x throughput"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
