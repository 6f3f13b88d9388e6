"""Readers: turn agent log files into canonical runs, one registered reader per log format.

A reader is a class registered with ``@register("name")`` that has

- ``detect(path: Path) -> bool`` — does this *file* look like my format (cheap: name, a peek);
- ``read(path: Path, strict: bool, report: ReadReport) -> Iterator[Run]`` — the canonical events of
  each run in the file; bad records go to ``report`` (or raise ``InputError`` under ``strict``), and
  what the format cannot express is counted in ``report.warnings``, never invented;
- optionally ``companions(path) -> list[Path]``: other files ``read`` consumes for this one (they are
  hashed into ``source_sha256`` and not offered to other readers).

``discover(paths, fmt)`` expands directories (recursively, sorted, hidden files skipped) and picks, per
file, the first reader whose ``detect`` is true; ``fmt`` forces one reader (explicitly named files are
then read with it even when ``detect`` says no). Files nobody recognises are listed in
``report.ignored``. Formats: ``canonical`` (``*.jsonl``), ``searcho1`` (``<qid>.a`` + ``<qid>.q``),
``gptr`` (GPT-Researcher ``outputs/task_*.json``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from branchgate.errors import InputError
from branchgate.logs_to_dataset.schema import Event
from branchgate.logs_to_dataset.traces import ReadReport

READERS: dict[str, object] = {}


@dataclass
class Run:
    """One run's canonical events, in ``seq`` order, and the file they came from."""

    run_id: str
    events: list[Event]
    file: str
    format: str = ""
    warnings: list[str] = field(default_factory=list)


def register(name: str):
    """Class decorator: register a reader under ``name`` (detection order = registration order)."""

    def deco(cls):
        reader = cls()
        reader.name = name
        READERS[name] = reader
        return cls

    return deco


def get_reader(name: str):
    try:
        return READERS[name]
    except KeyError:
        raise InputError(f"unknown trace format {name!r}; known: {', '.join(READERS)}") from None


def companions(reader, path: Path) -> list[Path]:
    fn = getattr(reader, "companions", None)
    return list(fn(path)) if fn else []


def _walk(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.exists():
        raise InputError("no such file or directory", str(path))
    return sorted(p for p in path.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(path).parts))


def discover(paths: Iterable[str | Path], fmt: str | None = None,
             report: ReadReport | None = None) -> list[tuple[Path, object]]:
    """(file, reader) pairs to read, in a stable order; unrecognised files go to ``report.ignored``."""
    report = report if report is not None else ReadReport()
    forced = get_reader(fmt) if fmt else None
    chosen: list[tuple[Path, object]] = []
    claimed: set[Path] = set()
    unknown: list[Path] = []
    for root in paths:
        root = Path(root)
        explicit = root.is_file()
        for f in _walk(root):
            if forced is not None:
                reader = forced if (explicit or forced.detect(f)) else None
            else:
                reader = next((r for r in READERS.values() if r.detect(f)), None)
            if reader is None:
                unknown.append(f)
                continue
            chosen.append((f, reader))
            claimed.update(p.resolve() for p in companions(reader, f))
    seen: set[Path] = set()
    out = []
    for f, reader in chosen:
        key = f.resolve()
        if key in seen:
            continue
        seen.add(key)
        out.append((f, reader))
    report.ignored.extend(str(f) for f in unknown if f.resolve() not in claimed and f.resolve() not in seen)
    return out


def input_files(found: list[tuple[Path, object]]) -> list[Path]:
    """Every file the readers will consume (traces and their companions), sorted, for hashing."""
    files = {f.resolve() for f, _ in found}
    for f, reader in found:
        files.update(p.resolve() for p in companions(reader, f) if p.exists())
    return sorted(files)


def read_runs(paths: Iterable[str | Path], fmt: str | None = None, strict: bool = False,
              report: ReadReport | None = None) -> Iterator[Run]:
    """Every run in ``paths`` (files or directories), auto-detecting each file's format."""
    report = report if report is not None else ReadReport()
    for f, reader in discover(paths, fmt, report):
        yield from read_file(f, reader, strict, report)


def read_file(path: Path, reader, strict: bool, report: ReadReport) -> Iterator[Run]:
    report.files += 1
    report.formats[reader.name] += 1
    try:
        report.bytes += path.stat().st_size + sum(p.stat().st_size for p in companions(reader, path) if p.exists())
    except OSError:
        pass
    for run in reader.read(path, strict, report):
        run.format = run.format or reader.name
        report.runs += 1
        yield run


# Registration order is detection order.
from branchgate.logs_to_dataset.readers import canonical, searcho1, gptr  # noqa: E402,F401
