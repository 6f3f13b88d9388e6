"""Canonical JSONL traces (``*.jsonl``), as written by ``TraceWriter``.

One file may hold several runs, even interleaved; events are grouped by ``run_id`` (runs in order of
first appearance) and sorted by ``seq`` (stable). Line-level outcomes are those of ``traces.read_events``.
A run whose ``seq`` repeats is kept; the repeat is counted in the report's warnings.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from branchgate.logs_to_dataset.traces import ReadReport, Run, read_events


class CanonicalReader:
    name = "canonical"

    def detect(self, path: Path) -> bool:
        return path.suffix.lower() == ".jsonl"

    def read(self, path: Path, strict: bool, report: ReadReport) -> Iterator[Run]:
        runs: dict[str, list] = {}
        for event in read_events(path, strict, report):
            runs.setdefault(event.run_id, []).append(event)
        for run_id, events in runs.items():
            events.sort(key=lambda e: e.seq)
            seqs = [e.seq for e in events]
            report.warn("canonical: repeated seq within a run", len(seqs) - len(set(seqs)))
            yield Run(run_id, events, str(path))
