"""The reference pipeline's settings: ``Config`` with its constants, and the budget reference it may name.

``Config.tag`` hashes the settings into every run id; ``pipeline/run.py`` runs a query under them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from branchgate.errors import BranchgateError, InputError
from branchgate.fileio import load_json, read_bounded
from branchgate.texts import SNIPPET_WORDS


@dataclass
class Config:
    breadth: int = 4
    depth: int = 3
    oversample: float = 1.5  # candidates per frame = ceil(breadth at that level × oversample)
    top_k: int = 10
    seed: int = 0
    pre: str = "none"
    read: str = "none"  # the read stage: which new hits of a search's result list are read (policy_spec.py)
    post: str = "none"
    synth: str = "none"
    generator: str = "offline"
    retriever: str = "bm25"
    encoder: str = "auto"
    budget_reference: str = ""  # JSON {query id: {"nodes", "tokens"}}: the reference runs of ``budget_*=P%`` specs
    protect: str = "none"  # "plan": the root's plan-search passages join C_0 as protected context (never pruned)
    shape: str = "tree"  # "chain": one candidate per decision, each search's follow-up the next (a sequential agent)
    snippet_words: int = SNIPPET_WORDS  # a hit's snippet at the read stage: the first N whitespace words of its passage

    def breadths(self) -> list[int]:
        """GPT-Researcher's breadth per level: halves per level, floor 2 (4, 2, 2 for breadth 4); 1 per level in
        a chain."""
        if self.shape == "chain":
            return [1] * self.depth
        out, b = [], self.breadth
        for _ in range(self.depth):
            out.append(b)
            b = max(2, b // 2)
        return out

    def candidates_per_level(self) -> list[int]:
        if self.shape == "chain":  # a sequential agent writes one search at a time: nothing to oversample
            return [1] * self.depth
        return [max(1, math.ceil(b * self.oversample)) for b in self.breadths()]

    def record(self) -> dict:
        """The settings as traces and ``simulate.json`` record them (later settings only when set)."""
        d = asdict(self)
        for key, default in LATER_DEFAULTS.items():
            if d[key] == default:
                d.pop(key)
        return d

    def tag(self) -> str:
        """Short hash of everything that changes a run's outcome (part of every run id). Settings added later
        count only when set (older run ids stay valid); a budget reference counts by its content."""
        d = self.record()
        if d.get("budget_reference"):
            from pathlib import Path

            ref = Path(d["budget_reference"])
            d["budget_reference"] = hashlib.sha256(ref.read_bytes()).hexdigest() if ref.is_file() else str(ref)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


LATER_DEFAULTS = {
    "budget_reference": "",
    "protect": "none",
    "shape": "tree",
    "read": "none",
    "snippet_words": SNIPPET_WORDS,
}
PROTECT = ("none", "plan")
SHAPES = ("tree", "chain")


def check_snippet_words(n) -> None:
    """``Config.snippet_words`` must be an integer ≥ 1 (``BranchgateError`` naming ``--snippet-words`` otherwise)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BranchgateError(f"--snippet-words must be an integer ≥ 1 (words of a hit's snippet), got {n!r}")


def _reference(path: str) -> dict:
    """``Config.budget_reference``: {query id: {"nodes", "tokens"}} (other keys ignored)."""
    if not path:
        raise BranchgateError(
            "a budget given as P% needs Config.budget_reference (simulate --budget-reference FILE): "
            "the reference run totals {query id: {nodes, tokens}}"
        )
    p = Path(path)
    if not p.is_file():
        raise InputError("budget reference not found", str(p))
    data = load_json(read_bounded(p, str(p)), str(p))
    if not isinstance(data, dict):
        raise InputError("expected an object {query id: {nodes, tokens}}", str(p))
    return data
