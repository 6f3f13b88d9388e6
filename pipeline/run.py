"""One query through Algorithm 1 (deep research with three pruning stages, and a read stage) → one canonical trace.

    plan:  retrieve(Q) → generator proposes the root frame's candidates
    for each level (breadth first), for each frame:
        frame_open, candidate events
        pre-retrieval stage: policy(candidates | retained branch texts, Q) → decision events
        for each expanded candidate c:
            retrieve(c) → results event (the hits as snippets)
            read stage: policy(hits new to the run | hits read so far, Q) → read events (read / skip)
            evidence events (ids new to the run) → retrieval event (the hits retrieved minus the skipped ones)
            post-retrieval stage: policy(new items read | retained evidence C_t, Q) → prune event
            learnings (extractive) and, below the depth limit, follow-up candidates → a child frame
    pre-synthesis stage: policy(C_T | Q) → prune event → extractive report → run_end with totals

A passage is admitted to a run once: re-retrieving a retained passage adds nothing, and a pruned one
stays pruned (as GPT-Researcher skips visited URLs), so ``C_t`` = retrieved minus pruned under any
reading of the trace. A hit the read stage skips is not seen: a later search may offer it again. Follow-ups
are spawned from a branch's newly retained evidence only; a branch that brings (or reads) nothing new is a dead
end.

``Runner.run`` calls these steps in order: ``_start`` (run_start), ``_plan``, ``_level`` per level and
``_frame`` per frame (``_choose_pre``, ``_schedule``, ``_decisions``, then ``_commit`` per expansion),
``_revisit``, ``_synthesis``, ``_report`` and ``_totals`` (run_end).

Each expansion is computed completely (``Runner._expansion``: retrieval, the read stage, post-retrieval pruning,
learnings, follow-ups) before it is written (``Runner._commit``), so a run budget (``--pre SPEC,budget_tokens=T``) knows
its exact cost and is never exceeded (``pipeline/exact_costs.py``); a frame's decisions are written once its
expansions are costed. With ``defer=1`` the run-scoped gate's deferred candidates are revisited when the tree
is done (``Runner._revisit``); ``Config.protect`` adds protected context. The settings are in
``pipeline/config.py``; the per-expansion steps and one run's state (``_Run``) in ``pipeline/expand.py``.

Over 400 lines: Algorithm 1's steps, each a short method, in the order a run takes them, so that a run reads top to
bottom in one file.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from branchgate import __version__
from branchgate.errors import BranchgateError
from branchgate.inference.inputs import DecisionState
from branchgate.inference.read_state import ReadState
from branchgate.models.teachers import Items, State
from branchgate.pipeline import accounting, stage_policies
from branchgate.pipeline.accounting import Ledger, count_tokens, covered_key_points, kpr, token_counts
from branchgate.pipeline.config import PROTECT, SHAPES, Config, _reference, check_snippet_words
from branchgate.pipeline.exact_costs import REPORT_SENTENCES, REPORT_WORDS, RunBudget, SynthBound
from branchgate.pipeline.expand import Expander, Expansion, _Run, call_tokens
from branchgate.pipeline.generate import cited_learnings
from branchgate.pipeline.read_stage import add_reads
from branchgate.texts import candidate_text

SYSTEM = f"branchgate-reference {__version__}"


@dataclass
class _Embed:
    needs_embeddings: bool


class Runner(Expander):
    """Runs queries of one environment under one configuration; reusable across runs in a process."""

    def __init__(self, env, cfg: Config, generator, embedder=None, encoder_id: str | None = None):
        self.env, self.cfg, self.gen = env, cfg, generator
        self.pre = stage_policies.parse(cfg.pre, "pre_retrieval")
        self.read = stage_policies.parse(cfg.read, "read")
        self.post = stage_policies.parse(cfg.post, "post_retrieval")
        self.synth = stage_policies.parse(cfg.synth, "pre_synthesis")
        self.embedder, self.encoder_id = embedder, encoder_id
        self.levels = cfg.candidates_per_level()
        self.breadths = cfg.breadths()
        self.depth_limit = cfg.depth
        if isinstance(self.pre, stage_policies.ShallowPolicy):
            self.depth_limit = len(self.pre.plan(self.levels))
        self.embed_any = any(p.needs_embeddings for p in (self.pre, self.read, self.post, self.synth))
        self._embedded: set[str] = set()
        self.score_log: list[tuple[str, float]] | None = None  # (stage, score) of every scored item, when a list
        if cfg.protect not in PROTECT:
            raise BranchgateError(f"protect must be one of {', '.join(PROTECT)}, got {cfg.protect!r}")
        if cfg.shape not in SHAPES:
            raise BranchgateError(f"shape must be one of {', '.join(SHAPES)}, got {cfg.shape!r}")
        check_snippet_words(cfg.snippet_words)
        self.reference = (
            _reference(cfg.budget_reference) if self.pre.budget is not None and self.pre.budget.relative else {}
        )
        if self.pre.budget is not None and getattr(generator, "name", "offline") != "offline":
            raise BranchgateError(
                f"--pre {cfg.pre}: run budgets need the offline generator (an expansion's exact cost "
                "is known before it is committed only when generation is deterministic)"
            )

    # -- helpers -----------------------------------------------------------------------------------
    def passage_tokens(self, idx: list[int]) -> list[int]:
        return token_counts([self.env.texts[i] for i in idx])

    def retrieve(self, query: str) -> list[int]:
        if self.cfg.retriever == "dense":
            qv = self.embedder([query])[0]
            hits = self.env.dense(self.encoder_id).search_vector(qv, self.cfg.top_k)
        else:
            hits = self.env.memo.get_or(
                ("bm25", query, self.cfg.top_k), lambda: tuple(self.env.bm25.search(query, self.cfg.top_k))
            )
        return [i for i, _ in hits]

    def items(self, texts: list[str], tokens: list[int] | None, policy, ledger: Ledger):
        if policy.needs_embeddings and self.embedder is not None:
            with ledger.timed("embed"):
                emb = self.embedder(texts)
            fresh = [t for t in dict.fromkeys(texts) if t not in self._embedded]
            self._embedded.update(fresh)
            ledger.add_tokens("embed", count_tokens(fresh))
        else:
            emb = np.zeros((len(texts), 1), dtype=np.float32)
        return Items(list(texts), emb, None if tokens is None else np.asarray(tokens, dtype=np.float64))

    # -- one run: Algorithm 1's steps -------------------------------------------------------------------
    def run(self, query, run_id: str, writer, rep: int = 0) -> dict:
        """Run ``query`` (repetition ``rep``), writing its trace to ``writer``; returns the run's totals."""
        t_start = time.perf_counter()
        r = self._start(query, run_id, writer, rep)
        frames = self._plan(r)
        r.root_items = self.items([r.root], None, _Embed(self.embed_any), r.led)
        for level in range(self.depth_limit):
            frames = self._level(r, frames, level)
        if r.run_gate is not None and r.run_gate.defer:
            self._revisit(r)
        final, kpr_before = self._synthesis(r)
        self._report(r, final)
        totals = self._totals(r, query, final, kpr_before, t_start)
        r.w("run_end", status="ok", totals=totals)
        self._run = None
        return totals

    def _start(self, query, run_id: str, writer, rep: int) -> _Run:
        """A new run's state (with its run budget and run-scoped gate, if any) and its run_start event."""
        env, cfg = self.env, self.cfg
        led = Ledger()
        self._embedded = set()
        key = f"{query.id}.r{rep}"  # random choices depend on (seed, query, repetition, place): paired across policies
        w = lambda type_, **f: writer.write(type=type_, run_id=run_id, **f)  # noqa: E731
        root = query.query
        limits = (
            self.pre.budget.resolve(self.reference.get(query.id), f"query {query.id}")
            if self.pre.budget is not None
            else (None, None)
        )
        run_gate = self.pre.start_run(run_id, *limits)
        r = self._run = _Run(
            root=root,
            key=key,
            w=w,
            led=led,
            kp_ids=query.kp_ids,
            kp_set=set(query.kp_ids),
            synth=SynthBound(env, root),
            run_gate=run_gate,
            reads=ReadState(root),
        )
        r.budget = RunBudget(limits[0], limits[1], led, r.synth)
        w(
            "run_start",
            root_query=root,
            system=SYSTEM,
            config={
                **cfg.record(),
                "env": env.name,
                "env_fingerprint": env.fingerprint(),
                "query_id": query.id,
                "candidates_per_level": self.levels,
                "depth_limit": self.depth_limit,
                "encoder_id": self.encoder_id,
                "tokenizer": accounting.TOKENIZER_ID,
                **(
                    {
                        "budget": {
                            "nodes": limits[0],
                            "tokens": limits[1],
                            "spec": self.pre.spec,
                            **({"run_gate": run_gate.config()} if run_gate is not None else {}),
                        }
                    }
                    if r.budget.limited
                    else {}
                ),
            },
        )
        return r

    def _plan(self, r: _Run) -> list[dict]:
        """Plan: search the root question, propose the first frame's candidates; returns the first level's frames
        (none when the budget cannot afford planning)."""
        env, led, budget, run_gate, root = self.env, r.led, r.budget, r.run_gate, r.root
        with led.timed("retrieve"):
            plan_hits = self.retrieve(root)
        r.stats["retrieval_calls"] += 1
        plan_texts = [env.texts[i] for i in plan_hits]
        with led.timed("generate"):
            cands = self.gen.plan(root, plan_texts, self.levels[0], self._rng(r.key, "f0"))
        usage = getattr(self.gen, "last_usage", None)
        cand_texts = [candidate_text(c.query, c.goal) for c in cands]
        protected = list(dict.fromkeys(plan_hits)) if self.cfg.protect == "plan" else []
        plan_cost = call_tokens([root, *plan_texts], cand_texts)
        growth = r.synth.growth(protected, self.passage_tokens(protected))
        if budget.limited and not budget.fits(plan_cost + growth, nodes=0):
            cands = []  # the budget cannot afford planning: the run expands nothing
            budget.exhausted_at = r.w(
                "raw", source_type="budget:exhausted", data={"candidate_ids": [], "plan": plan_cost, **budget.status()}
            ).seq
        else:
            self._llm(r.w, led, "plan", [root, *plan_texts], cand_texts, usage=usage)
            budget.commit_plan(plan_cost, growth, run_gate)  # one ledger: the run-scoped gate reads what the run spends
            self._protect(r, protected)
        return (
            [
                dict(
                    frame_id="f0",
                    parent_frame=None,
                    parent_candidate=None,
                    depth=0,
                    frame_query=root,
                    parent_goal="",
                    cands=cands,
                )
            ]
            if cands
            else []
        )

    def _level(self, r: _Run, frames: list[dict], level: int) -> list[dict]:
        """One level of the tree, breadth first: each frame in order; returns the next level's frames."""
        next_frames: list[dict] = []
        for fr in frames:
            self._frame(r, fr, level, next_frames)
        return next_frames

    def _frame(self, r: _Run, fr: dict, level: int, next_frames: list) -> None:
        """One frame: frame_open and candidate events, the pre-retrieval decision, then its expansions written in
        order (their child frames appended to ``next_frames``)."""
        fid, cands = fr["frame_id"], fr["cands"]
        r.w(
            "frame_open",
            frame_id=fid,
            parent_frame=fr["parent_frame"],
            parent_candidate=fr["parent_candidate"],
            depth=fr["depth"],
            frame_query=fr["frame_query"],
            parent_goal=fr["parent_goal"],
        )
        r.stats["n_frames"] += 1
        cids = [f"{fid}.c{i}" for i in range(len(cands))]
        for i, (cid, c) in enumerate(zip(cids, cands)):
            r.w("candidate", frame_id=fid, candidate_id=cid, order=i, query=c.query, goal=c.goal, origin=c.origin)
        r.stats["n_candidates"] += len(cands)
        covered_open = covered_key_points((self.env.labels[i] for i in r.context), r.kp_ids)
        texts = [candidate_text(c.query, c.goal) for c in cands]
        choice, alone = self._choose_pre(r, fr, level, cids, texts)
        self._log("pre_retrieval", choice.scores)
        plan = self._schedule(r, fr, level, choice, alone, cids, texts)
        self._decisions(r, choice, cids, plan)
        for i in sorted(plan):
            e = plan[i]
            if e is not None:
                self._commit(r, fr, e, next_frames, covered_open)
            if r.run_gate is not None and i in choice.kept:
                r.run_gate.spend(0 if e is None else e.cost)  # settles this admission's reservation

    def _choose_pre(self, r: _Run, fr: dict, level: int, cids: list[str], texts: list[str]):
        """The pre-retrieval stage's choice among the frame's candidates, and (for a run-scoped gate with a
        token budget) each candidate's expansion against the state at the frame, to price them exactly."""
        cands, led, run_gate = fr["cands"], r.led, r.run_gate
        alone: dict[int, Expansion] = {}  # each candidate's expansion against the state at the frame
        with led.timed("pre"):
            if run_gate is not None:
                if r.budget.tokens is not None:
                    alone = {
                        i: self._expansion(r, fr, level, i, cid, c, texts[i], r.seen, r.context, r.synth)
                        for i, (cid, c) in enumerate(zip(cids, cands))
                    }
                dstate = DecisionState(
                    r.root, fr["frame_query"], fr["parent_goal"], list(r.retained_branches), int(fr["depth"])
                )
                choice = self.pre.choose_run(
                    run_gate, dstate, cands, [alone[i].cost for i in range(len(cands))] if alone else None, cids
                )
                for i in choice.deferred:
                    r.deferred_meta[cids[i]] = (fr, level, i, cands[i], texts[i])
                r.n_deferred += len(choice.deferred)
            else:
                state = State(
                    query=r.root_items,
                    context=self.items(r.retained_branches, None, self.pre, led),
                    frame_query=fr["frame_query"],
                    parent_goal=fr["parent_goal"],
                    depth=fr["depth"],
                    extra={"budget_left": self._budget_left(r.stats), "breadth": self.breadths[fr["depth"]]},
                )
                choice = self.pre.choose(
                    self.items(texts, token_counts(texts), self.pre, led),
                    state,
                    "pre_retrieval",
                    self._rng(r.key, fr["frame_id"], "pre"),
                )
        return choice, alone

    def _schedule(
        self, r: _Run, fr: dict, level: int, choice, alone: dict, cids: list[str], texts: list[str]
    ) -> dict[int, Expansion | None]:
        """The frame's kept candidates' expansions in order, each against the state its predecessors leave;
        those the budget cannot afford are None (dropped, actor "budget")."""
        cands, budget = fr["cands"], r.budget
        plan: dict[int, Expansion | None] = {}
        seen, context, synth, reads = set(r.seen), list(r.context), r.synth.copy(), r.reads.copy()
        committed, expanded, changed = budget.committed(), budget.expanded, False
        for i in sorted(choice.kept):
            e = alone.get(i) if not changed else None
            if e is None:
                e = self._expansion(r, fr, level, i, cids[i], cands[i], texts[i], seen, context, synth, reads=reads)
            if budget.limited and not self._admit(e, committed, expanded):
                plan[i] = None
                continue
            plan[i] = e
            committed, expanded, changed = committed + e.cost, expanded + 1, True
            seen.update(e.new)
            context.extend(e.keep_new)
            synth.add(e.keep_new, self.passage_tokens(e.keep_new))
            add_reads(reads, self.hits_read(e))
        return plan

    def _decisions(self, r: _Run, choice, cids: list[str], plan: dict[int, Expansion | None]) -> None:
        """The frame's decision events (expand / defer / prune by the policy or by the budget), written once its
        expansions are costed, and the first ``budget:exhausted`` event."""
        budget = r.budget
        status = budget.status() if budget.limited else None
        dropped = set(choice.dropped) | {i for i, e in plan.items() if e is None}
        if (
            budget.limited
            and budget.exhausted_at is None
            and (choice.exhausted or (choice.kept and all(plan[i] is None for i in choice.kept)))
        ):
            # the first decision that finds the budget exhausted (as inference/agents/recorder.py records it)
            budget.exhausted_at = r.w(
                "raw", source_type="budget:exhausted", data={"candidate_ids": list(cids), **status}
            ).seq
        for i, cid in enumerate(cids):
            if plan.get(i) is not None:
                action, actor = "expand", self.pre.actor
            elif i in dropped:
                action, actor = "prune", "budget"
            elif i in choice.deferred:
                action, actor = "defer", self.pre.actor
            else:
                action, actor = "prune", self.pre.actor
            ev = r.w(
                "decision",
                candidate_id=cid,
                action=action,
                actor=actor,
                score=choice.scores[i],
                p_keep=choice.p_keep[i],
                **self._budget_fields(status, choice, i, plan.get(i)),
            )
            if action == "defer":
                r.deferred_seq[cid] = ev.seq
        budget.dropped += sum(1 for i in dropped if i in choice.kept or i in choice.dropped)
        r.stats["n_pruned_pre"] += len(cids) - sum(e is not None for e in plan.values())

    def _synthesis(self, r: _Run) -> tuple[list[int], float]:
        """The pre-synthesis stage (protected passages are always kept; the policy chooses among the others) and
        its prune event; returns the final context and the KPR before it."""
        env, led, context = self.env, r.led, r.context
        kpr_before = kpr((env.labels[i] for i in context), r.kp_ids)
        final = list(context)
        free = [pi for pi in context if pi not in r.protected]
        with led.timed("synth"):
            if self.synth.prunes and free:
                from branchgate.models.teachers import Items, State

                prot = [pi for pi in context if pi in r.protected]
                ctx_items = self.items([env.texts[j] for j in free], self.passage_tokens(free), self.synth, led)
                base = (
                    self.items([env.texts[j] for j in prot], self.passage_tokens(prot), self.synth, led)
                    if prot
                    else Items.empty(ctx_items.emb.shape[1])
                )
                sc = self.synth.choose(
                    ctx_items,
                    State(query=r.root_items, context=base, frame_query=r.root, depth=0),
                    "pre_synthesis",
                    self._rng(r.key, "synth"),
                )
                keep = set(prot) | {free[j] for j in sc.kept}
                final = [pi for pi in context if pi in keep]
        removed = [pi for pi in context if pi not in set(final)]
        if removed:
            r.w(
                "prune",
                stage="pre_synthesis",
                item_ids=[env.ids[pi] for pi in removed],
                tokens_before=int(sum(self.passage_tokens(context))),
                tokens_after=int(sum(self.passage_tokens(final))),
                actor=self.synth.actor,
            )
        return final, kpr_before

    def _report(self, r: _Run, final: list[int]) -> None:
        """The extractive report of the final context: the synthesis call (when the budget affords it) and the
        report event, each sentence citing the passages it was taken from."""
        env, root, budget = self.env, r.root, r.budget
        final_texts = [env.texts[i] for i in final]
        with r.led.timed("synth"):
            said = cited_learnings(root, final_texts, env.idf, max_sentences=REPORT_SENTENCES, max_words=REPORT_WORDS)
        report = " ".join(s for s, _ in said)
        cost = call_tokens([root, *final_texts], [report])
        if budget.tokens is None or budget.ledger.llm_tokens() + cost <= budget.tokens:
            self._llm(r.w, r.led, "synthesis", [root, *final_texts], [report])
        else:  # only when the root question alone exceeds the budget: no synthesis call, an empty report
            said, report = [], ""
        sentences = [{"text": s, "evidence_ids": [env.ids[final[j]] for j in src]} for s, src in said]
        cited = list(dict.fromkeys(i for s in sentences for i in s["evidence_ids"]))
        r.w("report", text=report, evidence_ids=[env.ids[i] for i in final], cited_ids=cited, sentences=sentences)

    def _totals(self, r: _Run, query, final: list[int], kpr_before: float, t_start: float) -> dict:
        """The run_end event's totals."""
        stats, led = r.stats, r.led
        final_kpr = kpr((self.env.labels[i] for i in final), r.kp_ids)
        totals = {
            "nodes": stats["nodes"],
            "retrieval_calls": stats["retrieval_calls"],
            "search_calls": stats["search_calls"],
            "hits_offered": stats["hits_offered"],
            "hits_read": stats["hits_read"],
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
            "n_context": len(r.context),
            "n_final": len(final),
            "tokens_by_stage": dict(sorted(led.tokens.items())),
            "wall_by_stage": {k: round(v, 4) for k, v in sorted(led.wall.items())},
        }
        if r.budget.limited:
            totals["budget"] = {**r.budget.totals(), "deferred": r.n_deferred, "revisited": r.n_revisited}
        if r.protected:
            totals["n_protected"] = len(r.protected)
        return totals

    def _log(self, stage: str, scores) -> None:
        if self.score_log is not None:
            self.score_log.extend((stage, float(v)) for v in scores if v is not None)

    def _budget_left(self, stats) -> int:
        if isinstance(self.pre, stage_policies.ShallowPolicy):
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
