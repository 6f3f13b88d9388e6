"""The manifest and messages of a dataset build (``build.py`` runs the build and calls these).

``_manifest``: what a finished build records; ``_nothing_parsed``: the ``NothingParsed`` error and the
manifest of a build that read no run; ``_count_keypoints``: a run's key-point ground truth (``KEYPOINT_STATS``);
the manifest's label and partial-run warnings; ``summary_line``: the CLI's one-line summary.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from branchgate import __version__
from branchgate.data.dataset_schema import DATASET_SCHEMA_VERSION, SPLITS, columns
from branchgate.fileio import atomic_write_json, mark_output_dir
from branchgate.logs_to_dataset.labels import LabelRecords
from branchgate.logs_to_dataset.trace_schema import SCHEMA_VERSION
from branchgate.models.teachers import params

KEYPOINT_STATS = (
    "runs_with_ground_truth",
    "runs_without_ground_truth",
    "runs_with_labelled_evidence",
    "evidence",
    "evidence_labelled",
    "labelled_by_id",
    "labelled_by_span_only",
    "key_points",
    "key_points_reachable",
    "bad_links",
)


class NothingParsed(Exception):
    """No run could be read from the inputs (the CLI exits 1). ``manifest``: what was read and skipped."""

    def __init__(self, message: str, manifest: dict | None = None):
        super().__init__(message)
        self.manifest = manifest or {}


def _partial_warning(section: dict) -> str:
    reasons = "; ".join(f"{r}: {n}" for r, n in section["reasons"].items())
    return (
        f"{section['runs']} partial run(s) kept ({reasons}); see manifest partial_runs, "
        "or leave them out with --partial-runs skip"
    )


def _nothing_parsed(traces, out, report, files, fmt, partial_section, stage: str = "pre") -> None:
    """Raise ``NothingParsed`` naming the first skipped records; write what was read to ``OUT/manifest.json``
    (never over an existing dataset), so the reasons are not lost."""
    skipped = [s.as_dict() for s in report.skipped]
    manifest = {
        "schema_version": DATASET_SCHEMA_VERSION,
        "created_by": f"branchgate {__version__}",
        "error": "nothing parsed",
        "stage": stage,
        "n_runs": {s: 0 for s in (*SPLITS, "total")},
        "n_files": len(files),
        "formats": dict(report.formats),
        "format_forced": fmt,
        "n_events": report.events,
        "skipped": skipped,
        "ignored_files": list(report.ignored),
        "read_warnings": dict(sorted(report.warnings.items())),
        "partial_runs": partial_section,
    }
    out = Path(out)
    written = ""
    if not (out / "dataset_dict.json").exists():  # ``out`` passed check_output_dir; this manifest alone marks it
        atomic_write_json(out / "manifest.json", manifest)
        mark_output_dir(out, "dataset build")  # the manifest alone, recorded as the build's (fileio)
        written = f"; what was read is in {out / 'manifest.json'}"
    first = "; ".join(
        f"{s['file']}{'' if s['line'] is None else ':' + str(s['line'])}: {s['reason']}" for s in skipped[:3]
    )
    more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
    raise NothingParsed(
        f"no run could be read from {', '.join(map(str, traces))} "
        f"({report.files} file(s) read, {len(skipped)} record(s) skipped, {len(report.ignored)} file(s) not recognised)"
        + (f": {first}{more}" if first else "")
        + written,
        manifest,
    )


def _count_keypoints(stats: Counter, run, rd) -> None:
    """Key-point ground truth of one run: runs with/without it, evidence labelled, key points reachable."""
    start = next((e for e in run.events if e.type == "run_start"), None)
    gt = (getattr(start, "config", None) or {}).get("keypoints") or {}
    if not (gt or rd.has_labels):
        stats["runs_without_ground_truth"] += 1
        return
    stats["runs_with_ground_truth"] += 1
    stats["runs_with_labelled_evidence"] += rd.has_labels  # runs labelled by key points (they retrieved something)
    evs = list(rd.evidence.values())
    stats["evidence"] += len(evs)
    stats["evidence_labelled"] += sum(1 for e in evs if e.labels)
    stats["key_points_reachable"] += len({k for e in evs for k in (e.labels or [])})
    for key in ("n_key_points", "labelled_by_id", "labelled_by_span_only", "bad_links"):
        if isinstance(gt.get(key), int):
            stats[{"n_key_points": "key_points"}.get(key, key)] += gt[key]


def _manifest(
    rows,
    n_runs,
    n_frames,
    report,
    files,
    source_sha,
    teacher,
    builder,
    kinds,
    models,
    enc,
    cache,
    problems,
    pruned_labels,
    fmt,
    stage: str = "pre",
) -> dict:
    def per_split(counter) -> dict:
        d = {s: int(counter.get(s, 0)) for s in SPLITS}
        d["total"] = sum(d.values())
        return d

    import numpy as np

    n_dec = Counter({s: rows.n(s) for s in SPLITS})
    labels = {s: Counter(str(v) for v in rows.labels(s)) for s in SPLITS}
    sources = Counter(v for s in SPLITS for v in rows.source(s))
    utils = np.concatenate([rows.utility(s) for s in SPLITS])
    utils = utils[~np.isnan(utils)]
    fitted = builder.fitted
    kind_names = sorted(kinds) or [f"teacher:{builder.label_name}"]
    thresholds = {k: fitted[k]["threshold"] for k in kind_names if k in fitted}
    label_kind = kind_names[0] if len(kind_names) == 1 else "mixed"
    missing: dict = {}
    for (kind, reason), n in sorted(builder.missing.items()):
        missing.setdefault(kind, {"runs": 0, "reasons": {}})
        missing[kind]["runs"] += n
        missing[kind]["reasons"][reason] = n

    return {
        "schema_version": DATASET_SCHEMA_VERSION,
        "stage": stage,
        "trace_schema_version": SCHEMA_VERSION,
        "created_by": f"branchgate {__version__}",
        "n_runs": per_split(n_runs),
        "n_decisions": per_split(n_dec),
        "n_frames": per_split(n_frames),
        "n_expanded": int(sum(rows.expanded(s).sum() for s in SPLITS)),
        "labels": {s: dict(sorted(labels[s].items())) for s in SPLITS},
        "label_sources": dict(sorted(sources.items())),
        "utility": _summary(utils.tolist()),
        "n_files": len(files),
        "formats": dict(report.formats),
        "format_forced": fmt,
        "n_events": report.events,
        "skipped": [s.as_dict() for s in report.skipped],
        "ignored_files": list(report.ignored),
        "read_warnings": dict(sorted(report.warnings.items())),
        "run_problems": dict(sorted(problems.items())),
        "teacher": builder.label_name,
        "teacher_params": params(builder.label_model),
        "label_spec": builder.labels,
        "teachers": list(models),
        "label_kind": label_kind,
        "label_kinds": {k: int(v) for k, v in sorted(kinds.items())},
        "label_threshold": thresholds.get(label_kind),
        "label_threshold_rule": (fitted.get(label_kind) or {}).get("rule"),
        "label_thresholds": thresholds,
        "label_threshold_rules": {k: v["rule"] for k, v in sorted(fitted.items())},
        "label_depth_thresholds": {
            k: v["depth_thresholds"] for k, v in sorted(fitted.items()) if v["depth_thresholds"]
        },
        "positive_rate_target": builder.positive_rate,
        "positive_rate": {k: v["positive_rate"] for k, v in sorted(fitted.items())},
        "label_missing": missing,
        "pruned_labels": pruned_labels,
        "encoder": enc.id,
        "encoder_dim": int(getattr(enc, "dim", 0) or 0),
        "evidence_max_chars": builder.max_chars,
        "embedding_cache": cache.stats(),
        "source_sha256": source_sha,
        "columns": columns(list(models), stage),
        "warnings": _label_warnings(rows, thresholds) + _missing_warnings(missing),
    }


def _missing_warnings(missing: dict) -> list[str]:
    return [
        f"{v['runs']} run(s) have nothing for --labels {kind} to label by "
        f"({'; '.join(f'{r}: {n}' for r, n in v['reasons'].items())}): their candidates are excluded (label -1)"
        for kind, v in missing.items()
    ]


def _label_warnings(rows: LabelRecords, thresholds) -> list[str]:
    """Say when labels cannot teach anything (one class only), with the utilities' quantiles."""
    import numpy as np

    out = []
    realized = {s: rows.realized(s) for s in SPLITS}
    if not any(len(i) for i in realized.values()):
        if len(rows):
            out.append("no realized labels: no expanded candidate has known retrieved evidence")
        return out
    for kind, thr in thresholds.items():
        idx = {s: rows.realized(s, kind) for s in SPLITS}
        n = sum(len(i) for i in idx.values())
        labels = {int(v) for s in SPLITS for v in rows.label(s)[idx[s]]}
        if n and len(labels) == 1:
            u = np.concatenate([rows.utility(s)[idx[s]] for s in SPLITS]).astype(np.float64)
            q = ", ".join(f"{p}%={np.percentile(u, p):.4g}" for p in (25, 50, 75))
            out.append(
                f"all {n} realized {kind} labels are {labels.pop()} at threshold {thr:g} "
                f"(utility min {u.min():.4g}, {q}, max {u.max():.4g}); choose another --label-threshold "
                "(or, for a teacher, leave it unset: --positive-rate)"
            )
    return out


