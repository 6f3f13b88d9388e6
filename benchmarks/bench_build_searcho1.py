"""``dataset build`` on one long Search-o1 run (issue 62, item 11): the rows' time with the teachers' BLAS threads
left as they are against one BLAS thread (``logs_to_dataset.labels.one_blas_thread``), in one invocation.

    python benchmarks/bench_build_searcho1.py [--searches 1500] [--docs 3] [--dim 384] [--full]

A Search-o1 trace of ``--searches`` searches (``--docs`` documents each) is written to a temporary folder, read,
cut into decision points, and its rows built with every teacher over random ``--dim``-dim unit vectors (the
encoder's width: 384 for MiniLM and bge-small) — the part of a build that grows with the run. Each arm runs in its
own fresh process, one after the other: ``threads`` (the BLAS pool as numpy starts it: every core) and ``one``
(the build's rule). The last line is ``speedup N.NNx`` (threads' rows time over one's). ``--full`` also times the
whole ``branchgate dataset build`` of the trace (packaged encoder, cold cache) and prints its manifest's timings.
The per-decision work itself is held to the caps' window by ``tests/test_limits.py`` (no time asserted there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARM = """
import contextlib, json, sys, time
import numpy as np
if sys.argv[2] == "threads":  # the BLAS pool as numpy starts it: undo the build's one-thread rule
    import threadpoolctl
    threadpoolctl.threadpool_limits = lambda *a, **k: contextlib.nullcontext()
from branchgate.logs_to_dataset.decision_points import run_decisions
from branchgate.logs_to_dataset.label_sources import run_info
from branchgate.logs_to_dataset.labels import RowBuilder
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.models import teachers as T

dim = int(sys.argv[3])
builder = RowBuilder({n: T.get(n) for n in T.NAMES}, "sc")
rng = np.random.default_rng(0)
t0 = time.perf_counter()
(run,) = list(read_runs([sys.argv[1]]))
rd = run_decisions(run.run_id, run.events, run.file)
info = run_info(run.events)
texts = builder.texts(rd, info)
vecs = rng.standard_normal((len(texts), dim)).astype(np.float32)
vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
t1 = time.perf_counter()
rows = builder.rows(rd, dict(zip(texts, vecs)), dim, info)
t2 = time.perf_counter()
print(json.dumps({"read_s": t1 - t0, "rows_s": t2 - t1, "rows": len(rows), "texts": len(texts)}))
"""


def searcho1_trace(folder: Path, n: int, docs: int) -> Path:
    """One Search-o1 run of ``n`` searches (``docs`` documents each) in ``folder`` (the tests' generator)."""
    folder.mkdir(parents=True)
    (folder / "9100001.q").write_text("what is topic zero")
    parts = []
    for i in range(n):
        parts.append(
            f"<|begin_search_query|>search {i} about subtopic {i % 97}<|end_search_query|>\n"
            "<|begin_search_result|>"
            + "".join(
                f"Doc {k + 1} (URL: https://ex.org/{i}/{k}, ClueWebID: cw-{i}-{k})\n"
                f"document {i} {k} about subtopic {i % 97}, word{i * 7 + k}\n"
                for k in range(docs)
            )
            + f"<|end_search_result|>\nthinking after search {i}\n"
        )
    (folder / "9100001.a").write_text("".join(parts) + "Final answer: done.")
    return folder / "9100001.a"


def arm(trace: Path, name: str, dim: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", ARM, str(trace), name, str(dim)], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def full_build(trace: Path, tmp: Path) -> dict:
    env = dict(os.environ, BRANCHGATE_CACHE=str(tmp / "cache"))
    out = tmp / "ds"
    cmd = [sys.executable, "-m", "branchgate", "dataset", "build", "--traces", str(trace.parent), "--out", str(out)]
    cmd += ["--encoder", "packaged", "--labels", "teacher:sc", "--no-progress"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    manifest = json.loads((out / "manifest.json").read_text())
    return {"wall_s": time.perf_counter() - t, "timings": manifest.get("timings", {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--searches", type=int, default=1500)
    ap.add_argument("--docs", type=int, default=3)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--full", action="store_true", help="also time the whole dataset build (packaged encoder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_build_searcho1.") as tmp:
        tmp = Path(tmp)
        trace = searcho1_trace(tmp / "Searcho1_ClueWeb22", args.searches, args.docs)
        print(
            f"trace: 1 run, {args.searches} searches x {args.docs} documents; {args.dim}-dim vectors; "
            f"{os.cpu_count()} cores"
        )
        got = {}
        for name in ("threads", "one"):
            got[name] = r = arm(trace, name, args.dim)
            print(
                f"{name:>7} BLAS thread(s): rows {r['rows_s']:.1f} s for {r['rows']} rows "
                f"({1000 * r['rows_s'] / max(1, r['rows']):.1f} ms a decision; read {r['read_s']:.1f} s, "
                f"{r['texts']} texts)"
            )
        if args.full:
            print("full dataset build:", json.dumps(full_build(trace, tmp)))
        print(f"speedup {got['threads']['rows_s'] / got['one']['rows_s']:.2f}x")


if __name__ == "__main__":
    main()
