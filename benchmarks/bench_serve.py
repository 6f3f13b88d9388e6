"""Load test of `branchgate serve` on 127.0.0.1: throughput and p50/p99 latency at 1, 8 and 32 clients (a
benchmark, not a test; the figures are in docs/use/serve.md).

    python3 benchmarks/bench_serve.py                                  # exports an untrained pre + read controller
    python3 benchmarks/bench_serve.py --pre PRE.onnx --read READ.onnx  # your controllers
    python3 benchmarks/bench_serve.py --requests 400 --seconds 60 --clients 1 8 32 --out serve_bench.json

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


def start_server(argv: list[str], timeout: float = 180.0, cwd=None) -> tuple[subprocess.Popen, str, list[str]]:
    """``branchgate serve ARGV --port 0`` as a subprocess → (process, its base URL, its log lines so far and to
    come). Its stderr is drained by a thread (a full pipe would stall the server); stdout goes nowhere."""
    cmd = [sys.executable, "-m", "branchgate", "serve", *argv, "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd)
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


async def level(url: str, path: str, clients: int, requests: int, seconds: float, start: int) -> dict:
    """``clients`` concurrent clients sending ``path`` requests until ``requests`` are sent or ``seconds`` pass."""
    import httpx

    bodies = [json.dumps(BODIES[path](start + i)).encode() for i in range(requests)]
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
    """The results as a Markdown table, then the in-process figures."""
    keys = ("clients", "ok", "throughput_rps", "p50_ms", "p99_ms", "errors")
    lines = [
        "| endpoint | clients | requests | throughput (req/s) | p50 (ms) | p99 (ms) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| `{r['path']}` | " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    for path, r in local.items():
        lines.append(
            f"in-process `Gate.select` ({path}): p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms; "
            f"HTTP p50 at 1 client / in-process p50 = {r['ratio']}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pre", default=None, help="pre-retrieval controller (default: an untrained one, exported)")
    parser.add_argument("--read", default=None, help="read controller (default: an untrained one, exported)")
    parser.add_argument("--threads", type=int, default=None, help="the server's --threads (default: its default)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=400, help="requests per level (default 400)")
    parser.add_argument("--seconds", type=float, default=60.0, help="at most this long per level (default 60)")
    parser.add_argument("--in-process", type=int, default=100, help="in-process decisions timed per endpoint")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    pre, read = args.pre, args.read
    if pre is None or read is None:
        pre, read = untrained_controllers(Path(tempfile.mkdtemp(prefix="bench-serve-")))
    argv = ["--pre", pre, "--read", read, "--no-access-log"]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    proc, url, _ = start_server(argv)
    rows, start = [], 0
    try:
        for path in BODIES:
            asyncio.run(level(url, path, 1, 10, 30, start=-100))  # warm-up, not counted
            for clients in args.clients:
                rows.append(asyncio.run(level(url, path, clients, args.requests, args.seconds, start)))
                start += args.requests
                print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        stop_server(proc)
    local = {}
    for path, model in (("/v1/select", pre), ("/v1/read", read)):
        local[path] = in_process(model, path, args.threads, args.in_process)
        one = next(r for r in rows if r["path"] == path and r["clients"] == 1) if 1 in args.clients else None
        local[path]["ratio"] = round(one["p50_ms"] / local[path]["p50_ms"], 2) if one and one["p50_ms"] else None
    result = {"cores": os.cpu_count(), "threads": args.threads, "levels": rows, "in_process": local}
    print(table(rows, local))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
