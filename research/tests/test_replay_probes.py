"""The replay probes on the reference pipeline's unpruned sample runs: replay_frontier's cost model, replay_rules'
rules, and the parent_inputs / result_inputs rows."""

from __future__ import annotations

import numpy as np
import pytest

from branchgate.logs_to_dataset.readers import read_runs
from research import common, parent_inputs, replay_rules, result_inputs


def test_replay_of_keeping_everything_reproduces_the_unpruned_run(sample_runs):
    """research/common.py's Tree (replay_frontier.py): its cost model and KPR match the runs' own totals exactly,
    and keeping only the root frame costs less and finds no more."""
    trees = [common.Tree(r) for r in read_runs([sample_runs])]
    assert len(trees) == 4
    for t in trees:
        nodes, tokens, kpr = t.replay(lambda frame, ids: ids)
        assert nodes == len(t.ev) and tokens == t.tokens and abs(kpr - t.kpr) < 1e-6
        n_root, t_root, k_root = t.replay(lambda frame, ids: ids if frame.depth == 0 else [])
        assert n_root < nodes and t_root < tokens and k_root <= kpr


def _random_scores(trees, seed: int = 0) -> dict:
    """{(run id, candidate id): (p_keep, label, depth)} with random p and labels, as ``gate_scores`` returns."""
    rng = np.random.default_rng(seed)
    return {
        (t.run_id, c.candidate_id): (float(rng.random()), int(rng.random() < 0.3), f.depth)
        for t in trees
        for f in t.frames.values()
        for c in f.candidates
    }


def test_replay_rules_reduce_to_the_gates_rule_at_their_neutral_settings(sample_runs):
    """research/replay_rules.py: each family at its neutral setting replays the Gate's rule exactly (and its
    paired difference from it is 0); diversity below every cosine keeps one branch per frame below the root; a
    parent bound with a large β keeps a found-something parent's children and only the top-1 of the others;
    malformed rules are refused."""
    mod = replay_rules
    trees = [common.Tree(r) for r in read_runs([sample_runs])]
    texts = sorted({c.query for t in trees for f in t.frames.values() for c in f.candidates})
    rules = mod.Rules(trees, _random_scores(trees), mod.encoder_embed("packaged", texts))
    gate = rules.replay("depth", (0.5, 0.3, 0.3))
    assert 0 < gate[1] < 1
    for family, x in (("relative", 0.0), ("diverse", 1.0), ("parent", 0.0)):
        assert rules.replay(family, (0.5, 0.3, x)) == gate, family
    assert rules.versus_gate("relative", (0.5, 0.3, 0.0), boot=50)[:3] == (0.0, 0.0, 0.0)
    assert max(f.depth for t in trees for f in t.frames.values()) == 1  # so the τ for depth ≥ 2 is never asked:
    assert rules.replay("depth", (0.5, 0.3, 0.9)) == gate and rules.replay("depth", (0.5, 0.9, 0.3)) != gate
    children = parents = 0
    for t in trees:
        one = rules.keep_fn(t.run_id, "diverse", (0.5, 0.0, -1.01))
        told = rules.keep_fn(t.run_id, "parent", (0.5, 0.5, 50.0))
        for parent, frame_id in t.child.items():
            frame = t.frames[frame_id]
            ids = [c.candidate_id for c in frame.candidates]
            assert len(one(frame, ids)) == 1
            found = rules.own[(t.run_id, parent)] == 1
            assert len(told(frame, ids)) == (len(ids) if found else 1)
            children += len(ids)
            parents += found
    assert children and parents
    for bad in ("depth:0.5,0.1", "nope:1,2,3", "relative:a,b,c"):
        with pytest.raises(SystemExit, match="--rules"):
            mod.parse_rule(bad)


