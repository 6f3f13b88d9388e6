"""The front door (``branchgate/__init__.py``): the names the docs show, imported on first use (PEP 562), so that
``import branchgate`` stays light and the Gate runs without torch, datasets or lightning."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import branchgate

# the agent packages these names need are not installed here (they are tested in their own venvs)
NEEDS_EXTRA = {"ReadGateCompressor", "ReadGatePostprocessor"}


@pytest.mark.parametrize("name", sorted(branchgate._NAMES))
def test_each_name_is_the_object_its_module_defines(name):
    module = branchgate._NAMES[name]
    try:
        expected = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        if name in NEEDS_EXTRA:
            pytest.skip(f"{name}: {exc}")
        raise
    assert getattr(branchgate, name) is expected
    assert name in branchgate.__all__ and name in dir(branchgate)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Gat'"):
        branchgate.Gat  # noqa: B018


def test_import_branchgate_is_light_and_the_gate_runs_without_torch():
    code = (
        "import sys, json\n"
        "for name in ('torch', 'sentence_transformers', 'transformers', 'datasets', 'lightning', 'fastapi'):\n"
        "    sys.modules[name] = None\n"  # any import of these now fails
        "import branchgate\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('branchgate.'))\n"
        "from branchgate import Gate, RunGate, gated, TraceWriter\n"
        "gate = Gate.load('pretrained:pre-model', threads=1)\n"
        "sel = gate.select({'root_query': 'bees'}, [{'query': 'varroa', 'goal': 'mites'}, 'pesticides'])\n"
        "run = gate.run(budget_nodes=3)\n"
        "assert isinstance(run, RunGate) and callable(gated) and TraceWriter.__name__ == 'TraceWriter'\n"
        "print(json.dumps({'loaded': loaded, 'p_keep': sel.to_json()['p_keep']}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["loaded"] == []  # `import branchgate` imported no module of the package
    assert len(out["p_keep"]) == 2
