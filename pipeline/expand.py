"""Expansions in the reference pipeline: ``Expansion``, one run's state ``_Run``, and ``Runner``'s steps on them.

``Expander`` (a mixin of ``run.Runner``) computes a candidate's expansion completely (``_expansion``: retrieval,
the read stage, post-retrieval pruning, learnings, follow-ups), checks it against the run budget (``_admit``),
writes it (``_commit``), admits protected context (``_protect``) and revisits deferred candidates (``_revisit``).

The read stage's steps (``_read_stage``, ``_write_reads``) are ``pipeline/read_stage.py``'s (``ReadStage``, which
``Expander`` extends); ``_commit`` writes the search's ``results`` and ``read`` events before the evidence and the
``retrieval`` event, which lists the retrieved hits minus the skipped ones.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from branchgate.inference.inputs import DecisionState
from branchgate.inference.read_state import ReadState
from branchgate.models.teachers import State
from branchgate.pipeline.accounting import Ledger, count_tokens, covered_key_points
from branchgate.pipeline.exact_costs import RunBudget, SynthBound
from branchgate.pipeline.read_stage import ReadStage
from branchgate.pipeline.stage_policies import Choice
from branchgate.texts import candidate_text


@dataclass
class Expansion:
    """One candidate's expansion computed completely before it is committed, so its exact LLM cost is known
    (``pipeline/exact_costs.py``)."""

    i: int
    cid: str
    cand: object
    text: str
    hits: list  # the passages retrieved, in rank order
    hit_tokens: list
    new: list  # the offered hits the read stage read, in rank order: the post-retrieval stage's candidates
    new_tokens: list
    keep_new: list
    learned: list
    kids: list | None  # None: no follow-ups call (nothing new kept, the depth limit, or a leaf expansion)
    kid_texts: list
    usage: dict | None
    process: int  # tokens of the process call (0: nothing new kept, no call)
    followups: int  # tokens of the follow-ups call
    growth: int  # growth of the synthesis bound
    leaf: bool = False
    offered: list = field(default_factory=list)  # the hits new to the run, in rank order: the read stage's input
    read_choice: Choice | None = None  # the read stage's choice among ``offered`` (kept = the hits read)

    @property
    def skipped(self) -> list:
        """The offered hits the read stage did not read."""
        read = set(self.new)
        return [pi for pi in self.offered if pi not in read]

    @property
    def listed(self) -> list:
        """The retrieved hits minus the skipped ones (the ``retrieval`` event's evidence), in rank order."""
        skipped = set(self.skipped)
        return [pi for pi in self.hits if pi not in skipped]

    @property
    def cost(self) -> int:
        return self.process + (0 if self.leaf else self.followups) + self.growth

    @property
    def leaf_cost(self) -> int:
        return self.process + self.growth


class Expander(ReadStage):
    """``Runner``'s steps on one expansion and on deferred candidates (a mixin: ``run.Runner`` is the class)."""

    # -- one expansion -------------------------------------------------------------------------------
    def _expansion(
        self,
        r: _Run,
        fr: dict,
        level: int,
        i: int,
        cid: str,
        c,
        text: str,
        seen: set,
        context: list,
        synth: SynthBound,
        children: bool = True,
        reads: ReadState | None = None,
    ) -> Expansion:
        """Candidate ``c``'s expansion against ``seen``/``context`` and the hits read so far, ``reads`` (default: the
        run's) — nothing written, no state changed."""
        env, led = self.env, r.led
        with led.timed("retrieve"):
            hits = self.retrieve(c.query)
        hit_tokens = self.passage_tokens(hits)
        offered = [pi for pi in hits if pi not in seen]  # the read stage: only passages new to the run are offered
        read_choice = self._read_stage(r, fr, cid, c, hits, offered, r.reads if reads is None else reads)
        new = [offered[j] for j in read_choice.kept]  # post-retrieval: only the hits read are candidates
        new_tokens = self.passage_tokens(new)
        with led.timed("post"):
            free = [pi for pi in new if pi not in r.protected]  # protected passages are never pruned
            if self.post.prunes and free:
                post_state = State(
                    query=r.root_items,
                    context=self.items([env.texts[j] for j in context], self.passage_tokens(context), self.post, led),
                    frame_query=c.query,
                    parent_goal=c.goal,
                    depth=fr["depth"] + 1,
                )
                pc = self.post.choose(
                    self.items([env.texts[j] for j in free], self.passage_tokens(free), self.post, led),
                    post_state,
                    "post_retrieval",
                    self._rng(r.key, cid, "post"),
                )
                kept_free = {free[j] for j in pc.kept}
                keep_new = [pi for pi in new if pi in r.protected or pi in kept_free]
                self._log("post_retrieval", pc.scores)
            else:
                keep_new = list(new)
        learned, kids, kid_texts, usage, process, follow = [], None, [], None, 0, 0
        if keep_new:
            kept_texts = [env.texts[pi] for pi in keep_new]
            with led.timed("generate"):
                learned = self.gen.learnings(c.query, kept_texts)
            process = call_tokens([text, *kept_texts], learned)
            if children and level + 1 < self.depth_limit:
                with led.timed("generate"):
                    kids = self.gen.followups(
                        r.root,
                        c,
                        kept_texts,
                        self.levels[level + 1],
                        self._rng(r.key, f"{fr['frame_id']}.{i}"),
                        fr["depth"] + 1,
                        learned,
                    )
                usage = getattr(self.gen, "last_usage", None)
                kid_texts = [candidate_text(k.query, k.goal) for k in kids]
                follow = call_tokens([r.root, text, *learned], kid_texts)
        growth = synth.growth(keep_new, self.passage_tokens(keep_new))
        return Expansion(
            i,
            cid,
            c,
            text,
            hits,
            hit_tokens,
            new,
            new_tokens,
            keep_new,
            learned,
            kids,
            kid_texts,
            usage,
            process,
            follow,
            growth,
            offered=offered,
            read_choice=read_choice,
        )

    def _commit(self, r: _Run, fr: dict, e: Expansion, next_frames: list, covered_open: set) -> None:
        """Write expansion ``e`` and apply it to the run's state (what the loop of Algorithm 1 does per node)."""
        env, w, stats = self.env, r.w, r.stats
        stats["nodes"] += 1
        stats["n_expanded"] += 1
        r.budget.commit(e.cost, e.growth)
        r.retained_branches.append(e.text)
        stats["retrieval_calls"] += 1
        self._write_reads(r, e)
        for pi, tok in zip(e.hits, e.hit_tokens):  # every hit retrieved, the skipped ones too (their labels)
            if pi not in r.emitted:
                r.emitted.add(pi)
                w(
                    "evidence",
                    evidence_id=env.ids[pi],
                    text=env.texts[pi],
                    source=env.ids[pi],
                    tokens=tok,
                    labels=[k for k in env.labels[pi] if k in r.kp_set],
                    doc=env.docs[pi],
                    hit_id=env.ids[pi],
                )
        listed = set(e.listed)
        w(
            "retrieval",
            candidate_id=e.cid,
            query=e.cand.query,
            evidence_ids=[env.ids[pi] for pi in e.listed],
            tokens=int(sum(tok for pi, tok in zip(e.hits, e.hit_tokens) if pi in listed)),
        )
        gain = covered_key_points((env.labels[pi] for pi in e.listed), r.kp_ids) - covered_open
        stats["expansions_with_gain"] += bool(gain)
        o = r.by_origin.setdefault(e.cand.origin, [0, 0])
        o[0] += 1
        o[1] += bool(gain)
        r.seen.update(e.new)
        keep = set(e.keep_new)
        removed = [pi for pi in e.new if pi not in keep]
        r.pruned.update(removed)
        # a re-retrieved passage that was pruned before stays pruned: say so again, so a reader replaying
        # retrievals and prunes in order gets the same C_t
        stale = [pi for pi in dict.fromkeys(e.hits) if pi in r.pruned and pi not in set(removed)]
        if removed or stale:
            w(
                "prune",
                stage="post_retrieval",
                item_ids=[env.ids[pi] for pi in removed + stale],
                tokens_before=int(sum(e.new_tokens)),
                tokens_after=int(sum(self.passage_tokens(e.keep_new))),
                actor=self.post.actor,
            )
        r.context.extend(e.keep_new)
        r.synth.add(e.keep_new, self.passage_tokens(e.keep_new))
        if not e.keep_new:
            return
        self._llm(w, r.led, "process", [e.text, *[env.texts[pi] for pi in e.keep_new]], e.learned)
        for s in e.learned:
            w("learning", candidate_id=e.cid, text=s)
        if e.leaf:
            r.budget.leaf_expansions += 1
            return
        if e.kids is not None:
            self._llm(w, r.led, "followups", [r.root, e.text, *e.learned], e.kid_texts, usage=e.usage)
            for kt in e.kid_texts:
                w("followup", candidate_id=e.cid, text=kt)
            if e.kids:
                next_frames.append(
                    dict(
                        frame_id=f"{fr['frame_id']}.{e.i}",
                        parent_frame=fr["frame_id"],
                        parent_candidate=e.cid,
                        depth=fr["depth"] + 1,
                        frame_query=e.cand.query,
                        parent_goal=e.cand.goal,
                        cands=e.kids,
                    )
                )

    def _admit(self, e: Expansion, committed: int, expanded: int) -> bool:
        """Whether the budget affords ``e`` (as a leaf when only its follow-ups do not fit: sets ``e.leaf``)."""
        b = self._run.budget
        if b.fits(e.cost, committed=committed, expanded=expanded):
            return True
        if e.kids is not None and b.fits(e.leaf_cost, committed=committed, expanded=expanded):
            e.leaf = True
            return True
        return False

    def _protect(self, r: _Run, idx: list[int]) -> None:
        """Admit passages ``idx`` to C_0 as protected context (evidence events with ``protected=True``)."""
        env = self.env
        for pi, tok in zip(idx, self.passage_tokens(idx)):
            r.emitted.add(pi)
            r.seen.add(pi)
            r.protected.add(pi)
            r.context.append(pi)
            r.w(
                "evidence",
                evidence_id=env.ids[pi],
                text=env.texts[pi],
                source=env.ids[pi],
                tokens=tok,
                labels=[k for k in env.labels[pi] if k in r.kp_set],
                doc=env.docs[pi],
                protected=True,
            )
        r.synth.add(idx, self.passage_tokens(idx))

    def _budget_fields(self, status: dict | None, choice, i: int, e: Expansion | None) -> dict:
        """A budgeted decision's extra fields, as ``inference/agents/recorder.py`` writes them: ``spent`` /
        ``remaining`` when it was made (as the pipeline counts them), the run-scoped gate's admission ``price``; and
        here also an expansion's exact ``cost``."""
        if status is None:
            return {}
        out = dict(status)
        if choice.status is not None:
            out["price"] = choice.status.get("price")
        if e is not None:
            out["cost"] = e.cost
        return out

    def _revisit(self, r: _Run) -> None:
        """Deferral: with budget left when the tree is done, the run-scoped gate re-scores the deferred
        candidates against the context as it is now (every retained branch); the ones it admits are expanded
        as leaves (retrieval + process, no follow-ups), each only if its exact cost fits. Their ``expand``
        decision names the ``defer`` decision that set them aside; the deferred candidates never expanded get
        a closing ``prune`` (actor ``budget`` when the budget could not afford them)."""
        gate, budget, w = r.run_gate, r.budget, r.w
        no_room: set[int] = set()  # ids of the Deferred entries the last revisit could not afford
        while gate.deferred:
            if not budget.fits(0, nodes=1) or (budget.tokens is not None and budget.remaining()["tokens"] == 0):
                no_room = {id(d) for d in gate.deferred}
                break
            state = DecisionState(r.root, r.root, "", list(r.retained_branches), 0)
            items = list(gate.deferred)
            kw = {}
            if _accepts(gate.revisit, "costs"):  # exact costs, when the run-scoped gate takes them
                kw["costs"] = [
                    self._expansion(
                        r,
                        *self._meta(r, d.key)[:2],
                        d.index,
                        d.key,
                        *self._meta(r, d.key)[3:],
                        r.seen,
                        r.context,
                        r.synth,
                        children=False,
                    ).cost
                    for d in items
                ]
            sel = gate.revisit(state, **kw)
            no_room = {id(items[j]) for j in sel.dropped_by_budget}
            if not sel.revisited:
                break
            for d in sorted(sel.revisited, key=lambda d: -float(sel.p_keep[items.index(d)])):  # best first
                fr, level, i, c, text = self._meta(r, d.key)
                e = self._expansion(r, fr, level, i, d.key, c, text, r.seen, r.context, r.synth, children=False)
                p = float(sel.p_keep[items.index(d)])
                status = budget.status()
                fits = budget.fits(e.cost)
                w(
                    "decision",
                    candidate_id=d.key,
                    action="expand" if fits else "prune",
                    actor=self.pre.actor if fits else "budget",
                    score=p,
                    p_keep=p,
                    deferred_from=r.deferred_seq.get(d.key),
                    **status,
                    price=(sel.budget or {}).get("price"),
                    **({"cost": e.cost} if fits else {}),
                )
                if fits:
                    self._commit(r, fr, e, [], covered_key_points((self.env.labels[j] for j in r.context), r.kp_ids))
                    r.n_revisited += 1
                    r.stats["n_pruned_pre"] -= 1  # it was counted as not expanded when it was deferred
                else:
                    budget.dropped += 1
        for d in gate.drop_deferred():
            w(
                "decision",
                candidate_id=d.key,
                action="prune",
                actor="budget" if id(d) in no_room else self.pre.actor,
                score=None,
                p_keep=None,
                deferred_from=r.deferred_seq.get(d.key),
                **budget.status(),
            )

    @staticmethod
    def _meta(r: _Run, cid: str):
        return r.deferred_meta[cid]


def call_tokens(prompt: list[str], output: list[str]) -> int:
    """An LLM call's tokens as ``Runner._llm`` counts them (prompt + output)."""
    return count_tokens(prompt) + count_tokens(output)


@dataclass
class _Run:
    """One run's mutable state (``Runner.run``)."""

    root: str
    key: str
    w: object
    led: Ledger
    kp_ids: list
    kp_set: set
    synth: SynthBound
    run_gate: object = None
    budget: RunBudget | None = None
    root_items: object = None
    stats: dict = field(
        default_factory=lambda: {
            "nodes": 1,
            "retrieval_calls": 0,
            "n_candidates": 0,
            "n_expanded": 0,
            "n_pruned_pre": 0,
            "expansions_with_gain": 0,
            "n_frames": 0,
            "search_calls": 0,  # the expansions' searches (one results event each; the plan's search is not one)
            "hits_offered": 0,  # hits shown to the read stage (new to the run)
            "hits_read": 0,
        }
    )
    by_origin: dict = field(default_factory=dict)
    retained_branches: list = field(default_factory=list)
    context: list = field(default_factory=list)  # retained evidence, in admission order
    seen: set = field(default_factory=set)  # every passage admitted or pruned in this run (read-skipped ones are not)
    reads: ReadState = field(default_factory=ReadState)  # the hits read and the window a read decision sees
    pruned: set = field(default_factory=set)
    emitted: set = field(default_factory=set)
    protected: set = field(default_factory=set)  # never removed by post-retrieval or pre-synthesis pruning
    deferred_meta: dict = field(default_factory=dict)  # candidate id → (frame, level, index, candidate, text)
    deferred_seq: dict = field(default_factory=dict)  # candidate id → seq of its defer decision
    n_deferred: int = 0
    n_revisited: int = 0


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
