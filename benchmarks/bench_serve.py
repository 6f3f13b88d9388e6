"""Load test of `branchgate serve` on 127.0.0.1: throughput and p50/p99 latency at 1, 8 and 32 clients (a
benchmark, not a test; the figures are in docs/use/serve.md).

    python3 benchmarks/bench_serve.py                                  # exports an untrained pre + read controller
    python3 benchmarks/bench_serve.py --pre PRE.onnx --read READ.onnx  # your controllers
    python3 benchmarks/bench_serve.py --requests 400 --seconds 60 --clients 1 8 32 --out serve_bench.json
    python3 benchmarks/bench_serve.py --pre pretrained:pre-model --read pretrained:read-model --workers 1 2

With ``--workers 1 2`` the same levels run against a server of each worker count (both up at once, on one
``--store``: a new SQLite file unless given; each level against one server then the other, next to each other in
time), and the report adds each level's throughput with two workers over one, from the same run. A third endpoint,
``/v1/runs/{run_id}/select`` on one unlimited run, measures the store's read-decide-write (compare-and-set) under
load.

One server process (``branchgate serve``, uvicorn, access log off) is started as a subprocess; one client process
(this one: httpx's async client, one connection per client) sends ``--requests`` requests per level or stops after
``--seconds``. ``/v1/select`` gets decisions of 8 candidates, ``/v1/read`` of 10 hits; every request's candidate or
hit texts are new (a counter in each), so the Gate encodes them rather than answering from its embedding cache.
Latency does not depend on the weights, so without ``--pre``/``--read`` an untrained ValueNet on the packaged
encoder is exported twice (stage pre, stage read; needs the train extra). The in-process figure is
``Gate.select`` on the same kind of decisions in this process, one at a time, with the server idle; the ratio is
the HTTP p50 at 1 client over it. Client and server share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
READY = re.compile(r"(?:Uvicorn running|branchgate serve: listening) on (http://[^\s)]+)")


def start_server(
    argv: list[str], timeout: float = 180.0, cwd=None, cache: str | None = None
) -> tuple[subprocess.Popen, str, list[str]]:
    """``branchgate serve ARGV --port 0`` as a subprocess → (process, its base URL, its log lines so far and to
    come). Its stderr is drained by a thread (a full pipe would stall the server); stdout goes nowhere. ``cache``:
    its ``BRANCHGATE_CACHE`` (default a new empty folder, so runs kept by the default SQLite store of an earlier
    server never meet this one's)."""
    cmd = [sys.executable, "-m", "branchgate", "serve", *argv, "--port", "0"]
    env = {**os.environ, "BRANCHGATE_CACHE": cache or tempfile.mkdtemp(prefix="branchgate-serve-")}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    lines: list[str] = []
    urls: queue.Queue = queue.Queue()

    def drain():
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            found = READY.search(line)
            if found:
                urls.put(found.group(1))
        urls.put(None)

    threading.Thread(target=drain, daemon=True).start()
    try:
        url = urls.get(timeout=timeout)
    except queue.Empty:
        url = None
    if url is None:
        stop_server(proc)
        raise RuntimeError("branchgate serve did not start:\n" + "\n".join(lines[-30:]))
    return proc, url, lines


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def select_body(i: int) -> dict:
    """A pre-retrieval decision of 8 candidates, every candidate text new (``i``)."""
    from branchgate.export.samples import sample_decisions

    decisions = sample_decisions()
    state, cands = decisions[i % len(decisions)]
    cands = (cands * 2)[:8]
    return {
        "state": state,
        "candidates": [{"query": f"{c['query']} #{i}.{j}", "goal": c["goal"]} for j, c in enumerate(cands)],
    }


def read_body(i: int) -> dict:
    """A read decision of 10 hits, every hit text new (``i``)."""
    from branchgate.export.samples import sample_read_decisions

    decisions = sample_read_decisions()
    state, hits = decisions[i % len(decisions)]
    return {"state": state, "hits": [{**h, "title": f"{h['title']} #{i}", "id": f"{h['id']}#{i}"} for h in hits]}


BODIES = {"/v1/select": select_body, "/v1/read": read_body}
RUN_PATH = "/v1/runs/{run_id}/select"  # a budgeted run's decisions: select_body on one unlimited run


def body_for(path: str):
    return BODIES.get(path, select_body)


async def level(url: str, path: str, clients: int, requests: int, seconds: float, start: int) -> dict:
    """``clients`` concurrent clients sending ``path`` requests until ``requests`` are sent or ``seconds`` pass."""
    import httpx

    bodies = [json.dumps(body_for(path)(start + i)).encode() for i in range(requests)]
    latencies: list[float] = []
    errors: list[str] = []
    sent = 0
    deadline = time.perf_counter() + seconds
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(http):
        nonlocal sent
        while sent < requests and time.perf_counter() < deadline:
            body, sent = bodies[sent], sent + 1
            t0 = time.perf_counter()
            try:
                r = await http.post(url + path, content=body, headers=headers)
                ok = r.status_code == 200
                if not ok:
                    errors.append(f"{r.status_code} {r.text[:200]}")
            except httpx.HTTPError as exc:
                ok = False
                errors.append(repr(exc)[:200])
            if ok:
                latencies.append(time.perf_counter() - t0)

    async with httpx.AsyncClient(limits=limits, timeout=120) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return {
        "path": path,
        "clients": clients,
        "requests": sent,
        "ok": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(wall, 3),
        "throughput_rps": round(len(latencies) / wall, 1),
        **percentiles(latencies),
    }


def percentiles(latencies: list[float]) -> dict:
    import numpy as np

    if not latencies:
        return {"p50_ms": None, "p99_ms": None}
    ms = np.asarray(latencies) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def in_process(model: str, path: str, threads: int | None, n: int) -> dict:
    """``Gate.select`` latency of ``n`` decisions like the HTTP ones, one at a time, in this process."""
    from branchgate.inference.gate import Gate

    gate = Gate.load(model, threads=threads)
    times = []
    for i in range(n + 5):
        body = BODIES[path](10_000_000 + i)
        items = body["candidates"] if path == "/v1/select" else body["hits"]
        t0 = time.perf_counter()
        gate.select(body["state"], items)
        if i >= 5:  # the first calls warm the session up
            times.append(time.perf_counter() - t0)
    return {"path": path, "decisions": n, **percentiles(times)}


def untrained_controllers(folder: Path) -> tuple[str, str]:
    """An untrained ValueNet on the packaged encoder exported as a pre and as a read controller (fp32)."""
    import torch

    from branchgate.export.controller import export_controller
    from branchgate.models.encoder import Encoder
    from branchgate.models.value_model import ValueNet
    from branchgate.training.checkpoint import make_meta, save_controller

    torch.manual_seed(0)
    encoder = Encoder.load("packaged")
    net = ValueNet(encoder.dim).eval()
    out = []
    for stage in ("pre", "read"):
        meta = {**make_meta(encoder, tau=0.5), "stage": stage}
        ckpt = save_controller(folder / stage / "controller.safetensors", net, meta)
        model = folder / stage / "controller.onnx"
        export_controller(str(ckpt), model, int8=False, encoder=encoder, max_decisions=4)
        out.append(str(model))
    return out[0], out[1]


def table(rows: list[dict], local: dict) -> str:
    """The results as a Markdown table, then the in-process figures and, with two worker counts, their ratios."""
    keys = ("workers", "clients", "ok", "throughput_rps", "p50_ms", "p99_ms", "errors")
    lines = [
        "| endpoint | workers | clients | requests | throughput (req/s) | p50 (ms) | p99 (ms) | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| `{r['endpoint']}` | " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    for path, r in local.items():
        lines.append(
            f"in-process `Gate.select` ({path}): p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms; "
            f"HTTP p50 at 1 client / in-process p50 = {r['ratio']}"
        )
    for r in worker_ratios(rows):
        lines.append(f"`{r['endpoint']}` at {r['clients']} clients: {r['workers']} throughput ratio {r['ratio']}")
    return "\n".join(lines)


def worker_ratios(rows: list[dict]) -> list[dict]:
    """Each level's throughput with the most workers over the fewest (same endpoint, same clients)."""
    counts = sorted({r["workers"] for r in rows})
    if len(counts) < 2:
        return []
    lo, hi = counts[0], counts[-1]
    out = []
    for r in rows:
        if r["workers"] != hi:
            continue
        base = next(
            b for b in rows if b["workers"] == lo and b["endpoint"] == r["endpoint"] and b["clients"] == r["clients"]
        )
        ratio = round(r["throughput_rps"] / base["throughput_rps"], 2) if base["throughput_rps"] else None
        out.append({"endpoint": r["endpoint"], "clients": r["clients"], "workers": f"{hi}/{lo}", "ratio": ratio})
    return out


def serve_levels(argv: list[str], args) -> list[dict]:
    """A server per worker count, all up at once; every endpoint at every client count against each of them in
    turn, so that the levels compared were measured next to each other (the machine's load drifts)."""
    import httpx

    servers = {}
    try:
        for workers in args.workers:
            proc, url, _ = start_server([*argv, "--workers", str(workers)])
            run_path = RUN_PATH.format(run_id=f"bench-{workers}-{os.getpid()}")
            with httpx.Client(base_url=url, timeout=120) as http:
                http.post("/v1/runs", json={"run_id": run_path.split("/")[3]}).raise_for_status()
            servers[workers] = (proc, url, run_path)
        rows, start = [], 0
        for path in (*BODIES, RUN_PATH):
            for _, url, run_path in servers.values():
                target = run_path if path == RUN_PATH else path
                asyncio.run(level(url, target, 2, 10, 30, start=-100 - start))  # warm-up, not counted
            for clients in args.clients:
                for workers, (_, url, run_path) in servers.items():
                    target = run_path if path == RUN_PATH else path
                    row = asyncio.run(level(url, target, clients, args.requests, args.seconds, start))
                    rows.append({**row, "endpoint": path, "workers": workers})
                    start += args.requests
                    print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        for proc, _, _ in servers.values():
            stop_server(proc)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pre", default=None, help="pre-retrieval controller (default: an untrained one, exported)")
    parser.add_argument("--read", default=None, help="read controller (default: an untrained one, exported)")
    parser.add_argument("--threads", type=int, default=None, help="the server's --threads (default: its default)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--workers", type=int, nargs="+", default=[1], help="worker counts to compare (e.g. 1 2)")
    parser.add_argument("--store", default=None, help="the server's --store (default: a new SQLite file)")
    parser.add_argument("--requests", type=int, default=400, help="requests per level (default 400)")
    parser.add_argument("--seconds", type=float, default=60.0, help="at most this long per level (default 60)")
    parser.add_argument("--in-process", type=int, default=100, help="in-process decisions timed per endpoint")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    pre, read = args.pre, args.read
    folder = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    if pre is None or read is None:
        pre, read = untrained_controllers(folder)
    store = args.store or f"sqlite:{folder / 'runs.db'}"
    argv = ["--pre", pre, "--read", read, "--no-access-log", "--store", store]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    rows = serve_levels(argv, args)
    local = {}
    for path, model in (("/v1/select", pre), ("/v1/read", read)):
        local[path] = in_process(model, path, args.threads, args.in_process)
        one = next((r for r in rows if r["endpoint"] == path and r["clients"] == 1), None)
        local[path]["ratio"] = round(one["p50_ms"] / local[path]["p50_ms"], 2) if one and one["p50_ms"] else None
    result = {
        "cores": os.cpu_count(),
        "threads": args.threads,
        "store": store.split(":")[0],
        "levels": rows,
        "in_process": local,
        "worker_ratios": worker_ratios(rows),
    }
    print(table(rows, local))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
