"""Label sources: where a branch's realized utility g comes from (``dataset build --labels``).

A source turns one run into ``{candidate_id: g}`` for its expanded candidates with known evidence E(c)
(``RowBuilder`` makes the rows, ``label = 1[g ≥ threshold]``, ``utility_kind`` = the source's ``kind``):

| ``--labels`` | kind | g | needs (else the run is excluded and counted) | default threshold |
|---|---|---|---|---|
| ``keypoints`` | ``keypoints`` | ground-truth key points covered by E(c) and not by C_t \
| evidence with key-point ``labels`` | 1 key point |
| ``returns[:γ]`` | ``returns:γ`` | the discounted return of expanding c: key points new to C_t that c's evidence \
covers, plus γ^k times those first covered by its expanded descendants k levels below (the frames whose \
``parent_candidate`` is c, and theirs); γ = 0.5 by default, γ = 0 is ``keypoints`` | as ``keypoints`` | 1 key point |
| ``citations`` | ``citations`` | evidence items of E(c) \\ C_t that the final report cites \
| a ``report`` with ``cited_ids`` naming some evidence | 1 citation |
| ``teacher:NAME`` | ``teacher:NAME`` | ``set_gain(teacher, E(c), state)`` given C_t | nothing (evidence text) \
| rate rule (below) |
| ``judge`` | ``judge`` | key points an LLM judge finds new in E(c) (``logs_to_dataset/judge.py``) \
| ``--llm-url``, ``--llm-model`` | the judge's |
| ``auto`` | per run | ``keypoints`` when the run has them, else ``teacher:<--teacher>`` | — | as above |

``returns`` counts only descendants the run expanded: in unpruned runs (the bench's training runs) that is the
whole subtree; in pruned runs it is a lower bound. Each key point counts once, at the shallowest level (then the
earliest branch) that finds it.

Rate rule: a teacher's set gains have no scale a fixed threshold fits across logs (on drgym dev runs without
key points every SC gain is below its 0.05 operating point), so with no ``--label-threshold`` the threshold
is the value at which a target fraction (``--positive-rate``) of the train split's realized utilities is
positive, lowered at each depth where fewer than that fraction of the depth's train utilities pass it
(``labels.depth_thresholds``: a set gain shrinks as the context grows); validation and test are labelled with
those thresholds, never looked at.

At the read stage (``dataset build --stage read``) ``keypoints``, ``citations``, ``teacher:NAME`` and ``auto`` label
each new hit of a search instead, with the same kinds and thresholds (``read_rows``: ``read_source``); ``returns``
and ``judge`` are refused there.

Adding a source is adding a class with ``kind``, ``threshold`` (a number, or None for the rate rule),
``higher_is_better``, ``needs_vectors(rd)``, ``missing(rd, info)`` and ``utilities(rd, info, tools)``, and
an entry in ``SOURCES``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from branchgate.errors import InputError
from branchgate.logs_to_dataset import judge
from branchgate.models import teachers as T
from branchgate.models.teachers import State, set_gain

EXCLUDED = "excluded"
DEFAULT_POSITIVE_RATE = 0.1
DEFAULT_DISCOUNT = 0.5  # returns: weight of key points one level below (γ), fixed before any measurement


@dataclass
class RunInfo:
    """What a run offers label sources beyond its decision points: its (last) report."""

    report: object | None = None


def run_info(events) -> RunInfo:
    reports = [e for e in events if e.type == "report"]
    return RunInfo(max(reports, key=lambda e: e.seq) if reports else None)


def _new_ids(f, c) -> list[str]:
    """E(c) minus the context C_t the frame opened with: the evidence the branch brought in."""
    ctx = set(f.context_ids)
    return [i for i in c.evidence_ids if i not in ctx]


def _known(f):
    return [c for c in f.candidates if c.expanded and c.evidence_ids is not None]


class _CountSource:
    """A source whose g counts things (key points, citations): positive from one, no vectors needed."""

    threshold = 1.0
    higher_is_better = True

    def needs_vectors(self, rd) -> bool:
        return False


class KeypointSource(_CountSource):
    """Key points new to the frame's context C_t: the branch's own (``discount`` 0, ``keypoints``), plus its
    expanded descendants', γ^k for those first found k levels below (``returns:γ``)."""

    def __init__(self, discount: float = 0.0):
        self.discount = discount_of(discount)
        self.kind = "keypoints" if self.discount == 0 else f"returns:{self.discount:g}"

    def missing(self, rd, info) -> str | None:
        return None if rd.has_labels else "no evidence carries key-point labels"

    def utilities(self, rd, info, tools) -> dict[str, float]:
        def kps(ids):
            return {kp for i in ids for kp in (rd.evidence[i].labels or [])}

        children: dict[str, list] = {}
        for f in rd.frames:
            if f.parent_candidate is not None:
                children.setdefault(f.parent_candidate, []).append(f)
        out = {}
        for f in rd.frames:
            covered = kps(f.context_ids)
            for c in _known(f):
                seen, g, weight, level = set(covered), 0.0, 1.0, [c]
                while level and weight > 0:
                    below = []
                    for b in level:
                        new = kps(b.evidence_ids) - seen
                        g += weight * len(new)
                        seen |= new
                        below += [k for fr in children.get(b.candidate_id, ()) for k in _known(fr)]
                    level, weight = below, weight * self.discount
                out[c.candidate_id] = g
        return out


class CitationSource(_CountSource):
    kind = "citations"

    def missing(self, rd, info) -> str | None:
        return citations_missing(info, rd.evidence)

    def utilities(self, rd, info, tools) -> dict[str, float]:
        cited = set(info.report.cited_ids)
        return {
            c.candidate_id: float(sum(1 for i in _new_ids(f, c) if i in cited)) for f in rd.frames for c in _known(f)
        }


