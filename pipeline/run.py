"""One query through Algorithm 1 (deep research with three pruning stages) → one canonical trace.

    plan:  retrieve(Q) → generator proposes the root frame's candidates
    for each level (breadth first), for each frame:
        frame_open, candidate events
        pre-retrieval stage: policy(candidates | retained branch texts, Q) → decision events
        for each expanded candidate c:
            retrieve(c) → evidence events (ids new to the run) → retrieval event
            post-retrieval stage: policy(new items | retained evidence C_t, Q) → prune event
            learnings (extractive) and, below the depth limit, follow-up candidates → a child frame
    pre-synthesis stage: policy(C_T | Q) → prune event → extractive report → run_end with totals

A passage is admitted to a run once: re-retrieving a retained passage adds nothing, and a pruned one
stays pruned (as GPT-Researcher skips visited URLs), so ``C_t`` = retrieved minus pruned under any
reading of the trace. Follow-ups are spawned from a branch's newly retained evidence only; a branch that
brings nothing new is a dead end.

Each expansion is computed completely (``Runner._expansion``: retrieval, post-retrieval pruning, learnings,
follow-ups) before it is written (``Runner._commit``), so a run budget (``--pre SPEC,budget_tokens=T``) knows
its exact cost and is never exceeded (``pipeline/budgeting.py``); a frame's decisions are written once its
expansions are costed. With ``defer=1`` the run-scoped gate's deferred candidates are revisited when the tree
is done (``Runner._revisit``); ``Config.protect`` adds protected context. Over 400 lines because Algorithm 1,
its budget and its deferral are one loop over one run's state (``_Run``), kept in one place.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from branchgate import __version__
from branchgate.pipeline import accounting, policies
from branchgate.errors import BranchgateError
from branchgate.pipeline.accounting import Ledger, count_tokens, covered_key_points, kpr, token_counts
from branchgate.pipeline.budgeting import REPORT_SENTENCES, REPORT_WORDS, RunBudget, SynthBound
from branchgate.pipeline.generate import cited_learnings
from branchgate.texts import candidate_text

SYSTEM = f"branchgate-reference {__version__}"


@dataclass
class Config:
    breadth: int = 4
    depth: int = 3
    oversample: float = 1.5  # candidates per frame = ceil(breadth at that level × oversample)
    top_k: int = 10
    seed: int = 0
    pre: str = "none"
    post: str = "none"
    synth: str = "none"
    generator: str = "offline"
    retriever: str = "bm25"
    encoder: str = "auto"
    budget_reference: str = ""  # JSON {query id: {"nodes", "tokens"}}: the reference runs of ``budget_*=P%`` specs
    protect: str = "none"  # "plan": the root's plan-search passages join C_0 as protected context (never pruned)
    shape: str = "tree"  # "chain": one candidate per decision, each search's follow-up the next (a sequential agent)

    def breadths(self) -> list[int]:
        """GPT-Researcher's breadth per level: halves per level, floor 2 (4, 2, 2 for breadth 4); 1 per level in
        a chain."""
        if self.shape == "chain":
            return [1] * self.depth
        out, b = [], self.breadth
        for _ in range(self.depth):
            out.append(b)
            b = max(2, b // 2)
        return out

    def candidates_per_level(self) -> list[int]:
        if self.shape == "chain":  # a sequential agent writes one search at a time: nothing to oversample
            return [1] * self.depth
        return [max(1, math.ceil(b * self.oversample)) for b in self.breadths()]

    def record(self) -> dict:
        """The settings as traces and ``simulate.json`` record them (later settings only when set)."""
        d = asdict(self)
        for key, default in LATER_DEFAULTS.items():
            if d[key] == default:
                d.pop(key)
        return d

    def tag(self) -> str:
        """Short hash of everything that changes a run's outcome (part of every run id). Settings added later
        count only when set (older run ids stay valid); a budget reference counts by its content."""
        d = self.record()
        if d.get("budget_reference"):
            from pathlib import Path

            ref = Path(d["budget_reference"])
            d["budget_reference"] = hashlib.sha256(ref.read_bytes()).hexdigest() if ref.is_file() else str(ref)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


LATER_DEFAULTS = {"budget_reference": "", "protect": "none", "shape": "tree"}
PROTECT = ("none", "plan")
SHAPES = ("tree", "chain")


@dataclass
class _Embed:
    needs_embeddings: bool


@dataclass
class Expansion:
    """One candidate's expansion computed completely before it is committed, so its exact LLM cost is known
    (``pipeline/budgeting.py``)."""

    i: int
    cid: str
    cand: object
    text: str
    hits: list
    hit_tokens: list
    new: list
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

    @property
    def cost(self) -> int:
        return self.process + (0 if self.leaf else self.followups) + self.growth

    @property
    def leaf_cost(self) -> int:
        return self.process + self.growth


class Runner:
    """Runs queries of one environment under one configuration; reusable across runs in a process."""

    def __init__(self, env, cfg: Config, generator, embedder=None, encoder_id: str | None = None):
        self.env, self.cfg, self.gen = env, cfg, generator
        self.pre = policies.parse(cfg.pre, "pre_retrieval")
        self.post = policies.parse(cfg.post, "post_retrieval")
        self.synth = policies.parse(cfg.synth, "pre_synthesis")
        self.embedder, self.encoder_id = embedder, encoder_id
        self.levels = cfg.candidates_per_level()
        self.breadths = cfg.breadths()
        self.depth_limit = cfg.depth
        if isinstance(self.pre, policies.ShallowPolicy):
            self.depth_limit = len(self.pre.plan(self.levels))
        self.embed_any = any(p.needs_embeddings for p in (self.pre, self.post, self.synth))
        self._embedded: set[str] = set()
        self.score_log: list[tuple[str, float]] | None = None  # (stage, score) of every scored item, when a list
        if cfg.protect not in PROTECT:
            raise BranchgateError(f"protect must be one of {', '.join(PROTECT)}, got {cfg.protect!r}")
        if cfg.shape not in SHAPES:
            raise BranchgateError(f"shape must be one of {', '.join(SHAPES)}, got {cfg.shape!r}")
        self.reference = _reference(cfg.budget_reference) if self.pre.budget is not None and self.pre.budget.relative \
            else {}
        if self.pre.budget is not None and getattr(generator, "name", "offline") != "offline":
            raise BranchgateError(f"--pre {cfg.pre}: run budgets need the offline generator (an expansion's exact cost "
                                  "is known before it is committed only when generation is deterministic)")

    # -- helpers -----------------------------------------------------------------------------------
    def passage_tokens(self, idx: list[int]) -> list[int]:
        return token_counts([self.env.texts[i] for i in idx])

    def retrieve(self, query: str) -> list[int]:
        if self.cfg.retriever == "dense":
            qv = self.embedder([query])[0]
            hits = self.env.dense(self.encoder_id).search_vector(qv, self.cfg.top_k)
        else:
            hits = self.env.memo.get_or(("bm25", query, self.cfg.top_k),
                                        lambda: tuple(self.env.bm25.search(query, self.cfg.top_k)))
        return [i for i, _ in hits]

    def items(self, texts: list[str], tokens: list[int] | None, policy, ledger: Ledger):
        from branchgate.models.teachers import Items

        if policy.needs_embeddings and self.embedder is not None:
            with ledger.timed("embed"):
                emb = self.embedder(texts)
            fresh = [t for t in dict.fromkeys(texts) if t not in self._embedded]
            self._embedded.update(fresh)
            ledger.add_tokens("embed", count_tokens(fresh))
        else:
            emb = np.zeros((len(texts), 1), dtype=np.float32)
        return Items(list(texts), emb, None if tokens is None else np.asarray(tokens, dtype=np.float64))

    # -- one expansion -------------------------------------------------------------------------------
    def _expansion(self, r: "_Run", fr: dict, level: int, i: int, cid: str, c, text: str, seen: set, context: list,
                   synth: SynthBound, children: bool = True) -> Expansion:
        """Candidate ``c``'s expansion against ``seen``/``context`` (nothing written, no state changed)."""
        from branchgate.models.teachers import State

        env, led = self.env, r.led
        with led.timed("retrieve"):
            hits = self.retrieve(c.query)
        hit_tokens = self.passage_tokens(hits)
        new = [pi for pi in hits if pi not in seen]  # post-retrieval: only passages new to the run are candidates
        new_tokens = self.passage_tokens(new)
        with led.timed("post"):
            free = [pi for pi in new if pi not in r.protected]  # protected passages are never pruned
            if self.post.prunes and free:
                post_state = State(query=r.root_items, context=self.items([env.texts[j] for j in context],
                                                                          self.passage_tokens(context), self.post, led),
                                   frame_query=c.query, parent_goal=c.goal, depth=fr["depth"] + 1)
                pc = self.post.choose(self.items([env.texts[j] for j in free], self.passage_tokens(free), self.post, led),
                                      post_state, "post_retrieval", self._rng(r.key, cid, "post"))
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
                    kids = self.gen.followups(r.root, c, kept_texts, self.levels[level + 1],
                                              self._rng(r.key, f"{fr['frame_id']}.{i}"), fr["depth"] + 1, learned)
                usage = getattr(self.gen, "last_usage", None)
                kid_texts = [candidate_text(k.query, k.goal) for k in kids]
                follow = call_tokens([r.root, text, *learned], kid_texts)
        growth = synth.growth(keep_new, self.passage_tokens(keep_new))
        return Expansion(i, cid, c, text, hits, hit_tokens, new, new_tokens, keep_new, learned, kids, kid_texts, usage,
                         process, follow, growth)

    def _commit(self, r: "_Run", fr: dict, e: Expansion, next_frames: list, covered_open: set) -> None:
        """Write expansion ``e`` and apply it to the run's state (what the loop of Algorithm 1 does per node)."""
        env, w, stats = self.env, r.w, r.stats
        stats["nodes"] += 1
        stats["n_expanded"] += 1
        r.budget.expanded += 1
        r.retained_branches.append(e.text)
        stats["retrieval_calls"] += 1
        for pi, tok in zip(e.hits, e.hit_tokens):
            if pi not in r.emitted:
                r.emitted.add(pi)
                w("evidence", evidence_id=env.ids[pi], text=env.texts[pi], source=env.ids[pi], tokens=tok,
                  labels=[k for k in env.labels[pi] if k in r.kp_set], doc=env.docs[pi])
        w("retrieval", candidate_id=e.cid, query=e.cand.query, evidence_ids=[env.ids[pi] for pi in e.hits],
          tokens=int(sum(e.hit_tokens)))
        gain = covered_key_points((env.labels[pi] for pi in e.hits), r.kp_ids) - covered_open
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
            w("prune", stage="post_retrieval", item_ids=[env.ids[pi] for pi in removed + stale],
              tokens_before=int(sum(e.new_tokens)), tokens_after=int(sum(self.passage_tokens(e.keep_new))),
              actor=self.post.actor)
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
                next_frames.append(dict(frame_id=f"{fr['frame_id']}.{e.i}", parent_frame=fr["frame_id"],
                                        parent_candidate=e.cid, depth=fr["depth"] + 1, frame_query=e.cand.query,
                                        parent_goal=e.cand.goal, cands=e.kids))

    def _admit(self, e: Expansion, committed: int, expanded: int) -> bool:
        """Whether the budget affords ``e`` (as a leaf when only its follow-ups do not fit: sets ``e.leaf``)."""
        b = self._run.budget
        if b.fits(e.cost, committed=committed, expanded=expanded):
            return True
        if e.kids is not None and b.fits(e.leaf_cost, committed=committed, expanded=expanded):
            e.leaf = True
            return True
        return False

    # -- one run -----------------------------------------------------------------------------------
    def run(self, query, run_id: str, writer, rep: int = 0) -> dict:
        from branchgate.inference.inputs import DecisionState
        from branchgate.models.teachers import State

        env, cfg = self.env, self.cfg
        t_start = time.perf_counter()
        led = Ledger()
        self._embedded = set()
        key = f"{query.id}.r{rep}"  # random choices depend on (seed, query, repetition, place): paired across policies
        w = lambda type_, **f: writer.write(type=type_, run_id=run_id, **f)  # noqa: E731
        root = query.query
        limits = self.pre.budget.resolve(self.reference.get(query.id), f"query {query.id}") \
            if self.pre.budget is not None else (None, None)
        run_gate = self.pre.start_run(run_id, *limits)
        r = self._run = _Run(root=root, key=key, w=w, led=led, kp_ids=query.kp_ids, kp_set=set(query.kp_ids),
                             synth=SynthBound(env, root), run_gate=run_gate)
        r.budget = RunBudget(limits[0], limits[1], led, r.synth)
        budget = r.budget
        w("run_start", root_query=root, system=SYSTEM, config={
            **cfg.record(), "env": env.name, "env_fingerprint": env.fingerprint(), "query_id": query.id,
            "candidates_per_level": self.levels, "depth_limit": self.depth_limit, "encoder_id": self.encoder_id,
            "tokenizer": accounting.TOKENIZER_ID,
            **({"budget": {"nodes": limits[0], "tokens": limits[1], "spec": self.pre.spec,
                           **({"run_gate": run_gate.config()} if run_gate is not None else {})}}
               if budget.limited else {})})
        stats = r.stats

        # plan: search the root question, propose the first frame's candidates
        with led.timed("retrieve"):
            plan_hits = self.retrieve(root)
        stats["retrieval_calls"] += 1
        plan_texts = [env.texts[i] for i in plan_hits]
        with led.timed("generate"):
            cands = self.gen.plan(root, plan_texts, self.levels[0], self._rng(key, "f0"))
        usage = getattr(self.gen, "last_usage", None)
        cand_texts = [candidate_text(c.query, c.goal) for c in cands]
        protected = list(dict.fromkeys(plan_hits)) if cfg.protect == "plan" else []
        plan_cost = call_tokens([root, *plan_texts], cand_texts)
        growth = r.synth.growth(protected, self.passage_tokens(protected))
        if budget.limited and not budget.fits(plan_cost + growth, nodes=0):
            cands = []  # the budget cannot afford planning: the run expands nothing
            budget.exhausted_at = w("raw", source_type="budget:exhausted", data={"candidate_ids": [], "plan": plan_cost,
                                                                                 **budget.status()}).seq
        else:
            self._llm(w, led, "plan", [root, *plan_texts], cand_texts, usage=usage)
            if run_gate is not None and run_gate.budget.tokens is not None:  # fixed costs: plan + synthesis reserve
                run_gate.budget.charge(tokens=plan_cost + r.synth.value + growth)
            self._protect(r, protected)

        frames = [dict(frame_id="f0", parent_frame=None, parent_candidate=None, depth=0, frame_query=root,
                       parent_goal="", cands=cands)] if cands else []
        r.root_items = self.items([root], None, _Embed(self.embed_any), led)
        for level in range(self.depth_limit):
            next_frames = []
            for fr in frames:
                fid = fr["frame_id"]
                w("frame_open", frame_id=fid, parent_frame=fr["parent_frame"], parent_candidate=fr["parent_candidate"],
                  depth=fr["depth"], frame_query=fr["frame_query"], parent_goal=fr["parent_goal"])
                stats["n_frames"] += 1
                cands = fr["cands"]
                cids = [f"{fid}.c{i}" for i in range(len(cands))]
                for i, (cid, c) in enumerate(zip(cids, cands)):
                    w("candidate", frame_id=fid, candidate_id=cid, order=i, query=c.query, goal=c.goal, origin=c.origin)
                stats["n_candidates"] += len(cands)
                covered_open = covered_key_points((env.labels[i] for i in r.context), r.kp_ids)
                texts = [candidate_text(c.query, c.goal) for c in cands]
                alone: dict[int, Expansion] = {}  # each candidate's expansion against the state at the frame
                # pre-retrieval stage
                with led.timed("pre"):
                    if run_gate is not None:
                        if budget.tokens is not None:
                            alone = {i: self._expansion(r, fr, level, i, cid, c, texts[i], r.seen, r.context, r.synth)
                                     for i, (cid, c) in enumerate(zip(cids, cands))}
                        dstate = DecisionState(root, fr["frame_query"], fr["parent_goal"], list(r.retained_branches),
                                               int(fr["depth"]))
                        choice = self.pre.choose_run(run_gate, dstate, cands,
                                                     [alone[i].cost for i in range(len(cands))] if alone else None, cids)
                        for i in choice.deferred:
                            r.deferred_meta[cids[i]] = (fr, level, i, cands[i], texts[i])
                        r.n_deferred += len(choice.deferred)
                    else:
                        state = State(query=r.root_items, context=self.items(r.retained_branches, None, self.pre, led),
                                      frame_query=fr["frame_query"], parent_goal=fr["parent_goal"], depth=fr["depth"],
                                      extra={"budget_left": self._budget_left(stats),
                                             "breadth": self.breadths[fr["depth"]]})
                        choice = self.pre.choose(self.items(texts, token_counts(texts), self.pre, led), state,
                                                 "pre_retrieval", self._rng(key, fid, "pre"))
                self._log("pre_retrieval", choice.scores)
                # the frame's expansions in order, each against the state its predecessors leave; those the budget
                # cannot afford are dropped (actor "budget")
                plan: dict[int, Expansion | None] = {}
                seen, context, synth = set(r.seen), list(r.context), r.synth.copy()
                committed, expanded, changed = budget.committed(), budget.expanded, False
                for i in sorted(choice.kept):
                    e = alone.get(i) if not changed else None
                    if e is None:
                        e = self._expansion(r, fr, level, i, cids[i], cands[i], texts[i], seen, context, synth)
                    if budget.limited and not self._admit(e, committed, expanded):
                        plan[i] = None
                        continue
                    plan[i] = e
                    committed, expanded, changed = committed + e.cost, expanded + 1, True
                    seen.update(e.new)
                    context.extend(e.keep_new)
                    synth.add(e.keep_new, self.passage_tokens(e.keep_new))
                status = budget.status() if budget.limited else None
                dropped = set(choice.dropped) | {i for i, e in plan.items() if e is None}
                if budget.limited and budget.exhausted_at is None and (choice.exhausted or (
                        choice.kept and all(plan[i] is None for i in choice.kept))):
                    # the first decision that finds the budget exhausted (as inference/recorder.py records it)
                    budget.exhausted_at = w("raw", source_type="budget:exhausted",
                                            data={"candidate_ids": list(cids), **status}).seq
                for i, cid in enumerate(cids):
                    if plan.get(i) is not None:
                        action, actor = "expand", self.pre.actor
                    elif i in dropped:
                        action, actor = "prune", "budget"
                    elif i in choice.deferred:
                        action, actor = "defer", self.pre.actor
                    else:
                        action, actor = "prune", self.pre.actor
                    ev = w("decision", candidate_id=cid, action=action, actor=actor, score=choice.scores[i],
                           p_keep=choice.p_keep[i], **self._budget_fields(status, choice, i, plan.get(i)))
                    if action == "defer":
                        r.deferred_seq[cid] = ev.seq
                budget.dropped += sum(1 for i in dropped if i in choice.kept or i in choice.dropped)
                stats["n_pruned_pre"] += len(cands) - sum(e is not None for e in plan.values())
                for i in sorted(plan):
                    e = plan[i]
                    if e is not None:
                        self._commit(r, fr, e, next_frames, covered_open)
                    if run_gate is not None and i in choice.kept:
                        run_gate.spend(0 if e is None else e.cost)  # settles this admission's reservation
            frames = next_frames
        if run_gate is not None and run_gate.defer:
            self._revisit(r)

        # pre-synthesis stage (protected passages are always kept; the policy chooses among the others)
        context = r.context
        kpr_before = kpr((env.labels[i] for i in context), r.kp_ids)
        final = list(context)
        free = [pi for pi in context if pi not in r.protected]
        with led.timed("synth"):
            if self.synth.prunes and free:
                from branchgate.models.teachers import Items

                prot = [pi for pi in context if pi in r.protected]
                ctx_items = self.items([env.texts[j] for j in free], self.passage_tokens(free), self.synth, led)
                base = self.items([env.texts[j] for j in prot], self.passage_tokens(prot), self.synth, led) if prot \
                    else Items.empty(ctx_items.emb.shape[1])
                sc = self.synth.choose(ctx_items, State(query=r.root_items, context=base, frame_query=root, depth=0),
                                       "pre_synthesis", self._rng(key, "synth"))
                keep = set(prot) | {free[j] for j in sc.kept}
                final = [pi for pi in context if pi in keep]
        removed = [pi for pi in context if pi not in set(final)]
        if removed:
            w("prune", stage="pre_synthesis", item_ids=[env.ids[pi] for pi in removed],
              tokens_before=int(sum(self.passage_tokens(context))), tokens_after=int(sum(self.passage_tokens(final))),
              actor=self.synth.actor)
        final_texts = [env.texts[i] for i in final]
        with led.timed("synth"):
            said = cited_learnings(root, final_texts, env.idf, max_sentences=REPORT_SENTENCES, max_words=REPORT_WORDS)
        report = " ".join(s for s, _ in said)
        if budget.tokens is None or budget.ledger.llm_tokens() + call_tokens([root, *final_texts], [report]) <= budget.tokens:
            self._llm(w, led, "synthesis", [root, *final_texts], [report])
        else:  # only when the root question alone exceeds the budget: no synthesis call, an empty report
            said, report = [], ""
        # the report is extractive: each sentence cites the final-context passages it was taken from
        sentences = [{"text": s, "evidence_ids": [env.ids[final[j]] for j in src]} for s, src in said]
        cited = list(dict.fromkeys(i for s in sentences for i in s["evidence_ids"]))
        w("report", text=report, evidence_ids=[env.ids[i] for i in final], cited_ids=cited, sentences=sentences)
        final_kpr = kpr((env.labels[i] for i in final), r.kp_ids)
        totals = {
            "nodes": stats["nodes"],
            "retrieval_calls": stats["retrieval_calls"],
            "tokens": led.llm_tokens(),
            "kpr": round(final_kpr, 6),
            "wall_s": round(time.perf_counter() - t_start, 4),
            "kpr_before_synthesis": round(kpr_before, 6),
            "reachable_kpr": round(len(query.reachable) / len(r.kp_ids), 6) if r.kp_ids else 0.0,
            "n_key_points": len(r.kp_ids),
            "n_frames": stats["n_frames"],
            "n_candidates": stats["n_candidates"],
            "n_expanded": stats["n_expanded"],
            "n_pruned_pre": stats["n_pruned_pre"],
            "expansions_with_gain": stats["expansions_with_gain"],
            "gain_by_origin": {k: {"expanded": v[0], "with_gain": v[1]} for k, v in sorted(r.by_origin.items())},
            "n_evidence": len(r.emitted),
            "n_context": len(context),
            "n_final": len(final),
            "tokens_by_stage": dict(sorted(led.tokens.items())),
            "wall_by_stage": {k: round(v, 4) for k, v in sorted(led.wall.items())},
        }
        if budget.limited:
            totals["budget"] = {**budget.totals(), "deferred": r.n_deferred, "revisited": r.n_revisited}
        if r.protected:
            totals["n_protected"] = len(r.protected)
        w("run_end", status="ok", totals=totals)
        self._run = None
        return totals

    def _protect(self, r: "_Run", idx: list[int]) -> None:
        """Admit passages ``idx`` to C_0 as protected context (evidence events with ``protected=True``)."""
        env = self.env
        for pi, tok in zip(idx, self.passage_tokens(idx)):
            r.emitted.add(pi)
            r.seen.add(pi)
            r.protected.add(pi)
            r.context.append(pi)
            r.w("evidence", evidence_id=env.ids[pi], text=env.texts[pi], source=env.ids[pi], tokens=tok,
                labels=[k for k in env.labels[pi] if k in r.kp_set], doc=env.docs[pi], protected=True)
        r.synth.add(idx, self.passage_tokens(idx))

    def _budget_fields(self, status: dict | None, choice, i: int, e: Expansion | None) -> dict:
        """A budgeted decision's extra fields, as ``inference/recorder.py`` writes them: ``spent`` / ``remaining``
        when it was made (as the pipeline counts them), the run-scoped gate's admission ``price``; and here also
        an expansion's exact ``cost``."""
        if status is None:
            return {}
        out = dict(status)
        if choice.status is not None:
            out["price"] = choice.status.get("price")
        if e is not None:
            out["cost"] = e.cost
        return out

    def _revisit(self, r: "_Run") -> None:
        """Deferral: with budget left when the tree is done, the run-scoped gate re-scores the deferred
        candidates against the context as it is now (every retained branch); the ones it admits are expanded
        as leaves (retrieval + process, no follow-ups), each only if its exact cost fits. Their ``expand``
        decision names the ``defer`` decision that set them aside; the deferred candidates never expanded get
        a closing ``prune`` (actor ``budget`` when the budget could not afford them)."""
        from branchgate.inference.inputs import DecisionState

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
                kw["costs"] = [self._expansion(r, *self._meta(r, d.key)[:2], d.index, d.key, *self._meta(r, d.key)[3:],
                                               r.seen, r.context, r.synth, children=False).cost for d in items]
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
                w("decision", candidate_id=d.key, action="expand" if fits else "prune",
                  actor=self.pre.actor if fits else "budget", score=p, p_keep=p,
                  deferred_from=r.deferred_seq.get(d.key),
                  **status, price=(sel.budget or {}).get("price"), **({"cost": e.cost} if fits else {}))
                if fits:
                    self._commit(r, fr, e, [], covered_key_points((self.env.labels[j] for j in r.context), r.kp_ids))
                    r.n_revisited += 1
                    r.stats["n_pruned_pre"] -= 1  # it was counted as not expanded when it was deferred
                else:
                    budget.dropped += 1
                gate.spend(e.cost if fits else 0)
        for d in gate.drop_deferred():
            w("decision", candidate_id=d.key, action="prune", actor="budget" if id(d) in no_room else self.pre.actor,
              score=None, p_keep=None, deferred_from=r.deferred_seq.get(d.key), **budget.status())

    @staticmethod
    def _meta(r: "_Run", cid: str):
        return r.deferred_meta[cid]

    def _log(self, stage: str, scores) -> None:
        if self.score_log is not None:
            self.score_log.extend((stage, float(v)) for v in scores if v is not None)

    def _budget_left(self, stats) -> int:
        if isinstance(self.pre, policies.ShallowPolicy):
            return max(0, self.pre.nodes - stats["nodes"])
        return 1 << 30

    def _rng(self, key: str, *parts: str) -> random.Random:
        return random.Random("|".join((str(self.cfg.seed), key, *parts)))

    def _llm(self, w, led: Ledger, purpose: str, prompt: list[str], output: list[str], usage=None) -> None:
        n_in = count_tokens(prompt)
        n_out = count_tokens(output)
        led.add_tokens(purpose, n_in + n_out)
        extra = {"reported_usage": usage} if usage else {}
        w("llm_call", purpose=purpose, model=self.gen.name, in_tokens=n_in, out_tokens=n_out, **extra)


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
    stats: dict = field(default_factory=lambda: {"nodes": 1, "retrieval_calls": 0, "n_candidates": 0, "n_expanded": 0,
                                                 "n_pruned_pre": 0, "expansions_with_gain": 0, "n_frames": 0})
    by_origin: dict = field(default_factory=dict)
    retained_branches: list = field(default_factory=list)
    context: list = field(default_factory=list)  # retained evidence, in admission order
    seen: set = field(default_factory=set)  # every passage admitted or pruned in this run
    pruned: set = field(default_factory=set)
    emitted: set = field(default_factory=set)
    protected: set = field(default_factory=set)  # never removed by post-retrieval or pre-synthesis pruning
    deferred_meta: dict = field(default_factory=dict)  # candidate id → (frame, level, index, candidate, text)
    deferred_seq: dict = field(default_factory=dict)  # candidate id → seq of its defer decision
    n_deferred: int = 0
    n_revisited: int = 0


def _reference(path: str) -> dict:
    """``Config.budget_reference``: {query id: {"nodes", "tokens"}} (other keys ignored)."""
    from pathlib import Path

    from branchgate.errors import InputError
    from branchgate.fileio import load_json

    if not path:
        raise BranchgateError("a budget given as P% needs Config.budget_reference (simulate --budget-reference FILE): "
                              "the reference run totals {query id: {nodes, tokens}}")
    p = Path(path)
    if not p.is_file():
        raise InputError("budget reference not found", str(p))
    data = load_json(p.read_bytes(), str(p))
    if not isinstance(data, dict):
        raise InputError("expected an object {query id: {nodes, tokens}}", str(p))
    return data


def _accepts(fn, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
