"""README's first command: `branchgate quickstart` runs the whole chain from a fresh working directory."""

from __future__ import annotations

import json

from branchgate.cli import main
from branchgate.inference.gate import Gate


def test_quickstart_runs_the_whole_chain_in_its_default_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # default --out ./quickstart, as a user runs it
    assert main(["quickstart", "--epochs", "2"]) == 0
    out = tmp_path / "quickstart"
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= metrics["auroc"] <= 1.0 and metrics["n_decision_points"]["test"] > 0
    assert metrics["calibration"]["method"] == "f1"
    for name in ("controller.onnx", "controller.int8.onnx", "controller.tokenizer.json", "controller.md"):
        assert (out / name).is_file(), name
    gate = Gate.load(out / "controller.onnx")
    sel = gate.select({"root_query": "Who founded the company that makes the iPhone?"},
                      [{"query": "Apple Inc. founders", "goal": "identify founders"}, {"query": "iPhone sales 2020"}])
    assert len(sel.kept) >= 1 and len(sel.p_keep) == 2
    assert "quickstart finished" in capsys.readouterr().out
