"""The package's import graph has no cycle, between modules or between top-level folders (ARCHITECTURE.md).

The graph is built from the source with ``ast``: every ``import`` statement counts, at module level, inside a
function (a lazy import of an extra) or under ``TYPE_CHECKING``, so a cycle cannot hide behind a deferred import.
A package's lazy names (``branchgate.__getattr__``, PEP 562) are strings, not import statements: they add no edge.
Scope: the installed package (the repository root's modules and the folders ``pyproject.toml`` installs).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Folder-level loops that cannot be broken, each with its reason (none today: keep it that way).
ALLOWED_FOLDER_LOOPS: dict[frozenset[str], str] = {}


def package_modules() -> dict[str, Path]:
    """Dotted module name → file, for every module the package installs."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    mods: dict[str, Path] = {}
    for pkg in packages:
        folder = ROOT.joinpath(*pkg.split(".")[1:])
        for f in sorted(folder.glob("*.py")):
            name = pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"
            mods[name] = f
    return mods


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the package modules it imports (anywhere in its source)."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = _package_of(name, path).split(".")
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:  # `import branchgate.x.y` → the longest installed prefix
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# inference/ holds three layers by job: the Gate runtime and run budgets (the bottom of everything that runs a
# controller), and two subfolders on top of everything, which nothing in the package imports: the agent
# integrations (they write traces in logs_to_dataset's format) and the HTTP server. Each subfolder is a node.
OWN_NODES = ("inference.agents", "inference.server")


def folder(module: str) -> str:
    """A module's folder node (``branchgate.logs_to_dataset.readers.x`` → ``logs_to_dataset``; ``OWN_NODES`` →
    ``inference/agents``, ``inference/server``); the root's modules are ``.`` (core helpers and the command line)."""
    parts = module.split(".")[1:]
    if len(parts) >= 2 and ".".join(parts[:2]) in OWN_NODES:
        return "/".join(parts[:2])
    return parts[0] if parts and f"branchgate.{parts[0]}" in FOLDERS else "."


FOLDERS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for v, ws in graph.items():
        a = folder(v)
        out.setdefault(a, set())
        out[a].update(folder(w) for w in ws if folder(w) != a and folder(w) != ".")
    return out


def test_no_module_cycle():
    found = cycles(import_graph(package_modules()))
    assert not found, "import cycles between modules:\n" + "\n".join(" ↔ ".join(c) for c in found)


def test_no_folder_cycle():
    found = [
        c for c in cycles(folder_graph(import_graph(package_modules()))) if frozenset(c) not in ALLOWED_FOLDER_LOOPS
    ]
    detail = []
    graph = import_graph(package_modules())
    for c in found:
        for v, ws in sorted(graph.items()):
            for w in sorted(ws):
                if folder(v) in c and folder(w) in c and folder(v) != folder(w) and folder(w) != ".":
                    detail.append(f"  {v} → {w}")
    assert not found, (
        "import loops between folders: " + "; ".join(" ↔ ".join(c) for c in found) + "\n" + "\n".join(detail)
    )


def test_graph_sees_every_kind_of_import(tmp_path):
    """The graph counts imports inside functions and under TYPE_CHECKING, and finds a cycle they make."""
    (tmp_path / "a.py").write_text("def f():\n    from branchgate.b import x\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import branchgate.a\n")
    (tmp_path / "c.py").write_text("import os\n")
    mods = {"branchgate.a": tmp_path / "a.py", "branchgate.b": tmp_path / "b.py", "branchgate.c": tmp_path / "c.py"}
    graph = import_graph(mods)
    assert graph == {"branchgate.a": {"branchgate.b"}, "branchgate.b": {"branchgate.a"}, "branchgate.c": set()}
    assert cycles(graph) == [["branchgate.a", "branchgate.b"]]


@pytest.mark.parametrize("name", ["branchgate.inference.gate", "branchgate.pipeline.read_stage"])
def test_graph_knows_the_package(name):
    assert name in package_modules()


def test_package_docstrings_name_only_files_that_exist():
    """Every module a package's docstring names — ``name.py`` anywhere, or ``name`` at the head of a bullet
    (``- ``name``:``, ``- ``a`` / ``b``:``) — is a file (or a folder) of that package, or with a path, of the
    repository."""
    missing = []
    for path in package_modules().values():
        if path.name != "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        refs = set(re.findall(r"[\w./]*\w\.py\b", doc))
        for line in doc.splitlines():
            if line.startswith("- ") and ":" in line:
                refs |= {f"{m}.py" for m in re.findall(r"``(\w+)``", line.split(":", 1)[0])}
        for ref in sorted(refs):
            folder = path.parent / ref.removesuffix(".py")
            if not ((path.parent / ref).is_file() or (ROOT / ref).is_file() or folder.is_dir()):
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, "package docstrings name files that do not exist:\n" + "\n".join(missing)
