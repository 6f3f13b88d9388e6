"""End to end: `branchgate train` learns a planted signal; metrics, plots, controller.safetensors; `evaluate`;
CLI errors."""

from __future__ import annotations

import json

import pytest

from branchgate.cli import main
from branchgate.data.decision_batches import TextTable, build_decisions
from branchgate.data.synthetic import warm_cache, write_synthetic_dataset
from branchgate.training.metrics import METRIC_KEYS
from branchgate.training.plots import PLOTS


@pytest.fixture(scope="module")
def trained(tmp_path_factory, encoder):
    root = tmp_path_factory.mktemp("fit")
    ds = write_synthetic_dataset(root / "ds", n_runs=110, seed=7)
    cache = root / "emb.sqlite"
    warm_cache(ds, cache, encoder)  # warm: training itself never loads the encoder
    out = root / "run"
    rc = main(
        [
            "train",
            "--config",
            "quickstart",
            "--data.dataset",
            str(ds),
            "--data.cache",
            str(cache),
            "--out",
            str(out),
            "--wandb.mode",
            "disabled",
            "--calibration.root_tau",
            "0.8",
            "--trainer.max_epochs",
            "15",
            "--model.hidden",
            "32",
            "--model.lr",
            "0.003",
            "--model.dropout",
            "0.1",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.enable_model_summary",
            "false",
        ]
    )
    assert rc == 0
    return ds, cache, out


