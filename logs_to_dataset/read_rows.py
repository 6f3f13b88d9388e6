"""The read stage's rows (``dataset build --stage read``): one row per new hit of each read decision point.

A run's read decision points come from ``read_points.run_read_points`` (one per ``results`` event; a version 1
run has none, and gives no rows). Each hit that is new to the run (``is_new``: neither read before nor in the
context) is one row, in rank order; hits that are not new get none (the runtime never scores them). The columns
are the pre stage's with the read meaning of ``data.dataset_schema`` (frame = the read point, candidate = the
hit, retained = the texts of the hits read before, on the decision's first row only) plus the hit's ``title``,
``snippet``, ``rank`` and ``url``. ``ReadRowBuilder`` is ``labels.RowBuilder`` with these rows: the same teacher
scores (``pre_scores``: the new hits' texts against the read hits' texts), the same label rule (``row_label``,
``finalize``: thresholds and the rate rule) and the same embedding path (``tower_texts``).

Label sources at the read stage (``--labels``; kinds and thresholds as at the pre stage), each giving a new hit's
utility g, or NaN when unlabelled (no full text: the run has no evidence for the hit; label −1):

| ``--labels`` | g of a new hit |
|---|---|
| ``keypoints`` | ``read_points.keypoint_gains``: key points of its full text new to the context and to the new \
hits ranked above it |
| ``citations`` | 1 when the run's report cites its evidence id or its hit id, else 0 |
| ``teacher:NAME`` | the teacher's set gain of its full text (evidence) given the context's full texts |
| ``auto`` | ``keypoints`` when the run's evidence has key-point labels, else ``teacher:<--teacher>`` |

``judge`` and ``returns`` are refused (``check_read_labels``): they score a branch's evidence and descendants,
which a hit has not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from branchgate.errors import InputError
from branchgate.features import FEATURE_NAMES, structured_features
from branchgate.logs_to_dataset.label_sources import (
    AutoSource,
    CitationSource,
    KeypointSource,
    RunInfo,
    TeacherSource,
    citations_missing,
    parse_spec,
)
from branchgate.logs_to_dataset.labels import RowBuilder, _Tools, one_blas_thread, tower_texts
from branchgate.logs_to_dataset.read_points import ReadPoint, evidence_labels, keypoint_gains, run_read_points
from branchgate.texts import hit_text

READ_LABELS = ("auto", "keypoints", "citations", "teacher")  # the --labels sources the read stage has
READ_COUNTS = (
    "runs_without_results",
    "read_points",
    "read_points_with_new_hits",
    "hits",
    "new_hits",
    "unlabelled_hits",
)  # the manifest's ``read`` section


@dataclass
class ReadRun:
    """One run's read decision points and what its label sources read (``read_run``)."""

    run_id: str
    root_query: str
    points: list[ReadPoint]
    evidence: dict  # evidence id → its (first) evidence event: ``decision_points.RunDecisions.evidence``
    has_labels: bool  # some evidence carries key-point labels
    labels: dict = field(default_factory=dict)  # evidence id → its key-point ids (None: unlabelled)
    problems: dict = field(default_factory=dict)  # ``run_read_points``' problem counts
    has_results: bool = False  # the run has a results event (a version 1 run has none)

    def new_hits(self, point: ReadPoint) -> list[dict]:
        return [h for h in point.hits if h["is_new"]]

    @property
    def n_decisions(self) -> int:
        """Rows: the new hits of every read point."""
        return sum(len(self.new_hits(p)) for p in self.points)

    @property
    def n_frames(self) -> int:
        """Decision points with rows: read points with a new hit."""
        return sum(1 for p in self.points if self.new_hits(p))

    @property
    def deferral(self) -> dict[str, int]:
        """New hits deferred (then read, or never), and skipped by the budget (``DEFERRAL_COUNTS``)."""
        hits = [h for p in self.points for h in self.new_hits(p)]
        return {
            "deferred": sum(h["deferred"] for h in hits),
            "deferred_expanded": sum(h["deferred"] and h["action"] == "read" for h in hits),
            "deferred_never_expanded": sum(h["deferred"] and h["action"] != "read" for h in hits),
            "dropped_by_budget": sum(h["action"] == "skip" and h["actor"] == "budget" for h in hits),
        }

    def labels_of(self, evidence_id: str):
        return self.labels.get(evidence_id)


def read_run(run, rd) -> ReadRun:
    """The ``ReadRun`` of a run (``readers.Run``) whose decision points ``rd`` the build has made."""
    points, problems = run_read_points(run.events, run.file)
    labels_of = evidence_labels(run.events)
    return ReadRun(
        run_id=rd.run_id,
        root_query=rd.root_query,
        points=points,
        evidence=rd.evidence,
        has_labels=rd.has_labels,
        labels={i: labels_of(i) for i in rd.evidence},
        problems=problems,
        has_results=any(e.type == "results" for e in run.events),
    )


def check_read_labels(spec: str | None) -> None:
    """An ``InputError`` naming ``--labels`` when its source has no read-stage meaning (judge, returns)."""
    name, _ = parse_spec(spec)
    if name not in READ_LABELS:
        raise InputError(
            f"--labels {spec} is not available at --stage read (use auto, keypoints, citations or teacher:NAME)",
            "--labels",
        )


class ReadKeypoints(KeypointSource):
    """``keypoint_gains``: −1 (unlabelled, or not new) becomes NaN."""

    def utilities(self, run: ReadRun, info, tools) -> list[list[float]]:
        return [[math.nan if g < 0 else float(g) for g in keypoint_gains(p, run.labels_of)] for p in run.points]


