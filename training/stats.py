"""Bootstrap intervals and offline metrics of scorers (the gate, every teacher) on a decision dataset.

``bootstrap_ci`` is the one bootstrap: resample groups (runs, queries) with replacement, recompute a statistic,
take the 2.5/97.5 percentiles. ``offline_metrics`` scores the controller (the training path,
``training/evaluate.predict``) and every ``teacher_*`` column on rows of a dataset: AUROC, AUPRC and top-1 per
scorer with bootstrap intervals over runs, pooled and per depth stratum.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from branchgate.training.metrics import safe_auprc, safe_auroc, top1_accuracy, top1_hits

DEPTH_STRATA = {"depth0": lambda d: d == 0, "depth1+": lambda d: d >= 1}


def bootstrap_ci(groups, stat: Callable[[np.ndarray], float], boot: int = 1000, seed: int = 0) -> list[float | None]:
    """95% percentile interval of ``stat(resampled group ids)`` over ``boot`` resamples of the distinct ``groups``
    (``stat`` gets an array of group ids, repeats included); NaN values are skipped, ``[None, None]`` if none."""
    uniq = np.unique(np.asarray(groups))
    if len(uniq) == 0 or boot < 1:
        return [None, None]
    rng = np.random.default_rng(seed)
    vals = np.array([stat(uniq[rng.integers(0, len(uniq), len(uniq))]) for _ in range(boot)], np.float64)
    vals = vals[np.isfinite(vals)]
    if not len(vals):
        return [None, None]
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return [float(lo), float(hi)]


def mean_ci(values, boot: int = 1000, seed: int = 0) -> dict:
    """``{"mean", "ci95"}`` of per-item values (one per query), bootstrapping items."""
    v = np.asarray(values, np.float64)
    if not len(v):
        return {"mean": None, "ci95": [None, None]}
    ci = bootstrap_ci(np.arange(len(v)), lambda idx: float(v[idx].mean()), boot, seed)
    return {"mean": float(v.mean()), "ci95": ci}


def _nan(x):
    return np.nan if x is None else float(x)


class Rows:
    """Labelled rows of a dataset with scorer columns, grouped by run for the bootstrap."""

    def __init__(self, labels, utility, runs, frames, depth, scorers: dict[str, np.ndarray], order=None):
        keep = np.asarray(labels) >= 0
        self.labels = np.asarray(labels, np.int64)[keep]
        self.utility = np.asarray(utility, np.float64)[keep]
        self.runs = np.asarray(runs)[keep]
        self.frames = np.asarray(frames)[keep]
        self.depth = np.asarray(depth, np.int64)[keep]
        self.order = (np.zeros(len(keep), np.int64) if order is None else np.asarray(order, np.int64))[keep]
        self.scorers = {k: np.asarray(v, np.float64)[keep] for k, v in scorers.items()}
        self.by_run = {r: np.flatnonzero(self.runs == r) for r in np.unique(self.runs)}

    def rows_of(self, run_ids) -> np.ndarray:
        parts = [self.by_run[r] for r in run_ids]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def auroc(self, name: str, rows) -> float:
        return _nan(safe_auroc(self.labels[rows], self.scorers[name][rows]))

    def top1(self, name: str, rows) -> float:
        return _nan(top1_accuracy(self.scorers[name][rows], self.utility[rows], self.frames[rows]))

    def top1_informative(self, name: str, rows) -> float:
        """Top-1 accuracy over decision points where some candidate has positive utility (the choice matters)."""
        hits = top1_hits(self.scorers[name][rows], self.utility[rows], self.frames[rows], informative=True)
        return float(np.mean(list(hits.values()))) if hits else np.nan

    def subset(self, mask) -> Rows:
        return Rows(
            self.labels[mask],
            self.utility[mask],
            self.runs[mask],
            self.frames[mask],
            self.depth[mask],
            {k: v[mask] for k, v in self.scorers.items()},
            self.order[mask],
        )


def per_decision(rows: Rows) -> Rows:
    """One row per decision point (``rows.frames``): labelled 1 when any of its rows is positive, each scorer's
    score its best row's, utility the rows' sum — e.g. per search: does any hit of this search add a key point."""
    frames, inverse = np.unique(rows.frames, return_inverse=True)
    n = len(frames)

    def best(values):
        out = np.full(n, -np.inf)
        np.maximum.at(out, inverse, np.nan_to_num(values, nan=-np.inf))
        return np.where(np.isfinite(out), out, np.nan)

    first = np.zeros(n, np.int64)
    first[inverse[::-1]] = np.arange(len(inverse))[::-1]
    utility = np.zeros(n)
    np.add.at(utility, inverse, np.nan_to_num(rows.utility))
    return Rows(
        best(rows.labels.astype(np.float64)).astype(np.int64),
        utility,
        rows.runs[first],
        frames,
        rows.depth[first],
        {k: best(v) for k, v in rows.scorers.items()},
    )


def scorer_metrics(rows: Rows, boot: int = 1000, seed: int = 0, ref: str | None = None) -> dict:
    """``{SCORER: {"auroc", "auprc", "top1", "top1_informative", "ci95_auroc", "n_rows"}}``; with ``ref`` (the
    gate) every other scorer also gets ``delta_vs_gate`` = paired bootstrap over runs of ref's AUROC minus its own."""
    out = {}
    everything = np.arange(len(rows.labels))
    for name in rows.scorers:
        auroc = rows.auroc(name, everything)
        m = {
            "auroc": None if np.isnan(auroc) else auroc,
            "auprc": safe_auprc(rows.labels, rows.scorers[name]),
            "top1": None if np.isnan(t := rows.top1(name, everything)) else t,
            "top1_informative": None if np.isnan(t := rows.top1_informative(name, everything)) else t,
            "ci95_auroc": bootstrap_ci(rows.runs, lambda b, n=name: rows.auroc(n, rows.rows_of(b)), boot, seed),
            "n_rows": int(len(rows.labels)),
        }
        if ref is not None and name != ref:

            def delta(b, n=name):
                r = rows.rows_of(b)
                return rows.auroc(ref, r) - rows.auroc(n, r)

            d = rows.auroc(ref, everything) - auroc
            m["delta_vs_gate"] = {
                "mean": None if np.isnan(d) else float(d),
                "ci95": bootstrap_ci(rows.runs, delta, boot, seed),
            }
        out[name] = m
    return out


