"""Calibration of the simulator against real logs: the same statistics computed the same way on both.

``shape(paths)`` reads traces of any format the readers know (the simulator's canonical traces, Search-o1 logs,
...) through ``logs_to_dataset.read_points`` and gives their read-stage shape: searches per run, hits per search,
hits new to the run per search, the positive rate of new hits (a hit adds a key point: ``keypoint_gains`` > 0),
reads per run (``read`` events with action "read"; a log without read events reads every hit it lists) and the
words of a hit's full text.

``auroc_table(datasets)`` gives every teacher's per-row AUROC (the dataset's ``teacher_<name>`` columns against its
labels) of decision datasets (``dataset build``; pre-retrieval and read), and ``frontier(dataset)`` DPP's replay
frontier of a read dataset: the key points kept at shares of the tokens when each run's new hits are read best
first by DPP's score, against reading all of them (the share of a run's tokens is the hits' full-text words).

``calibrate(sim, real)`` puts them side by side (simulator, real, difference; the targets: AUROC within ±0.03,
the frontier within 10 points at 30% and 60% of the tokens); ``table(cal)`` is its markdown. The bench calls
``bench_table`` when ``--real`` is given (``bench/run_order.py``); ``python3 -m research.calibration`` writes the
docs' table on the DeepResearchGym dev set.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from branchgate.logs_to_dataset.read_points import evidence_labels, keypoint_gains, run_read_points
from branchgate.logs_to_dataset.traces import ReadReport

AUROC_TOLERANCE = 0.03
FRONTIER_TOLERANCE = 0.10
FRONTIER_SHARES = (0.3, 0.6)
MAX_RUNS = 100_000


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def shape(paths: Iterable[str | Path], fmt: str | None = None, max_runs: int = MAX_RUNS) -> dict:
    """The read-stage shape of the runs in ``paths`` (module docstring); runs without a results event count
    in ``runs`` only."""
    from branchgate.logs_to_dataset.readers import read_runs

    report = ReadReport()
    runs = searched = 0
    per_run_searches, per_run_reads, hits, new, words = [], [], [], [], []
    pos = labelled = 0
    for run in read_runs([str(p) for p in paths], fmt, report=report):
        if runs >= max_runs:
            break
        runs += 1
        points, _ = run_read_points(run.events, run.file)
        if not points:
            continue
        searched += 1
        labels_of = evidence_labels(run.events)
        texts = {}
        reads = 0
        has_read_events = False
        for e in run.events:
            if e.type == "evidence" and getattr(e, "text", None):
                texts.setdefault(getattr(e, "hit_id", None) or e.evidence_id, e.text)
            if e.type == "read":
                has_read_events = True
                reads += e.action == "read"
        per_run_searches.append(len(points))
        for p in points:
            hits.append(len(p.hits))
            fresh = [h for h in p.hits if h["is_new"]]
            new.append(len(fresh))
            if not has_read_events:
                reads += len(fresh)
            for h, g in zip(p.hits, keypoint_gains(p, labels_of)):
                if g >= 0:
                    labelled += 1
                    pos += g > 0
                if h["is_new"] and h["hit_id"] in texts:
                    words.append(len(texts[h["hit_id"]].split()))
        per_run_reads.append(reads)
    return {
        "runs": runs,
        "runs_with_searches": searched,
        "searches_per_run": _mean(per_run_searches),
        "hits_per_search": _mean(hits),
        "new_hits_per_search": _mean(new),
        "reads_per_run": _mean(per_run_reads),
        "positive_rate": pos / labelled if labelled else None,
        "labelled_hits": labelled,
        "page_words_median": _median(words),
        "page_words_mean": _mean(words),
    }


def _rows(dataset: str | Path, columns: list[str] | None = None) -> dict[str, np.ndarray | list]:
    """Every split's rows of a decision dataset, as columns (numbers as arrays)."""
    from datasets import concatenate_datasets, load_from_disk

    d = load_from_disk(str(dataset))
    rows = concatenate_datasets([d[s] for s in d])
    names = columns or rows.column_names
    return {c: (rows[c] if c in ("run_id", "candidate_id") else np.asarray(rows[c], dtype=np.float64)) for c in names}


