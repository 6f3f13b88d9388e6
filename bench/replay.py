"""What a controller would have done on a user's own logs: replay it over unpruned runs (``branchgate replay``).

In an unpruned run every candidate was searched and every hit read, so a pre-retrieval or read policy can be
replayed offline: walk the run's events in ``seq`` order, let the policy keep what it keeps at each frame (and at
each search's result list), follow only the kept branches' child frames, and charge what the log says each kept
branch and each read hit cost. ``ReplayRun`` holds one run; ``ReplayRun.replay(pre, read)`` walks it.

The cost rule (one rule for every log format):
- an ``llm_call`` before the first search is the plan's (fixed); one of purpose ``synthesis`` or ``report`` is the
  synthesis call; any other is the branch's whose ``retrieval`` (or ``results``) came last before it;
- a branch's calls cost their fixed part (their tokens minus the evidence tokens the branch found new in the log)
  plus the tokens of the evidence it finds new in the replay; a branch that finds nothing new makes no call and
  opens no child frame (the reference pipeline's rule: nothing new kept, no process call); a branch that found
  nothing new in the log (so made no call) but finds something in the replay, because what an earlier branch
  read there was pruned, is charged the run's median fixed part plus that evidence; the child frames it would
  then open are not in the log and are not replayed (so replay runs slightly cheap: docs/use/replay.md);
- an agent that searches again whatever a search brought (run_start ``config.follow_ups`` = ``"always"``, as the
  Search-o1 reader declares: each search is the next step of one chain of reasoning) goes on to a searched branch's
  child frames even when the branch reads nothing new (``ReplayRun.follows_always``);
- the synthesis call costs its fixed part (its tokens minus the tokens of every evidence of the run) plus the
  tokens of the evidence found in the replay;
- a log without ``llm_call`` events costs the tokens of the evidence found: what reading costs.
Keeping everything reproduces the log: its ``llm_call`` tokens and its key-point recall.

The read stage: a kept branch's ``results`` event lists its hits; the hits not read earlier in the replay are
offered to the read policy with the search's state (``inference.read_state``: root question, the sub-query, its
goal, the frame's depth, the newest ``READ_WINDOW`` hits read before, as a live run sees them); the evidence of
the hits it reads (``evidence.hit_id``) is what the branch finds. A branch without a ``results`` event finds its
``retrieval`` evidence, as with no read stage.

Caps (``branchgate.limits``, as a dataset's decision points have them): a frame offers its first ``MAX_CANDIDATES``
candidates (by order), a search its first ``MAX_HITS`` hits (by rank) that have a title or a snippet (a read
controller has nothing else to judge), a decision its newest ``MAX_RETAINED`` branches searched; what is left out
is never replayed, and counted (``ReplayRun.left_out``, the report's
``left_out``), so a log whose unpruned replay falls short of it says why.

Value kept (``RunValue``): the key points of the evidence found over the run's key points (``keypoints``), the
cited evidence found over the cited evidence (``citations``, the report's ``cited_ids``), or the sum of a decision
dataset's row utilities over the kept candidates or read hits (``rows``: any label source of ``dataset build``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from branchgate.inference.read_state import ReadState
from branchgate.limits import MAX_HITS, MAX_RETAINED
from branchgate.logs_to_dataset.decision_points import OVER_CANDIDATES, run_decisions
from branchgate.texts import candidate_text, hit_text

SYNTHESIS_PURPOSES = ("synthesis", "report")

# keep_pre(frame, state dict, [(query, goal)]) → kept indices; keep_read(state dict, hits) → kept indices
PreRule = Callable[[object, dict, list], list[int]]
ReadRule = Callable[[dict, list[dict]], list[int]]


@dataclass
class Outcome:
    """One replayed run: searches made, hits offered to and read by the read stage, tokens, what was found."""

    searches: int = 0
    hits_offered: int = 0
    hits_read: int = 0
    tokens: float = 0.0
    found: set = field(default_factory=set)  # evidence ids
    kept: list = field(default_factory=list)  # candidate ids searched
    read: list = field(default_factory=list)  # (results seq, hit id) read by the read stage


class ReplayRun:
    """One run's events as the replay needs them (the module docstring's rules)."""

    def __init__(self, run):
        events = sorted(run.events, key=lambda e: e.seq)
        rd = run_decisions(run.run_id, events)
        # what the replay leaves out (module docstring): candidates past a frame's first MAX_CANDIDATES, hits past
        # a search's first MAX_HITS, hits with neither title nor snippet (nothing a read controller could judge)
        self.left_out = {"candidates": rd.problems.count(OVER_CANDIDATES), "hits": 0, "hits_without_text": 0}
        self.run_id, self.root_query, self.evidence = run.run_id, rd.root_query, rd.evidence
        self.frames = {f.frame_id: f for f in rd.frames}
        self.child: dict[str, list[str]] = {}
        for f in rd.frames:
            if f.parent_candidate is not None:
                self.child.setdefault(f.parent_candidate, []).append(f.frame_id)
        # candidate id → (frame, query, goal); an agent's own search in a frame (``Results.frame_id``) is added
        # by ``_timeline`` and made whenever its frame is open
        self.cands = {c.candidate_id: (f, c.query, c.goal) for f in rd.frames for c in f.candidates}
        self.own: dict[str, str] = {}  # own search id → its frame id
        self.ev = {c.candidate_id: list(c.evidence_ids or []) for f in rd.frames for c in f.candidates}
        self.results: dict[str, tuple[int, list]] = {}  # candidate id → (seq, hits) of its first results event
        self.hit_evidence: dict[str, list[str]] = {}  # hit id → evidence ids its reading produced
        self.report = None
        self.totals: dict = {}
        start = next((e for e in events if e.type == "run_start"), None)
        # the module docstring's follow-up rule: the agent's next search does not wait for this one to find something
        self.follows_always = (getattr(start, "config", None) or {}).get("follow_ups") == "always"
        self.timeline = self._timeline(events)
        self._costs(events)

    def _timeline(self, events) -> list[tuple[int, str, str]]:
        """(seq, "frame" | "search", id): each frame's opening and each candidate's first search, in seq order."""
        first: dict[str, int] = {}
        for e in events:
            if e.type == "results" and e.candidate_id not in self.cands and e.frame_id in self.frames:
                self.own[e.candidate_id] = e.frame_id
                self.cands[e.candidate_id] = (self.frames[e.frame_id], e.query or "", "")
            if e.type in ("retrieval", "results") and e.candidate_id in self.cands:
                first.setdefault(e.candidate_id, e.seq)
                if e.type == "results":
                    if e.candidate_id not in self.results:
                        hits = sorted((h for h in e.hits if has_text(h)), key=lambda h: h.rank)
                        self.results[e.candidate_id] = (e.seq, hits[:MAX_HITS])
                        self.left_out["hits"] += max(0, len(hits) - MAX_HITS)
                        self.left_out["hits_without_text"] += len(e.hits) - len(hits)
            elif e.type == "evidence" and e.hit_id is not None:
                self.hit_evidence.setdefault(e.hit_id, []).append(e.evidence_id)
            elif e.type == "report":
                self.report = e
            elif e.type == "run_end":
                self.totals = dict(e.totals or {})
        items = [(f.seq, "frame", fid) for fid, f in self.frames.items()]
        items += [(seq, "search", cid) for cid, seq in first.items()]
        return sorted(items)

    def _costs(self, events) -> None:
        """The plan, each branch's calls and the synthesis call, and each branch's new evidence in the log."""
        self.plan, self.synthesis, self.calls, self.has_calls = 0, 0, {}, False
        last = None
        for e in events:
            if e.type in ("retrieval", "results") and e.candidate_id in self.cands:
                last = e.candidate_id
            elif e.type == "llm_call":
                self.has_calls = True
                tokens = int(e.in_tokens) + int(e.out_tokens)
                if e.purpose in SYNTHESIS_PURPOSES:
                    self.synthesis += tokens
                elif last is None:
                    self.plan += tokens
                else:
                    self.calls[last] = self.calls.get(last, 0) + tokens
        seen: set[str] = set()
        self.new_tokens: dict[str, int] = {}
        self.found_nothing: set[str] = set()  # branches that found nothing new in the log (so made no call)
        for _, kind, cid in self.timeline:
            if kind == "search":
                new = self.new_evidence(cid, seen)
                seen.update(new)
                self.new_tokens[cid] = sum(self.tokens_of(new))
                if not new:
                    self.found_nothing.add(cid)
        self.synthesis_fixed = self.synthesis - sum(self.tokens_of(seen)) if self.synthesis else 0
        fixed = sorted(max(0, c - self.new_tokens.get(cid, 0)) for cid, c in self.calls.items())
        self.typical_fixed = fixed[len(fixed) // 2] if fixed else 0  # the median fixed part of a branch's calls

    def branch_tokens(self, cid: str, new: list[str]) -> int:
        """What branch ``cid`` costs when it finds ``new`` evidence in the replay: its logged calls' fixed part plus
        the new evidence; a branch that found nothing new in the log made no call, so its call is priced at the
        run's median fixed part (``typical_fixed``) plus the new evidence."""
        calls = self.calls.get(cid, 0)
        if calls:
            return max(0, calls - self.new_tokens.get(cid, 0)) + sum(self.tokens_of(new))
        if cid in self.found_nothing and self.has_calls:
            return self.typical_fixed + sum(self.tokens_of(new))
        return 0

    def tokens_of(self, ids) -> list[int]:
        return [int(self.evidence[i].tokens or 0) for i in ids if i in self.evidence]

    def replay(self, pre: PreRule | None = None, read: ReadRule | None = None, budget=None) -> Outcome:
        """Walk the run keeping what ``pre`` keeps at each frame (None: every candidate) and reading what ``read``
        reads of each kept search's new hits (None: every hit). ``budget``, a run budget's ``RunGate`` made with
        ``charges=False``, replaces ``pre`` (``_Ledger``: the reference pipeline's exact-cost rule)."""
        out, walk = Outcome(tokens=self.plan), _Walk(reads=ReadState(self.root_query))
        ledger = _Ledger(self, budget) if budget is not None else None
        open_frames = {fid for fid, f in self.frames.items() if f.parent_candidate is None}
        for _, kind, key in self.timeline:
            if kind == "frame" and key in open_frames:
                frame = self.frames[key]
                kept = ledger.keep(frame, self._state(frame, walk), walk) if ledger else self._keep(frame, walk, pre)
                walk.kept.update(kept)
                walk.kept.update(c for c, fid in self.own.items() if fid == key)
            elif kind == "search" and key in walk.kept:
                if ledger is not None and not ledger.fits(key, walk):
                    continue  # the budget cannot afford it: not expanded (the pipeline's "prune", actor budget)
                new = self._search(key, walk, read, out)
                if new or self.follows_always:
                    open_frames.update(self.child.get(key, []))
                if new:
                    cost = self.branch_tokens(key, new)
                    out.tokens += cost
                    if ledger is not None:
                        ledger.commit(cost, sum(self.tokens_of(new)))
                elif ledger is not None:
                    ledger.commit(0, 0)
        out.found = walk.found
        if self.synthesis or not self.has_calls:  # the synthesis reads what was found; without calls, reading costs
            out.tokens += self.synthesis_fixed + sum(self.tokens_of(walk.found))
        return out

    def new_evidence(self, cid: str, found: set, read_ids=frozenset()) -> list[str]:
        """The evidence branch ``cid`` brings that is not in ``found``, reading every hit not in ``read_ids``: its
        ``retrieval`` evidence and its hits' (the log's accounting; a budget's cost of searching it now)."""
        hits = self.results.get(cid, (0, []))[1]
        logged = self.ev.get(cid, []) + [
            i for h in hits if h.hit_id not in read_ids for i in self.hit_evidence.get(h.hit_id, [])
        ]
        return [i for i in dict.fromkeys(logged) if i not in found and i in self.evidence]

    def cost_now(self, cid: str, walk: _Walk) -> int:
        """What searching ``cid`` would cost now, reading every hit: its calls for the evidence it would find new
        and that evidence's growth of the synthesis call (0 when it would find nothing new: no call)."""
        new = self.new_evidence(cid, walk.found, walk.reads.read_ids)
        return self.branch_tokens(cid, new) + sum(self.tokens_of(new)) if new else 0

    def _state(self, frame, walk: _Walk) -> dict:
        return {
            "root_query": self.root_query,
            "frame_query": frame.frame_query,
            "parent_goal": frame.parent_goal,
            "retained": walk.retained[-MAX_RETAINED:],  # the newest, as a dataset's decision point keeps them
            "depth": frame.depth,
        }

    def _keep(self, frame, walk: _Walk, pre: PreRule | None) -> list[str]:
        ids = [c.candidate_id for c in frame.candidates]
        if pre is None or not ids:
            return ids
        state = self._state(frame, walk)
        return [ids[i] for i in pre(frame, state, [(c.query, c.goal or "") for c in frame.candidates])]

    def _search(self, cid: str, walk: _Walk, read: ReadRule | None, out: Outcome) -> list[str]:
        """Search kept candidate ``cid``: read its hits (the read stage) and return the evidence new to the run."""
        frame, query, goal = self.cands[cid]
        out.searches += 1
        out.kept.append(cid)
        if cid not in self.own:
            walk.retained.append(candidate_text(query, goal))
        if cid not in self.results:
            found = self.ev.get(cid, [])
        else:
            seq, hits = self.results[cid]
            offered = [hits[i] for i in walk.reads.new(h.hit_id for h in hits)]
            out.hits_offered += len(offered)
            chosen = range(len(offered))
            if read is not None and offered:
                chosen = read(walk.reads.state(query, goal, frame.depth), offered)
            found = []
            for h in (offered[i] for i in chosen):
                walk.reads.add(h.hit_id, hit_text(h.title or "", h.snippet or ""))
                out.read.append((seq, h.hit_id))
                found += self.hit_evidence.get(h.hit_id, [])
            out.hits_read += len(chosen)
        new = [i for i in dict.fromkeys(found) if i not in walk.found and i in self.evidence]
        walk.found.update(new)
        return new

    @property
    def n_key_points(self) -> int:
        """The run's key points: ``run_end`` totals ``n_key_points``, else those its evidence covers."""
        given = self.totals.get("n_key_points")
        if given:
            return int(given)
        return len({k for e in self.evidence.values() for k in (e.labels or [])})

    @property
    def has_results(self) -> bool:
        return bool(self.results)


