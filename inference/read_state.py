"""One read decision: the read state of a run and the rule that picks the hits to read (core install).

A read decision is made after a sub-query's search returns its hits and before any is read. Every place that
makes one — the agents' hook (``agents/read_hook.py``), the simulator (``pipeline/read_stage.py``), replay
(``bench/replay.py``) — keeps a ``ReadState`` per run and asks it for the decision's inputs, so the same log
gives the Gate the same inputs in all three (``tests/test_read_state.py``):

- ``ReadState.new(ids)``: which of a search's hits are new to the run (their id was never read), in their order;
  a hit read before is not offered again.
- ``ReadState.state(query, goal, depth)``: the read controller's state (``inputs.READ_STATE_FIELDS``): the
  run's question, the sub-query searched and its goal, the frame's depth, and the window of what has been read:
  the texts (``texts.hit_text``) and ids of the newest ``READ_WINDOW`` hits read, oldest first.
- ``ReadState.add(hit_id, text)``: a hit was read (a hit read twice counts once).

``select_hits`` is the keep rule of a read decision for every read controller (``Gate`` and ``TeacherGate``):
the new hits scored in rank order, kept by ``decide`` without the top-1 fallback (with it at the root frame
when ``floor`` is ``"root"``); ``check_floor`` refuses ``floor`` for a pre-retrieval controller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from branchgate.decide import decide, threshold_at
from branchgate.errors import InputError
from branchgate.inference.inputs import DecisionState, as_floor, as_read_decision
from branchgate.inference.selection import Selection

READ_WINDOW = 128  # hits read that a read decision sees (the newest)


class ReadState:
    """What one run has read, as its read decisions see it (module docstring)."""

    def __init__(self, root_query: str = "", window: int | None = None):
        self.root_query = root_query
        self.read_ids: dict[str, None] = {}  # every hit id read in this run, in the order first read
        self.window: deque[tuple[str, str]] = deque(maxlen=READ_WINDOW if window is None else window)  # (id, text)

    def copy(self) -> ReadState:
        out = ReadState(self.root_query, self.window.maxlen)
        out.read_ids, out.window = dict(self.read_ids), deque(self.window, maxlen=self.window.maxlen)
        return out

    def __contains__(self, hit_id: str) -> bool:
        return hit_id in self.read_ids

    def new(self, ids: Iterable[str]) -> list[int]:
        """Positions of the hits (given by id, in rank order) that this run has not read."""
        return [i for i, hid in enumerate(ids) if hid not in self.read_ids]

    def add(self, hit_id: str, text: str) -> None:
        """Hit ``hit_id`` (its text ``texts.hit_text(title, snippet)``) was read."""
        if hit_id not in self.read_ids:
            self.read_ids[hit_id] = None
            self.window.append((hit_id, text))

    @property
    def texts(self) -> list[str]:
        """The window's texts, oldest first."""
        return [text for _, text in self.window]

    def state(self, query: str, goal: str, depth: int) -> dict:
        """The read controller's state for a search of ``query`` (its ``goal``) at a frame of ``depth``."""
        return {
            "root_query": self.root_query,
            "query": query,
            "goal": goal,
            "read": self.texts,
            "read_ids": [hid for hid, _ in self.window],
            "depth": depth,
        }


def check_floor(stage: str, floor: str | None) -> str | None:
    """``floor`` checked for a controller of ``stage``: ``"root"`` or None for a read controller; a pre-retrieval
    controller takes none (it keeps its top-1 when none passes τ)."""
    if stage == "read":
        return as_floor(floor)
    if floor is not None:
        raise InputError(
            "applies to a read controller only (a pre-retrieval controller keeps its top-1 when none passes τ)",
            "floor",
        )
    return None


Scorer = Callable[[DecisionState, Sequence[str]], tuple[np.ndarray, np.ndarray]]


def select_hits(
    state,
    hits,
    score: Scorer,
    tau: float,
    root_tau: float | None,
    max_keep: int | None,
    floor: str | None,
    higher_is_better: bool = True,
    out_of_range: Callable[[DecisionState, int], list[str]] | None = None,
) -> Selection:
    """A read decision (module docstring): ``score(state, texts)`` → (p_keep, utility) of the new hits; every index
    of the answer is the caller's, a hit read before is in ``not_new`` with NaN scores."""
    read = as_read_decision(state, hits)
    t = threshold_at(read.state.depth, tau, root_tau)
    p, u = score(read.state, read.texts)
    d = decide(
        p, t, higher_is_better=higher_is_better, max_keep=max_keep, fallback=floor == "root" and read.state.depth == 0
    )
    p_all, u_all = np.full((2, read.n_hits), np.nan, np.float32)  # NaN: not scored (read before)
    p_all[read.scored], u_all[read.scored] = p, u
    kept = sorted(read.scored[i] for i in d.kept)
    ranged = out_of_range(read.state, len(read.texts)) if out_of_range is not None else []
    return Selection(kept, p_all, u_all, d.fallback, t, ranged, not_new=read.not_new)
