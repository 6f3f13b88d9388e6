"""Baselines the learned controller must beat, scored on the same test rows.

- ``teacher_<name>``: the dataset's pre-retrieval teacher score of the candidate text alone. Orientation
  from the teacher registry's ``higher_is_better`` (default True); keep probabilities for Brier/ECE come
  from Platt scaling fitted on validation.
- ``tfidf_logreg``: TF-IDF (word 1–2 grams) of the candidate text + class-balanced logistic regression,
  fitted on the train split's labelled rows.
- ``random``: uniform scores thresholded to the model's test keep rate.
Every baseline's τ is calibrated on validation with the model's calibration method (``fixed`` falls back
to maximum F1, since a fixed p_keep threshold means nothing for raw teacher scores).
"""

from __future__ import annotations

import logging

import numpy as np

from branchgate.data.dataset_schema import TEACHER_PREFIX, teacher_columns
from branchgate.texts import candidate_text
from branchgate.training.metrics import calibrate_tau, gate_metrics

log = logging.getLogger(__name__)


def _labels(split) -> np.ndarray:
    return np.asarray(split["label"], dtype=np.int64)


def _utility(split) -> np.ndarray:
    return np.asarray([np.nan if u is None else u for u in split["utility"]], dtype=np.float64)


def _texts(split) -> list[str]:
    return [candidate_text(q, g) for q, g in zip(split["query"], split["goal"])]


def _oriented(values, sign: float) -> np.ndarray:
    """Higher = keep; a missing teacher score ranks last."""
    s = sign * np.asarray([np.nan if v is None else v for v in values], np.float64)
    return np.where(np.isfinite(s), s, -1e9)


def teacher_direction(name: str) -> float:
    try:
        from branchgate.models import teachers

        model = teachers.get(name)
        return 1.0 if getattr(model, "higher_is_better", True) else -1.0
    except Exception:  # unknown name or registry not available: scores are "higher = keep"
        return 1.0


def platt_coefficients(val_scores, val_labels) -> tuple[float, float] | None:
    """(a, b) of the logistic fit P(keep) = sigmoid(a·score + b) on validation's labelled rows; None with
    fewer than two classes."""
    from sklearn.linear_model import LogisticRegression

    m = np.asarray(val_labels) >= 0
    x, y = np.nan_to_num(np.asarray(val_scores, np.float64)[m]).reshape(-1, 1), np.asarray(val_labels)[m]
    if len(np.unique(y)) < 2:
        return None
    lr = LogisticRegression(C=1e4).fit(x, y)
    return float(lr.coef_[0, 0]), float(lr.intercept_[0])


def platt(val_scores, val_labels):
    """Scores → keep probabilities, logistic fit on validation's labelled rows."""
    coef = platt_coefficients(val_scores, val_labels)
    if coef is None:
        y = np.asarray(val_labels)[np.asarray(val_labels) >= 0]
        rate = float(y.mean()) if len(y) else 0.5
        return lambda s: np.full(len(s), rate)
    a, b = coef
    return lambda s: 1.0 / (1.0 + np.exp(-(a * np.nan_to_num(np.asarray(s, np.float64)) + b)))


def _calib(method: str, keep_rate):
    return ("f1", None) if method == "fixed" else (method, keep_rate)


def evaluate_baselines(
    splits, test_groups, model_keep_rate: float, method: str = "f1", keep_rate: float | None = None, seed: int = 0
) -> tuple[dict, dict]:
    """``(metrics per baseline, test scores per baseline)`` for curves."""
    val, test = splits["validation"], splits["test"]
    yv, yt, ut = _labels(val), _labels(test), _utility(test)
    cm, ck = _calib(method, keep_rate)
    out, curves = {}, {}
    for col in teacher_columns(test.column_names):
        if col not in val.column_names:
            continue
        sign = teacher_direction(col[len(TEACHER_PREFIX) :])
        sv, st = _oriented(val[col], sign), _oriented(test[col], sign)
        tau = calibrate_tau(sv, yv, cm, ck)
        out[col] = gate_metrics(st, platt(sv, yv)(st), yt, ut, test_groups, tau)
        out[col]["direction"] = "higher_is_better" if sign > 0 else "lower_is_better"
        curves[col] = st
    try:
        sv, st = tfidf_logreg_scores(splits, seed)
        tau = calibrate_tau(sv, yv, cm, ck)
        out["tfidf_logreg"] = gate_metrics(st, st, yt, ut, test_groups, tau)
        curves["tfidf_logreg"] = st
    except ValueError as exc:  # e.g. one class only in train
        log.warning("tfidf_logreg baseline skipped: %s", exc)
    rng = np.random.default_rng(seed)
    sv, st = rng.random(len(yv)), rng.random(len(yt))
    n_keep = int(round(model_keep_rate * len(st)))
    tau = float(np.sort(st)[::-1][n_keep - 1]) if n_keep > 0 else 1.0 + 1e-9  # keep exactly the model's share
    out["random"] = gate_metrics(st, platt(sv, yv)(st), yt, ut, test_groups, tau)
    curves["random"] = st
    return out, curves


def tfidf_logreg_scores(splits, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    train = splits["train"]
    y = _labels(train)
    m = y >= 0
    texts = [t for t, keep in zip(_texts(train), m) if keep]
    if len(np.unique(y[m])) < 2:
        raise ValueError("train split has a single class")
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
    x = vec.fit_transform(texts)
    clf = LogisticRegression(class_weight="balanced", max_iter=2000, random_state=seed).fit(x, y[m])
    score = lambda split: clf.predict_proba(vec.transform(_texts(split)))[:, 1]  # noqa: E731
    return score(splits["validation"]), score(splits["test"])