def _summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    import numpy as np

    a = np.asarray(values, dtype=np.float64)
    return {
        "n": int(a.size),
        "mean": float(a.mean()),
        "min": float(a.min()),
        "median": float(np.median(a)),
        "max": float(a.max()),
    }


def summary_line(manifest: dict, out) -> str:
    d, r = manifest["n_decisions"], manifest["n_runs"]
    c = manifest["embedding_cache"]
    skipped = len(manifest["skipped"])
    return (
        f"branchgate dataset: {r['total']} runs from {manifest['n_files']} files → {d['total']} decisions "
        f"(train {d['train']} / validation {d['validation']} / test {d['test']}) in {out}; "
        f"{skipped} record(s) skipped{' (see manifest skipped)' if skipped else ''}; "
        f"embeddings {c['misses']} new, {c['hits']} cached{_keypoint_line(manifest.get('keypoints') or {})}"
        f"{_read_line(manifest.get('read'))}{_problems_line(manifest.get('run_problems') or {})}"
    )


def _problems_line(problems: dict) -> str:
    """What the caps left out and the other problems counted (the manifest's ``run_problems``), the largest first."""
    if not problems:
        return ""
    top = sorted(problems.items(), key=lambda kv: -kv[1])
    shown = "; ".join(f"{n} × {reason}" for reason, n in top[:4])
    return f"; counted in the manifest's run_problems: {shown}{f' (and {len(top) - 4} more)' if len(top) > 4 else ''}"


def _read_line(read: dict | None) -> str:
    """The read stage's counts (``--stage read``), or "" for a pre-stage build."""
    if not read:
        return ""
    return (
        f"; read stage: {read['new_hits']} new hits of {read['hits']} at {read['read_points']} read points "
        f"({read['unlabelled_hits']} unlabelled), {read['runs_without_results']} run(s) without results events"
    )


def _keypoint_line(kp: dict) -> str:
    if not kp.get("runs_with_ground_truth"):
        return ""
    total = kp.get("key_points") or 0  # 0: the traces carry labels but no key-point file says how many exist
    reach = f"{kp['key_points_reachable']}/{total}" if total else str(kp["key_points_reachable"])
    return (
        f"; key points for {kp['runs_with_ground_truth']} runs: {kp['evidence_labelled']}/{kp['evidence']} "
        f"evidence labelled, {reach} key points reachable"
    )
