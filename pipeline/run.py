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
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass

import numpy as np

from branchgate import __version__
from branchgate.pipeline import accounting, policies
from branchgate.pipeline.accounting import Ledger, count_tokens, covered_key_points, kpr, token_counts
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

    def breadths(self) -> list[int]:
        """GPT-Researcher's breadth per level: halves per level, floor 2 (4, 2, 2 for breadth 4)."""
        out, b = [], self.breadth
        for _ in range(self.depth):
            out.append(b)
            b = max(2, b // 2)
        return out

    def candidates_per_level(self) -> list[int]:
        return [max(1, math.ceil(b * self.oversample)) for b in self.breadths()]

    def tag(self) -> str:
        """Short hash of everything that changes a run's outcome (part of every run id)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]


@dataclass
class _Embed:
    needs_embeddings: bool


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

    # -- one run -----------------------------------------------------------------------------------
    def run(self, query, run_id: str, writer, rep: int = 0) -> dict:
        from branchgate.models.teachers import State

        env, cfg = self.env, self.cfg
        t_start = time.perf_counter()
        led = Ledger()
        self._embedded = set()
        key = f"{query.id}.r{rep}"  # random choices depend on (seed, query, repetition, place): paired across policies
        w = lambda type_, **f: writer.write(type=type_, run_id=run_id, **f)  # noqa: E731
        root = query.query
        w("run_start", root_query=root, system=SYSTEM, config={
            **asdict(cfg), "env": env.name, "env_fingerprint": env.fingerprint(), "query_id": query.id,
            "candidates_per_level": self.levels, "depth_limit": self.depth_limit, "encoder_id": self.encoder_id,
            "tokenizer": accounting.TOKENIZER_ID})
        kp_ids = query.kp_ids
        kp_set = set(kp_ids)  # evidence carries this query's key points only (the corpus is shared)
        stats = {"nodes": 1, "retrieval_calls": 0, "n_candidates": 0, "n_expanded": 0, "n_pruned_pre": 0,
                 "expansions_with_gain": 0}
        by_origin: dict[str, list[int]] = {}

        # plan: search the root question, propose the first frame's candidates
        with led.timed("retrieve"):
            plan_hits = self.retrieve(root)
        stats["retrieval_calls"] += 1
        plan_texts = [env.texts[i] for i in plan_hits]
        with led.timed("generate"):
            cands = self.gen.plan(root, plan_texts, self.levels[0], self._rng(key, "f0"))
        self._llm(w, led, "plan", [root, *plan_texts], [candidate_text(c.query, c.goal) for c in cands])

        frames = [dict(frame_id="f0", parent_frame=None, parent_candidate=None, depth=0, frame_query=root,
                       parent_goal="", cands=cands)]
        retained_branches: list[str] = []
        context: list[int] = []  # retained evidence, in admission order
        seen: set[int] = set()  # every passage admitted or pruned in this run
        pruned: set[int] = set()
        emitted: set[int] = set()
        n_frames = 0
        root_items = self.items([root], None, _Embed(self.embed_any), led)
        for level in range(self.depth_limit):
            next_frames = []
            for fr in frames:
                fid = fr["frame_id"]
                w("frame_open", frame_id=fid, parent_frame=fr["parent_frame"], parent_candidate=fr["parent_candidate"],
                  depth=fr["depth"], frame_query=fr["frame_query"], parent_goal=fr["parent_goal"])
                n_frames += 1
                cands = fr["cands"]
                cids = [f"{fid}.c{i}" for i in range(len(cands))]
                for i, (cid, c) in enumerate(zip(cids, cands)):
                    w("candidate", frame_id=fid, candidate_id=cid, order=i, query=c.query, goal=c.goal, origin=c.origin)
                stats["n_candidates"] += len(cands)
                covered_open = covered_key_points((env.labels[i] for i in context), kp_ids)
                # pre-retrieval stage
                with led.timed("pre"):
                    texts = [candidate_text(c.query, c.goal) for c in cands]
                    state = State(query=root_items, context=self.items(retained_branches, None, self.pre, led),
                                  frame_query=fr["frame_query"], parent_goal=fr["parent_goal"], depth=fr["depth"],
                                  extra={"budget_left": self._budget_left(stats),
                                         "breadth": self.breadths[fr["depth"]]})
                    choice = self.pre.choose(self.items(texts, token_counts(texts), self.pre, led), state,
                                             "pre_retrieval", self._rng(key, fid, "pre"))
                kept = set(choice.kept)
                self._log("pre_retrieval", choice.scores)
                for i, cid in enumerate(cids):
                    w("decision", candidate_id=cid, action="expand" if i in kept else "prune",
                      actor=self.pre.actor, score=choice.scores[i], p_keep=choice.p_keep[i])
                stats["n_pruned_pre"] += len(cands) - len(kept)
                for i in sorted(kept):
                    c, cid = cands[i], cids[i]
                    stats["nodes"] += 1
                    stats["n_expanded"] += 1
                    retained_branches.append(texts[i])
                    with led.timed("retrieve"):
                        hits = self.retrieve(c.query)
                    stats["retrieval_calls"] += 1
                    hit_tokens = self.passage_tokens(hits)
                    for pi, tok in zip(hits, hit_tokens):
                        if pi not in emitted:
                            emitted.add(pi)
                            w("evidence", evidence_id=env.ids[pi], text=env.texts[pi], source=env.ids[pi], tokens=tok,
                              labels=[k for k in env.labels[pi] if k in kp_set], doc=env.docs[pi])
                    w("retrieval", candidate_id=cid, query=c.query, evidence_ids=[env.ids[pi] for pi in hits],
                      tokens=int(sum(hit_tokens)))
                    gain = covered_key_points((env.labels[pi] for pi in hits), kp_ids) - covered_open
                    stats["expansions_with_gain"] += bool(gain)
                    o = by_origin.setdefault(c.origin, [0, 0])
                    o[0] += 1
                    o[1] += bool(gain)
                    # post-retrieval stage: only passages new to the run are candidates for C
                    new = [pi for pi in hits if pi not in seen]
                    seen.update(new)
                    new_tokens = self.passage_tokens(new)
                    with led.timed("post"):
                        if self.post.prunes and new:
                            post_state = State(query=root_items, context=self.items([env.texts[j] for j in context],
                                                                  self.passage_tokens(context), self.post, led),
                                               frame_query=c.query, parent_goal=c.goal, depth=fr["depth"] + 1)
                            pc = self.post.choose(self.items([env.texts[j] for j in new], new_tokens, self.post, led),
                                                  post_state, "post_retrieval", self._rng(key, cid, "post"))
                            keep_new = [new[j] for j in sorted(pc.kept)]
                            self._log("post_retrieval", pc.scores)
                        else:
                            keep_new = list(new)
                    removed = [pi for pi in new if pi not in set(keep_new)]
                    pruned.update(removed)
                    # a re-retrieved passage that was pruned before stays pruned: say so again, so a reader
                    # replaying retrievals and prunes in order gets the same C_t
                    stale = [pi for pi in dict.fromkeys(hits) if pi in pruned and pi not in set(removed)]
                    if removed or stale:
                        w("prune", stage="post_retrieval", item_ids=[env.ids[pi] for pi in removed + stale],
                          tokens_before=int(sum(new_tokens)), tokens_after=int(sum(self.passage_tokens(keep_new))),
                          actor=self.post.actor)
                    context.extend(keep_new)
                    if not keep_new:
                        continue
                    kept_texts = [env.texts[pi] for pi in keep_new]
                    with led.timed("generate"):
                        learned = self.gen.learnings(c.query, kept_texts)
                    self._llm(w, led, "process", [texts[i], *kept_texts], learned)
                    for s in learned:
                        w("learning", candidate_id=cid, text=s)
                    if level + 1 < self.depth_limit:
                        child = f"{fid}.{i}"
                        with led.timed("generate"):
                            kids = self.gen.followups(root, c, kept_texts, self.levels[level + 1],
                                                      self._rng(key, child), fr["depth"] + 1, learned)
                        kid_texts = [candidate_text(k.query, k.goal) for k in kids]
                        self._llm(w, led, "followups", [root, texts[i], *learned], kid_texts)
                        for kt in kid_texts:
                            w("followup", candidate_id=cid, text=kt)
                        if kids:
                            next_frames.append(dict(frame_id=child, parent_frame=fid, parent_candidate=cid,
                                                    depth=fr["depth"] + 1, frame_query=c.query, parent_goal=c.goal,
                                                    cands=kids))
            frames = next_frames

        # pre-synthesis stage
        kpr_before = kpr((env.labels[i] for i in context), kp_ids)
        final = list(context)
        with led.timed("synth"):
            if self.synth.prunes and context:
                from branchgate.models.teachers import Items

                ctx_items = self.items([env.texts[j] for j in context], self.passage_tokens(context), self.synth, led)
                sc = self.synth.choose(ctx_items, State(query=root_items,
                                                        context=Items.empty(ctx_items.emb.shape[1]), frame_query=root,
                                                        depth=0), "pre_synthesis", self._rng(key, "synth"))
                final = [context[j] for j in sorted(sc.kept)]
        removed = [pi for pi in context if pi not in set(final)]
        if removed:
            w("prune", stage="pre_synthesis", item_ids=[env.ids[pi] for pi in removed],
              tokens_before=int(sum(self.passage_tokens(context))), tokens_after=int(sum(self.passage_tokens(final))),
              actor=self.synth.actor)
        final_texts = [env.texts[i] for i in final]
        with led.timed("synth"):
            said = cited_learnings(root, final_texts, env.idf, max_sentences=8, max_words=80)
        report = " ".join(s for s, _ in said)
        self._llm(w, led, "synthesis", [root, *final_texts], [report])
        # the report is extractive: each sentence cites the final-context passages it was taken from
        sentences = [{"text": s, "evidence_ids": [env.ids[final[j]] for j in src]} for s, src in said]
        cited = list(dict.fromkeys(i for s in sentences for i in s["evidence_ids"]))
        w("report", text=report, evidence_ids=[env.ids[i] for i in final], cited_ids=cited, sentences=sentences)
        final_kpr = kpr((env.labels[i] for i in final), kp_ids)
        totals = {
            "nodes": stats["nodes"],
            "retrieval_calls": stats["retrieval_calls"],
            "tokens": led.llm_tokens(),
            "kpr": round(final_kpr, 6),
            "wall_s": round(time.perf_counter() - t_start, 4),
            "kpr_before_synthesis": round(kpr_before, 6),
            "reachable_kpr": round(len(query.reachable) / len(kp_ids), 6) if kp_ids else 0.0,
            "n_key_points": len(kp_ids),
            "n_frames": n_frames,
            "n_candidates": stats["n_candidates"],
            "n_expanded": stats["n_expanded"],
            "n_pruned_pre": stats["n_pruned_pre"],
            "expansions_with_gain": stats["expansions_with_gain"],
            "gain_by_origin": {k: {"expanded": v[0], "with_gain": v[1]} for k, v in sorted(by_origin.items())},
            "n_evidence": len(emitted),
            "n_context": len(context),
            "n_final": len(final),
            "tokens_by_stage": dict(sorted(led.tokens.items())),
            "wall_by_stage": {k: round(v, 4) for k, v in sorted(led.wall.items())},
        }
        w("run_end", status="ok", totals=totals)
        return totals

    def _log(self, stage: str, scores) -> None:
        if self.score_log is not None:
            self.score_log.extend((stage, float(v)) for v in scores if v is not None)

    def _budget_left(self, stats) -> int:
        if isinstance(self.pre, policies.ShallowPolicy):
            return max(0, self.pre.nodes - stats["nodes"])
        return 1 << 30

    def _rng(self, key: str, *parts: str) -> random.Random:
        return random.Random("|".join((str(self.cfg.seed), key, *parts)))

    def _llm(self, w, led: Ledger, purpose: str, prompt: list[str], output: list[str]) -> None:
        usage = getattr(self.gen, "last_usage", None) if purpose in ("plan", "followups") else None
        n_in = count_tokens(prompt)
        n_out = count_tokens(output)
        led.add_tokens(purpose, n_in + n_out)
        extra = {"reported_usage": usage} if usage else {}
        w("llm_call", purpose=purpose, model=self.gen.name, in_tokens=n_in, out_tokens=n_out, **extra)