class _Ledger:
    """A run budget replayed the way the reference pipeline spends one (``pipeline/exact_costs.py``): the plan is
    charged and the synthesis call's fixed part held first; at each frame the run's ``RunGate`` admits candidates
    by its price, given what each would cost now (``ReplayRun.cost_now``: its calls, the evidence it would find
    new, and that evidence's growth of the synthesis call); before a kept branch is searched that cost must still
    fit what is left, else it is dropped; then its calls are charged and the growth held."""

    def __init__(self, run: ReplayRun, budget):
        if budget.charges:
            raise ValueError("replay a run budget with a RunGate made with charges=False")
        self.run, self.gate, self.account = run, budget, budget.budget
        self.account.spent_tokens += run.plan  # the plan was made before any decision
        self.account.reserved_tokens += run.synthesis_fixed

    def keep(self, frame, state: dict, walk: _Walk) -> list[str]:
        cands = frame.candidates
        if not cands:
            return []
        costs = [self.run.cost_now(c.candidate_id, walk) for c in cands]
        sel = self.gate.select(state, [{"query": c.query, "goal": c.goal or ""} for c in cands], costs=costs)
        return [cands[i].candidate_id for i in sel.kept]

    def fits(self, cid: str, walk: _Walk) -> bool:
        return self.account.can_afford(1, self.run.cost_now(cid, walk))

    def commit(self, cost: int, growth: int) -> None:
        self.account.spent_nodes += 1
        self.account.spent_tokens += cost
        self.account.reserved_tokens += growth


