"""Done means: a fresh venv with only the core install (no torch) loads an exported controller and gates.

Builds a real venv (``python -m venv``), installs the package with ``--no-deps`` plus only the core
runtime (numpy, onnxruntime, tokenizers, pydantic) from the package index, checks that torch is absent
there and runs ``branchgate gate`` on a model exported in this (full) environment. Skipped with the
reason when the venv or the index cannot be reached; any other failure fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from export_support import exported

from branchgate.inference.gate import Gate
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import simulate

REPO = Path(__file__).resolve().parents[1]
CORE = ["numpy", "onnxruntime", "tokenizers", "pydantic"]
NETWORK_SIGNS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Could not find a version that satisfies",
    "No matching distribution found",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "SSLError",
)
DECISION = {
    "state": {
        "root_query": "Why are honeybee colonies collapsing?",
        "frame_query": "",
        "parent_goal": "",
        "retained": ["varroa mites\nparasites"],
        "depth": 1,
    },
    "candidates": [
        {"query": "neonicotinoid field studies", "goal": "pesticides"},
        {"query": "honey prices by country", "goal": ""},
        {"query": "蜜蜂 病毒"},
    ],
}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd, what: str, timeout: int = 900, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), **kw)
    if proc.returncode != 0:
        out = proc.stdout[-3000:] + proc.stderr[-3000:]
        if any(sign in out for sign in NETWORK_SIGNS):
            pytest.skip(f"{what}: the package index is not reachable ({out.strip().splitlines()[-1][:200]})")
        pytest.fail(f"{what} failed (exit {proc.returncode}):\n{out}")
    return proc


def _copy_source(dst: Path) -> Path:
    """The repository without git data, caches, build output or tests (pip builds in the source tree)."""
    ignore = shutil.ignore_patterns(
        ".git",
        "__pycache__",
        "*.egg-info",
        "build",
        "dist",
        "tests",
        ".pytest_cache",
        "wandb",
        "lightning_logs",
        "quickstart",
        "envs",
        "traces",
        "runs",
        "out",
        "*.onnx",
        ".ci",  # the integration virtualenvs (GBs)
    )
    pretrained = REPO / "pretrained"

    def skip(folder, names):  # stray exports are left out; the packaged pretrained controllers are not
        return set() if Path(folder).parent == pretrained else ignore(folder, names)

    shutil.copytree(REPO, dst, ignore=skip)
    return dst


@pytest.mark.slow
def test_core_install_without_torch_gates_a_decision(encoder, tmp_path):
    model = exported(encoder)["files"]["int8"]
    venv = tmp_path / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot create a venv here: {exc}")
    py = venv / "bin" / "python"
    src = _copy_source(tmp_path / "src")
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(src)], "pip install --no-deps <repo>")
    _run([str(py), "-m", "pip", "install", "-q", *CORE], "pip install " + " ".join(CORE))

    no_torch = subprocess.run([str(py), "-c", "import torch"], capture_output=True, text=True, env=_env())
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    listed = _run([str(py), "-m", "pip", "list", "--format", "json"], "pip list").stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "branchgate" in names and not names & {"torch", "transformers", "sentence-transformers", "datasets"}

    cli = venv / "bin" / "branchgate"

    def in_venv(*cmd, stdin: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(c) for c in cmd],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
            cwd=tmp_path,
        )

    proc = in_venv(cli, "gate", "--pre", model, stdin=json.dumps(DECISION))
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = json.loads(proc.stdout)
    want = Gate.load(model).select(DECISION["state"], DECISION["candidates"])
    assert answer["kept"] == want.kept and answer["fallback"] == want.fallback
    np.testing.assert_allclose(answer["p_keep"], want.p_keep, atol=1e-5)
    assert len(answer["utility"]) == 3

    bad = in_venv(cli, "gate", "--pre", model, stdin='{"state": {}, "candidates": []}')
    assert bad.returncode == 2 and "state.root_query" in bad.stderr
    helped = in_venv(cli, "--help", timeout=120)
    assert helped.returncode == 0 and "gate" in helped.stdout
    pretrained = in_venv(  # the packaged controllers load from the core install (branchgate.pretrained)
        py,
        "-c",
        "from branchgate.inference.gate import Gate\n"
        "for n in ('pre', 'read', 'pre-model', 'read-model', 'pre-teacher', 'read-teacher'):\n"
        "    g = Gate.load('pretrained:' + n)\n"
        "    hits = [{'title': 'Varroa mites', 'snippet': 'parasites of bees'}, {'title': 'Honey prices'}]\n"
        "    args = ({'root_query': 'Why are bees dying?'}, hits) if g.stage == 'read' else "
        "({'root_query': 'Why are bees dying?'}, ['varroa mites', 'honey prices'])\n"
        "    print(n, g.stage, g.select(*args).kept)\n",
    )
    assert pretrained.returncode == 0, pretrained.stderr[-2000:]
    assert [line.split()[1] for line in pretrained.stdout.splitlines()] == ["pre", "read"] * 3
    serve = in_venv(cli, "serve", "--pre", model, timeout=120)  # the serve extra is not in the core: it is named
    assert serve.returncode == 2 and "pip install 'branchgate[serve]'" in serve.stderr, serve.stderr[-2000:]
    traces = tmp_path / "sim"  # replay from the core install: the table and JSON; the picture names its extra
    simulate("sample", Config(depth=1), traces, runs=2, progress=False)
    out = tmp_path / "replay"
    replay = in_venv(
        cli,
        "replay",
        "--traces",
        traces / "traces",
        "--pre",
        "pretrained:pre",
        "--taus",
        "0.3",
        "--bootstrap",
        "20",
        "--out",
        out,
    )
    for cmd, missing in (  # the train extra's commands name it, as serve does, instead of a traceback
        (["dataset", "build", "--traces", traces / "traces", "--out", tmp_path / "ds"], "datasets"),
        (["train", "--config", "bench_train"], "lightning"),
    ):
        proc = in_venv(cli, *cmd, timeout=120)
        hint = f"{missing} is not installed (pip install 'branchgate[train]'; in a clone: pip install '.[train]')"
        assert proc.returncode == 2 and hint in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert replay.returncode == 0, replay.stderr[-2000:]
    report = json.loads((out / "replay.json").read_text())
    assert report["runs"] == 2 and len(report["points"]) == 1
    assert "branchgate[replay]" in replay.stderr and not (out / "replay.png").exists()
    assert "replay.png" not in replay.stderr.strip().splitlines()[-1]  # "wrote …" names only what it wrote


@pytest.mark.slow
def test_the_built_wheel_installs_in_a_clean_venv_and_gates(tmp_path):
    """The install the docs show without PyPI: `python -m build --wheel` in a clone, then `pip install
    dist/branchgate-*.whl` in a venv that sees nothing of this one (pip fetches the core runtime)."""
    src = _copy_source(tmp_path / "src")
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(src)], "python -m build")
    (wheel,) = (tmp_path / "dist").glob("branchgate-*.whl")
    venv = tmp_path / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot create a venv here: {exc}")
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", str(wheel)], "pip install dist/branchgate-*.whl")
    listed = {
        p["name"].lower()
        for p in json.loads(_run([str(py), "-m", "pip", "list", "--format", "json"], "pip list").stdout)
    }
    assert "branchgate" in listed and not listed & {"torch", "lightning", "datasets", "fastapi"}, listed
    state = {"root_query": "Why are honeybee colonies collapsing?", "query": "varroa mites", "depth": 1}
    hits = [
        {"id": "a", "title": "Varroa mites", "snippet": "parasites that weaken bee colonies", "rank": 0},
        {"id": "b", "title": "Honey prices", "snippet": "honey markets by country", "rank": 1},
    ]
    script = (
        "import json, sys\nfrom branchgate.inference.gate import Gate\n"
        "state, hits = json.loads(sys.argv[1])\n"
        "sel = Gate.load('pretrained:read').select(state, hits)\n"
        "print(json.dumps({'kept': sel.kept, 'p_keep': [float(p) for p in sel.p_keep]}))\n"
    )
    got = json.loads(
        _run([str(py), "-c", script, json.dumps([state, hits])], "gate in the wheel's venv", cwd=tmp_path).stdout
    )
    want = Gate.load("pretrained:read").select(state, hits)
    assert got["kept"] == want.kept
    np.testing.assert_allclose(got["p_keep"], want.p_keep, atol=1e-5)


def test_a_missing_extra_is_named_by_every_command_not_a_traceback(monkeypatch, capsys):
    """Any command whose work imports a module of a missing extra exits 2 naming the extra (from the package and
    from a clone); a missing module of branchgate itself is a bug and still raises."""
    import branchgate.pipeline.env_cli as env_cli
    from branchgate.cli import main

    def needs(name):
        def run(args):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        return run

    monkeypatch.setattr(env_cli, "run", needs("datasets"))
    assert main(["env", "build", "--format", "musique", "--src", "x", "--out", "y"]) == 2
    err = capsys.readouterr().err
    assert "datasets is not installed (pip install 'branchgate[train]'; in a clone: pip install '.[train]')" in err
    monkeypatch.setattr(env_cli, "run", needs("uvicorn"))
    assert main(["env", "build", "--format", "musique", "--src", "x", "--out", "y"]) == 2
    assert "pip install '.[serve]'" in capsys.readouterr().err
    monkeypatch.setattr(env_cli, "run", needs("branchgate.nope"))
    with pytest.raises(ModuleNotFoundError):
        main(["env", "build", "--format", "musique", "--src", "x", "--out", "y"])