def teachers_of(dataset: str | Path) -> list[str]:
    from datasets import load_from_disk

    d = load_from_disk(str(dataset))
    cols = d[next(iter(d))].column_names
    return sorted(c[len("teacher_") :] for c in cols if c.startswith("teacher_"))


def auroc_table(dataset: str | Path) -> dict:
    """Per-row AUROC of every teacher column of ``dataset`` against its labels (rows labelled 0/1, score known),
    with the positive rate and the row count."""
    from sklearn.metrics import roc_auc_score

    names = teachers_of(dataset)
    cols = _rows(dataset, ["label", *(f"teacher_{n}" for n in names)])
    y = cols["label"]
    out = {"rows": int((y >= 0).sum()), "positive_rate": float((y == 1).sum() / max(1, (y >= 0).sum())), "auroc": {}}
    for n in names:
        s = cols[f"teacher_{n}"]
        ok = (y >= 0) & np.isfinite(s)
        if ok.any() and 0 < y[ok].sum() < ok.sum():
            out["auroc"][n] = float(roc_auc_score(y[ok], s[ok]))
    return out


def _hits(paths: Iterable[str | Path], fmt: str | None, max_runs: int) -> dict[tuple[str, str], tuple[int, set]]:
    """(run id, hit id) → (words of the hit's full text, its key points) of every new hit of every run."""
    from branchgate.logs_to_dataset.readers import read_runs

    out = {}
    for n, run in enumerate(read_runs([str(p) for p in paths], fmt)):
        if n >= max_runs:
            break
        points, _ = run_read_points(run.events, run.file)
        labels_of = evidence_labels(run.events)
        for p in points:
            for h in p.hits:
                if h["is_new"] and h["text"] is not None:
                    out[(p.run_id, h["hit_id"])] = (len(h["text"].split()), set(labels_of(h["evidence_id"]) or ()))
    return out


def frontier(paths: Iterable[str | Path], dataset: str | Path, teacher: str = "dpp", fmt: str | None = None,
             shares: tuple[float, ...] = FRONTIER_SHARES, max_runs: int = MAX_RUNS) -> dict:  # fmt: skip
    """``teacher``'s replay frontier on the read decisions of the runs in ``paths`` (their read dataset
    ``dataset`` holds the teacher's score of each hit): every new hit whose score passes τ is read, τ swept over
    the scores; the share of tokens = the words of the hits read over the words of all new hits (pooled over
    runs), the KPR = the mean over runs of the key points the hits read cover over those all of them cover (runs
    whose hits cover none are left out). ``kpr_at``: the KPR at each of ``shares`` (interpolated)."""
    cols = _rows(dataset, ["run_id", "candidate_id", f"teacher_{teacher}"])
    score = dict(zip(zip(cols["run_id"], cols["candidate_id"]), cols[f"teacher_{teacher}"]))
    hits = _hits(paths, fmt, max_runs)
    by_run: dict[str, list[tuple[float, int, set]]] = {}
    for (run_id, hit_id), (words, labels) in hits.items():
        s = score.get((run_id, hit_id))
        if s is not None and math.isfinite(s):
            by_run.setdefault(run_id, []).append((float(s), words, labels))
    runs = {r: h for r, h in by_run.items() if set().union(*(x[2] for x in h))}
    total = sum(w for h in by_run.values() for _, w, _ in h)
    if not runs or not total:
        return {"runs": 0, "kpr_at": {}}
    taus = np.unique([s for h in by_run.values() for s, _, _ in h])[::-1]
    curve = [(0.0, 0.0)]
    for tau in taus:
        words = sum(w for h in by_run.values() for s, w, _ in h if s >= tau)
        kpr = np.mean([len(set().union(*(lab for s, _, lab in h if s >= tau))) / len(set().union(*(x[2] for x in h)))
                       for h in runs.values()])  # fmt: skip
        curve.append((words / total, float(kpr)))
    xs, ys = zip(*curve)
    return {
        "runs": len(runs),
        "hits": sum(len(h) for h in by_run.values()),
        "kpr_at": {f"{s:.0%}": float(np.interp(s, xs, ys)) for s in shares},
    }