def _probe_rows(mod, sample_runs, seed: int, fixed: int):
    """A probe script's ``rows_of`` on the sample runs with random gate scores and ``common.lazy_embed``
    (packaged encoder), checked for what every probe's rows share: one per labelled candidate below the root
    (``fixed`` leading columns, then ``mod.INPUTS``), its depth, label and p_keep the scores'. Returns (runs,
    trees, scores, rows, keys)."""
    runs = list(read_runs([sample_runs]))
    trees = [common.Tree(r) for r in runs]
    scores = _random_scores(trees, seed=seed)
    embed = common.lazy_embed("packaged")
    assert embed([]).shape == (0, 384)
    unit = embed(["a query", "another", "a query"])
    assert unit.shape == (3, 384) and np.allclose(np.linalg.norm(unit, axis=1), 1) and (unit[0] == unit[2]).all()
    a, keys = mod.rows_of(runs, trees, scores, embed)
    below = sum(len(t.frames[f].candidates) for t in trees for f in t.child.values())
    assert a.shape == (below, fixed + len(mod.INPUTS)) and set(a[:, 1]) == {1} and len(set(keys)) == below
    assert all(a[i, 3] == scores[k][0] and a[i, 2] == scores[k][1] for i, k in enumerate(keys))
    return runs, trees, scores, a, keys


def test_parent_inputs_rows_hold_what_the_parent_found(sample_runs):
    """research/parent_inputs.py: one row per labelled candidate below the root; the parent flag is its
    parent's own label; counts are whole and cosines within [−1, 1]. replay_rules.frontier_change on the gate's
    own scores changes nothing."""
    runs, trees, scores, a, keys = _probe_rows(parent_inputs, sample_runs, seed=1, fixed=5)
    assert set(a[:, 4]) <= {0, 1} and (a[:, 5] >= 0).all() and (a[:, 5] == a[:, 5].round()).all()
    assert (np.abs(a[:, 6:]) <= 1 + 1e-6).all() and a[:, 6:].std(0).min() > 0
    same = replay_rules.frontier_change(trees, scores, keys, a[:, 3])  # the gate's own scores: no change anywhere
    assert same and all(row[1:4] == (0.0, 0.0, 0.0) and not row[4] for row in same)
    flat = replay_rules.frontier_change(trees, scores, keys, np.zeros(len(keys)))  # below the root only the top-1
    assert any(row[4] for row in flat)  # fallbacks: one point, so the gate's other points lie outside its sweep


def test_result_inputs_rows_see_each_candidates_own_result_list(sample_runs):
    """research/result_inputs.py: one row per labelled candidate below the root; "new to the run" counts the
    candidate's passages that no earlier retrieval of the run returned (so the root frame's first candidate has
    all of its passages new, and no count exceeds the list); the cosines lie in [−1, 1] and vary."""
    runs, trees, scores, a, keys = _probe_rows(result_inputs, sample_runs, seed=2, fixed=4)
    by_id = {t.run_id: t for t in trees}
    sizes = np.array([len(by_id[r].ev[c]) for r, c in keys])
    assert (a[:, 4] >= 0).all() and (a[:, 4] <= sizes).all() and (a[:, 4] < sizes).any()  # some repeats below
    assert (np.abs(a[:, 5:]) <= 1 + 1e-6).all() and a[:, 5:].std(0).min() > 0
    for run, t in zip(runs, trees):
        new = common.new_passages(run, t)
        first = next(e.candidate_id for e in sorted(run.events, key=lambda e: e.seq) if e.type == "retrieval")
        assert new[first] == t.ev[first] and set(new) == set(t.ev)
    assert common.opening("a  b\nc " + "w " * 50).split()[:3] == ["a", "b", "c"]
    assert len(common.opening("w " * 50).split()) == common.SNIPPET_WORDS


def test_unpruned_refuses_a_selection_without_runs(sample_runs):
    """common.unpruned names the folder and split when no run is selected (before loading any model)."""
    with pytest.raises(SystemExit, match="no runs in .* of split nope"):
        common.unpruned(str(sample_runs), "no-dataset", "no-checkpoint", split="nope")


def test_snippet_length_interpolates_a_curve_at_its_token_share():
    from research.snippet_length import share_at

    def point(family, tokens, kpr):
        return {"family": family, "tokens": {"mean": tokens}, "kpr": {"mean": kpr}}

    policies = {
        "none": point("none", 100.0, 0.5),
        "g1": point("read_gate", 20.0, 0.4),
        "g2": point("read_gate", 40.0, 0.5),
        "d1": point("dpp@read", 50.0, 0.45),
    }
    assert share_at(policies, "read_gate") == pytest.approx(0.9)  # halfway between 0.8 and 1.0
    assert share_at(policies, "dpp@read") is None and share_at(policies, "missing") is None
