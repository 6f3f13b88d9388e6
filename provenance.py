"""Which source made an output: the short git commit of the checkout branchgate runs from, for reports that say
how to reproduce them (``branchgate replay``'s report, ``scripts/build_pretrained.py``)."""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import subprocess
from pathlib import Path


def source_commit() -> str | None:
    """``git rev-parse --short HEAD`` in the package's folder (bounded to 10 s); None outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
