"""How the Gate schedules a decision's text encoding (core-safe: numpy only): thread counts for text groups,
token-balanced groups, and length buckets that trade padding against extra graph runs.
"""

from __future__ import annotations

import numpy as np


def group_threads(cores: int, groups: int) -> int:
    """intra_op_num_threads for one session run by ``groups`` threads at once on ``cores`` cores.

    onnxruntime gives a session ``intra_op_num_threads - 1`` pool workers, and every thread calling ``run``
    also computes; concurrent runs share the workers. So ``groups`` callers plus ``cores - groups`` workers
    keep every core busy without oversubscribing: 1 on two cores (each group on its own core), 3 on four.
    """
    return max(1, int(cores) - int(groups) + 1)


def length_buckets(lengths: np.ndarray, overhead: int = 16) -> list[np.ndarray]:
    """Group rows by token length so that padded tokens plus ``overhead`` per extra run is smallest.

    Returns index arrays in ascending length order (the last group holds the longest rows). Exact
    dynamic programme over the distinct lengths (at most the encoder's max_length of them).
    """
    lengths = np.asarray(lengths)
    n = len(lengths)
    if n <= 1:
        return [np.arange(n)]
    order = np.argsort(lengths, kind="stable")
    ls = lengths[order]
    ends = [i for i in range(1, n + 1) if i == n or ls[i] != ls[i - 1]]  # group boundaries worth considering
    best = {0: 0.0}
    cut = {}
    for e in ends:
        best[e] = float("inf")
        for p in [0, *ends]:
            if p >= e:
                break
            cost = best[p] + (e - p) * float(ls[e - 1]) + (overhead if p else 0)
            if cost < best[e]:
                best[e], cut[e] = cost, p
    groups, i = [], n
    while i > 0:
        groups.append(order[cut[i] : i])
        i = cut[i]
    return groups[::-1]


def balanced_groups(lengths: np.ndarray, n: int) -> list[np.ndarray]:
    """``n`` non-empty groups of row indices (n ≤ rows) with about equal total length: longest rows first,
    each to the lightest group; indices ascending within a group."""
    groups: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in np.argsort(-np.asarray(lengths), kind="stable"):
        g = min(range(n), key=lambda j: (load[j], len(groups[j])))
        groups[g].append(int(i))
        load[g] += int(lengths[i])
    return [np.array(sorted(g), dtype=np.int64) for g in groups]
