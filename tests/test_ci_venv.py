"""`.ci/integration` run from inside an activated virtualenv: the integration venv it builds must see what that
virtualenv has (branchgate and its dependencies), not only the base interpreter's packages."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
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
    # `python -m venv` run from inside an activated virtualenv builds over the base interpreter: when the tests
    # themselves run in a virtualenv (the README's set-up), the outer venv must see it too, where branchgate is
    if sys.prefix != sys.base_prefix:
        here = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
        lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in here)
        (Path(site) / "_tests_virtualenv.pth").write_text(lines)
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import only_in_outer_venv\n\nfrom branchgate.inference.gate import Gate\n\n\n"
        "def test_sees_the_virtualenv():\n    assert only_in_outer_venv.WHERE == 'outer'\n"
        "    assert Gate.load\n"
        "    import branchgate\n"
        f"    assert branchgate.__file__ == {__import__('branchgate').__file__!r}\n"
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


def _marks(fn) -> set[str]:
    """The ``pytest.mark.NAME`` decorators on a function (called or not)."""
    names = set()
    for dec in fn.decorator_list:
        node = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "pytest.mark":
            names.add(node.attr)
    return names


def test_every_test_that_needs_shared_data_carries_the_shared_mark():
    """A fresh clone has no ../shared: `pytest -m "not shared"` must deselect every test that would need it, so a
    test that takes the `shared` fixture (or reaches ../shared/data another way) carries `@pytest.mark.shared`."""
    unmarked, marked = [], 0
    for path in sorted([*(REPO / "tests").glob("test_*.py"), *(REPO / "research" / "tests").glob("test_*.py")]):
        tree = ast.parse(path.read_text(), filename=str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or not fn.name.startswith("test_"):
                continue
            names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
            needs = "shared" in {a.arg for a in fn.args.args} or bool(names & {"shared_path", "SHARED_DATA"})
            if needs and "shared" not in _marks(fn):
                unmarked.append(f"{path.relative_to(REPO)}::{fn.name}")
            marked += needs
    assert not unmarked, f"needs ../shared but has no @pytest.mark.shared: {unmarked}"
    assert marked >= 8  # the real-data tests this checks are found at all
