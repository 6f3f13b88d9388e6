"""Decision rows with labels and per-teacher pre-retrieval scores (the dataset contract: ``data.dataset_schema``).

Realized utility ``g`` of an expanded candidate ``c`` whose retrieved evidence E(c) is known comes from the
run's label source (``logs_to_dataset.label_sources``: ``keypoints``, ``citations``, ``teacher:<name>``,
``judge``; ``auto`` = keypoints when the run's evidence carries ``labels``, else ``teacher:<name>``). For
teachers, g = ``set_gain(teacher, E(c), state)`` given C_t and the root query; the pool P (used by coverage
teachers) is C_t ∪ the evidence of every expanded candidate of the frame.

``label = 1[g ≥ threshold]`` (the source's comparison direction), ``label_source = "realized"``; labels are
set once the whole build is read (``RowBuilder.finalize``), since a teacher's default threshold comes from
the train split's realized utilities (the rate rule). A run that lacks what its source needs (no key-point
labels, no report citing evidence) is counted in ``RowBuilder.missing`` and all its candidates get label −1
(``excluded``). Candidates never expanded, or expanded without known evidence, get ``utility = NaN`` and, by
``pruned_labels``: ``"excluded"`` (label −1, default) or ``"teacher_pre"`` (the label teacher's
pre-retrieval score on the candidate text, thresholded at its operating point).

Pre-retrieval scores ``teacher_<name>`` for every teacher: x = the frame's candidate texts, state =
``State(query=[root_query], context=retained texts, frame_query, parent_goal, depth, extra={"pool": x})``
(``RowBuilder.pre_scores``; the read stage's rows, ``read_rows.ReadRowBuilder``, call it with a search's new hits
and the hits read before it, and label with the same ``row_label`` and ``finalize``).
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from contextlib import contextmanager

import numpy as np

from branchgate.errors import InputError
from branchgate.features import FEATURE_NAMES, structured_features
from branchgate.logs_to_dataset.decision_points import RunDecisions
from branchgate.logs_to_dataset.label_sources import (
    DEFAULT_POSITIVE_RATE,
    AutoSource,
    RunInfo,
    TeacherSource,
    make,
    rate_threshold,
)
from branchgate.models.teachers import Items, State, get

PRUNED_LABELS = ("excluded", "teacher_pre")
# Evidence is cut to ~10 characters per token of the encoder's window before embedding (the build sets
# it from the encoder): beyond what the encoder reads, so vectors are unchanged and tokenising stays cheap.
EVIDENCE_MAX_CHARS = 5120


@contextmanager
def one_blas_thread():
    """Run the teachers on one BLAS thread (a decorator of ``rows``). Their matrices are small (a decision's window:
    at most ``MAX_CONTEXT`` evidence rows and ``MAX_RETAINED`` retained texts), and more threads only spin against
    each other and every other process on shared cores: a Search-o1 log of 1,500 searches with 384-dim vectors built
    its rows 8.2× slower on every thread of a loaded 2-core machine (932 s against 113 s in one run of
    ``benchmarks/bench_build_searcho1.py``). Without threadpoolctl (it comes with the train extra's scikit-learn) the
    threads are left as they are."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(1, user_api="blas"):
        yield


def evidence_text(text: str, max_chars: int) -> str:
    """Evidence as embedded: cut to ``max_chars`` (beyond the encoder's window, so the vector is unchanged)."""
    return text[:max_chars]


def run_texts(rd: RunDecisions, max_chars: int, evidence: bool | None = None) -> list[str]:
    """Every text of a run that needs an embedding (one cache call per run).

    Evidence is embedded only when ``evidence`` (default: for runs without key-point labels): only teacher
    labels need evidence vectors.
    """
    if evidence is None:
        evidence = not rd.has_labels
    towers = []
    for f in rd.frames:
        if f.candidates:  # the towers' texts of a decision
            towers += [f.frame_query, f.parent_goal, *f.retained, *(c.text for c in f.candidates)]
    return tower_texts(rd.root_query, towers, rd.evidence.values() if evidence else (), max_chars)


def tower_texts(root_query: str, towers: list[str], evidence=(), max_chars: int = EVIDENCE_MAX_CHARS) -> list[str]:
    """The distinct texts to embed for a run: the root query, each tower text as the teachers read it and,
    stripped, as training reads it (``data/decision_batches.TextTable``), then the ``evidence`` events' texts as
    embedded (``evidence_text``)."""
    texts = [root_query] + [v for t in [root_query, *towers] if t and t.strip() for v in (t, t.strip())]
    texts += [evidence_text(e.text, max_chars) for e in evidence]
    return list(dict.fromkeys(texts))


class _Tools:
    """Embedded texts of one run, for sources that need vectors (teachers)."""

    def __init__(self, rd: RunDecisions, vectors: dict[str, np.ndarray], dim: int, max_chars: int):
        self.rd, self.vectors, self.dim, self.max_chars = rd, vectors, dim, max_chars
        self.q = self.items([rd.root_query])

    def items(self, texts: list[str], tokens=None):
        if not texts:
            return Items.empty(self.dim)
        return Items(list(texts), np.stack([self.vectors[t] for t in texts]), tokens)

    def evidence(self, ids: list[str]):
        evs = [self.rd.evidence[i] for i in ids]
        texts = [evidence_text(e.text, self.max_chars) for e in evs]
        tokens = np.array([e.tokens if e.tokens > 0 else max(1, len(e.text.split())) for e in evs], dtype=np.float64)
        return self.items(texts, tokens if evs else None)


class RowBuilder:
    """Turns a run's decision points into rows, given embeddings for ``texts``; ``finalize`` labels them."""

    stage = "pre"  # the dataset stage its rows belong to (``read_rows.ReadRowBuilder``: "read")

    def __init__(
        self,
        teachers: dict,
        label_teacher: str,
        label_threshold: float | None = None,
        pruned_labels: str = "excluded",
        max_chars: int = EVIDENCE_MAX_CHARS,
        labels: str = "auto",
        positive_rate: float = DEFAULT_POSITIVE_RATE,
        label_options: dict | None = None,
    ):
        if pruned_labels not in PRUNED_LABELS:
            raise ValueError(f"pruned_labels must be one of {PRUNED_LABELS}")
        if not 0.0 < positive_rate < 1.0:
            raise InputError(f"--positive-rate must be in (0, 1), got {positive_rate}")
        model = teachers[label_teacher] if label_teacher in teachers else get(label_teacher)
        self.source = make(labels, label_teacher, model, label_options)
        teacher = self.source.teacher if isinstance(self.source, AutoSource) else self.source
        if not isinstance(teacher, TeacherSource):
            teacher = TeacherSource(label_teacher, model)
        self.teachers = teachers
        self.label_name, self.label_model = teacher.name, teacher.model
        self.labels = labels
        self.override = label_threshold
        self.positive_rate = positive_rate
        self.pruned_labels = pruned_labels
        self.max_chars = max_chars
        self.kinds: dict[str, object] = {}  # utility_kind → its source, as met
        self.missing: Counter = Counter()  # (kind, reason) → runs excluded
        self.fitted: dict[str, dict] = {}  # kind → threshold, rule, positive rate per split (``finalize``)

    def resolve(self, rd: RunDecisions, info: RunInfo):
        """(the run's source, why it cannot label the run or None)."""
        src = self.source.resolve(rd) if isinstance(self.source, AutoSource) else self.source
        self.kinds.setdefault(src.kind, src)
        return src, src.missing(rd, info)

    def texts(self, rd: RunDecisions, info: RunInfo) -> list[str]:
        src, missing = self.resolve(rd, info)
        return run_texts(rd, self.max_chars, evidence=missing is None and src.needs_vectors(rd))

    @one_blas_thread()
    def rows(
        self, rd: RunDecisions, vectors: dict[str, np.ndarray], dim: int, info: RunInfo | None = None
    ) -> list[dict]:
        """Rows of one run (on one BLAS thread: ``one_blas_thread``); realized rows carry ``label = None`` until
        ``finalize``."""
        info = info or RunInfo()
        src, missing = self.resolve(rd, info)
        if missing is not None:
            self.missing[(src.kind, missing)] += 1
        tools = _Tools(rd, vectors, dim, self.max_chars)
        g_of = {} if missing is not None else src.utilities(rd, info, tools)
        out: list[dict] = []
        for f in rd.frames:
            if not f.candidates:
                continue
            pre, label_pre = self.pre_scores(
                tools, [c.text for c in f.candidates], f.retained, f.frame_query, f.parent_goal, f.depth
            )
            feats = structured_features(f.depth, len(f.candidates), len(f.retained)).astype(int)
            for k, c in enumerate(f.candidates):
                g = g_of.get(c.candidate_id, math.nan)
                label, source = self.row_label(missing, c.candidate_id in g_of, g, label_pre[k])
                row = {
                    "run_id": rd.run_id,
                    "frame_id": f.frame_id,
                    "candidate_id": c.candidate_id,
                    "root_query": rd.root_query,
                    "frame_query": f.frame_query,
                    "parent_goal": f.parent_goal,
                    "retained": list(f.retained),
                    "query": c.query,
                    "goal": c.goal,
                    **{name: int(v) for name, v in zip(FEATURE_NAMES, feats[k])},
                    "expanded": bool(c.expanded),
                    "utility": g,
                    "label": label,
                    "label_source": source,
                    "utility_kind": src.kind,
                    **self.teacher_columns(pre, k),
                }
                out.append(row)
        return out

    def pre_scores(self, tools, texts, retained, frame_query, parent_goal, depth):
        """Every teacher's pre-retrieval score of a decision's candidate ``texts`` (name → array), and the label
        teacher's: x = the texts, state = ``State([root query], retained texts, frame_query, parent_goal, depth,
        {"pool": x})``. The read stage calls it with the new hits' texts and the read hits' texts."""
        x = tools.items(list(texts))
        state = State(tools.q, tools.items(list(retained)), frame_query, parent_goal, depth, {"pool": x})
        pre = {name: np.asarray(m.score(x, state), dtype=np.float64) for name, m in self.teachers.items()}
        label_pre = pre[self.label_name] if self.label_name in pre else np.asarray(self.label_model.score(x, state))
        return pre, label_pre

    def teacher_columns(self, pre: dict, k: int) -> dict[str, float]:
        """Row ``k``'s ``teacher_<name>`` columns from ``pre_scores``."""
        return {f"teacher_{name}": float(pre[name][k]) for name in self.teachers}

    def row_label(self, missing: str | None, scored: bool, g: float, pre_score: float) -> tuple[int | None, str]:
        """A row's ``(label, label_source)`` before ``finalize``: excluded (−1) when the run lacks what its source
        needs; realized (None until ``finalize``) when the source ``scored`` the row with a known g; else, with
        ``pruned_labels`` teacher_pre and no score, the label teacher's ``pre_score`` at its operating point;
        else excluded."""
        if missing is not None:
            return -1, "excluded"
        if scored and not math.isnan(g):
            return None, "realized"
        if not scored and self.pruned_labels == "teacher_pre":
            higher = getattr(self.label_model, "higher_is_better", True)
            return int(_keep(float(pre_score), float(self.label_model.threshold), higher)), "teacher_pre"
        return -1, "excluded"

    def finalize(self, records: LabelRecords) -> dict[str, dict]:
        """Label every realized row of ``records`` (``LabelRecords``: the rows' compact label fields, per split);
        per kind: ``threshold``, ``rule`` and the ``positive_rate`` per split.

        Thresholds: ``--label-threshold`` if given; else the source's own (1 key point, 1 citation); else (teachers)
        the rate rule over the train split's realized utilities, with its per-depth floor (``depth_thresholds``);
        with none, the teacher's operating point."""
        out = {}
        for kind, src in sorted(self.kinds.items()):
            realized = {s: records.realized(s, kind) for s in records.splits}  # split → row positions
            by_depth: dict[int, float] = {}  # the rate rule's per-depth thresholds (``depth_thresholds``)
            higher = getattr(src, "higher_is_better", True)
            if self.override is not None:
                thr, rule = float(self.override), "--label-threshold"
            elif src.threshold is not None:
                thr, rule = float(src.threshold), f"the source's default ({kind})"
            else:
                idx = realized.get("train", np.zeros(0, np.int64))
                train, depth = records.utility("train")[idx], records.depth("train")[idx]
                fit = rate_threshold(train.tolist(), self.positive_rate, higher)
                if fit is None:
                    thr = float(getattr(src, "model", self.label_model).threshold)
                    rule = "the teacher's operating point (no realized train utility to set a rate from)"
                else:
                    thr = fit[0]
                    by_depth = depth_thresholds(train, depth, thr, self.positive_rate, higher)
                    rule = (
                        f"positive rate {self.positive_rate:g} of the train split's realized utilities "
                        f"(achieved {fit[1]:.4g}), and at least that rate at each depth"
                    )
            rates = {}
            for s, idx in realized.items():
                cut = level_thresholds(records.depth(s)[idx], thr, by_depth)
                labels = _keep(records.utility(s)[idx], cut, higher).astype(np.int64)
                records.label(s)[idx] = labels
                rates[s] = round(int(labels.sum()) / len(idx), 4) if len(idx) else None
            out[kind] = {
                "threshold": thr,
                "rule": rule,
                "positive_rate": rates,
                "depth_thresholds": {str(d): t for d, t in sorted(by_depth.items())},
            }
        return out


UNLABELLED = int(np.iinfo(np.int64).min)  # a realized row's label until ``finalize`` (None in a row dict)


class LabelRecords:
    """What labelling and the manifest read of each row (``utility``, ``utility_kind``, ``label_source``,
    ``expanded``, ``depth``, ``label``), per split, as flat arrays (about 24 bytes a row): the rows themselves (texts,
    retained lists, teacher scores) go to disk as they are built. ``finalize`` sets ``label`` here."""

    def __init__(self, splits):
        self.splits = tuple(splits)
        self.kinds: list[str] = []  # utility_kind / label_source codes → names
        self.sources: list[str] = []
        self._cols = {
            s: {
                "utility": array("d"),
                "kind": array("H"),
                "source": array("B"),
                "expanded": array("B"),
                "depth": array("I"),
                "label": array("q"),
            }
            for s in self.splits
        }

    @staticmethod
    def _code(names: list[str], name: str) -> int:
        if name not in names:
            names.append(name)
        return names.index(name)

    def add(self, split: str, rows: list[dict]) -> None:
        c = self._cols[split]
        for r in rows:
            c["utility"].append(float(r["utility"]))
            c["kind"].append(self._code(self.kinds, r["utility_kind"]))
            c["source"].append(self._code(self.sources, r["label_source"]))
            c["expanded"].append(bool(r["expanded"]))
            c["depth"].append(max(0, int(r["depth"])))
            c["label"].append(UNLABELLED if r["label"] is None else int(r["label"]))

    def __len__(self) -> int:
        return sum(self.n(s) for s in self.splits)

    def n(self, split: str) -> int:
        return len(self._cols[split]["utility"])

    def _array(self, split: str, col: str, dtype) -> np.ndarray:
        a = self._cols[split][col]
        return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype)  # views: writes go to the record

    def utility(self, split: str) -> np.ndarray:
        return self._array(split, "utility", np.float64)

    def depth(self, split: str) -> np.ndarray:
        return self._array(split, "depth", np.uint32).astype(np.int64)

    def expanded(self, split: str) -> np.ndarray:
        return self._array(split, "expanded", np.uint8).astype(bool)

    def label(self, split: str) -> np.ndarray:
        """The labels (int64; ``UNLABELLED`` for a realized row before ``finalize``), writable in place."""
        return self._array(split, "label", np.int64)

    def labels(self, split: str) -> list:
        """The labels as the row dicts hold them (None: not labelled yet)."""
        return [None if v == UNLABELLED else v for v in self.label(split).tolist()]

    def source(self, split: str) -> list[str]:
        return [self.sources[i] for i in self._cols[split]["source"]]

    def kind(self, split: str) -> list[str]:
        return [self.kinds[i] for i in self._cols[split]["kind"]]

    def realized(self, split: str, kind: str | None = None) -> np.ndarray:
        """Positions of the split's realized rows (of ``kind``), in row order."""
        if "realized" not in self.sources or (kind is not None and kind not in self.kinds):
            return np.zeros(0, np.int64)
        mask = self._array(split, "source", np.uint8) == self.sources.index("realized")
        if kind is not None:
            mask &= self._array(split, "kind", np.uint16) == self.kinds.index(kind)
        return np.flatnonzero(mask)