def test_learns_planted_signal_and_beats_baselines(trained):
    _, _, out = trained
    m = json.loads((out / "metrics.json").read_text())
    for key in METRIC_KEYS:
        assert key in m
    assert m["auroc"] >= 0.8, m["auroc"]
    assert m["auroc"] > m["baselines"]["random"]["auroc"] + 0.2
    assert m["auroc"] > m["baselines"]["tfidf_logreg"]["auroc"]
    assert set(m["baselines"]) == {"teacher_lexical", "tfidf_logreg", "random"}
    for name, b in m["baselines"].items():
        assert set(METRIC_KEYS) <= set(b), name
    assert m["baselines"]["random"]["keep_rate"] == pytest.approx(m["keep_rate"], abs=0.01)
    assert m["encoder"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert m["embedding_cache"]["misses"] == 0
    for name in PLOTS:
        assert (out / name).stat().st_size > 1000
    assert (out / "config.yaml").is_file() and (out / "logs" / "metrics.csv").is_file()
    header = (out / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"val_auroc", "val_auroc_deep"} <= set(header)  # the pooled and the below-the-root monitors


def test_final_checkpoint_holds_tau_and_standardisation(trained):
    from branchgate.training.checkpoint import META_KEYS, load_controller

    _, _, out = trained
    m = json.loads((out / "metrics.json").read_text())
    net, meta = load_controller(out / "controller.safetensors")
    assert set(META_KEYS) <= set(meta)
    assert meta["tau"] == pytest.approx(m["tau"]) and meta["calibration"]["method"] == "f1"
    assert meta["calibration"]["root_tau"] == 0.8  # the root frame's own τ, exported as metadata root_tau
    assert meta["encoder"] == m["encoder"] and meta["dim"] == 384
    assert any(abs(v - 1.0) > 1e-3 for v in meta["standardisation"]["scalar_std"])  # fitted, not defaults
    assert float(net.scalar_std[0]) == pytest.approx(meta["standardisation"]["scalar_std"][0])
    platt = meta["calibration"]["platt"]  # p_keep is Platt-scaled on validation, inside the net
    assert platt["scale"] > 0 and float(net.keep_scale) == pytest.approx(platt["scale"])
    assert float(net.keep_shift) == pytest.approx(platt["shift"])
    assert m["brier"] <= m["baselines"]["random"]["brier"]  # calibrated: no worse than the base-rate guess
    # the train split's structured-feature range (issue 24): stored, and the net clamps to it
    rng = meta["feature_range"]
    assert list(rng) == ["depth", "order", "n_candidates", "n_retained"] and all(lo <= hi for lo, hi in rng.values())
    assert net.feature_min.tolist() == [v[0] for v in rng.values()] and rng["n_candidates"][1] > 1


def test_train_ships_safetensors_and_keeps_lightning_ckpt_for_resuming_only(trained):
    from safetensors import safe_open

    from branchgate.training.checkpoint import load_controller, read_lightning_checkpoint

    _, _, out = trained
    m = json.loads((out / "metrics.json").read_text())
    final = out / "controller.safetensors"
    assert m["checkpoint"] == str(final) and not (out / "controller.ckpt").exists()
    with safe_open(str(final), framework="pt") as f:  # weights + one JSON entry, no pickle
        assert set(f.metadata()) == {"branchgate"} and "keep_scale" in f.keys()
        assert json.loads(f.metadata()["branchgate"])["meta"]["tau"] == pytest.approx(m["tau"])
    best = m["best_checkpoint"]
    assert best and best.endswith(".ckpt")
    ckpt = read_lightning_checkpoint(best)  # what train reloads: torch.load(weights_only=True) suffices
    assert "optimizer_states" in ckpt and "branchgate" in ckpt  # still a full resume checkpoint
    _, meta = load_controller(best)  # and export/evaluate may read it the same safe way
    assert meta["encoder"] == m["encoder"]


def test_evaluate_reproduces_metrics(trained, tmp_path, capsys):
    ds, cache, out = trained
    rc = main(
        [
            "evaluate",
            "--checkpoint",
            str(out / "controller.safetensors"),
            "--dataset",
            str(ds),
            "--cache",
            str(cache),
            "--out",
            str(tmp_path / "eval"),
        ]
    )
    assert rc == 0
    again = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    first = json.loads((out / "metrics.json").read_text())
    assert again["auroc"] == pytest.approx(first["auroc"]) and again["tau"] == pytest.approx(first["tau"])
    assert "teacher_lexical" in capsys.readouterr().out


def test_evaluate_refuses_a_checkpoint_whose_max_length_its_encoder_does_not_embed(trained, tmp_path, capsys):
    from branchgate.training.checkpoint import load_controller, save_controller

    ds, cache, out = trained
    net, meta = load_controller(out / "controller.safetensors")
    edited = save_controller(tmp_path / "edited.safetensors", net, dict(meta, max_length=1000))
    argv = ["evaluate", "--checkpoint", str(edited), "--dataset", str(ds), "--cache", str(cache)]
    assert main([*argv, "--out", str(tmp_path / "eval")]) == 2
    assert "records max_length=1000, but its encoder" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()  # nothing written


def test_cli_encoder_errors(trained, tmp_path, capsys):
    ds, cache, _ = trained
    rc = main(
        [
            "train",
            "--config",
            "quickstart",
            "--data.dataset",
            str(ds),
            "--data.cache",
            str(cache),
            "--data.encoder",
            "no-such-org/no-such-encoder",
            "--out",
            str(tmp_path / "x"),
            "--wandb.mode",
            "disabled",
        ]
    )
    assert rc == 2
    assert "--encoder packaged" in capsys.readouterr().err
    rc = main(
        [
            "train",
            "--config",
            "quickstart",
            "--data.dataset",
            str(ds),
            "--data.cache",
            str(cache),
            "--calibration.root_tau",
            "1.5",
            "--out",
            str(tmp_path / "y"),
            "--wandb.mode",
            "disabled",
        ]
    )
    assert rc == 2 and "--calibration.root_tau" in capsys.readouterr().err
    import shutil

    bge = tmp_path / "bge"
    shutil.copytree(ds, bge)
    manifest = json.loads((bge / "manifest.json").read_text())
    manifest["encoder"] = "BAAI/bge-small-en-v1.5"
    (bge / "manifest.json").write_text(json.dumps(manifest))
    rc = main(["evaluate", "--checkpoint", str(tmp_path.parent / "x.safetensors"), "--dataset", str(bge)])
    assert rc == 2 and "controller checkpoint not found" in capsys.readouterr().err
    _, _, out = trained
    rc = main(
        [
            "evaluate",
            "--checkpoint",
            str(out / "controller.safetensors"),
            "--dataset",
            str(bge),
            "--cache",
            str(cache),
            "--out",
            str(tmp_path / "e"),
        ]
    )
    assert rc == 2 and "was built with encoder 'BAAI/bge-small-en-v1.5'" in capsys.readouterr().err


def test_config_names_resolve_to_packaged_files_even_beside_a_same_named_directory(tmp_path, monkeypatch):
    from pathlib import Path

    from branchgate.training.cli import resolve_config_names

    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").mkdir()  # what `branchgate quickstart` creates before it trains
    argv = resolve_config_names(["--config", "quickstart", "--config=benchmark"])
    assert Path(argv[1]).name == "quickstart.yaml" and Path(argv[1]).is_file()
    assert argv[2].startswith("--config=") and argv[2].endswith("bench_train.yaml")  # the old name is an alias
    (tmp_path / "mine.yaml").write_text("seed_everything: 1\n")
    assert resolve_config_names(["--config", "mine.yaml"])[1] == "mine.yaml"  # a real file wins


def test_scalars_computed_once_equal_those_of_any_batch(tmp_path):
    """Training computes the parameter-free scalar features once per split (split_scalars); each row's must
    equal what a forward pass computes in whatever shuffled, padded batch it lands."""
    import datasets
    import numpy as np
    import torch

    from branchgate.models.value_model import ValueNet
    from branchgate.training.module import split_scalars

    ds = write_synthetic_dataset(tmp_path / "ds", n_runs=12, seed=3)
    texts = TextTable()
    dset = build_decisions("train", datasets.load_from_disk(str(ds))["train"], texts)
    g = torch.Generator().manual_seed(0)
    table = torch.nn.functional.normalize(torch.randn(len(texts), 16, generator=g), dim=-1)
    table[0] = 0
    net = ValueNet(16, hidden=8)
    once = split_scalars(net, dset, table, batch_decisions=5)
    assert once.shape == (dset.n_rows, len(net.scalar_mean)) and torch.isfinite(once).all()
    order = np.random.default_rng(1).permutation(len(dset))
    for start in range(0, len(order), 7):
        b = dset.batch(order[start : start + 7], table)
        s = net.scalars(b["root"], b["frame"], b["goal"], b["retained"], b["cand"], b["features"])
        assert torch.allclose(once[b["rows"][b["mask"]]], s[b["mask"]].float(), atol=1e-5)
