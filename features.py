"""The structured features of a decision's candidates: the one place they are computed (core-safe: numpy).

Dataset rows (``logs_to_dataset.labels``), training batches (``data.decision_batches``), the torch reference
(``export.torch_ref``) and the Gate (``inference.gate``) all call ``structured_features``, so the value
network sees the same numbers in training and in service.

A decision's candidates are in their list order: ``order`` is the position 0..K-1 in that list (a trace's
own ``order`` field only sorts the candidates when decisions are built; it is renumbered there), so
``order / (K - 1)`` lies in [0, 1].
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import numpy as np

FEATURE_NAMES = ("depth", "order", "n_candidates", "n_retained")


def structured_features(depth: float, n_candidates: int, n_retained: int) -> np.ndarray:
    """``[n_candidates, len(FEATURE_NAMES)]`` float32: depth, position in the list, K, number retained."""
    k = int(n_candidates)
    out = np.empty((k, len(FEATURE_NAMES)), np.float32)
    out[:, 0] = float(depth)
    out[:, 1] = np.arange(k, dtype=np.float32)
    out[:, 2] = float(k)
    out[:, 3] = float(n_retained)
    return out


def outside_range(ranges: dict, depth: float, n_candidates: int, n_retained: int) -> list[str]:
    """Names of the features of a decision (``structured_features``) outside ``ranges`` ``{name: (min, max)}``
    (the train split's, stored in a controller), in ``FEATURE_NAMES`` order; [] without ranges or candidates."""
    if not ranges or not n_candidates:
        return []
    feats = structured_features(depth, n_candidates, n_retained)
    return [
        name
        for j, name in enumerate(FEATURE_NAMES)
        if name in ranges and (feats[:, j].min() < ranges[name][0] or feats[:, j].max() > ranges[name][1])
    ]
