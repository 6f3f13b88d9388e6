"""ONNX export: one graph (encoder + towers + heads), metadata, tokenizer, card, parity checks, refusal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from export_support import exported, max_abs, trained_controller

from branchgate.cli import main
from branchgate.errors import MismatchError
from branchgate.export.controller import ParityError, export_model, torch_threads
from branchgate.export.parity import auroc
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import DecisionState
from branchgate.inference.metadata import REQUIRED_METADATA
from branchgate.inference.model_file import read_metadata
from branchgate.texts import candidate_text


def test_export_writes_model_int8_twin_tokenizer_and_card(encoder):
    report = exported(encoder)
    files = {k: Path(v) for k, v in report["files"].items()}
    assert set(files) == {"fp32", "int8", "tokenizer", "card"}
    assert all(p.is_file() for p in files.values())
    assert files["int8"].name == "controller.int8.onnx" and files["tokenizer"].name == "controller.tokenizer.json"
    assert files["int8"].stat().st_size < files["fp32"].stat().st_size / 2
    for key, precision in (("fp32", "fp32"), ("int8", "int8")):
        meta = read_metadata(files[key])
        assert set(REQUIRED_METADATA) <= set(meta)
        assert meta["precision"] == precision
        assert meta["encoder"] == encoder.id and int(meta["dim"]) == encoder.dim
        assert json.loads(meta["feature_names"]) == ["depth", "order", "n_candidates", "n_retained"]
        assert json.loads(meta["standardisation"])["scalar_names"][0] == "depth"
        assert meta["data_sha256"] == "0" * 64 and float(meta["tau"]) == 0.5
    par = report["parity"]
    assert par["decisions"] == 8 and par["candidates"] == 64
    assert par["fp32_max_abs_diff_p_keep"] <= 1e-4 and par["tower_max_abs_diff_embedding"] <= 1e-5
    assert par["fp32_auroc"] is not None and par["int8_auroc"] is not None
    assert par["int8_auroc_delta"] <= 0.01
    assert 0.9 <= par["int8_same_keep_at_tau"] <= 1.0
    assert report["passed"] and not report["forced"]
    card = files["card"].read_text()
    assert "max |Δp_keep|" in card and encoder.id in card and "controller.int8.onnx" in card


def _edge_decisions():
    long_text = " ".join(f"word{i} evidence" for i in range(400))  # far beyond 256 tokens
    ret = [candidate_text(f"retained branch {i} about soil erosion", f"goal {i}") for i in range(6)]
    return [
        (DecisionState("soil erosion causes", "soil erosion causes", "", [], 0), ["terracing effectiveness"]),
        (DecisionState("soil erosion causes", "", "", [], 0), ["a", "terracing effectiveness\nmeasure yield", "a"]),
        (
            DecisionState("soil erosion causes", "frame q", "parent goal", ret, 2),
            [ret[0], "wind erosion in drylands", long_text, "水土流失的原因", "érosion des sols 🌱 <b>&amp;</b>"],
        ),
        (DecisionState("", "", "", ["only retained"], 1), ["x", "y"]),
    ]


def test_fp32_gate_matches_torch_on_edge_shapes(encoder):
    from branchgate.export.torch_ref import TorchController

    report = exported(encoder)
    net, _ = trained_controller(encoder)
    torch_ref = TorchController(net, encoder)
    gate = Gate.load(report["files"]["fp32"], threads=1)
    worst = 0.0
    with torch_threads(1):
        worst = _compare(torch_ref, gate)
    assert worst <= 1e-4, worst


def _compare(torch_ref, gate) -> float:
    worst = 0.0
    for _rounds in range(2):  # second round: every text cached (the dummy-text path)
        for state, cands in _edge_decisions():
            p_t, u_t = torch_ref.predict(state, cands)
            p_o, u_o = gate.predict(state, cands)
            assert p_o.shape == (len(cands),) and np.all(np.isfinite(p_o)) and np.all(np.isfinite(u_o))
            worst = max(worst, max_abs(p_t, p_o))
            assert np.all(np.abs(u_t - u_o) <= 1e-4 * np.maximum(1.0, np.abs(u_t))), (u_t, u_o)
    return worst


def test_gate_embeddings_match_encoder_including_truncation(encoder):
    gate = Gate.load(exported(encoder)["files"]["fp32"])
    texts = ["short", "x " * 1000, "Gesundheit für alle – ça va?", "ñandú 🦤"]
    got = gate.embed(texts)
    want = encoder.encode(texts)
    assert max_abs(got.ravel(), want.ravel()) <= 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.all(gate.embed(["", "   "]) == 0)


def test_export_refuses_failed_parity_and_force_writes_anyway(encoder, tmp_path, capsys):
    ckpt = exported(encoder)["checkpoint"]
    out = tmp_path / "m" / "controller.onnx"
    rc = main(["export", "--checkpoint", ckpt, "--out", str(out), "--tol", "-1", "--max-decisions", "2"])
    assert rc == 1
    assert "parity check failed" in capsys.readouterr().err
    assert not out.exists() and not list(out.parent.glob("*"))  # nothing written, no temp left behind
    rc = main(["export", "--checkpoint", ckpt, "--out", str(out), "--tol", "-1", "--max-decisions", "2", "--force"])
    assert rc == 0
    assert out.is_file() and out.with_name("controller.tokenizer.json").is_file()
    assert not out.with_name("controller.int8.onnx").exists()  # --int8 not asked
    assert "FORCED" in out.with_name("controller.md").read_text()
    assert "WARNING" in capsys.readouterr().err


def test_a_trained_root_tau_reaches_the_onnx_metadata_the_card_and_the_gate(encoder, tmp_path):
    from branchgate.training.checkpoint import load_controller, save_controller

    net, meta = load_controller(exported(encoder)["checkpoint"])
    assert "root_tau" not in read_metadata(exported(encoder)["files"]["fp32"])  # trained without one
    meta["calibration"] = dict(meta.get("calibration") or {}, root_tau=0.7)
    ckpt = save_controller(tmp_path / "controller.safetensors", net, meta)
    out = tmp_path / "m" / "controller.onnx"
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out), "--max-decisions", "2"]) == 0
    assert float(read_metadata(out)["root_tau"]) == 0.7
    assert "at the root frame (depth 0) τ = 0.7000" in out.with_name("controller.md").read_text()
    assert Gate.load(out, threads=1).root_tau == 0.7


def test_export_refuses_a_tower_that_does_not_reproduce_the_encoder(encoder, tmp_path):
    import copy

    class PooledWrongly(type(encoder)):
        pooling_mode = "cls"  # the packaged model pools by mean: the tower would not match training

    wrong = copy.copy(encoder)
    wrong.__class__ = PooledWrongly
    net, meta = trained_controller(encoder)
    with pytest.raises(ParityError, match="text tower differs from the encoder") as err:
        export_model(net, meta, tmp_path / "c.onnx", encoder=wrong, int8=False)
    assert err.value.report["parity"]["tower_max_abs_diff_embedding"] > 0.05
    assert not (tmp_path / "c.onnx").exists()


def test_export_rejects_a_checkpoint_whose_features_the_gate_cannot_compute(encoder, tmp_path):
    net, meta = trained_controller(encoder)
    with pytest.raises(MismatchError, match="feature_names"):
        export_model(net, dict(meta, feature_names=["depth", "order"]), tmp_path / "c.onnx", encoder=encoder)
    with pytest.raises(MismatchError, match="encoder"):
        export_model(net, dict(meta, encoder="BAAI/bge-small-en-v1.5"), tmp_path / "c.onnx", encoder=encoder)
    assert not list(tmp_path.iterdir())


def test_bench_gate_reports_all_three_latencies(encoder, tmp_path, capsys):
    report = exported(encoder)
    from branchgate.export.samples import sample_decisions

    dec = tmp_path / "decisions.jsonl"
    dec.write_text("".join(json.dumps({"state": s, "candidates": c}) + "\n" for s, c in sample_decisions()[:2]))
    rc = main(
        [
            "bench-gate",
            "--pre",
            report["files"]["fp32"],
            "--checkpoint",
            report["checkpoint"],
            "--reps",
            "2",
            "--decisions",
            str(dec),
            "--json",
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in (
        "torch_ms_p50",
        "onnx_fp32_ms_p50",
        "onnx_int8_ms_p50",
        "torch_ms_p95",
        "onnx_fp32_ms_p95",
        "onnx_int8_ms_p95",
        "warm_torch_ms_p50",
        "warm_onnx_int8_ms_p50",
        "speedup_fp32",
        "speedup_int8",
    ):
        assert res[key] > 0, key
    assert res["decisions"] == 2 and res["threads"] == 1
    assert res["load_avg_1min_start"] >= 0 and res["load_avg_1min"] >= 0  # so a noisy run can be told apart
    assert res["onnx_fp32_max_abs_diff_p_keep"] <= 1e-4
    for key in ("speedup_fp32", "speedup_int8", "warm_speedup_int8"):
        lo, hi = res[key + "_ci95"]  # how far the ratio moves from round to round
        assert 0 < lo <= hi, key


def test_ratio_interval_resamples_whole_rounds():
    from branchgate.export.latency import ratio_interval

    steady = ratio_interval([40.0] * 6, [10.0] * 6, rounds=3)
    assert steady == pytest.approx((4.0, 4.0))
    lo, hi = ratio_interval([40, 40, 40, 40, 40, 40], [10, 10, 8, 8, 12, 12], rounds=3)  # rounds 4x, 5x, 3.3x
    assert 3.3 <= lo < 4.0 < hi <= 5.0


def test_auroc_with_ties_and_single_class():
    assert auroc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)
    assert auroc(np.array([0, 1]), np.array([0.5, 0.5])) == pytest.approx(0.5)
    assert auroc(np.array([1, 1, -1]), np.array([0.1, 0.2, 0.3])) is None


def test_gate_constants_agree_with_the_training_side():
    from branchgate.features import FEATURE_NAMES
    from branchgate.inference import metadata
    from branchgate.models.value_model import SCALAR_NAMES
    from branchgate.training.checkpoint import CONTROLLER_SCHEMA_VERSION

    assert SCALAR_NAMES[: len(FEATURE_NAMES)] == list(FEATURE_NAMES)
    assert metadata.SCHEMA_VERSION == CONTROLLER_SCHEMA_VERSION


def test_fp32_gate_scores_what_evaluate_scores(encoder, tmp_path):
    """End to end: on a dataset's test rows the fp32 Gate gives the p_keep the training path gives (rows grouped
    by data.decision_batches, embedded by the encoder, scored by training.evaluate), and `branchgate evaluate`'s
    AUROC."""
    report = exported(encoder)
    par = report["parity"]
    assert par["training_max_abs_diff_p_keep"] <= 1e-5
    assert par["training_auroc"] == pytest.approx(par["fp32_auroc"], abs=1e-9)
    out = tmp_path / "eval"
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                report["checkpoint"],
                "--dataset",
                report["dataset"],
                "--out",
                str(out),
                "--cache",
                str(tmp_path / "cache.sqlite"),
            ]
        )
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    from branchgate.export.parity import load_decisions

    decisions = load_decisions(report["dataset"], "test", max_decisions=10**6)
    gate = Gate.load(report["files"]["fp32"])
    p = np.concatenate([gate.predict(s, c)[0] for s, c, _ in decisions.items])
    labels = np.concatenate([lab for _, _, lab in decisions.items])
    assert len(p) == metrics["n_rows"]["test"] and auroc(labels, p) == pytest.approx(metrics["auroc"], abs=1e-9)


def test_an_order_free_controller_scores_a_relisted_decision_alike_in_the_gate(encoder, tmp_path):
    """``order=False`` reaches the exported graph: the ONNX Gate gives each candidate the same p_keep whatever its
    place in the list, where the position-reading controller it was made from does not."""
    from branchgate.export.samples import sample_decisions
    from branchgate.models.value_model import ValueNet
    from branchgate.training.checkpoint import load_controller, save_controller

    net, meta = load_controller(exported(encoder)["checkpoint"])
    free = ValueNet(**{**net.config(), "order": False})
    free.load_state_dict(net.state_dict())
    out = tmp_path / "m" / "controller.onnx"
    ckpt = save_controller(tmp_path / "free.safetensors", free.eval(), meta)
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out), "--max-decisions", "2"]) == 0
    state, cands = next((s, c) for s, c in sample_decisions() if len(c) >= 4)
    perm = list(range(len(cands)))[::-1]
    moved = {}
    for name, path in (("free", out), ("ordered", exported(encoder)["files"]["fp32"])):
        gate = Gate.load(path, threads=1)
        p = gate.select(state, cands).p_keep
        q = gate.select(state, [cands[i] for i in perm]).p_keep
        moved[name] = float(np.abs(p[perm] - q).max())
    assert moved["free"] < 1e-5 < moved["ordered"]
