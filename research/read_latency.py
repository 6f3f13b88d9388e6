"""Latency of one read decision of 10 hits through the Gate, with new texts every decision (no cache hit).

    python3 -m research.read_latency [CONTROLLER] [--threads 2] [--decisions 60]

CONTROLLER: a read controller (default ``pretrained:read-model``, the graph every fine-tuned read gate shares).
Prints p50 and p90 in milliseconds of one run; `branchgate bench-gate` gives the same with the torch model beside
it when the checkpoint is at hand.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from branchgate import Gate


def decision(k: int) -> tuple[dict, list[dict]]:
    """A read decision whose texts are new for every ``k``: 3 texts read before, 10 hits."""
    read = [f"Varroa destructor feeds on the fat bodies of bees and spreads viruses ({k}, {j})." for j in range(3)]
    state = {
        "root_query": f"Why are honeybee colonies collapsing? ({k})",
        "query": f"varroa mite colony losses {k}",
        "goal": "",
        "read": read,
        "read_ids": [f"r{j}" for j in range(3)],
        "depth": 1,
    }
    hits = [
        {
            "id": f"h{i}",
            "title": f"Result {i} on bees and mites ({k})",
            "snippet": f"Beekeepers report winter losses ({k}, {i}) linked to varroa mites, pesticides and poor forage",
            "rank": i,
        }
        for i in range(10)
    ]
    return state, hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("controller", nargs="?", default="pretrained:read-model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decisions", type=int, default=60)
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # the built-in decisions lie outside the packaged gate's rank range
    gate = Gate.load(args.controller, threads=args.threads)
    for k in range(5):  # warm-up
        gate.select(*decision(-1 - k))
    times = []
    for k in range(args.decisions):
        state, hits = decision(k)
        started = time.perf_counter()
        gate.select(state, hits)
        times.append(1000 * (time.perf_counter() - started))
    print(
        f"{args.controller}: 10 hits, {args.threads} threads: p50 {np.percentile(times, 50):.1f} ms, "
        f"p90 {np.percentile(times, 90):.1f} ms over {args.decisions} decisions"
    )


if __name__ == "__main__":
    main()