@dataclass
class _Walk:
    """The replay's state: branches kept and searched, evidence found, hits read."""

    kept: set = field(default_factory=set)
    retained: list = field(default_factory=list)
    found: set = field(default_factory=set)
    reads: ReadState = field(default_factory=ReadState)  # the hits read (``inference.read_state``)


def has_text(hit) -> bool:
    """A hit a read controller can judge: it has a title or a snippet."""
    return bool((hit.title or "").strip() or (hit.snippet or "").strip())


def keypoint_value(run: ReplayRun, out: Outcome) -> float:
    """Key-point recall of what the replay found."""
    n = run.n_key_points
    kps = {k for i in out.found for k in (run.evidence[i].labels or [])}
    return len(kps) / n if n else 0.0


def citation_value(run: ReplayRun, out: Outcome) -> float:
    """The share of the report's cited evidence (or hits) that the replay found or read."""
    cited = set((run.report.cited_ids or []) if run.report is not None else [])
    if not cited:
        return 0.0
    got = out.found | {hid for _, hid in out.read}
    return len(cited & got) / len(cited)


def row_value(utilities: dict, stage: str) -> Callable[[ReplayRun, Outcome], float]:
    """The sum of a decision dataset's row utilities over what the replay kept: candidates (``stage`` pre, keys
    ``(run_id, candidate_id)``) or hits read (read, keys ``(run_id, "candidate@seq", hit_id)``)."""

    def value(run: ReplayRun, out: Outcome) -> float:
        if stage == "pre":
            return float(sum(utilities.get((run.run_id, c), 0.0) for c in out.kept))
        frame_of = {seq: f"{cid}@{seq}" for cid, (seq, _) in run.results.items()}
        return float(sum(utilities.get((run.run_id, frame_of.get(seq), h), 0.0) for seq, h in out.read))

    return value
