"""The one keep rule: keep every candidate whose score passes the threshold (at most ``max_keep``, best
first); when none passes, keep the best one anyway (the top-1 fallback). Core-safe (numpy only).

The read gate (a controller of stage ``read``: which search hits to read) decides by the same rule without the
fallback (``fallback=False``): when no hit passes, none is read and the branch ends; ``Gate.select(...,
floor="root")`` turns the fallback back on at the root frame (depth 0).

The Gate (``inference.gate``), the teachers' thresholded gate (``models.teachers.base.gate``), the
reference pipeline's policies and the training metrics all decide through ``decide``; a controller with a root
threshold of its own picks each decision's threshold through ``threshold_at``.
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

from dataclasses import dataclass

import numpy as np


@dataclass
class KeepResult:
    kept: list[int]  # candidate indices, ascending (their original order)
    fallback: bool  # nothing passed the threshold and the best candidate was kept anyway


def threshold_at(depth: int | None, tau: float, root_tau: float | None = None) -> float:
    """The threshold of a decision at ``depth``: ``root_tau`` at the root frame (depth 0) when one is set, else
    ``tau``. A root branch costs its whole subtree, so the root may deserve a higher bar than the frames below."""
    return float(root_tau) if root_tau is not None and int(depth or 0) == 0 else float(tau)


def decide(
    scores, threshold: float, *, higher_is_better: bool = True, max_keep: int | None = None, fallback: bool = True
) -> KeepResult:
    """Keep ``scores ≥ threshold`` (``≤`` when lower is better), the best ``max_keep`` of them (ties: lower
    index first); with ``fallback`` a non-empty input never yields an empty selection (the best is kept), without
    it (the read stage) nothing is kept when nothing passes."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if s.size == 0:
        return KeepResult([], False)
    signed = s if higher_is_better else -s
    passing = np.flatnonzero(signed >= (threshold if higher_is_better else -threshold))
    used_fallback = False
    if passing.size == 0:
        if not fallback:
            return KeepResult([], False)
        passing, used_fallback = np.array([int(np.argmax(signed))]), True
    if max_keep is not None and passing.size > max_keep:
        passing = np.array(sorted(passing.tolist(), key=lambda i: (-float(signed[i]), i))[:max_keep])
    return KeepResult(sorted(int(i) for i in passing), used_fallback)
