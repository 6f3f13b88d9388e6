"""branchgate: learned controllers for deep-research agents (which sub-queries to search, which results to read).

The front door: the names the docs show, importable from here::

    from branchgate import Gate, RunGate, gated, TraceWriter

Each is imported on first use (PEP 562 ``__getattr__``), so ``import branchgate`` loads nothing but this file, and
the core install (numpy, onnxruntime, tokenizers, pydantic) runs the Gate; an agent integration loads its module
only when its name is used. Installed, the repository's folders import as ``branchgate.<folder>``:
``logs_to_dataset``, ``data``, ``models``, ``training``, ``inference``, ``export``, ``pipeline``, ``bench``.
"""

# Every module below this one refuses to be imported under any name but branchgate.<folder>.<module> (pytest
# imports this file itself under the checkout's folder name, which is harmless: it defines only the version and
# the table below).
__version__ = "0.1.0"

from importlib import import_module as _import_module  # noqa: E402

# name → the module that defines it (module paths as strings: nothing is imported until a name is used)
_NAMES = {
    "Gate": "branchgate.inference.gate",
    "Selection": "branchgate.inference.selection",
    "RunGate": "branchgate.inference.run_gate",
    "TeacherGate": "branchgate.inference.teacher_gate",
    "ReadState": "branchgate.inference.read_state",
    "gated": "branchgate.inference.agents.adapters",
    "gate_research": "branchgate.inference.agents.gpt_researcher",
    "gate_open_deep_research": "branchgate.inference.agents.open_deep_research",
    "ReadGateCompressor": "branchgate.inference.agents.langchain",
    "ReadGatePostprocessor": "branchgate.inference.agents.llamaindex",
    "TraceWriter": "branchgate.logs_to_dataset.traces",
    "read_runs": "branchgate.logs_to_dataset.readers",
}
__all__ = ["__version__", *_NAMES]


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'branchgate' has no attribute {name!r}")
    value = getattr(_import_module(_NAMES[name]), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))
