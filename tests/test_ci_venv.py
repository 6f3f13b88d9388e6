"""`.ci/integration` run from inside an activated virtualenv: the integration venv it builds must see what that
virtualenv has (branchgate and its dependencies), not only the base interpreter's packages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_integration_venv_built_in_a_virtualenv_sees_its_packages(tmp_path):
    outer = tmp_path / "outer"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(outer)], check=True)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run(
        [str(outer / "bin" / "python"), "-c", purelib], check=True, capture_output=True, text=True
    ).stdout.strip()
    # a module only the virtualenv has, as branchgate is when a user installs it there
    (Path(site) / "only_in_outer_venv.py").write_text("WHERE = 'outer'\n")
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import only_in_outer_venv\n\nfrom branchgate.inference.gate import Gate\n\n\n"
        "def test_sees_the_virtualenv():\n    assert only_in_outer_venv.WHERE == 'outer'\n"
        "    assert Gate.load\n"
    )
    integrations = tmp_path / "integrations"
    integrations.mkdir()
    # a requirement every environment here already has: nothing is downloaded
    (integrations / "probe.txt").write_text(f"# tests: {probe}\n# import: only_in_outer_venv\npytest\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH", "PYTHONHOME")}
    env.update(
        PATH=f"{outer / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(outer),
        INTEGRATIONS=str(integrations),
        VENVS=str(tmp_path / "venvs"),
    )
    run = subprocess.run(
        ["bash", str(REPO / ".ci" / "integration"), "probe"], env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    # the venv was built in the given folder, over the virtualenv
    pth = next((tmp_path / "venvs" / ".venv-probe").rglob("_outer_environment.pth"))
    assert site in pth.read_text()
