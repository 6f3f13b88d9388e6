"""From one run's canonical events to its read decision points (trace schema v2; pure Python, no embeddings).

A read decision point is one ``results`` event: the result list a sub-query's search returned, before any hit
was read. ``run_read_points`` walks the run's events once, in ``seq`` order, keeping the run's context and the
hits read so far as it goes, and gives one ``ReadPoint`` per ``results`` event (a version 1 run has none: []):

- the search's state: ``root_query`` (``run_start``), ``frame_query`` = the searched candidate's query,
  ``parent_goal`` = its goal ("" when none), ``depth`` = the depth of the frame it belongs to, ``frame_id`` and
  ``candidate_id`` (the candidate: declared by a ``candidate`` event before the results event; for the agent's
  own search, a results event naming a ``frame_id`` opened before it: the results' query, no goal);
- ``context_ids``: the evidence ids in the run's context just before the results event: every id listed by an
  earlier ``retrieval`` (of a declared candidate), minus the ids removed by earlier ``prune`` events of stage
  ``post_retrieval`` or ``pre_synthesis``, in the order they entered (newest last). The newest ``MAX_CONTEXT``
  are kept (``decision_points.MAX_CONTEXT``);
- ``read_ids``: the hit ids read earlier in the run (``read`` events with action "read" before the results
  event), in the order first read; the newest ``MAX_READ_IDS`` are kept;
- ``retained``: the texts of those read hits as the read gate sees them, ``texts.hit_text(title, snippet)`` of
  each from the first results event that showed its id, oldest first; the newest ``MAX_RETAINED``
  (``decision_points.MAX_RETAINED``) are kept; a read hit no earlier results event showed has no text and is
  left out (its read counts as ``read_without_results``);
- ``hits``, in rank order, each a dict: ``hit_id``, ``title``, ``snippet``, ``rank``, ``url``; ``is_new`` = its
  id is neither among the hits read earlier nor in the context (``is_new`` is decided on the whole sets, not on
  the kept lists); ``action`` = its ``read`` event's action ("read" / "skip" / "defer"; None when the trace has
  no read event for it; a deferred hit decided later takes that outcome, with ``deferred`` True) and ``actor`` (the
  ``actor`` of the read event that set ``action``); ``evidence_id`` and
  ``text`` = the evidence whose ``hit_id`` is the hit's id, or else whose ``evidence_id`` is (the first such
  event of the run, wherever it lies: a writer may emit the text of a hit it skipped), None when the run has
  no such evidence.

Labels (``keypoint_gains``): the read stage's ``keypoints`` label of a hit is the number of key points of its
full text (``labels_of(evidence_id)``: the key-point ids of that evidence, from the evidence events' ``labels``)
covered neither by the context (the union of the key points of ``context_ids``) nor by the new hits ranked
above it in the same list: the list is read top-down and each labelled new hit's key points join what is
covered. A hit that is not new (the runtime never scores those), or has no full text or no labels (no
evidence for it, or the run has no key-point labels) gets -1 (unlabelled, never guessed) and covers nothing.

Problems are counted, never guessed (``problems``, a dict of counts; keys below): a ``results`` event whose
candidate was not declared before it (or was declared in an unknown frame) is skipped
(``results_without_candidate``); hits past the first ``MAX_HITS`` of a list (by rank) are left out, each counted
(``hits_over_cap``); a hit with neither title nor snippet is left out too, since a read controller has nothing to
judge and the Gate refuses it (``hits_without_text``); a hit id repeated within one list keeps its first
(``duplicate_hits``, per repeat); a read point whose context, read ids or retained texts went over their cap counts
once (``context_over_cap``, ``read_ids_over_cap``, ``retained_over_cap``); a ``retrieval`` of an undeclared
candidate is ignored (``retrieval_without_candidate``); a ``read`` event naming no hit of an earlier results event
of its candidate sets no action (``read_without_results``; a "read" still counts as read), and a second decision for
a hit that was not deferred (or a second defer) is ignored (``read_repeated``). The caps bound the work per point,
so that a build grows linearly with its logs: contexts and read sets are kept incrementally over one pass, sets for
membership.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice

from branchgate.errors import InputError
from branchgate.limits import MAX_CONTEXT, MAX_HITS, MAX_RETAINED
from branchgate.texts import hit_text

MAX_READ_IDS = MAX_CONTEXT  # read hit ids a read point keeps (the newest)
CONTEXT_PRUNE_STAGES = ("post_retrieval", "pre_synthesis")  # prunes that take evidence out of the context
UNLABELLED = -1

RESULTS_WITHOUT_CANDIDATE = "results_without_candidate"
HITS_OVER_CAP = "hits_over_cap"
HITS_WITHOUT_TEXT = "hits_without_text"
DUPLICATE_HITS = "duplicate_hits"
CONTEXT_OVER_CAP = "context_over_cap"
READ_IDS_OVER_CAP = "read_ids_over_cap"
RETAINED_OVER_CAP = "retained_over_cap"
RETRIEVAL_WITHOUT_CANDIDATE = "retrieval_without_candidate"
READ_WITHOUT_RESULTS = "read_without_results"
READ_REPEATED = "read_repeated"


@dataclass
class ReadPoint:
    """One search's read decision point (fields in the module docstring)."""

    run_id: str
    frame_id: str
    candidate_id: str
    root_query: str
    frame_query: str
    parent_goal: str
    depth: int
    context_ids: list[str]
    read_ids: list[str]
    hits: list[dict]
    seq: int
    retained: list[str] = field(default_factory=list)


