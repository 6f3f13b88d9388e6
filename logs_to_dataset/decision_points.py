"""From one run's canonical events to its decision points (pure Python, no embeddings).

For each ``frame_open`` (a decision point) it collects the frame's candidates and, using ``seq`` order:

- ``retained``: the branches expanded before the frame opened (``decision`` expand, or else a
  ``retrieval``, with smaller seq), as ``texts.candidate_text(query, goal)``, in that order;
- ``context_ids`` (C_t): evidence ids retrieved before the frame opened, minus ids removed by
  ``prune`` events of stage ``post_retrieval`` before it, in retrieval order;
- candidates sorted by the trace's ``order`` (then ``seq``) and renumbered 0..K-1, the position the Gate
  sees (``features.structured_features``);
- per candidate: ``expanded`` (an expand decision, or a retrieval for it) and ``evidence_ids`` E(c) (the
  union of its retrievals; ``None`` when no retrieval is known or it names evidence the run never
  emitted — its realized value is then unknown).
- deferral and budgets (``inference/run_gate.py``): a candidate with a ``defer`` decision is ``deferred``; if a
  later ``expand`` (naming the defer's seq in ``deferred_from``) or a retrieval follows, it is ``expanded`` and
  its row stays at its first frame (where it was a candidate), labelled from its evidence like any expanded
  candidate (its g is measured against that frame's context, as its siblings' are). Deferred and never
  expanded counts as not expanded (labelled as pruned candidates are: ``pruned_labels``). A ``prune`` by actor
  ``budget`` is ``dropped_by_budget``. ``RunDecisions.deferral`` counts them; an ``expand`` whose
  ``deferred_from`` names no defer decision of the same candidate is listed in ``problems``.

A run without a ``run_end``, or whose ``run_end`` status is not "ok", is partial (``partial_reason``); the
build counts it and keeps or skips it (``--partial-runs``). Run-level problems are reported, not guessed: no
``run_start`` → ``InputError`` (the run is skipped); a candidate in an unknown frame, or a decision/retrieval
for an unknown candidate → that event is
ignored and listed in ``problems``; a ``parent_candidate`` that is not a candidate declared before its frame
opened (unknown, later, or the frame's own: a cycle) → None, listed in ``problems``, so that follow-up links
always point back in time.

Caps (``MAX_CANDIDATES``, ``MAX_RETAINED``, ``MAX_CONTEXT``, ``MAX_EVIDENCE``): what one decision point holds is
bounded, so that the work per decision (the teachers' scores and set gains, the rows' ``retained`` lists) is
bounded and a build grows linearly with its logs. They live here, where decision points are made, because
every reader's runs pass through ``run_decisions`` before any teacher sees them, so the teachers keep their
maths (the lexical teacher alone bounds its own input: ``lexical.MAX_CHARS`` characters of a text); the
``openinference`` reader applies ``MAX_CANDIDATES`` to one LLM span's tool calls itself. Beyond a cap the items
are left out and counted in ``problems`` (the manifest's ``run_problems``):
each candidate past the first ``MAX_CANDIDATES`` of its decision point (by order) once — it gets no row, though
its expansion still counts as a retained branch of later decisions —, and once per decision point whose
retained branches (the newest are kept) or context (the newest evidence is kept), or per candidate whose E(c)
(the first retrieved are kept), went over its cap. Real logs stay below them (the quickstart's simulated runs
reach 6 candidates, 69 retained branches and 215 context items; DeepResearchGym's Search-o1 traces 1, 5 and 18).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import islice

from branchgate.errors import InputError
from branchgate.limits import MAX_CANDIDATES, MAX_CONTEXT, MAX_EVIDENCE, MAX_RETAINED
from branchgate.logs_to_dataset.trace_schema import Evidence
from branchgate.texts import candidate_text

OVER_CANDIDATES = f"candidate past the first {MAX_CANDIDATES} of its decision point (left out: no row)"
OVER_RETAINED = f"decision point with more than {MAX_RETAINED} retained branches (the newest {MAX_RETAINED} kept)"
OVER_CONTEXT = (
    f"decision point whose context holds more than {MAX_CONTEXT} evidence items (the newest {MAX_CONTEXT} kept)"
)
OVER_EVIDENCE = f"candidate that retrieved more than {MAX_EVIDENCE} evidence items (the first {MAX_EVIDENCE} kept)"


def partial_reason(events: list) -> str | None:
    """Why a run is partial (crashed, cut or unfinished), or None when it ended normally: no ``run_end``
    event, or a ``run_end`` whose ``status`` is not "ok" (Search-o1 "truncated", GPT-Researcher "incomplete")."""
    ends = [e for e in events if getattr(e, "type", None) == "run_end"]
    if not ends:
        return "no run_end (the run crashed or is still running)"
    status = getattr(ends[-1], "status", "ok")
    return None if status == "ok" else f"run_end status {str(status)[:40]!r}"


SPLIT_BY = ("run", "question")  # dataset build --split-by


def check_split_by(split_by: str) -> str:
    """``split_by`` when it is one of ``SPLIT_BY``, else an ``InputError`` naming ``--split-by``."""
    if split_by not in SPLIT_BY:
        raise InputError(f"must be one of {list(SPLIT_BY)}, got {split_by!r}", "--split-by")
    return split_by


def split_key(run_id: str, root_query: str, split_by: str = "run") -> str:
    """What ``split_of`` hashes: the run id, or with ``question`` the run's root question, so that repeated
    runs of one question (several simulation seeds, retries) share a split and never leak it into validation
    or test. Either way a run lies wholly in one split."""
    return run_id if check_split_by(split_by) == "run" else "question:" + " ".join(str(root_query).split()).lower()


@dataclass
class CandidateInfo:
    candidate_id: str
    order: int
    query: str
    goal: str
    seq: int
    expanded: bool = False
    evidence_ids: list[str] | None = None
    deferred: bool = False  # a defer decision set it aside (it may have been expanded later)
    dropped_by_budget: bool = False  # pruned by actor "budget"

    @property
    def text(self) -> str:
        return candidate_text(self.query, self.goal)


@dataclass
class FrameInfo:
    frame_id: str
    seq: int
    depth: int
    frame_query: str
    parent_goal: str
    parent_candidate: str | None = None  # the expanded candidate this frame follows up (None: the root)
    candidates: list[CandidateInfo] = field(default_factory=list)
    retained: list[str] = field(default_factory=list)
    context_ids: list[str] = field(default_factory=list)


@dataclass
class RunDecisions:
    run_id: str
    root_query: str
    frames: list[FrameInfo]
    evidence: dict[str, Evidence]
    has_labels: bool  # some evidence carries ground-truth key-point labels
    problems: list[str] = field(default_factory=list)

    @property
    def n_decisions(self) -> int:
        return sum(len(f.candidates) for f in self.frames)

    @property
    def n_frames(self) -> int:
        """Decision points with rows: frames with candidates."""
        return sum(1 for f in self.frames if f.candidates)

    @property
    def deferral(self) -> dict[str, int]:  # keys: DEFERRAL_COUNTS
        """Candidates deferred (then expanded, or never), and pruned by the budget."""
        cands = [c for f in self.frames for c in f.candidates]
        return {
            "deferred": sum(c.deferred for c in cands),
            "deferred_expanded": sum(c.deferred and c.expanded for c in cands),
            "deferred_never_expanded": sum(c.deferred and not c.expanded for c in cands),
            "dropped_by_budget": sum(c.dropped_by_budget and not c.expanded for c in cands),
        }


DEFERRAL_COUNTS = (
    "deferred",
    "deferred_expanded",
    "deferred_never_expanded",
    "dropped_by_budget",
)  # RunDecisions.deferral


def run_decisions(run_id: str, events: list, file: str = "") -> RunDecisions:
    """The decision points of one run (rules in the module docstring): one pass over its events in ``seq``
    order, then each candidate's expansion and evidence, then each frame's retained branches and context."""
    events = sorted(events, key=lambda e: e.seq)
    start = next((e for e in events if e.type == "run_start"), None)
    if start is None:
        raise InputError(f"run {run_id!r} has no run_start event (skipped)", file)
    run = _RunEvents()
    for e in events:
        run.add(e)
    run.mark_expanded()
    run.fill_frames()
    has_labels = any(ev.labels is not None for ev in run.evidence.values())
    return RunDecisions(
        run_id,
        start.root_query,
        sorted(run.frames.values(), key=lambda f: f.seq),
        run.evidence,
        has_labels,
        run.problems,
    )


@dataclass
class _RunEvents:
    """What one pass over a run's events (in ``seq`` order) collects for ``run_decisions``."""

    frames: dict[str, FrameInfo] = field(default_factory=dict)
    cands: dict[str, CandidateInfo] = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)
    expands: list[tuple[int, str]] = field(default_factory=list)  # (seq, candidate_id)
    retrievals: list[tuple[int, str, list[str]]] = field(default_factory=list)
    prunes: list[tuple[int, list[str]]] = field(default_factory=list)
    defers: dict[str, int] = field(default_factory=dict)  # candidate_id → seq of its (first) defer decision
    problems: list[str] = field(default_factory=list)

    def add(self, e) -> None:
        t = e.type
        if t == "frame_open":
            self.frame_open(e)
        elif t == "candidate":
            self.candidate(e)
        elif t == "decision":
            self.decision(e)
        elif t == "retrieval":
            if e.candidate_id not in self.cands:
                self.problems.append(f"retrieval for unknown candidate {e.candidate_id!r} (ignored)")
            else:
                self.retrievals.append((e.seq, e.candidate_id, list(e.evidence_ids)))
        elif t == "evidence":
            self.evidence.setdefault(e.evidence_id, e)
        elif t == "prune" and e.stage == "post_retrieval":
            self.prunes.append((e.seq, list(e.item_ids)))

    def frame_open(self, e) -> None:
        if e.frame_id in self.frames:
            self.problems.append(f"frame {e.frame_id!r} opened twice (second ignored)")
            return
        parent = getattr(e, "parent_candidate", None)
        if parent is not None and parent not in self.cands:  # not declared before this frame: unknown, later, a cycle
            self.problems.append(
                f"frame {e.frame_id!r} names parent_candidate {str(parent)[:80]!r}, not a candidate "
                "declared before it (ignored)"
            )
            parent = None
        self.frames[e.frame_id] = FrameInfo(e.frame_id, e.seq, e.depth, e.frame_query, e.parent_goal, parent)

    def candidate(self, e) -> None:
        if e.frame_id not in self.frames:
            self.problems.append(f"candidate {e.candidate_id!r} names unknown frame {e.frame_id!r} (ignored)")
            return
        if e.candidate_id in self.cands:
            self.problems.append(f"candidate {e.candidate_id!r} declared twice (second ignored)")
            return
        c = CandidateInfo(e.candidate_id, e.order, e.query, e.goal, e.seq)
        self.cands[e.candidate_id] = c
        self.frames[e.frame_id].candidates.append(c)

    def decision(self, e) -> None:
        if e.candidate_id not in self.cands:
            self.problems.append(f"decision for unknown candidate {e.candidate_id!r} (ignored)")
        elif e.action == "expand":
            self.expands.append((e.seq, e.candidate_id))
            origin = getattr(e, "deferred_from", None)
            if origin is not None and self.defers.get(e.candidate_id) != origin:
                self.problems.append(
                    f"expand of {e.candidate_id!r} names deferred_from={origin!r}, not a defer "
                    "decision of that candidate (kept as an expand)"
                )
        elif e.action == "defer":
            self.defers.setdefault(e.candidate_id, e.seq)
            self.cands[e.candidate_id].deferred = True
        elif e.action == "prune" and e.actor == "budget":
            self.cands[e.candidate_id].dropped_by_budget = True

    def mark_expanded(self) -> None:
        """Each candidate's ``expanded`` and, when every id its retrievals name was emitted, ``evidence_ids``."""
        for _, cid in self.expands:
            self.cands[cid].expanded = True
        found: dict[str, dict[str, None]] = {}  # candidate_id → its evidence ids, in retrieval order
        for _, cid, ids in self.retrievals:
            self.cands[cid].expanded = True
            found.setdefault(cid, {}).update(dict.fromkeys(ids))
        unknown_ids = 0
        for cid, ids in found.items():
            if all(i in self.evidence for i in ids):
                self.cands[cid].evidence_ids = list(ids)
            else:
                unknown_ids += 1
        if unknown_ids:
            self.problems.append(f"{unknown_ids} retrieval(s) name evidence the run never emitted (utility unknown)")

    def fill_frames(self) -> None:
        """Each frame's candidates (sorted, renumbered, capped), retained branches and context C_t."""
        first_expand: dict[str, int] = {}  # a retrieval without a decision also means "expanded"
        for seq, cid in sorted(self.expands + [(seq, cid) for seq, cid, _ in self.retrievals]):
            first_expand.setdefault(cid, seq)
        order = sorted(first_expand.items(), key=lambda kv: kv[1])
        expanded_seqs = [seq for _, seq in order]
        expanded_texts = [self.cands[cid].text for cid, _ in order]
        frames = sorted(self.frames.values(), key=lambda f: f.seq)
        for f, ctx in zip(frames, self.contexts(frames), strict=True):
            self.cap_candidates(f)
            n = bisect_left(expanded_seqs, f.seq)  # branches expanded before the frame opened
            if n > MAX_RETAINED:
                self.problems.append(OVER_RETAINED)
            f.retained = expanded_texts[max(0, n - MAX_RETAINED) : n]
            if len(ctx) > MAX_CONTEXT:
                self.problems.append(OVER_CONTEXT)
            f.context_ids = list(islice(reversed(ctx), MAX_CONTEXT))[::-1]

    def cap_candidates(self, f: FrameInfo) -> None:
        """Sort a frame's candidates by (order, seq), keep the first ``MAX_CANDIDATES``, renumber them 0..K-1 (the
        position the Gate sees: features.py) and cut each one's E(c) to ``MAX_EVIDENCE``."""
        f.candidates.sort(key=lambda c: (c.order, c.seq))
        self.problems.extend([OVER_CANDIDATES] * max(0, len(f.candidates) - MAX_CANDIDATES))
        del f.candidates[MAX_CANDIDATES:]
        for i, c in enumerate(f.candidates):
            c.order = i
            if c.evidence_ids is not None and len(c.evidence_ids) > MAX_EVIDENCE:
                self.problems.append(OVER_EVIDENCE)
                c.evidence_ids = c.evidence_ids[:MAX_EVIDENCE]

    def contexts(self, frames: list[FrameInfo]):
        """C_t of each frame (``frames`` in seq order): the evidence retrieved before it opened, minus the
        post-retrieval prunes before it, in retrieval order. One dict, updated as the timeline is read once."""
        timeline = sorted(
            [(seq, "retrieval", ids) for seq, _, ids in self.retrievals]
            + [(seq, "prune", ids) for seq, ids in self.prunes],
            key=lambda t: t[0],
        )
        ctx: dict[str, None] = {}
        step = 0
        for f in frames:
            while step < len(timeline) and timeline[step][0] < f.seq:
                _, kind, ids = timeline[step]
                step += 1
                if kind == "retrieval":
                    ctx.update(dict.fromkeys(i for i in ids if i in self.evidence))
                else:
                    for i in ids:
                        ctx.pop(i, None)
            yield ctx
