"""What the document-gate tests share (``tests/test_doc_gate.py``, ``test_langchain.py``, ``test_llamaindex.py``):
a small corpus of retrieved documents (text + metadata, as a retriever returns them) and the read dataset built
from the traces a drop-in wrote."""

from __future__ import annotations

import json
from pathlib import Path

QUESTION = "Why do honeybee colonies collapse?"
CORPUS = [
    (
        "Varroa destructor mites feed on honeybee larvae and spread deformed wing virus; heavily infested colonies "
        "dwindle over the winter and collapse by spring.",
        {"title": "Varroa mites and colony losses", "source": "https://bees.example/varroa"},
    ),
    (
        "Neonicotinoid pesticides impair foraging and navigation in honeybees at field doses, weakening colonies.",
        {"title": "Pesticides and foraging", "url": "https://bees.example/neonicotinoids"},
    ),
    (
        "Honey prices rose in 2023 in most European countries because of poor harvests.",
        {"title": "Honey prices in Europe", "source": "https://market.example/honey"},
    ),
    (
        "Colony collapse disorder: the worker bees vanish, leaving the queen, brood and food stores behind.",
        {"title": "Colony collapse disorder", "source": "https://bees.example/ccd"},
    ),
    (
        "Recipe: honey glazed carrots with thyme, ready in twenty minutes.",
        {"source": "https://food.example/carrots"},  # no title: the text's first line is
    ),
    ("Poor nutrition from monoculture crops leaves bee colonies less able to fight disease.", {}),  # no URL
]
QUERIES = ["varroa mites honeybee colonies", "pesticides and bee colony collapse", "bee nutrition and disease"]


def read_dataset(traces: Path, root: Path, labels: str = "teacher:dpp") -> dict:
    """``branchgate dataset build --stage read --labels LABELS`` over ``traces`` (the CLI, as a user runs it);
    returns its manifest."""
    from branchgate.cli import main

    out, cache = root / "read_ds", root / "emb.sqlite"
    argv = ["dataset", "build", "--traces", str(traces), "--out", str(out), "--stage", "read", "--labels", labels]
    argv += ["--encoder", "packaged", "--workers", "1", "--cache", str(cache), "--no-progress"]
    assert main(argv) == 0
    return json.loads((out / "manifest.json").read_text())


def page_blocks(page: str, language: str) -> list[str]:
    """The fenced ``language`` blocks of ``docs/use/PAGE``, in order (the tests run what the page shows)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "use" / page).read_text()
    return [m.group(1) for m in re.finditer(rf"^```{language}\n(.*?)^```$", text, re.M | re.S)]


def run_page_commands(page: str) -> list[str]:
    """Run the ``branchgate ...`` lines of the page's bash blocks in the current directory (the CLI's ``main``,
    as the shell would call it); returns them."""
    import shlex

    from branchgate.cli import main

    lines = [ln for b in page_blocks(page, "bash") for ln in b.splitlines() if ln.startswith("branchgate ")]
    for line in lines:
        assert main(shlex.split(line)[1:]) == 0, line
    return lines
