"""``branchgate dataset build`` throughput: the torch embedding path against the ONNX one, and memory against runs.

    python benchmarks/bench_build.py [--traces PATH] [--runs 40] [--scale 4] [--workers N] [--repeat 1]

Input: ``--traces`` (a folder of canonical traces), else ``--runs`` runs simulated from the bundled sample
environment (``branchgate simulate --env sample``, ``data/samples/musique_sample``). Runs beyond what the
input holds are copies under new run ids.

1. Throughput: the same runs built twice, ``--embed torch`` then ``--embed onnx``, each in its own process with
   a cold embedding cache (a new ``--cache`` file). texts/s = texts embedded (cache misses) / (encoder load +
   embedding time, the manifest's ``load_s + embed_s``; for onnx that includes starting the workers and the
   parity check); the whole build's wall time is shown too. The ONNX tower is exported once beforehand (it is
   cached per encoder, in a temporary ``BRANCHGATE_CACHE``), and that one-time export is reported apart.
   The two datasets are compared row by row (teacher scores within 1e-5).
2. Memory: ``--embed onnx`` builds over N and ``--scale``×N runs (copies), peak RSS of the build process and of
   its process tree (with the workers), sampled every 0.2 s.

The last line is ``speedup N.NNx`` (ONNX texts/s over torch texts/s, median over ``--repeat``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def simulate(out: Path, runs: int, encoder: str, env: dict) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "branchgate",
        "simulate",
        "--env",
        "sample",
        "--out",
        str(out),
        "--runs",
        str(runs),
        "--encoder",
        encoder,
        "--no-progress",
    ]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out / "traces"


def replicate(src: Path, dst: Path, runs: int) -> int:
    """``runs`` canonical trace files in ``dst``: those of ``src``, then copies with new run ids (``~cN``)."""
    files = sorted(p for p in src.rglob("*.jsonl") if p.is_file())
    if not files:
        raise SystemExit(f"no canonical *.jsonl traces under {src}")
    dst.mkdir(parents=True, exist_ok=True)
    for i in range(runs):
        f, copy = files[i % len(files)], i // len(files)
        target = dst / (f.name if not copy else f"{f.stem}~c{copy}.jsonl")
        if not copy:
            shutil.copyfile(f, target)
            continue
        with open(f, encoding="utf-8") as fin, open(target, "w", encoding="utf-8") as fout:
            for line in fin:
                if line.strip():
                    ev = json.loads(line)
                    if "run_id" in ev:
                        ev["run_id"] = f"{ev['run_id']}~c{copy}"
                    fout.write(json.dumps(ev, ensure_ascii=False) + "\n")
    return runs


def tree_rss_kb(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (kB, from /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    ppid = int(fh.read().rpartition(")")[2].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                total += next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
        except OSError:
            pass
        todo.extend(children.get(p, []))
    return total


def run_build(traces: Path, out: Path, cache: Path, embed: str, encoder: str, workers: int | None, env: dict) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "branchgate",
        "dataset",
        "build",
        "--traces",
        str(traces),
        "--out",
        str(out),
        "--encoder",
        encoder,
        "--cache",
        str(cache),
        "--embed",
        embed,
        "--no-progress",
    ]
    if workers:
        cmd += ["--workers", str(workers)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = {"tree": 0}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak["tree"] = max(peak["tree"], tree_rss_kb(proc.pid))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"build failed ({' '.join(cmd)}):\n{stderr[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    t = m["timings"]
    misses = int(m["embedding_cache"]["misses"])
    embed_time = float(t.get("load_s", 0)) + float(t.get("embed_s", 0))
    return {
        "embed": embed,
        "wall_s": wall,
        "embed_s": embed_time,
        "texts": misses,
        "texts_per_s": misses / embed_time if embed_time > 0 else float("nan"),
        "rows": int(m["n_decisions"]["total"]),
        "runs": int(m["n_runs"]["total"]),
        "rss_mb": usage.ru_maxrss / 1024,
        "tree_rss_mb": peak["tree"] / 1024,
        "embedder": m.get("embedder"),
        "out": str(out),
    }


def compare(a: str, b: str) -> str:
    """Row-by-row comparison of two datasets: same columns and values, floats within 1e-5."""
    import datasets
    import numpy as np

    da, db = datasets.load_from_disk(a), datasets.load_from_disk(b)
    worst = 0.0
    for split in da:
        x, y = da[split], db[split]
        if x.column_names != y.column_names or len(x) != len(y):
            return f"DIFFERENT ({split}: columns or row counts)"
        for col in x.column_names:
            u, v = x[col], y[col]
            if getattr(x.features[col], "dtype", None) in ("float32", "float64"):
                u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
                if not np.array_equal(np.isnan(u), np.isnan(v)):
                    return f"DIFFERENT ({split}.{col}: NaNs)"
                d = np.abs(np.nan_to_num(u) - np.nan_to_num(v))
                worst = max(worst, float(d.max()) if d.size else 0.0)
            elif u != v:
                return f"DIFFERENT ({split}.{col})"
    return f"same rows and columns; max |Δ| of float columns {worst:.2g}" + ("" if worst <= 1e-5 else " (> 1e-5!)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default=None, help="folder of canonical traces (default: simulate the bundled sample)")
    p.add_argument("--runs", type=int, default=40, help="runs per throughput build (N)")
    p.add_argument("--scale", type=int, default=4, help="memory: builds over N and scale×N runs (0: skip)")
    p.add_argument("--workers", type=int, default=None, help="--embed onnx workers (default: available cores)")
    p.add_argument("--repeat", type=int, default=1, help="throughput measurements (torch, onnx) pairs")
    p.add_argument("--encoder", default="packaged")
    p.add_argument("--work", default=None, help="work folder (default: a temporary one, removed)")
    a = p.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="bench_build."))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", BRANCHGATE_CACHE=str(work / "bgcache"))
    try:
        if a.traces:
            base = Path(a.traces)
        else:
            t = time.perf_counter()
            base = simulate(work / "sim", a.runs, a.encoder, env)
            print(f"simulated {a.runs} runs of the bundled sample in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        traces = work / "traces_n"
        replicate(base, traces, a.runs)
        # the one-time export of the ONNX tower (cached per encoder), outside the timed builds
        one = work / "traces_1"
        replicate(base, one, 1)
        t = time.perf_counter()
        warm = run_build(one, work / "ds_warm", work / "warm.sqlite", "onnx", a.encoder, a.workers, env)
        print(
            f"one-time ONNX export + parity reference: {time.perf_counter() - t:.1f} s "
            f"(tower {warm['embedder']['tower']})",
            file=sys.stderr,
        )

        results = []
        for r in range(a.repeat):
            for embed in ("torch", "onnx"):
                res = run_build(
                    traces,
                    work / f"ds_{embed}_{r}",
                    work / f"cold_{embed}_{r}.sqlite",
                    embed,
                    a.encoder,
                    a.workers,
                    env,
                )
                results.append(res)
                print(
                    f"  {embed}: {res['texts']} texts in {res['embed_s']:.1f} s → {res['texts_per_s']:.1f} texts/s "
                    f"(build {res['wall_s']:.1f} s)",
                    file=sys.stderr,
                )
        same = compare(results[0]["out"], results[1]["out"])

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        onnx_workers = results[1]["embedder"].get("workers")
        print(
            f"\ndataset build, {a.runs} runs, encoder {a.encoder}, {cores} cores (load avg "
            f"{os.getloadavg()[0]:.1f}), onnx workers {onnx_workers}, cold embedding cache"
        )
        print(
            f"{'path':<7} {'texts':>6} {'embed s':>8} {'texts/s':>8} {'build s':>8} {'peak RSS MB':>12} {'tree MB':>8}"
        )
        for res in results:
            print(
                f"{res['embed']:<7} {res['texts']:>6} {res['embed_s']:>8.1f} {res['texts_per_s']:>8.1f} "
                f"{res['wall_s']:>8.1f} {res['rss_mb']:>12.0f} {res['tree_rss_mb']:>8.0f}"
            )
        print(f"datasets (torch vs onnx): {same}")
        parity = results[1]["embedder"].get("parity_max_abs_diff")
        print(f"parity check at start: max |Δ| {parity:.2g} on the probes (tolerance 1e-6)")

        if a.scale and a.scale > 1:
            print("\nmemory against runs (--embed onnx, cold cache; copies share texts)")
            print(f"{'runs':>6} {'rows':>7} {'build s':>8} {'peak RSS MB':>12} {'tree MB':>8}")
            for n in (a.runs, a.scale * a.runs):
                folder = work / f"traces_mem_{n}"
                replicate(base, folder, n)
                res = run_build(
                    folder, work / f"ds_mem_{n}", work / f"mem_{n}.sqlite", "onnx", a.encoder, a.workers, env
                )
                print(
                    f"{res['runs']:>6} {res['rows']:>7} {res['wall_s']:>8.1f} {res['rss_mb']:>12.0f} "
                    f"{res['tree_rss_mb']:>8.0f}"
                )
                shutil.rmtree(work / f"ds_mem_{n}", ignore_errors=True)

        torch_rates = [r["texts_per_s"] for r in results if r["embed"] == "torch"]
        onnx_rates = [r["texts_per_s"] for r in results if r["embed"] == "onnx"]
        speedups = [o / t for o, t in zip(onnx_rates, torch_rates)]
        if len(speedups) > 1:
            print("speedups per repeat: " + ", ".join(f"{s:.2f}x" for s in speedups))
        print(f"speedup {statistics.median(speedups):.2f}x")
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
