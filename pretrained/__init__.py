"""Pretrained controllers shipped with the core install: ``Gate.load("pretrained:NAME")``.

Trained by ``scripts/build_pretrained.py`` on the bundled samples only (MuSiQue CC BY 4.0, HotpotQA CC BY-SA 4.0;
see NOTICE and each stage's ``card.md``); int8 ONNX only. Each stage folder holds ``controller.int8.onnx``, its
tokenizer, ``card.md`` and ``choice.json`` (which of the two is the stage's default and the real Search-o1
figures it was chosen on). Names:

- ``pre`` / ``read``: the stage's default (``choice.json``: the learned controller, or its teacher when the
  controller did not beat the teacher on the real Search-o1 decisions);
- ``pre-model`` / ``read-model``: the learned controller itself (a ``Gate``);
- ``pre-teacher`` / ``read-teacher``: the teacher through the same keep rule (``inference.teacher_gate``), its
  texts embedded by the stage's own shipped text tower (no third copy of the tower).

This package only names and finds the files (it imports nothing of the Gate); ``Gate.load`` loads them.
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import json
from importlib.resources import files
from pathlib import Path

from branchgate.errors import InputError

PREFIX = "pretrained:"
STAGES = ("pre", "read")
MODEL_FILE = "controller.int8.onnx"
NAMES = tuple(n for s in STAGES for n in (s, f"{s}-model", f"{s}-teacher"))


def folder(stage: str) -> Path:
    return Path(str(files("branchgate.pretrained") / stage))


def is_pretrained(name) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def choice(stage: str) -> dict:
    """The stage's ``choice.json``: ``default`` ("model" | "teacher"), ``teacher``, every teacher's τ
    (``teacher_taus``), the build and the real Search-o1 figures the default was chosen on."""
    return json.loads((folder(stage) / "choice.json").read_text())


def resolve(name: str) -> tuple[str, str, Path]:
    """``(stage, kind, model file)`` of ``NAME`` or ``pretrained:NAME``; kind is "model" or "teacher"."""
    short = name[len(PREFIX) :] if is_pretrained(name) else str(name)
    if short not in NAMES:
        raise InputError(f"unknown pretrained controller {short!r}; one of {', '.join(NAMES)}", "model")
    stage, _, kind = short.partition("-")
    path = folder(stage) / MODEL_FILE
    if not path.is_file():
        raise InputError(f"the pretrained {stage} controller is not installed ({path} missing)", "model")
    return stage, kind or choice(stage)["default"], path
