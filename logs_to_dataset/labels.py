"""Decision rows with labels and per-teacher pre-retrieval scores (the dataset contract: ``data.schema``).

Realized utility ``g`` of an expanded candidate ``c`` whose retrieved evidence E(c) is known:

- ``keypoints`` (the run's evidence carries ``labels``): the number of ground-truth key points covered by
  E(c) and not already covered by the retained context C_t (evidence without labels covers none);
- ``teacher:<name>`` otherwise: ``set_gain(teacher, E(c), state)``, the teacher's marginal value of the
  set E(c) given C_t and the root query; the pool P (used by coverage teachers) is C_t ∪ the evidence of
  every expanded candidate of the frame.

``label = 1[g ≥ threshold]`` (the teacher's own comparison direction), ``label_source = "realized"``.
Candidates never expanded, or expanded without known evidence, get ``utility = NaN`` and, by
``pruned_labels``: ``"excluded"`` (label −1, default) or ``"teacher_pre"`` (the label teacher's
pre-retrieval score on the candidate text, thresholded at its operating point).

Pre-retrieval scores ``teacher_<name>`` for every teacher: x = the frame's candidate texts, state =
``State(query=[root_query], context=retained texts, frame_query, parent_goal, depth, extra={"pool": x})``.
"""

from __future__ import annotations

import math

import numpy as np

from branchgate.features import FEATURE_NAMES, structured_features
from branchgate.logs_to_dataset.decisions import RunDecisions

KEYPOINTS = "keypoints"
DEFAULT_KEYPOINT_THRESHOLD = 1.0
PRUNED_LABELS = ("excluded", "teacher_pre")
# Evidence is cut to ~10 characters per token of the encoder's window before embedding (the build sets
# it from the encoder): beyond what the encoder reads, so vectors are unchanged and tokenising stays cheap.
EVIDENCE_MAX_CHARS = 5120


def evidence_text(text: str, max_chars: int) -> str:
    """Evidence as embedded: cut to ``max_chars`` (beyond the encoder's window, so the vector is unchanged)."""
    return text[:max_chars]


def run_texts(rd: RunDecisions, max_chars: int) -> list[str]:
    """Every text of a run that needs an embedding (one cache call per run).

    Evidence is embedded only for teacher-labelled runs: key-point labels need no evidence vectors.
    """
    texts = [rd.root_query]
    for f in rd.frames:
        texts += f.retained
        texts += [c.text for c in f.candidates]
    if not rd.has_labels:
        texts += [evidence_text(e.text, max_chars) for e in rd.evidence.values()]
    return list(dict.fromkeys(texts))


class RowBuilder:
    """Turns a run's decision points into rows, given embeddings for ``run_texts``."""

    def __init__(self, teachers: dict, label_teacher: str, label_threshold: float | None = None,
                 pruned_labels: str = "excluded", max_chars: int = EVIDENCE_MAX_CHARS):
        from branchgate.models.teachers import get

        if pruned_labels not in PRUNED_LABELS:
            raise ValueError(f"pruned_labels must be one of {PRUNED_LABELS}")
        self.teachers = teachers
        self.label_name = label_teacher
        self.label_model = teachers[label_teacher] if label_teacher in teachers else get(label_teacher)
        self.override = label_threshold
        self.pruned_labels = pruned_labels
        self.max_chars = max_chars

    def threshold(self, kind: str) -> float:
        if self.override is not None:
            return float(self.override)
        return DEFAULT_KEYPOINT_THRESHOLD if kind == KEYPOINTS else float(self.label_model.threshold)

    def kind(self, rd: RunDecisions) -> str:
        return KEYPOINTS if rd.has_labels else f"teacher:{self.label_name}"

    def _keep(self, value: float, threshold: float, kind: str) -> bool:
        if kind != KEYPOINTS and not getattr(self.label_model, "higher_is_better", True):
            return value <= threshold
        return value >= threshold

    def rows(self, rd: RunDecisions, vectors: dict[str, np.ndarray], dim: int) -> list[dict]:
        from branchgate.models.teachers import Items, State, set_gain

        def items(texts: list[str], tokens=None) -> Items:
            if not texts:
                return Items.empty(dim)
            return Items(list(texts), np.stack([vectors[t] for t in texts]), tokens)

        def ev_items(ids: list[str]) -> Items:
            evs = [rd.evidence[i] for i in ids]
            texts = [evidence_text(e.text, self.max_chars) for e in evs]
            tokens = np.array([e.tokens if e.tokens > 0 else max(1, len(e.text.split())) for e in evs], dtype=np.float64)
            return items(texts, tokens if evs else None)

        kind = self.kind(rd)
        thr = self.threshold(kind)
        q = items([rd.root_query])
        out: list[dict] = []
        for f in rd.frames:
            if not f.candidates:
                continue
            x = items([c.text for c in f.candidates])
            pre_state = State(q, items(f.retained), f.frame_query, f.parent_goal, f.depth, {"pool": x})
            pre = {name: np.asarray(m.score(x, pre_state), dtype=np.float64) for name, m in self.teachers.items()}
            label_pre = pre[self.label_name] if self.label_name in pre else np.asarray(self.label_model.score(x, pre_state))
            known = [c for c in f.candidates if c.expanded and c.evidence_ids is not None]
            if kind == KEYPOINTS:
                covered = {kp for i in f.context_ids for kp in (rd.evidence[i].labels or [])}
            else:
                ctx = ev_items(f.context_ids)
                pool_ids = list(dict.fromkeys(f.context_ids + [i for c in known for i in c.evidence_ids]))
                post_state = State(q, ctx, f.frame_query, f.parent_goal, f.depth, {"pool": ev_items(pool_ids)})
            feats = structured_features(f.depth, len(f.candidates), len(f.retained)).astype(int)
            for k, c in enumerate(f.candidates):
                if c.expanded and c.evidence_ids is not None:
                    if kind == KEYPOINTS:
                        g = float(len({kp for i in c.evidence_ids for kp in (rd.evidence[i].labels or [])} - covered))
                    else:
                        g = float(set_gain(self.label_model, ev_items(c.evidence_ids), post_state))
                    label, source = int(self._keep(g, thr, kind)), "realized"
                    if math.isnan(g):
                        label, source = -1, "excluded"
                elif self.pruned_labels == "teacher_pre":
                    g = math.nan
                    label = int(self._keep(float(label_pre[k]), float(self.label_model.threshold), "teacher"))
                    source = "teacher_pre"
                else:
                    g, label, source = math.nan, -1, "excluded"
                row = {
                    "run_id": rd.run_id, "frame_id": f.frame_id, "candidate_id": c.candidate_id,
                    "root_query": rd.root_query, "frame_query": f.frame_query, "parent_goal": f.parent_goal,
                    "retained": list(f.retained), "query": c.query, "goal": c.goal,
                    **{name: int(v) for name, v in zip(FEATURE_NAMES, feats[k])},
                    "expanded": bool(c.expanded), "utility": g, "label": label, "label_source": source,
                    "utility_kind": kind,
                }
                for name in self.teachers:
                    row[f"teacher_{name}"] = float(pre[name][k])
                out.append(row)
        return out
