"""The read stage of the reference pipeline (``--read``): which hits of a search to read, before any is read.

After a candidate's search, the hits new to the run (``Expansion.offered``; protected passages are already seen)
are shown to the read policy as a search engine shows them (``ReadStage.hit``): in an environment of pages
(``env build --unit page``) the page's title (its first line) and the opening ``Config.snippet_words`` words after
it; else title "" and the first ``Config.snippet_words`` words of the passage; a hit's text is
``texts.hit_text(title, snippet)``.
The state: the root question, the searched sub-query and its goal, the depth of the candidate's frame, and the
texts (and ids) of the hits read earlier in the run, oldest first: ``_Run.reads``, the run's
``inference.read_state.ReadState`` (its window: the newest ``READ_WINDOW``), as the agents' hook and replay keep it.
A skipped hit is not seen (a later search may offer it again), not processed, and costs no LLM tokens.

``ReadStage`` (a mixin of ``expand.Expander``) makes the choice (``_read_stage``) and writes it (``_write_reads``):
one ``results`` event (every hit retrieved, in rank order; ``hit_id`` = the passage's evidence id) and one
``read`` event per offered hit (read / skip, the read policy's actor, score and p_keep); it counts
``search_calls``, ``hits_offered`` and ``hits_read`` for the run's totals.
"""

from __future__ import annotations

from branchgate.inference.read_state import ReadState
from branchgate.models.teachers import State
from branchgate.pipeline.accounting import token_counts
from branchgate.pipeline.stage_policies import Choice, ReadGatePolicy
from branchgate.texts import hit_text, snippet, title_of


class ReadStage:
    """The read stage's steps on one expansion (a mixin: ``run.Runner`` is the class; it has ``env``, ``cfg``,
    ``read`` = the read policy, ``items``, ``_rng`` and ``_log``)."""

    def hit(self, pi: int) -> tuple[str, str]:
        """Passage ``pi`` as a search engine lists it, ``(title, snippet)``: a page's first line and the opening
        ``Config.snippet_words`` words after it; a chunk's first ``Config.snippet_words`` words, no title."""
        text = self.env.texts[pi]
        if self.env.unit == "page":
            return title_of(text), snippet(text.strip().partition("\n")[2], self.cfg.snippet_words)
        return "", snippet(text, self.cfg.snippet_words)

    def hits_read(self, e) -> list[tuple[str, str]]:
        """(hit id, hit text) of each hit expansion ``e`` (``expand.Expansion``) reads."""
        return [(self.env.ids[pi], hit_text(*self.hit(pi))) for pi in e.new]

    def _read_stage(self, r, fr: dict, cid: str, c, hits: list, offered: list, reads: ReadState) -> Choice:
        """The read stage's choice among a search's ``offered`` hits (kept = indices into ``offered``): every one
        with ``--read none``; else the read policy on their snippets, with the search's state (root question,
        sub-query, goal, the depth of the candidate's frame) and the hits read before (``reads``). ``r`` is the
        run (``expand._Run``)."""
        n = len(offered)
        if not self.read.prunes or not offered:
            return Choice(list(range(n)), [None] * n, [None] * n)
        env, led = self.env, r.led
        shown = [self.hit(pi) for pi in offered]
        with led.timed("read"):
            if isinstance(self.read, ReadGatePolicy):
                rank = {pi: k for k, pi in enumerate(dict.fromkeys(hits))}
                state = reads.state(c.query, c.goal, fr["depth"])
                listed = [
                    {"id": env.ids[pi], "title": t, "snippet": s, "rank": rank[pi]}
                    for pi, (t, s) in zip(offered, shown)
                ]
                choice = self.read.choose_hits(state, listed)
            else:
                texts = [hit_text(t, s) for t, s in shown]
                read_texts = reads.texts
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

    def _write_reads(self, r, e) -> None:
        """The search's ``results`` event (every hit retrieved, in rank order, as a snippet) and one ``read`` event
        per offered hit (read / skip, by the read policy's actor); counts them and remembers the hits read (``r``:
        the run, ``expand._Run``; ``e``: the expansion, ``expand.Expansion``)."""
        env, w, choice = self.env, r.w, e.read_choice
        w(
            "results",
            candidate_id=e.cid,
            query=e.cand.query,
            hits=[
                {"hit_id": env.ids[pi], "title": t, "snippet": s, "rank": k, "url": None}
                for k, pi in enumerate(dict.fromkeys(e.hits))
                for t, s in [self.hit(pi)]
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


def add_reads(reads: ReadState, new: list) -> None:
    """Record ``new`` (hit id, hit text) pairs as read in ``reads``."""
    for hit_id, text in new:
        reads.add(hit_id, text)
