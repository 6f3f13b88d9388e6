"""Copy a folder of canonical traces with the candidates' research goals removed (the issue-22 goals probe).

    python3 -m research.strip_goals SRC DST [--runs all|half]

Real agents' searches (Search-o1, ReAct) have no research goal; the simulator writes one per candidate, from
templates. A gate trained on goal-less copies of the simulator's runs shows whether the goals' phrasing is
what it learns. Every ``*.jsonl`` file below SRC is copied to the same place below DST; in the chosen runs
(``all``, or ``half``: the runs whose sha256(run id) starts with an even byte) each ``candidate`` event's
``goal`` becomes "" (so the retained branches' texts lose theirs too). Every other line is copied
byte for byte. Prints how many runs and goals it changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from branchgate.fileio import atomic_path

MODES = ("all", "half")


def chosen(run_id: str, mode: str) -> bool:
    """Whether the run's candidates lose their goals."""
    return mode == "all" or hashlib.sha256(run_id.encode()).digest()[0] % 2 == 0


def _stripped(line: str, mode: str) -> tuple[str, str | None]:
    """The line, with the goal removed when it is a chosen run's candidate; and that run's id, else None."""
    if '"candidate"' not in line:
        return line, None
    event = json.loads(line)
    run_id = str(event.get("run_id"))
    if event.get("type") != "candidate" or not event.get("goal") or not chosen(run_id, mode):
        return line, None
    event["goal"] = ""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n", run_id


def strip(src: str | Path, dst: str | Path, mode: str = "all") -> dict:
    """Copy SRC's traces to DST with goals removed in the chosen runs; ``{files, runs_changed, goals_removed}``."""
    if mode not in MODES:
        raise SystemExit(f"--runs must be one of {', '.join(MODES)}, got {mode!r}")
    src, dst = Path(src), Path(dst)
    if dst.resolve() == src.resolve():
        raise SystemExit(f"{dst}: the copy must go to another folder than its source")
    files = sorted(src.rglob("*.jsonl"))
    if not files:
        raise SystemExit(f"{src}: no *.jsonl trace files")
    runs, removed = set(), 0
    for path in files:
        out = dst / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(path, encoding="utf-8") as f, atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as g:
            for line in f:
                line, run_id = _stripped(line, mode)
                if run_id is not None:
                    removed += 1
                    runs.add(run_id)
                g.write(line)
    return {"files": len(files), "runs_changed": len(runs), "goals_removed": removed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--runs", default="all", choices=MODES)
    args = ap.parse_args()
    counts = strip(args.src, args.dst, args.runs)
    print(f"{counts['files']} files, {counts['runs_changed']} runs changed, {counts['goals_removed']} goals removed")


if __name__ == "__main__":
    main()
