"""One read decision (``inference/read_state.py``): the same log gives the read controller identical inputs in a
live agent hook, in the simulator and in replay, window of what has been read included.

The log is a simulated run (the bundled sample environment) whose read controller keeps every hit and records
what it is given; the hook is fed that log's result lists in order, and replay walks it. The window is cut to
3 hits so that it is full long before a run ends (replay had no window before: it gave every hit read so far).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from branchgate.bench.replay import ReplayRun
from branchgate.bench.replay_cli import read_rule
from branchgate.inference import read_state
from branchgate.inference.agents.read_hook import ReadHook, SearchCall
from branchgate.inference.agents.recorder import TraceRecorder
from branchgate.inference.inputs import as_hits, as_read_decision
from branchgate.inference.read_state import READ_WINDOW, ReadState
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.pipeline import stage_policies
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import simulate

WINDOW = 3


class RecordingGate:
    """A read controller that reads every hit and records, per decision, what the Gate would compute from:
    ``inputs.as_read_decision`` of its state and hits, and the hits' ids in the order given."""

    stage = "read"
    name = "recording"

    def __init__(self):
        self.decisions: dict[tuple, tuple] = {}

    def select(self, state, hits, tau=None, floor=None):
        d = as_read_decision(state, hits)
        ids = tuple(h.id for h in as_hits(hits))
        st = d.state
        # the last call for a search wins (the simulator may cost a sibling's expansion before its turn)
        self.decisions[(st.root_query, st.frame_query, st.parent_goal, st.depth, ids)] = (st, d.texts, d.scored)
        n = len(hits)
        return SimpleNamespace(kept=list(range(n)), p_keep=np.ones(n, np.float32))


class Hook(ReadHook, TraceRecorder):
    def __init__(self, trace: Path, root_query: str, read):
        super().__init__(None, trace, root_query=root_query)
        self._init_read(read)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """The simulator's decisions and its log (2 runs of the sample environment at depth 2)."""
    out = tmp_path_factory.mktemp("read_state") / "sim"
    gate = RecordingGate()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(read_state, "READ_WINDOW", WINDOW)
        mp.setattr(stage_policies, "_shared_gate", lambda path: gate)
        simulate("sample", Config(depth=2, read="gate:recording.onnx"), out, runs=2, progress=False)
    return gate.decisions, list(read_runs([out / "traces"]))


def replayed(runs) -> dict:
    gate = RecordingGate()
    for run in runs:
        ReplayRun(run).replay(read=read_rule(gate, 0.5, None))
    return gate.decisions


def live(runs, tmp: Path) -> dict:
    """Each run's result lists handed to an agent hook in the log's order, as a search tool returns them."""
    gate = RecordingGate()
    for k, run in enumerate(runs):
        events = sorted(run.events, key=lambda e: e.seq)
        depth = {e.frame_id: e.depth for e in events if e.type == "frame_open"}
        cands = {e.candidate_id: e for e in events if e.type == "candidate"}
        hook = Hook(tmp / f"live{k}.jsonl", events[0].root_query, gate)
        for e in (e for e in events if e.type == "results"):
            c = cands[e.candidate_id]
            results = [{"url": h.hit_id, "title": h.title or "", "snippet": h.snippet} for h in e.hits]
            hook.read_results(SearchCall(c.candidate_id, c.query, c.goal or "", depth[c.frame_id]), results)
    return gate.decisions


def test_the_same_log_gives_the_gate_the_same_inputs_live_in_the_simulator_and_in_replay(logged, tmp_path, monkeypatch):
    simulated, runs = logged
    monkeypatch.setattr(read_state, "READ_WINDOW", WINDOW)
    in_replay, in_hook = replayed(runs), live(runs, tmp_path)
    offered = [{e.candidate_id for e in run.events if e.type == "read"} for run in runs]
    n_lists = sum(
        1 for run, ids in zip(runs, offered) for e in run.events if e.type == "results" and e.candidate_id in ids
    )
    assert len(simulated) == n_lists > 10  # one decision per result list that offered a new hit
    assert in_replay == simulated
    assert in_hook == simulated
    windows = [len(st.retained) for st, _, _ in simulated.values()]
    assert max(windows) == WINDOW and windows.count(WINDOW) > 3  # the window is full, and it is what they all see


def test_replay_sees_the_window_not_every_hit_read(logged, monkeypatch):
    """The one change in behaviour: replay gives the read controller the newest ``READ_WINDOW`` hits read."""
    _, runs = logged
    monkeypatch.setattr(read_state, "READ_WINDOW", WINDOW)
    seen = [len(st.retained) for st, _, _ in replayed(runs).values()]
    assert max(seen) == WINDOW
    monkeypatch.setattr(read_state, "READ_WINDOW", 10_000)
    assert max(len(st.retained) for st, _, _ in replayed(runs).values()) > WINDOW  # more were read


def test_read_state_window_and_new_hits():
    rs = ReadState("q")
    for i in range(READ_WINDOW + 5):
        rs.add(f"h{i}", f"text {i}")
    rs.add("h0", "again")  # read twice counts once
    assert len(rs.read_ids) == READ_WINDOW + 5
    st = rs.state("sub", "goal", 2)
    assert st["read"] == [f"text {i}" for i in range(5, READ_WINDOW + 5)]  # the newest, oldest first
    assert st["read_ids"] == [f"h{i}" for i in range(5, READ_WINDOW + 5)]
    assert (st["root_query"], st["query"], st["goal"], st["depth"]) == ("q", "sub", "goal", 2)
    assert rs.new(["h0", "x", "h3", "y"]) == [1, 3]  # a hit read before, even out of the window, is not new
    copy = rs.copy()
    copy.add("x", "x")
    assert "x" in copy and "x" not in rs
