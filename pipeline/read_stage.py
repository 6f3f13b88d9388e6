"""The read stage of the reference pipeline (``--read``): which hits of a search to read, before any is read.

After a candidate's search, the hits new to the run (``Expansion.offered``; protected passages are already seen)
are shown to the read policy as a search engine shows them: title "" (the pipeline has none) and snippet = the
first ``Config.snippet_words`` whitespace words of the passage; a hit's text is ``texts.hit_text("", snippet)``.
The state: the root question, the searched sub-query and its goal, the depth of the candidate's frame, and the
texts (and ids) of the hits read earlier in the run, oldest first (the newest ``READ_CONTEXT``: ``_Run.reads``).
A skipped hit is not seen (a later search may offer it again), not processed, and costs no LLM tokens.

``ReadStage`` (a mixin of ``expand.Expander``) makes the choice (``_read_stage``) and writes it (``_write_reads``):
one ``results`` event (every hit retrieved, in rank order; ``hit_id`` = the passage's evidence id) and one
``read`` event per offered hit (read / skip, the read policy's actor, score and p_keep); it counts
``search_calls``, ``hits_offered`` and ``hits_read`` for the run's totals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from branchgate.pipeline.accounting import token_counts
from branchgate.pipeline.stage_policies import Choice, ReadGatePolicy
from branchgate.texts import hit_text, snippet

if TYPE_CHECKING:
    from branchgate.pipeline.expand import Expansion, _Run

READ_CONTEXT = 128  # hits read a read decision sees (the newest)


class ReadStage:
    """The read stage's steps on one expansion (a mixin: ``run.Runner`` is the class; it has ``env``, ``cfg``,
    ``read`` = the read policy, ``items``, ``_rng`` and ``_log``)."""

    def snippet(self, pi: int) -> str:
        """Passage ``pi`` as a search hit's snippet: its first ``Config.snippet_words`` whitespace words."""
        return snippet(self.env.texts[pi], self.cfg.snippet_words)

    def hits_read(self, e: Expansion) -> list[tuple[str, str]]:
        """(hit id, hit text) of each hit expansion ``e`` reads, as the read stage's context keeps them."""
        return [(self.env.ids[pi], hit_text("", self.snippet(pi))) for pi in e.new]

    def _read_stage(self, r: _Run, fr: dict, cid: str, c, hits: list, offered: list, reads: list) -> Choice:
        """The read stage's choice among a search's ``offered`` hits (kept = indices into ``offered``): every one
        with ``--read none``; else the read policy on their snippets, with the search's state (root question,
        sub-query, goal, the depth of the candidate's frame) and the hits read before (``reads``)."""
        n = len(offered)
        if not self.read.prunes or not offered:
            return Choice(list(range(n)), [None] * n, [None] * n)
        from branchgate.models.teachers import State

        env, led = self.env, r.led
        snippets = [self.snippet(pi) for pi in offered]
        with led.timed("read"):
            if isinstance(self.read, ReadGatePolicy):
                rank = {pi: k for k, pi in enumerate(dict.fromkeys(hits))}
                state = {
                    "root_query": r.root,
                    "query": c.query,
                    "goal": c.goal,
                    "read": [text for _, text in reads],
                    "read_ids": [hid for hid, _ in reads],
                    "depth": fr["depth"],
                }
                listed = [
                    {"id": env.ids[pi], "title": "", "snippet": s, "rank": rank[pi]} for pi, s in zip(offered, snippets)
                ]
                choice = self.read.choose_hits(state, listed)
            else:
                texts = [hit_text("", s) for s in snippets]
                read_texts = [text for _, text in reads]
                state = State(
                    query=r.root_items,
                    context=self.items(read_texts, token_counts(read_texts), self.read, led),
                    frame_query=c.query,
                    parent_goal=c.goal,
                    depth=fr["depth"],
                )
                choice = self.read.choose(
                    self.items(texts, token_counts(texts), self.read, led), state, "read", self._rng(r.key, cid, "read")
                )
        self._log("read", choice.scores)
        return choice

    def _write_reads(self, r: _Run, e: Expansion) -> None:
        """The search's ``results`` event (every hit retrieved, in rank order, as a snippet) and one ``read`` event
        per offered hit (read / skip, by the read policy's actor); counts them and remembers the hits read."""
        env, w, choice = self.env, r.w, e.read_choice
        w(
            "results",
            candidate_id=e.cid,
            query=e.cand.query,
            hits=[
                {"hit_id": env.ids[pi], "title": "", "snippet": self.snippet(pi), "rank": k, "url": None}
                for k, pi in enumerate(dict.fromkeys(e.hits))
            ],
        )
        kept = set(choice.kept)
        for j, pi in enumerate(e.offered):
            w(
                "read",
                candidate_id=e.cid,
                hit_id=env.ids[pi],
                action="read" if j in kept else "skip",
                actor=self.read.actor,
                score=choice.scores[j],
                p_keep=choice.p_keep[j],
            )
        r.stats["search_calls"] += 1
        r.stats["hits_offered"] += len(e.offered)
        r.stats["hits_read"] += len(e.new)
        add_reads(r.reads, self.hits_read(e))


def add_reads(reads: list, new: list) -> None:
    """Append ``new`` (hit id, hit text) pairs to ``reads`` in place, keeping the newest ``READ_CONTEXT``."""
    reads.extend(new)
    del reads[: max(0, len(reads) - READ_CONTEXT)]
