"""Offline metrics of a gate (scores + threshold) and threshold calibration.

Conventions: ``labels`` are 1/0/-1 (-1 = excluded from label metrics); ``probs`` are calibrated keep
probabilities (the model's p_keep, or a Platt-scaled baseline score); ``scores`` rank candidates (higher
= keep) and are thresholded at ``tau``; NaN utilities are ignored.
"""

from __future__ import annotations

import math

import numpy as np

from branchgate.decide import decide

METRIC_KEYS = [
    "auroc",
    "auprc",
    "f1",
    "precision",
    "recall",
    "brier",
    "ece",
    "spearman_utility",
    "top1_accuracy",
    "keep_rate",
    "tau",
]


def safe_auroc(labels, scores) -> float | None:
    """Area under the ROC curve (the Mann-Whitney statistic, tied scores counted half); None without both
    classes. Plain numpy, fast enough for the bench's thousands of bootstrap resamples."""
    labels, scores = np.asarray(labels), np.asarray(scores, np.float64)
    if len(labels) == 0 or len(np.unique(labels)) < 2:
        return None
    if not np.all(np.isfinite(scores)):
        raise ValueError("AUROC: scores contain NaN or infinity")
    pos = labels == labels.max()
    order = np.argsort(scores, kind="mergesort")
    ranked = scores[order]
    starts = np.r_[0, np.flatnonzero(ranked[1:] != ranked[:-1]) + 1]
    ends = np.r_[starts[1:], len(ranked)]
    ranks = np.empty(len(scores), np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # average 1-based rank of each tie block
    n_pos = int(pos.sum())
    n_neg = len(labels) - n_pos
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def safe_auprc(labels, scores) -> float | None:
    """Average precision; None without both classes (as ``safe_auroc``)."""
    from sklearn.metrics import average_precision_score

    labels, scores = np.asarray(labels), np.asarray(scores)
    if len(labels) == 0 or len(np.unique(labels)) < 2:
        return None
    return float(average_precision_score(labels, scores))


def calibrate_tau(
    scores, labels, method: str = "f1", keep_rate: float | None = None, tau: float | None = None
) -> float:
    """Threshold on validation scores: ``f1`` maximises F1 (keep when score ≥ τ), ``keep_rate`` keeps the
    given fraction of candidates, ``fixed`` returns ``tau`` unchanged."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels)
    if method == "fixed":
        if tau is None:
            raise ValueError("calibration method 'fixed' needs a tau")
        return float(tau)
    if method == "keep_rate":
        if keep_rate is None or not 0.0 < keep_rate <= 1.0:
            raise ValueError(f"calibration method 'keep_rate' needs keep_rate in (0, 1], got {keep_rate}")
        if len(scores) == 0:
            return 0.5
        desc = np.sort(scores)[::-1]
        n_keep = max(1, int(round(keep_rate * len(desc))))
        return float(desc[n_keep - 1])
    if method != "f1":
        raise ValueError(f"unknown calibration method {method!r} (f1, keep_rate, fixed)")
    m = labels >= 0
    s, y = scores[m], labels[m].astype(np.int64)
    if len(s) == 0 or y.sum() == 0:
        return 0.5
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    tp = np.cumsum(y)
    k = np.arange(1, len(y) + 1)
    last = np.r_[s[1:] != s[:-1], True]  # thresholds only at the end of a run of ties
    f1 = 2 * tp / (k + y.sum())
    f1 = np.where(last, f1, -1.0)
    best = int(np.argmax(f1))
    # midway to the next lower score: same decisions on validation, less brittle on new data
    return float((s[best] + s[best + 1]) / 2) if best + 1 < len(s) else float(s[best])


def ece(probs, labels, bins: int = 10) -> float:
    probs, labels = np.asarray(probs, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    if len(probs) == 0:
        return float("nan")
    idx = np.minimum((probs * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.sum() * abs(probs[m].mean() - labels[m].mean())
    return float(total / len(probs))


def reliability(probs, labels, bins: int = 10):
    """(mean predicted, observed frequency, count) per non-empty bin."""
    probs, labels = np.asarray(probs, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    idx = np.minimum((probs * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        m = idx == b
        if m.any():
            out.append((float(probs[m].mean()), float(labels[m].mean()), int(m.sum())))
    return out


def top1_accuracy(scores, utility, groups) -> float | None:
    """Share of decision points (≥ 2 candidates with known utility) whose top-scored candidate has the best
    realized utility (ties in utility count as correct)."""
    hits = top1_hits(scores, utility, groups)
    return float(np.mean(list(hits.values()))) if hits else None


def top1_hits(scores, utility, groups, informative: bool = False) -> dict:
    """{decision point: 1.0 if its top-scored candidate has the best realized utility, else 0.0} over points
    with ≥ 2 candidates of known utility; ``informative`` keeps only points where some utility is positive
    (where the choice matters)."""
    scores, utility, groups = np.asarray(scores, np.float64), np.asarray(utility, np.float64), np.asarray(groups)
    m = np.isfinite(utility)
    scores, utility, groups = scores[m], utility[m], groups[m]
    order = np.argsort(groups, kind="mergesort")
    scores, utility, groups = scores[order], utility[order], groups[order]
    starts = np.r_[0, np.flatnonzero(groups[1:] != groups[:-1]) + 1, len(groups)]
    out = {}
    for a, b in zip(starts[:-1], starts[1:]):
        if b - a < 2 or (informative and utility[a:b].max() <= 0):
            continue
        out[groups[a]] = float(utility[a + int(np.argmax(scores[a:b]))] >= utility[a:b].max() - 1e-9)
    return out


def keep_rate_with_fallback(scores, groups, tau: float) -> float | None:
    """Keep rate of the deployed gate (``branchgate.decide``: score ≥ τ, else the top-1) over decision points."""
    scores, groups = np.asarray(scores, np.float64), np.asarray(groups)
    if len(scores) == 0:
        return None
    order = np.argsort(groups, kind="mergesort")
    s, g = scores[order], groups[order]
    bounds = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1, len(g)]
    kept = sum(len(decide(s[a:b], tau).kept) for a, b in zip(bounds[:-1], bounds[1:]))
    return float(kept / len(s))


def spearman(x, y) -> float | None:
    from scipy.stats import spearmanr

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    m = np.isfinite(x) & np.isfinite(y)
    if m.sum() < 3 or np.ptp(x[m]) == 0 or np.ptp(y[m]) == 0:
        return None
    return float(spearmanr(x[m], y[m]).statistic)


def gate_metrics(scores, probs, labels, utility, groups, tau: float, utility_pred=None) -> dict:
    """All METRIC_KEYS for one scorer. ``utility_pred`` (default ``scores``) is correlated with utility."""
    from sklearn.metrics import brier_score_loss

    scores = np.asarray(scores, np.float64)
    probs = np.asarray(probs, np.float64)
    labels = np.asarray(labels)
    m = labels >= 0
    y, s, p = labels[m].astype(np.int64), scores[m], probs[m]
    keep = s >= tau
    tp = int((keep & (y == 1)).sum())
    precision = tp / keep.sum() if keep.sum() else 0.0
    recall = tp / (y == 1).sum() if (y == 1).sum() else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "auroc": safe_auroc(y, s),
        "auprc": safe_auprc(y, s),
        "f1": float(f1),
        "precision": float(precision),
        "recall": float(recall),
        "brier": float(brier_score_loss(y, np.clip(p, 0, 1))) if len(y) else None,
        "ece": ece(p, y) if len(y) else None,
        "spearman_utility": spearman(scores if utility_pred is None else utility_pred, utility),
        "top1_accuracy": top1_accuracy(scores, utility, groups),
        "keep_rate": float((scores >= tau).mean()) if len(scores) else None,
        "keep_rate_fallback": keep_rate_with_fallback(scores, groups, tau),
        "tau": float(tau),
        "n_rows": int(len(scores)),
        "n_labelled": int(m.sum()),
        "n_positive": int((y == 1).sum()),
    }


def clean(obj):
    """JSON-safe copy: NaN/inf → None, numpy scalars → Python."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return None if math.isnan(v) or math.isinf(v) else v
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