MIN_DEPTH_ROWS = 50  # realized train rows a depth needs for a threshold of its own


def depth_thresholds(
    values: np.ndarray, depths: np.ndarray, threshold: float, rate: float, higher_is_better: bool = True
) -> dict[int, float]:
    """The rate rule's per-depth thresholds: for each depth with at least ``MIN_DEPTH_ROWS`` realized train rows,
    the global ``threshold`` or, when that leaves fewer than ``rate`` of the depth's rows positive, the
    threshold giving ``rate`` among them (the lower of the two, so every depth has at least ``rate``).

    Why: a teacher's set gain shrinks as the retained context grows, so one threshold over all rows labels
    by depth (on simulated drgym runs: 98% of the root's candidates positive, 0.2% of deeper ones) and a
    gate trained on it has nothing to rank below the root."""
    out: dict[int, float] = {}
    for d in np.unique(depths):
        v = values[depths == d]
        if v.size < MIN_DEPTH_ROWS:
            continue
        fit = rate_threshold(v.tolist(), rate, higher_is_better)
        own = threshold if fit is None else fit[0]
        out[int(d)] = min(own, threshold) if higher_is_better else max(own, threshold)
    return out


def level_thresholds(depths: np.ndarray, threshold: float, by_depth: dict[int, float]) -> np.ndarray:
    """Each row's threshold: its depth's (``depth_thresholds``); a depth with too few train rows takes the
    nearest shallower depth's, else the global ``threshold``."""
    known = np.asarray(sorted(by_depth), np.int64)
    if not known.size:
        return np.full(len(depths), threshold, np.float64)
    values = np.asarray([threshold] + [by_depth[int(d)] for d in known], np.float64)
    return values[np.searchsorted(known, np.asarray(depths, np.int64), side="right")]


def _keep(value: float, threshold: float, higher_is_better: bool = True) -> bool:
    return value >= threshold if higher_is_better else value <= threshold
