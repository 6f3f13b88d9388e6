"""Streaming reader and append-only writer for canonical traces (JSON Lines).

Reading a file (``read_events``), each outcome is reported, nothing is dropped silently:

| input | outcome (default) | with ``strict`` |
|---|---|---|
| valid line | event | event |
| blank line | ignored | ignored |
| invalid JSON / missing or invalid field | line skipped, ``Skipped(file, line, reason)`` | ``InputError`` |
| last line cut off (no newline, not valid JSON: a crashed or still-running writer) \
| skipped as "truncated last line" | ``InputError`` |
| last line valid but without a newline (hand-written file) | event | event |
| line that is not UTF-8 | skipped | ``InputError`` |
| JSON that parses but cannot be used (integer over 4300 digits, nesting deeper than ``fileio.MAX_JSON_DEPTH``) \
| skipped | ``InputError`` |
| lone surrogate escape (``"\\ud800"``) | replaced by U+FFFD (``fileio.load_json``) | same |
| binary file (NUL bytes in the first 8 KiB) / UTF-16 or UTF-32 text | whole file skipped, one record naming which \
| ``InputError`` |
| empty file (nothing but whitespace) | one record "empty file" | ``InputError`` |
| unknown ``type`` | kept as a ``raw`` event | same |
| ``v`` newer than this library | ``SchemaVersionError`` (always fatal) | same |
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from branchgate.errors import InputError
from branchgate.fileio import load_json, wide_encoding
from branchgate.logs_to_dataset.trace_schema import SCHEMA_VERSION, Event, SchemaVersionError, parse_event, to_json

BINARY_SNIFF = 8192


@dataclass
class Run:
    """One run's canonical events, in ``seq`` order, and the file they came from (what a reader yields)."""

    run_id: str
    events: list[Event]
    file: str
    format: str = ""
    warnings: list[str] = field(default_factory=list)


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
    """What reading produced: counts, skipped records, and what a reader could not rebuild."""

    events: int = 0
    runs: int = 0
    files: int = 0
    bytes: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    warnings: Counter = field(default_factory=Counter)  # message → count (e.g. "gptr: goals are not logged")
    ignored: list[str] = field(default_factory=list)  # files no reader recognised
    formats: Counter = field(default_factory=Counter)  # reader name → files read

    def skip(self, file, line: int | None, reason: str, strict: bool = False) -> None:
        """Record a bad record, or raise it under ``strict``."""
        if strict:
            raise InputError(reason, str(file), line)
        self.skipped.append(Skipped(str(file), line, reason))

    def warn(self, message: str, n: int = 1) -> None:
        if n:
            self.warnings[message] += n


def is_binary(path: str | Path) -> bool:
    with open(path, "rb") as fh:
        return b"\x00" in fh.read(BINARY_SNIFF)


def text_problem(path: str | Path) -> str | None:
    """Why a file cannot be a UTF-8 text log (``None`` when it may be one): UTF-16/32 text
    (``fileio.wide_encoding``) or binary data (NUL bytes in the first 8 KiB). Readers report this reason."""
    with open(path, "rb") as fh:
        head = fh.read(BINARY_SNIFF)
    name = wide_encoding(head)
    if name:
        return f"{name} text, not UTF-8 (save it as UTF-8)"
    return "binary data (NUL bytes)" if b"\x00" in head else None


def read_events(path: str | Path, strict: bool = False, report: ReadReport | None = None) -> Iterator[Event]:
    """Stream events from a canonical JSONL trace (outcomes in the module docstring).

    Safe to call while a writer is still appending: a final line without its newline that does not
    parse is in progress or truncated; it is reported, never half-parsed.
    """
    path = Path(path)
    report = report if report is not None else ReadReport()
    problem = text_problem(path)
    if problem:
        report.skip(path, None, f"{problem}, not a JSON Lines trace", strict)
        return
    seen_any = False
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            complete = raw.endswith(b"\n")
            text = raw.strip()
            if not text:
                continue
            seen_any = True
            try:
                try:
                    obj = load_json(text, str(path), lineno)
                except InputError as exc:
                    if not complete and exc.reason.startswith("invalid JSON ("):
                        raise InputError("truncated last line", str(path), lineno) from None
                    raise
                event = parse_event(obj, str(path), lineno)
            except SchemaVersionError:
                raise
            except InputError as exc:
                report.skip(path, lineno, exc.reason, strict)
                continue
            report.events += 1
            yield event
    if not seen_any:
        report.skip(path, None, "empty file (no events)", strict)


def _last_seqs(path: Path) -> dict[str, int]:
    """Next free ``seq`` per run in an existing trace (bad lines are ignored here; readers report them)."""
    nxt: dict[str, int] = {}
    try:
        for event in read_events(path, strict=False):
            nxt[event.run_id] = max(nxt.get(event.run_id, 0), event.seq + 1)
    except SchemaVersionError:
        raise
    return nxt


class TraceWriter:
    """Append-only writer: one JSON line per event, flushed per event.

    ``seq`` is assigned per run when the caller leaves it out, continuing after the events already in
    the file. Reopening an existing file appends; a truncated last line left by a crashed writer is
    terminated first so the next event starts on its own line (the reader skips and reports the broken
    one). A reader may read the file at any time.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._seq: dict[str, int] = {}
        needs_newline = False
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                needs_newline = fh.read(1) != b"\n"
            self._seq = _last_seqs(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        if needs_newline:
            self._fh.write("\n")
            self._fh.flush()

    def write(self, event: Event | None = None, /, **fields) -> Event:
        """Write an event object, or build one from ``fields`` (must include ``type`` and ``run_id``)."""
        if event is None:
            fields.setdefault("v", SCHEMA_VERSION)
            fields.setdefault("seq", self._seq.get(fields.get("run_id", ""), 0))
            fields.setdefault("ts", time.time())
            event = parse_event(fields)
        self._seq[event.run_id] = max(self._seq.get(event.run_id, 0), event.seq + 1)
        self._fh.write(to_json(event) + "\n")
        self._fh.flush()
        return event

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
