"""What the output-folder tests share: a folder's snapshot, a refused command, the dataset build's argv."""

from __future__ import annotations

from pathlib import Path

from branchgate.cli import main


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``root``, hidden ones included."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def refused(argv: list[str], capsys, path) -> str:
    """Run the CLI: exit 2, ``path`` named in a one-line error, no traceback; returns the message."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err and f"branchgate: error: {path}" in err, err[-2000:]
    return err


def build_argv(traces, out) -> list[str]:
    return ["dataset", "build", "--traces", str(traces), "--out", str(out), "--encoder", "packaged", "--no-progress"]