def _get(obj, name: str, default=None):
    """A field of an event or hit: a pydantic model's attribute, or a plain dict's key."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _newest(ids: dict[str, None], cap: int) -> list[str]:
    """The newest ``cap`` keys of an insertion-ordered dict, oldest first."""
    return list(islice(reversed(ids), cap))[::-1]


def run_read_points(events: Iterable, file: str = "") -> tuple[list[ReadPoint], dict[str, int]]:
    """The read decision points of one run and its problem counts (rules in the module docstring). No
    ``run_start`` → ``InputError`` naming ``file``, as ``decision_points.run_decisions``."""
    events = sorted(events, key=lambda e: _get(e, "seq"))
    start = next((e for e in events if _get(e, "type") == "run_start"), None)
    if start is None:
        run_id = _get(events[0], "run_id", "") if events else ""
        raise InputError(f"run {run_id!r} has no run_start event (skipped)", file)
    walk = _ReadWalk(run_id=_get(start, "run_id", ""), root_query=_get(start, "root_query", ""))
    for e in events:
        walk.add(e)
    walk.fill_texts()
    return walk.points, dict(walk.problems)


@dataclass
class _ReadWalk:
    """What one pass over a run's events (in ``seq`` order) keeps for ``run_read_points``."""

    run_id: str
    root_query: str
    depths: dict[str, int] = field(default_factory=dict)  # frame_id → depth
    cands: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # candidate_id → (frame_id, query, goal)
    context: dict[str, None] = field(default_factory=dict)  # evidence ids in context, oldest first
    read: dict[str, None] = field(default_factory=dict)  # hit ids read so far, in the order first read
    pending: dict[tuple[str, str], dict] = field(default_factory=dict)  # (candidate_id, hit_id) → newest hit dict
    shown: dict[str, str] = field(default_factory=dict)  # hit id → its hit_text, from the first results showing it
    texts: dict[str, tuple[str, str]] = field(default_factory=dict)  # hit id or evidence id → (evidence_id, text)
    by_hit: set[str] = field(default_factory=set)  # keys of ``texts`` set from an evidence's hit_id
    points: list[ReadPoint] = field(default_factory=list)
    problems: Counter = field(default_factory=Counter)

    def add(self, e) -> None:
        t = _get(e, "type")
        if t == "frame_open":
            self.depths.setdefault(_get(e, "frame_id"), _get(e, "depth", 0))
        elif t == "candidate":
            cid, fid = _get(e, "candidate_id"), _get(e, "frame_id")
            if fid in self.depths and cid not in self.cands:
                self.cands[cid] = (fid, _get(e, "query", ""), _get(e, "goal", "") or "")
        elif t == "results":
            self.results(e)
        elif t == "read":
            self.read_event(e)
        elif t == "retrieval":
            if _get(e, "candidate_id") not in self.cands:
                self.problems[RETRIEVAL_WITHOUT_CANDIDATE] += 1
            else:
                self.context.update(dict.fromkeys(_get(e, "evidence_ids", None) or []))
        elif t == "prune" and _get(e, "stage") in CONTEXT_PRUNE_STAGES:
            for i in _get(e, "item_ids", None) or []:
                self.context.pop(i, None)
        elif t == "evidence":
            self.evidence(e)

    def results(self, e) -> None:
        cid, own_frame = _get(e, "candidate_id"), _get(e, "frame_id")
        if cid not in self.cands and own_frame in self.depths:  # the agent's own search in a known frame
            self.cands[cid] = (own_frame, _get(e, "query", ""), "")
        if cid not in self.cands:
            self.problems[RESULTS_WITHOUT_CANDIDATE] += 1
            return
        frame_id, query, goal = self.cands[cid]
        if len(self.context) > MAX_CONTEXT:
            self.problems[CONTEXT_OVER_CAP] += 1
        if len(self.read) > MAX_READ_IDS:
            self.problems[READ_IDS_OVER_CAP] += 1
        retained = self.retained()
        hits = self.hit_dicts(_get(e, "hits", None) or [])
        for h in hits:
            self.pending[(cid, h["hit_id"])] = h
            self.shown.setdefault(h["hit_id"], hit_text(h["title"], h["snippet"]))
        self.points.append(
            ReadPoint(
                run_id=self.run_id,
                frame_id=frame_id,
                candidate_id=cid,
                root_query=self.root_query,
                frame_query=query,
                parent_goal=goal,
                depth=self.depths[frame_id],
                context_ids=_newest(self.context, MAX_CONTEXT),
                read_ids=_newest(self.read, MAX_READ_IDS),
                hits=hits,
                seq=_get(e, "seq"),
                retained=retained,
            )
        )

    def retained(self) -> list[str]:
        """The texts of the hits read so far that a results event showed, the newest ``MAX_RETAINED``, oldest
        first (one over the cap is counted: ``retained_over_cap``)."""
        shown = (self.shown[h] for h in reversed(self.read) if h in self.shown)
        newest = list(islice(shown, MAX_RETAINED + 1))
        if len(newest) > MAX_RETAINED:
            self.problems[RETAINED_OVER_CAP] += 1
        return newest[:MAX_RETAINED][::-1]

    def hit_dicts(self, raw_hits: list) -> list[dict]:
        """One results event's hits as dicts, in rank order: repeats and hits without text dropped, capped at
        ``MAX_HITS``."""
        ranked = sorted(raw_hits, key=lambda h: _get(h, "rank", 0))
        out: list[dict] = []
        seen: set[str] = set()
        for h in ranked:
            hid = _get(h, "hit_id")
            if hid in seen:
                self.problems[DUPLICATE_HITS] += 1
                continue
            if not (str(_get(h, "title", "") or "").strip() or str(_get(h, "snippet", "") or "").strip()):
                self.problems[HITS_WITHOUT_TEXT] += 1
                continue
            if len(out) == MAX_HITS:
                self.problems[HITS_OVER_CAP] += 1
                continue
            seen.add(hid)
            out.append(
                {
                    "hit_id": hid,
                    "title": _get(h, "title", "") or "",
                    "snippet": _get(h, "snippet", "") or "",
                    "rank": _get(h, "rank", 0),
                    "url": _get(h, "url"),
                    "is_new": hid not in self.read and hid not in self.context,
                    "action": None,
                    "actor": None,
                    "deferred": False,
                    "evidence_id": None,
                    "text": None,
                }
            )
        return out

    def read_event(self, e) -> None:
        hid, action = _get(e, "hit_id"), _get(e, "action")
        if action == "read":
            self.read.setdefault(hid, None)
        hit = self.pending.get((_get(e, "candidate_id"), hid))
        if hit is None:
            self.problems[READ_WITHOUT_RESULTS] += 1
        elif hit["action"] is None:
            hit["action"], hit["actor"] = action, _get(e, "actor")
            hit["deferred"] = action == "defer"
        elif hit["action"] == "defer" and action != "defer":
            hit["action"], hit["actor"] = action, _get(e, "actor")  # decided later: its outcome (still ``deferred``)
        else:
            self.problems[READ_REPEATED] += 1

    def evidence(self, e) -> None:
        """Keep the first text per hit id (``hit_id``) and per evidence id; a hit_id wins over an evidence id."""
        eid, text, hid = _get(e, "evidence_id"), _get(e, "text", ""), _get(e, "hit_id")
        if hid is not None and hid not in self.by_hit:
            self.by_hit.add(hid)
            self.texts[hid] = (eid, text)
        self.texts.setdefault(eid, (eid, text))

    def fill_texts(self) -> None:
        """Each hit's ``evidence_id`` and ``text`` (evidence may come after its results event)."""
        for p in self.points:
            for h in p.hits:
                found = self.texts.get(h["hit_id"])
                if found is not None:
                    h["evidence_id"], h["text"] = found


def evidence_labels(events: Iterable) -> Callable[[str], set[str] | None]:
    """``labels_of`` for ``keypoint_gains`` from a run's evidence events: an evidence id → the set of its
    key-point ids (the first evidence event of that id), or None when it has no labels (or is unknown)."""
    labels: dict[str, set[str] | None] = {}
    for e in events:
        if _get(e, "type") == "evidence":
            eid = _get(e, "evidence_id")
            if eid not in labels:
                found = _get(e, "labels")
                labels[eid] = None if found is None else set(found)
    return labels.get


def keypoint_gains(point: ReadPoint, labels_of: Callable[[str], Iterable[str] | None]) -> list[int]:
    """The ``keypoints`` label of each hit of ``point`` (the rule in the module docstring): key points of its
    full text covered neither by the context nor by the new hits above it; -1 when unlabelled."""
    covered: set[str] = set()
    for i in point.context_ids:
        covered.update(labels_of(i) or ())
    gains: list[int] = []
    for h in point.hits:
        found = labels_of(h["evidence_id"]) if h["is_new"] and h["evidence_id"] is not None else None
        if found is None:
            gains.append(UNLABELLED)
            continue
        found = set(found)
        gains.append(len(found - covered))
        covered |= found
    return gains
