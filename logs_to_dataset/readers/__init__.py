"""Readers: turn agent log files into canonical runs, one registered reader per log format.

A reader is a class in ``READERS`` (its ``name`` is its format) that has

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
``gptr`` (GPT-Researcher ``outputs/task_*.json``), ``openinference`` (OpenInference / OpenTelemetry spans:
OTLP JSON, Phoenix span exports).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from branchgate.errors import InputError
from branchgate.logs_to_dataset.readers.canonical import CanonicalReader
from branchgate.logs_to_dataset.readers.gptr import GPTResearcherReader
from branchgate.logs_to_dataset.readers.openinference import OpenInferenceReader
from branchgate.logs_to_dataset.readers.searcho1 import SearchO1Reader
from branchgate.logs_to_dataset.traces import ReadReport, Run  # noqa: F401  (Run: importable from here)

# Detection order: openinference first (its span files are JSON lines that would otherwise pass for canonical
# traces), then the rest.
READERS: dict[str, object] = {
    r.name: r for r in (OpenInferenceReader(), CanonicalReader(), SearchO1Reader(), GPTResearcherReader())
}


def get_reader(name: str):
    try:
        return READERS[name]
    except KeyError:
        raise InputError(f"unknown trace format {name!r}; known: {', '.join(READERS)}") from None


def companions(reader, path: Path) -> list[Path]:
    fn = getattr(reader, "companions", None)
    return list(fn(path)) if fn else []


def _walk(path: Path, report: ReadReport) -> list[Path]:
    """The files under ``path``; a symlink that loops or points nowhere is listed in ``report.skipped``."""
    if path.is_file():
        return [path]
    if not path.exists():
        raise InputError("no such file or directory", str(path))
    out = []
    for p in sorted(path.rglob("*")):
        if any(part.startswith(".") for part in p.relative_to(path).parts):
            continue
        if p.is_file():
            out.append(p)
        elif p.is_symlink() and not p.exists():
            report.skip(p, None, "symlink that loops or points to nothing (skipped)")
    return out


def _detect(reader, path: Path, report: ReadReport, strict: bool) -> bool | None:
    """``reader.detect(path)``; None when the file cannot be read (listed in ``report.skipped``). A peek that
    fails on the file's content (JSON too deep or too large to decode) does not claim the file."""
    try:
        return bool(reader.detect(path))
    except OSError as exc:
        report.skip(path, None, f"cannot read ({exc.strerror or exc})", strict)
        return None
    except (ValueError, RecursionError):
        return False


def discover(
    paths: Iterable[str | Path], fmt: str | None = None, report: ReadReport | None = None, strict: bool = False
) -> list[tuple[Path, object]]:
    """(file, reader) pairs to read, in a stable order; unrecognised files go to ``report.ignored``, files
    that cannot be opened (permission denied) and looping symlinks to ``report.skipped``."""
    report = report if report is not None else ReadReport()
    forced = get_reader(fmt) if fmt else None
    chosen: list[tuple[Path, object]] = []
    claimed: set[Path] = set()
    unknown: list[Path] = []
    for root in paths:
        root = Path(root)
        explicit = root.is_file()
        for f in _walk(root, report):
            if not _readable(f):
                report.skip(f, None, "cannot read (permission denied or not a regular file)", strict)
                continue
            reader, hit = None, None
            for r in [forced] if forced is not None else READERS.values():
                hit = True if (forced is not None and explicit) else _detect(r, f, report, strict)
                if hit:
                    reader = r
                    break
                if hit is None:  # unreadable: already listed in report.skipped
                    break
            if hit is None:
                continue
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


def _readable(path: Path) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def input_files(found: list[tuple[Path, object]]) -> list[Path]:
    """Every file the readers will consume (traces and their companions), sorted, for hashing."""
    files = {f.resolve() for f, _ in found}
    for f, reader in found:
        files.update(p.resolve() for p in companions(reader, f) if p.exists() and _readable(p))
    return sorted(files)


def read_runs(
    paths: Iterable[str | Path], fmt: str | None = None, strict: bool = False, report: ReadReport | None = None
) -> Iterator[Run]:
    """Every run in ``paths`` (files or directories), auto-detecting each file's format."""
    report = report if report is not None else ReadReport()
    for f, reader in discover(paths, fmt, report, strict):
        yield from read_file(f, reader, strict, report)


def read_file(path: Path, reader, strict: bool, report: ReadReport) -> Iterator[Run]:
    report.files += 1
    report.formats[reader.name] += 1
    try:
        report.bytes += path.stat().st_size + sum(p.stat().st_size for p in companions(reader, path) if p.exists())
    except OSError:
        pass
    try:
        for run in reader.read(path, strict, report):
            run.format = run.format or reader.name
            report.runs += 1
            yield run
    except OSError as exc:  # a file (or companion) that vanished or cannot be read mid-way
        report.skip(getattr(exc, "filename", None) or path, None, f"cannot read ({exc.strerror or exc})", strict)
