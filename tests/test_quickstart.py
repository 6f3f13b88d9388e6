"""README's first command: `branchgate quickstart` runs the whole chain from a fresh working directory."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

from branchgate.cli import main
from branchgate.decide import decide
from branchgate.inference.gate import Gate
from branchgate.inference.model_file import read_metadata
from branchgate.models.teachers import NAMES


def test_quickstart_runs_the_whole_chain_in_its_default_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # default --out ./quickstart, as a user runs it
    assert main(["quickstart", "--epochs", "2"]) == 0
    out = tmp_path / "quickstart"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_decision_points"]["test"] > 0 and metrics["calibration"]["method"] == "f1"
    assert metrics["auroc"] > 0.5  # better than chance on held-out runs, even after two epochs
    assert {f"teacher_{n}" for n in NAMES} <= set(metrics["baselines"])  # every teacher is a baseline
    for name in ("controller.onnx", "controller.int8.onnx", "controller.tokenizer.json", "controller.md"):
        assert (out / name).is_file(), name
    assert float(read_metadata(out / "controller.onnx")["tau"]) == metrics["tau"]  # the calibrated τ ships
    card = (out / "controller.md").read_text()
    assert "- Passed: True" in card and "training path" in card  # parity held, against the training path too
    gate = Gate.load(out / "controller.onnx")
    sel = gate.select(
        {"root_query": "Who founded the company that makes the iPhone?"},
        [{"query": "Apple Inc. founders", "goal": "identify founders"}, {"query": "iPhone sales 2020"}],
    )
    assert len(sel.p_keep) == 2 and sel.kept == decide(sel.p_keep, metrics["tau"]).kept
    assert "quickstart finished" in capsys.readouterr().out
    assert re.search(r"same keep decision at τ for \d+\.\d% of candidates", card)  # a share, as the console says

    # the README's "Gate a decision" example, as shown, on this controller: no out-of-range warning

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Gate a decision", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)[:1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an out-of-range warning fails here
        scope: dict = {}
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102  (the README's own example)
    assert scope["sel"].out_of_range == [] and scope["sel"].kept
