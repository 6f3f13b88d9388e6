"""Cached bench steps: each writes OUT/<step>/ and, when finished, OUT/<step>/done.json with its fingerprint.

An interrupted step (OUT/<step>/started.json with the same fingerprint, no done.json) resumes in its
folder (simulation skips finished runs). The fingerprint is the sha256 of the step's inputs (its config
section, the query ids, the upstream steps' fingerprints, the branchgate version). A rerun with the same
fingerprint returns the recorded result without running; a different one clears the folder and runs again,
so a changed setting re-runs exactly the steps that depend on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from branchgate import __version__
from branchgate.fileio import atomic_write_json

log = logging.getLogger(__name__)


def fingerprint(inputs) -> str:
    """sha256 of the canonical JSON of ``inputs`` plus the branchgate version."""
    blob = json.dumps({"inputs": inputs, "branchgate": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class Steps:
    """Runs named steps under ``out``; ``ran`` lists the steps that actually ran, ``timings`` their seconds."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.ran: list[str] = []
        self.timings: dict[str, float] = {}
        self.fingerprints: dict[str, str] = {}

    def run(self, name: str, inputs: dict, fn: Callable[[Path], dict]) -> dict:
        """``fn(step_dir)`` → a JSON-able result, unless OUT/<name>/done.json holds the same fingerprint."""
        fp = fingerprint(inputs)
        self.fingerprints[name] = fp
        folder = self.out / name
        done = folder / "done.json"
        if done.is_file():
            rec = json.loads(done.read_text())
            if rec.get("fingerprint") == fp:
                print(f"== {name}: cached ({folder})", file=sys.stderr, flush=True)
                self.timings[name] = 0.0
                return rec["result"]
            log.info("%s: settings changed, running again", name)
        started = folder / "started.json"
        resume = started.is_file() and not done.is_file() and json.loads(started.read_text()).get("fingerprint") == fp
        if resume:
            log.info("%s: resuming an interrupted run in %s", name, folder)
        elif folder.exists():
            shutil.rmtree(folder) if not getattr(fn, "keeps_folder", False) else done.unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(started, {"fingerprint": fp})
        print(f"== {name}: running", file=sys.stderr, flush=True)
        start = time.perf_counter()
        result = fn(folder)
        seconds = round(time.perf_counter() - start, 2)
        atomic_write_json(
            done, {"fingerprint": fp, "inputs": inputs, "result": result, "seconds": seconds, "branchgate": __version__}
        )
        self.ran.append(name)
        self.timings[name] = seconds
        print(f"== {name}: done in {seconds:.1f}s", file=sys.stderr, flush=True)
        return result


def keeps_folder(fn):
    """Mark a step function that manages reuse inside its own folder (the closed loop's per-policy runs)."""
    fn.keeps_folder = True
    return fn
