"""`branchgate train --init-from` (a checkpoint, an ONNX export's graph, pretrained:NAME) and `--folds K` on small
synthetic data: what stays frozen, what is checked, the out-of-fold report and the refusal of a dataset too small
to judge."""

from __future__ import annotations

import json

import numpy as np
import pytest

from branchgate.cli import main
from branchgate.data.synthetic import warm_cache, write_synthetic_dataset

QUIET = [
    "--wandb.mode",
    "disabled",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--model.hidden",
    "32",
    "--model.dropout",
    "0.1",
]


def train(ds, cache, out, *extra) -> int:
    args = ["train", "--config", "quickstart", "--data.dataset", str(ds), "--data.cache", str(cache)]
    return main([*args, "--out", str(out), *QUIET, *extra])


@pytest.fixture(scope="module")
def base(tmp_path_factory, encoder):
    root = tmp_path_factory.mktemp("finetune")
    ds = write_synthetic_dataset(root / "ds", n_runs=60, seed=3)
    cache = root / "emb.sqlite"
    warm_cache(ds, cache, encoder)
    assert train(ds, cache, root / "base", "--trainer.max_epochs", "4") == 0
    return root, ds, cache


def test_init_from_a_checkpoint_keeps_the_towers_and_the_standardisation(base):
    from branchgate.training.checkpoint import load_controller

    root, ds, cache = base
    start = root / "base" / "controller.safetensors"
    out = root / "ft"
    rc = train(ds, cache, out, "--init-from", str(start), "--trainer.max_epochs", "3", "--model.lr", "0.01")
    assert rc == 0
    a, meta_a = load_controller(start)
    b, meta_b = load_controller(out / "controller.safetensors")
    sa, sb = a.state_dict(), b.state_dict()
    for key in sa:
        same = bool(np.array_equal(sa[key].numpy(), sb[key].numpy()))
        if key.startswith(("state_tower.", "cand_tower.", "scalar_", "utility_")):
            assert same, f"{key} changed though frozen / kept"
    assert not np.array_equal(sa["heads.weight"].numpy(), sb["heads.weight"].numpy())  # the rest trained
    note = meta_b["init_from"]
    assert note["source"] == str(start) and note["freeze"] == "towers"
    assert not any(n.startswith(("state_tower", "cand_tower")) for n in note["trainable"])
    assert meta_b["standardisation"]["scalar_mean"] == meta_a["standardisation"]["scalar_mean"]


def test_freeze_none_trains_the_towers_too(base):
    from branchgate.training.checkpoint import load_controller

    root, ds, cache = base
    start = root / "base" / "controller.safetensors"
    out = root / "ft_none"
    args = ["--init-from", str(start), "--freeze", "none", "--trainer.max_epochs", "2", "--model.lr", "0.01"]
    assert train(ds, cache, out, *args) == 0
    a, _ = load_controller(start)
    b, _ = load_controller(out / "controller.safetensors")
    assert not np.array_equal(a.cand_tower[1].weight.detach().numpy(), b.cand_tower[1].weight.detach().numpy())


def test_init_from_refuses_another_stage_and_a_missing_file(base, capsys):
    root, ds, cache = base
    assert train(ds, cache, root / "bad1", "--init-from", "pretrained:read", "--trainer.max_epochs", "1") != 0
    err = capsys.readouterr().err
    assert "'read'-stage controller" in err and "'pre'-stage dataset" in err
    assert train(ds, cache, root / "bad2", "--init-from", str(root / "nope.safetensors")) != 0
    assert "nope.safetensors" in capsys.readouterr().err


def test_pretrained_graph_weights_score_as_the_packaged_gate(base):
    """The int8 graph's weights, dequantised, give the packaged Gate's scores (up to int8 rounding)."""
    from branchgate.inference.gate import Gate
    from branchgate.models.encoder import recorded_spec
    from branchgate.pretrained import resolve
    from branchgate.training.evaluate import gate_predict, predict
    from branchgate.training.init_from import load_start

    root, ds, cache = base
    from branchgate.data.datamodule import DecisionDataModule

    net, meta, how = load_start("pretrained:pre")
    assert "dequantised" in how and meta["stage"] == "pre"
    dm = DecisionDataModule(str(ds), cache=str(cache), show_progress=False)
    dm.encoder_spec = recorded_spec(meta["encoder"])
    dm.setup("predict")
    p_torch, _ = predict(net, dm.sets["test"], dm.table)
    gate = Gate.load(resolve("pretrained:pre-model")[2])
    p_gate, _ = gate_predict(gate, dm.splits["test"], dm.sets["test"])
    assert np.corrcoef(p_torch, p_gate)[0, 1] > 0.97
    assert np.abs(p_torch - p_gate).max() < 0.15


def test_folds_report_out_of_fold_and_a_final_model(base):
    from branchgate.training.checkpoint import load_controller

    root, ds, cache = base
    out = root / "folds"
    assert train(ds, cache, out, "--folds", "3", "--trainer.max_epochs", "3") == 0
    rep = json.loads((out / "oof.json").read_text())
    from branchgate.data.decision_batches import load_decision_dataset

    dsd, _ = load_decision_dataset(ds)
    labels = np.concatenate([np.asarray(dsd[s]["label"]) for s in dsd])
    assert rep["rows"] == int((labels >= 0).sum())  # every labelled row scored once, out of fold
    runs = {r for s in dsd for r in dsd[s]["run_id"]}
    assert set(rep["fold_of_run"]) == runs and set(rep["fold_of_run"].values()) == {0, 1, 2}
    assert "gate" in rep["per_row"] and "lexical" in rep["per_row"]
    assert rep["per_row"]["lexical"]["delta_vs_gate"]["ci95"][0] is not None
    assert rep["per_row"]["gate"]["auroc"] > 0.6  # the synthetic signal is learned out of fold
    for i in range(3):  # each fold's test runs are that fold's, and no fold trained on them
        fold = load_decision_dataset(out / "folds" / f"{i}.dataset")[0]
        test = set(fold["test"]["run_id"])
        assert test == {r for r, f in rep["fold_of_run"].items() if f == i}
        assert not test & (set(fold["train"]["run_id"]) | set(fold["validation"]["run_id"]))
    _, meta = load_controller(out / "controller.safetensors")
    assert meta["tau"] == pytest.approx(rep["final"]["tau"])
    assert meta["calibration"]["tau_from"] == "out-of-fold predictions"
    assert "| **model** |" in (out / "oof.md").read_text()


def test_folds_refuse_a_dataset_too_small_to_judge(base, capsys):
    root, ds, cache = base  # 60 runs: 40 folds would need 80 runs with both classes
    assert train(ds, cache, root / "small", "--folds", "40") != 0
    err = capsys.readouterr().err
    assert "too small to judge with --folds 40" in err and "at least 80" in err
    assert not (root / "small" / "folds").exists()  # refused before anything was written
    assert train(ds, cache, root / "two", "--folds", "2") != 0
    assert "must be ≥ 3" in capsys.readouterr().err


def test_assign_folds_spreads_the_runs_that_can_rank():
    from branchgate.training.folds import assign_folds, check_enough

    counts = {f"r{i}": ((1, 3) if i < 10 else (0, 2)) for i in range(23)}
    folds = assign_folds(counts, 5)
    both = [folds[f"r{i}"] for i in range(10)]
    assert sorted(np.bincount(both)) == [2, 2, 2, 2, 2]
    assert set(folds.values()) == set(range(5))
    check_enough(counts, 5, "d")
    from branchgate.errors import InputError

    with pytest.raises(InputError, match="at least 12"):
        check_enough(counts, 6, "d")