def by_depth(rows: Rows, boot: int = 1000, seed: int = 0, ref: str | None = None) -> dict:
    """``scorer_metrics`` per stratum of ``DEPTH_STRATA`` (depth 0, depth ≥ 1)."""
    return {k: scorer_metrics(rows.subset(f(rows.depth)), boot, seed, ref) for k, f in DEPTH_STRATA.items()}


def controller_predictions(checkpoint, dataset, splits=("test",), cache=None):
    """``(split, rows, p_keep)`` for each of ``splits`` of a dataset: the controller's keep probabilities by the
    training path, in the split's row order."""
    from branchgate.training.evaluate import checkpoint_data, predict

    # labels are needed where scored: an eval-only dataset may leave a split empty
    net, _, dm = checkpoint_data(checkpoint, dataset, cache, "predict")
    if not any((dm.sets[split].label >= 0).any() for split in splits):
        dm.require_labels(*splits)  # names the first split without a labelled row
    for split in splits:
        p, _ = predict(net, dm.sets[split], dm.table)
        yield split, dm.splits[split], p


def controller_rows(checkpoint, dataset, splits=("test",), cache=None) -> Rows:
    """The controller (``gate``, by the training path) and every ``teacher_*`` column on ``splits`` of a dataset."""
    return split_rows((part, {"gate": p}) for _, part, p in controller_predictions(checkpoint, dataset, splits, cache))


def split_rows(parts) -> Rows:
    """``Rows`` of dataset splits: ``parts`` yields ``(split, scores)``, the split's rows with extra scorers' values
    in its row order (``{}``: its ``teacher_*`` columns only)."""
    cols: dict[str, list] = {k: [] for k in ("label", "utility", "run", "frame", "depth", "order")}
    scorers: dict[str, list] = {}
    for part, extra in parts:
        cols["label"].append(np.asarray(part["label"], np.int64))
        cols["utility"].append(np.asarray([np.nan if v is None else v for v in part["utility"]], np.float64))
        cols["run"].append(np.asarray(part["run_id"]))
        cols["frame"].append(np.asarray([f"{r}/{f}" for r, f in zip(part["run_id"], part["frame_id"])]))
        cols["depth"].append(np.asarray(part["depth"], np.int64))
        cols["order"].append(np.asarray(part["rank" if "rank" in part.column_names else "order"], np.int64))
        for name, values in extra.items():
            scorers.setdefault(name, []).append(np.asarray(values, np.float64))
        for c in part.column_names:
            if c.startswith("teacher_"):
                scorers.setdefault(c[len("teacher_") :], []).append(
                    np.asarray([np.nan if v is None else v for v in part[c]], np.float64)
                )
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    return Rows(
        cat["label"],
        cat["utility"],
        cat["run"],
        cat["frame"],
        cat["depth"],
        {k: np.concatenate(v) for k, v in scorers.items()},
        cat["order"],
    )
