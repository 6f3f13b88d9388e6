"""The install layout: everything under `branchgate.`, nothing generic at top level; the CLI answers --help."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from branchgate.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stderr[-2000:]}")
    return next(out.glob("branchgate-*.whl"))


def test_wheel_installs_only_the_branchgate_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"branchgate"}, top
    for folder in ("logs_to_dataset", "data", "models", "training", "inference", "export", "pipeline"):
        assert f"branchgate/{folder}/__init__.py" in names
    assert not any(n.startswith("branchgate/tests/") for n in names)
    for resource in (
        "configs/quickstart.yaml",
        "export/card.md",
        "logs_to_dataset/trace.schema.json",
        "data/samples/musique_sample/manifest.json",
        "data/samples/hotpotqa_sample/manifest.json",
        "pretrained/pre/controller.int8.onnx",
        "pretrained/read/controller.int8.onnx",
        "pretrained/read/choice.json",
    ):
        assert f"branchgate/{resource}" in names, resource


MODULES = [
    "errors",
    "fileio",
    "texts",
    "features",
    "decide",
    "cli",
    "data.decision_batches",
    "models.teachers",
    "training.metrics",
    "inference.gate",
    "export.parity",
    "logs_to_dataset.build",
    "pipeline.stage_policies",
    "configs",
]


@pytest.mark.parametrize("name", MODULES)
def test_no_module_imports_under_a_second_name(name):
    """With the repository root on sys.path, `import errors` would make a second errors module (and a second
    InputError class); every module refuses any name but branchgate.<...>."""
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); import {name}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=120)
    assert proc.returncode != 0
    assert f"import branchgate.{name.split('.')[0]} (the repository root is the branchgate package)" in proc.stderr


def test_a_module_run_with_dash_m_imports_again_in_spawned_workers():
    """`python3 -m branchgate.cli ... --workers 2`: a spawned worker imports the main module again as
    ``__mp_main__``, which the guard above must let through (it refused it: every worker died)."""
    import runpy

    runpy.run_module("branchgate.cli", run_name="__mp_main__")  # raised ImportError before


@pytest.mark.parametrize("path", [c[0] for c in COMMANDS], ids=lambda p: " ".join(p))
def test_every_command_has_help(path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*path, "--help"])
    assert exc.value.code == 0
    assert "usage: branchgate" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error():
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
