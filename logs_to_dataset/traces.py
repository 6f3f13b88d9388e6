"""Streaming reader and append-only writer for canonical traces (JSON Lines)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from branchgate.errors import InputError
from branchgate.logs_to_dataset.schema import Event, parse_event, to_json


@dataclass
class Skipped:
    """A record that could not be read; reported, never silently dropped."""

    file: str
    line: int | None
    reason: str

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "reason": self.reason}


@dataclass
class ReadReport:
    events: int = 0
    skipped: list[Skipped] = field(default_factory=list)


def read_events(path: str | Path, strict: bool = False, report: ReadReport | None = None) -> Iterator[Event]:
    """Stream events from a canonical JSONL trace.

    Safe to call while a writer is still appending: a final line without its newline is treated as
    in-progress/truncated and is skipped (reported), never half-parsed. Bad lines are skipped and
    recorded in ``report`` unless ``strict``, in which case the first one raises ``InputError``.
    """
    path = Path(path)
    report = report if report is not None else ReadReport()
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            complete = raw.endswith(b"\n")
            text = raw.strip()
            if not text:
                continue
            try:
                try:
                    obj = json.loads(text.decode("utf-8"))
                except UnicodeDecodeError:
                    raise InputError("not UTF-8 text (binary data?)", str(path), lineno) from None
                except json.JSONDecodeError as exc:
                    what = "truncated last line" if not complete else f"invalid JSON ({exc.msg} at column {exc.colno})"
                    raise InputError(what, str(path), lineno) from None
                event = parse_event(obj, str(path), lineno)
            except InputError as exc:
                if strict:
                    raise
                report.skipped.append(Skipped(str(path), lineno, exc.reason))
                continue
            report.events += 1
            yield event


class TraceWriter:
    """Append-only writer: one JSON line per event, flushed (and fsync'd if asked) per event.

    ``seq`` is assigned per run when the caller leaves it out. Reopening an existing file appends;
    a truncated last line left by a crashed writer is terminated first so the next event starts on
    its own line (the reader skips and reports the broken one).
    """

    def __init__(self, path: str | Path, fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._seq: dict[str, int] = {}
        needs_newline = False
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                needs_newline = fh.read(1) != b"\n"
        self._fh = open(self.path, "a", encoding="utf-8")
        if needs_newline:
            self._fh.write("\n")
            self._fh.flush()

    def write(self, event: Event | None = None, /, **fields) -> Event:
        """Write an event object, or build one from ``fields`` (must include ``type`` and ``run_id``)."""
        if event is None:
            fields.setdefault("seq", self._seq.get(fields.get("run_id", ""), 0))
            fields.setdefault("ts", time.time())
            event = parse_event(fields)
        self._seq[event.run_id] = max(self._seq.get(event.run_id, 0), event.seq + 1)
        self._fh.write(to_json(event) + "\n")
        self._fh.flush()
        if self._fsync:
            os.fsync(self._fh.fileno())
        return event

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