def calibrate(sim: dict, real: dict) -> dict:
    """Simulator and real side by side. ``sim`` / ``real``: ``{"traces": [paths], "pre": dataset, "read":
    dataset}`` (each optional); the figures are ``shape``, ``auroc_table`` of each stage and DPP's ``frontier``;
    each pair gets its difference and whether it meets its target (AUROC ±0.03; the frontier ±10 points)."""
    out: dict = {"sim": {}, "real": {}}
    for side, inp in (("sim", sim), ("real", real)):
        if inp.get("traces"):
            out[side]["shape"] = shape(inp["traces"])
        for stage in ("pre", "read"):
            if inp.get(stage):
                out[side][stage] = auroc_table(inp[stage])
        if inp.get("traces") and inp.get("read"):
            out[side]["frontier"] = frontier(inp["traces"], inp["read"])
    out["checks"] = checks(out["sim"], out["real"])
    return out


def checks(sim: dict, real: dict) -> list[dict]:
    """One entry per compared figure: ``what``, ``sim``, ``real``, ``diff`` and, where a target is set, ``ok``."""
    rows = []
    for stage in ("pre", "read"):
        s, r = sim.get(stage, {}), real.get(stage, {})
        if not s or not r:
            continue
        rows.append({"what": f"{stage}: positive rate", "sim": s["positive_rate"], "real": r["positive_rate"]})
        for name in sorted(set(s["auroc"]) & set(r["auroc"])):
            a, b = s["auroc"][name], r["auroc"][name]
            rows.append({"what": f"{stage}: {name} AUROC", "sim": a, "real": b, "ok": abs(a - b) <= AUROC_TOLERANCE})
    shape_keys = ["hits_per_search", "new_hits_per_search", "searches_per_run", "reads_per_run", "page_words_median"]
    if not (sim.get("read") and real.get("read")):  # the read datasets' positive rate is the same figure
        shape_keys.append("positive_rate")
    for key in shape_keys:
        a, b = sim.get("shape", {}).get(key), real.get("shape", {}).get(key)
        if a is not None and b is not None:
            rows.append({"what": f"read: {key.replace('_', ' ')}", "sim": a, "real": b})
    fs, fr = sim.get("frontier", {}).get("kpr_at", {}), real.get("frontier", {}).get("kpr_at", {})
    for share in sorted(set(fs) & set(fr)):
        ok = abs(fs[share] - fr[share]) <= FRONTIER_TOLERANCE
        rows.append(
            {"what": f"read: DPP frontier KPR at {share} of tokens", "sim": fs[share], "real": fr[share], "ok": ok}
        )
    for row in rows:
        row["diff"] = row["sim"] - row["real"]
    return rows


def table(cal: dict) -> list[str]:
    """The calibration table, markdown lines."""
    lines = ["| statistic | simulator | real | sim − real | target met |", "|---|---|---|---|---|"]
    for row in cal["checks"]:
        fmt = (lambda v: f"{v:.1f}") if abs(row["real"]) >= 10 or abs(row["sim"]) >= 10 else (lambda v: f"{v:.3f}")
        ok = "" if "ok" not in row else ("yes" if row["ok"] else "**no**")
        lines.append(f"| {row['what']} | {fmt(row['sim'])} | {fmt(row['real'])} | {row['diff']:+.3f} | {ok} |")
    met = [r["ok"] for r in cal["checks"] if "ok" in r]
    lines += ["", f"Targets met: {sum(met)} of {len(met)} (AUROC within ±{AUROC_TOLERANCE}, the frontier within "
              f"{FRONTIER_TOLERANCE:.0%} points)."]  # fmt: skip
    return lines


def bench_table(sim_traces: list[str], eval_set: dict, real: list[str], real_sets: dict) -> dict:
    """The bench's calibration (``--real``): the unpruned eval runs (``sim_traces``, their datasets ``eval_set``:
    ``dataset``, ``read_dataset``) against the first ``--real`` trace folder and its datasets (``real_sets``:
    ``datasets``, ``read_datasets``); ``calibrate``'s result with its markdown ``table``."""
    traces = [p for p in real if not (Path(p) / "manifest.json").is_file()]
    first = lambda d: next(iter((real_sets.get(d) or {}).values()), None)  # noqa: E731
    sim = {"traces": sim_traces, "pre": eval_set.get("dataset"), "read": eval_set.get("read_dataset")}
    cal = calibrate(sim, {"traces": traces[:1], "pre": first("datasets"), "read": first("read_datasets")})
    cal["table"] = table(cal)
    return cal