def citations_missing(info, known) -> str | None:
    """Why a run's report cannot label by citations (None: it can): no report, no ``cited_ids``, or none of
    them among the run's ``known`` ids (its evidence ids; at the read stage also its hit ids)."""
    r = info.report
    if r is None:
        return "no report event"
    if r.cited_ids is None:
        return "the report records no citations (cited_ids)"
    if not any(i in known for i in r.cited_ids):
        return "the report cites no evidence of the run"
    return None


class TeacherSource:
    threshold = None  # the rate rule, unless --label-threshold
    needs_vectors = staticmethod(lambda rd: True)

    def __init__(self, name: str, model):
        self.name, self.model = name, model
        self.kind = f"teacher:{name}"
        self.higher_is_better = bool(getattr(model, "higher_is_better", True))

    def missing(self, rd, info) -> str | None:
        return None

    def utilities(self, rd, info, tools) -> dict[str, float]:
        out = {}
        for f in rd.frames:
            known = _known(f)
            if known:
                gains = self.gains(tools, f.context_ids, [c.evidence_ids for c in known], f)
                out.update((c.candidate_id, g) for c, g in zip(known, gains))
        return out

    def gains(self, tools, context_ids: list[str], evidence_sets: list[list[str]], at) -> list[float]:
        """``set_gain(teacher, E, state)`` of each evidence set E (lists of evidence ids) given the context C_t
        (``context_ids``): state = ``State([root query], C_t, at.frame_query, at.parent_goal, at.depth, {"pool":
        C_t ∪ every E})``; ``at`` is the decision (a frame, or a read point)."""
        pool = list(dict.fromkeys(context_ids + [i for ids in evidence_sets for i in ids]))
        state = State(
            tools.q,
            tools.evidence(context_ids),
            at.frame_query,
            at.parent_goal,
            at.depth,
            {"pool": tools.evidence(pool)},
        )
        return [float(set_gain(self.model, tools.evidence(ids), state)) for ids in evidence_sets]


class AutoSource:
    """``keypoints`` for runs that have them, else the teacher (the behaviour before ``--labels``)."""

    def __init__(self, teacher: TeacherSource):
        self.keypoints, self.teacher = KeypointSource(), teacher

    def resolve(self, rd):
        return self.keypoints if rd.has_labels else self.teacher


def _judge(teacher_source, options: dict):
    if not options.get("llm_url") or not options.get("llm_model"):
        raise InputError(
            "--labels judge needs --llm-url/--llm-model (an OpenAI-compatible endpoint and model "
            "that reads each branch's evidence and names the key points it adds)"
        )

    return judge.label_source(**options)


SOURCES = {
    "keypoints": lambda teacher, options: KeypointSource(),
    "returns": lambda teacher, options: KeypointSource(options.get("discount", DEFAULT_DISCOUNT)),
    "citations": lambda teacher, options: CitationSource(),
    "teacher": lambda teacher, options: teacher,
    "judge": _judge,
    "auto": lambda teacher, options: AutoSource(teacher),
}


def discount_of(value) -> float:
    """The ``returns`` discount γ (``returns:γ`` or ``label_options.discount``): a number in [0, 1]."""
    try:
        g = float(value)
    except (TypeError, ValueError):
        g = float("nan")
    if not 0.0 <= g <= 1.0:
        raise InputError(f"--labels returns:DISCOUNT needs a number in [0, 1]; got {value!r}")
    return g


def parse_spec(spec: str | None) -> tuple[str, str]:
    """``(source, argument or "")`` of a ``--labels`` value (``teacher:NAME``, ``returns:γ``); InputError for
    an unknown one."""
    spec = (spec or "auto").strip()
    name, _, arg = spec.partition(":")
    if name not in SOURCES or (arg and name not in ("teacher", "returns")):
        raise InputError(
            f"--labels must be one of auto, keypoints, returns[:DISCOUNT], citations, judge, teacher:NAME; got {spec!r}"
        )
    if name == "teacher" and arg and arg not in T.NAMES:
        raise InputError(f"unknown teacher {arg!r} in --labels; valid names: {', '.join(T.NAMES)}")
    if name == "returns" and arg:
        discount_of(arg)
    return name, arg


def make(spec: str, teacher_name: str, teacher_model, options: dict | None = None):
    """The source named by ``--labels`` (``teacher:NAME`` overrides ``--teacher``'s name for the label)."""
    name, arg = parse_spec(spec)
    options = dict(options or {})
    if name == "teacher" and arg:
        teacher_name, teacher_model = arg, T.get(arg)
    elif name == "returns" and arg:
        options["discount"] = arg
    return SOURCES[name](TeacherSource(teacher_name, teacher_model), options)


def rate_threshold(values, rate: float, higher_is_better: bool = True) -> tuple[float, float] | None:
    """The threshold t among the values' own levels whose positive rate (g ≥ t, or g ≤ t when lower is better)
    is closest to ``rate`` while leaving both classes (ties: fewer positives); (t, achieved rate), or None
    when there are no values. With one level only, every value is positive (the build warns)."""
    a = np.asarray([v for v in values if v == v], dtype=np.float64)
    if not a.size:
        return None
    s = np.sort(a if higher_is_better else -a)
    levels = np.unique(s)
    rates = (s.size - np.searchsorted(s, levels, side="left")) / s.size  # fraction ≥ each level
    ok = (rates > 0) & (rates < 1)
    if not ok.any():
        return (float(levels[0] if higher_is_better else -levels[0]), 1.0)
    idx = np.flatnonzero(ok)
    best = idx[np.lexsort((-levels[idx], np.abs(rates[idx] - rate)))[0]]
    t = float(levels[best])
    return (t if higher_is_better else -t, float(rates[best]))