class ReadCitations(CitationSource):
    """1 when the report cites a hit's evidence id or hit id, 0 when not; NaN without full text."""

    def missing(self, run: ReadRun, info) -> str | None:
        hit_ids = {h["hit_id"] for p in run.points for h in p.hits}
        return citations_missing(info, _Either(run.evidence, hit_ids))

    def utilities(self, run: ReadRun, info, tools) -> list[list[float]]:
        cited = set(info.report.cited_ids)
        return [[_cited(h, cited) for h in p.hits] for p in run.points]


def _cited(hit: dict, cited: set) -> float:
    """1.0 when ``cited`` holds the hit's evidence id or hit id, 0.0 when not, NaN when it has no evidence."""
    if hit["evidence_id"] is None:
        return math.nan
    return float(hit["evidence_id"] in cited or hit["hit_id"] in cited)


class _Either:
    """Membership in either of two containers."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __contains__(self, item) -> bool:
        return item in self.a or item in self.b


class ReadTeacher(TeacherSource):
    """The teacher's set gain of each new hit's full text given the read point's context (``TeacherSource.gains``;
    pool: the context and every labelled new hit's text)."""

    def utilities(self, run: ReadRun, info, tools) -> list[list[float]]:
        out = []
        for p in run.points:
            known = [h for h in run.new_hits(p) if h["evidence_id"] in run.evidence]
            context = [i for i in p.context_ids if i in run.evidence]
            found = self.gains(tools, context, [[h["evidence_id"]] for h in known], p) if known else []
            gains = {h["hit_id"]: g for h, g in zip(known, found)}
            out.append([gains.get(h["hit_id"], math.nan) if h["is_new"] else math.nan for h in p.hits])
        return out


class ReadAuto(AutoSource):
    """``keypoints`` for runs whose evidence has key-point labels, else the teacher (read stage)."""

    def __init__(self, teacher: ReadTeacher):
        self.keypoints, self.teacher = ReadKeypoints(), teacher


def read_source(src):
    """The read-stage source of a pre-stage source (``label_sources.make``): same kind and threshold."""
    if isinstance(src, AutoSource):
        return ReadAuto(read_source(src.teacher))
    if isinstance(src, TeacherSource):
        return ReadTeacher(src.name, src.model)
    if isinstance(src, KeypointSource) and src.discount == 0:
        return ReadKeypoints()
    if isinstance(src, CitationSource):
        return ReadCitations()
    raise InputError(f"--labels {getattr(src, 'kind', src)} is not available at --stage read", "--labels")


class ReadRowBuilder(RowBuilder):
    """``RowBuilder`` for ``ReadRun``s: ``texts`` and ``rows`` of the read stage; ``finalize`` is the pre stage's."""

    stage = "read"

    def __init__(self, *args, labels: str = "auto", **options):
        check_read_labels(labels)
        super().__init__(*args, labels=labels, **options)
        self.source = read_source(self.source)

    def texts(self, run: ReadRun, info: RunInfo) -> list[str]:
        src, missing = self.resolve(run, info)
        towers = []
        for p in run.points:
            new = [hit_text(h["title"], h["snippet"]) for h in run.new_hits(p)]
            if new:
                towers += [p.frame_query, p.parent_goal, *p.retained, *new]
        evidence = run.evidence.values() if missing is None and src.needs_vectors(run) else ()
        return tower_texts(run.root_query, towers, evidence, self.max_chars)

    @one_blas_thread()
    def rows(self, run: ReadRun, vectors: dict[str, np.ndarray], dim: int, info: RunInfo | None = None) -> list[dict]:
        """Rows of one run's new hits; realized rows carry ``label = None`` until ``finalize``."""
        info = info or RunInfo()
        src, missing = self.resolve(run, info)
        if missing is not None:
            self.missing[(src.kind, missing)] += 1
        tools = _Tools(run, vectors, dim, self.max_chars)
        utilities = None if missing is not None else src.utilities(run, info, tools)
        out: list[dict] = []
        for i, p in enumerate(run.points):
            gains = [math.nan] * len(p.hits) if utilities is None else utilities[i]
            new = [(h, g) for h, g in zip(p.hits, gains) if h["is_new"]]
            if new:
                out += self.point_rows(run, p, new, src.kind, missing, tools)
        return out

    def point_rows(self, run: ReadRun, p: ReadPoint, new: list, kind: str, missing, tools) -> list[dict]:
        """The rows of one read point's new hits (``new``: (hit, g) in rank order)."""
        texts = [hit_text(h["title"], h["snippet"]) for h, _ in new]
        pre, label_pre = self.pre_scores(tools, texts, p.retained, p.frame_query, p.parent_goal, p.depth)
        feats = structured_features(p.depth, len(new), len(p.retained)).astype(int)
        out = []
        for k, (h, g) in enumerate(new):
            label, source = self.row_label(missing, not math.isnan(g), g, label_pre[k])
            out.append(
                {
                    "run_id": run.run_id,
                    "frame_id": f"{p.candidate_id}@{p.seq}",
                    "candidate_id": h["hit_id"],
                    "root_query": p.root_query,
                    "frame_query": p.frame_query,
                    "parent_goal": p.parent_goal,
                    "retained": list(p.retained) if k == 0 else [],  # the decision's state: on its first row only
                    "query": texts[k],
                    "goal": "",
                    **{name: int(v) for name, v in zip(FEATURE_NAMES, feats[k])},
                    "expanded": h["action"] == "read",
                    "utility": g,
                    "label": label,
                    "label_source": source,
                    "utility_kind": kind,
                    "title": h["title"],
                    "snippet": h["snippet"],
                    "rank": int(h["rank"]),
                    "url": h["url"] or "",
                    **self.teacher_columns(pre, k),
                }
            )
        return out
