"""The probes on real decisions: real_inputs' and common's out-of-fold fits, real_strata's bounds; and the
goals probe's trace copier (strip_goals)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from research import common, real_inputs, real_strata, strip_goals


def test_real_inputs_reads_search_ids_and_keeps_word_columns_unscaled():
    """research/real_inputs.py and common.out_of_fold: a Search-o1 candidate id names its search; word columns
    are binary counts over queries; ``scaled`` standardises only the leading columns."""
    mod = real_inputs
    assert mod.search_index("c0") == 0 and mod.search_index("c12") == 12
    with pytest.raises(ValueError, match="c1x"):
        mod.search_index("c1x")
    words = mod.word_columns(["gun laws", "Gun statistics", "laws of gas"], min_df=2)
    assert words.shape == (3, 2) and set(np.unique(words)) == {0.0, 1.0}  # "gun" and "laws"
    rng = np.random.default_rng(0)
    runs = np.repeat(np.arange(40), 2)
    y = (rng.random(80) < 0.5).astype(int)
    x = np.c_[rng.normal(size=80) * 100, rng.integers(0, 2, 80)]
    every, lead = common.out_of_fold(x, y, runs, 0, 0.01), common.out_of_fold(x, y, runs, 0, 0.01, scaled=1)
    assert every.shape == lead.shape == (80,) and not np.allclose(every, lead)
    assert np.allclose(common.out_of_fold(x, y, runs, 0, 0.01, scaled=2), every)


def test_real_strata_bounds_rank_the_deep_rows_perfectly_and_keep_the_root_ones():
    """research/real_strata.py: the perfect-below-the-root bound reassigns only the deep rows' own values."""
    from branchgate.training.metrics import safe_auroc

    mod = real_strata
    labels = np.array([1, 0, 1, 0, 1, 0])
    score = np.array([0.9, 0.85, 0.2, 0.8, 0.3, 0.5])
    deep = np.array([0, 0, 1, 1, 1, 1], np.float64)
    perfect = mod.perfect_below_root(labels, score, deep)
    assert perfect[:2].tolist() == [0.9, 0.85] and sorted(perfect[2:]) == sorted(score[2:])
    assert min(perfect[[2, 4]]) > max(perfect[[3, 5]])  # every deep positive above every deep negative
    assert safe_auroc(labels, perfect) < 1.0  # the root negative still outranks the deep positives
    auroc, shift = mod.best_shift(labels, perfect, deep)
    assert auroc == 1.0 and shift > 0  # lifting the deep rows above it separates everything


def test_strip_goals_empties_the_chosen_runs_goals_and_copies_every_other_line(tmp_path):
    """research/strip_goals.py (the goals probe): goals go in the chosen runs only, nothing else changes."""
    mod = strip_goals
    ids = [f"q{i}.r0" for i in range(40)]
    even = next(r for r in ids if mod.chosen(r, "half"))
    odd = next(r for r in ids if not mod.chosen(r, "half"))
    src = tmp_path / "src" / "traces"
    src.mkdir(parents=True)
    for run in (even, odd):
        lines = [
            {"v": 1, "run_id": run, "seq": 0, "type": "run_start"},
            {
                "v": 1,
                "run_id": run,
                "seq": 1,
                "type": "candidate",
                "query": "a b",
                "goal": "Find the candidate's facts.",
            },
            {"v": 1, "run_id": run, "seq": 2, "type": "evidence", "text": 'a "candidate" goal'},
        ]
        (src / f"{run}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    counts = mod.strip(tmp_path / "src", tmp_path / "dst", "half")
    assert counts == {"files": 2, "runs_changed": 1, "goals_removed": 1}
    out = {r: (tmp_path / "dst" / "traces" / f"{r}.jsonl").read_text().splitlines() for r in (even, odd)}
    assert json.loads(out[even][1])["goal"] == "" and json.loads(out[even][1])["query"] == "a b"
    assert out[odd] == (src / f"{odd}.jsonl").read_text().splitlines()  # the other run byte for byte
    assert out[even][2] == (src / f"{even}.jsonl").read_text().splitlines()[2]
    assert mod.strip(tmp_path / "src", tmp_path / "all", "all")["goals_removed"] == 2
    with pytest.raises(SystemExit, match="another folder"):
        mod.strip(tmp_path / "src", tmp_path / "src")
