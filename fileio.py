"""Atomic output (write to a temporary sibling, then rename into place) and the output-folder rule: branchgate
never deletes or replaces a file it did not write, at any path (``check_output_dir``, see below); bounded reads
of users' files and the one JSON loader.

Over 400 lines: the output-folder rule records what the atomic writers here write, so both live in one module;
the bounded readers could move to a module of their own."""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from branchgate import __version__
from branchgate.errors import InputError

log = logging.getLogger(__name__)


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp"):
    """Yield a temporary sibling path for any writer (text, torch.save, savefig, a trace writer); it replaces
    ``path`` only if the block succeeds, with the permissions a plain ``open`` would give (umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
        record_written(path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def default_cache_dir() -> Path:
    """Where caches live (embeddings, LLM judge replies): ``$BRANCHGATE_CACHE`` (when set and not empty), else
    ``~/.cache/branchgate``. ``$BRANCHGATE_CACHE`` naming a file, or a path under one, is an ``InputError``."""
    given = os.environ.get("BRANCHGATE_CACHE")
    folder = Path(given) if given else Path.home() / ".cache" / "branchgate"
    up = folder
    while not up.exists() and up != up.parent:
        up = up.parent
    if given and not up.is_dir():
        raise InputError(f"must name a folder for branchgate's caches, but {up} is a file", "BRANCHGATE_CACHE")
    return folder


def atomic_write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: str | Path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def replace_files(moves: dict) -> None:
    """Replace a set of files whole or not at all: ``{target: new file}`` (a new file on the target's filesystem;
    None: remove the target). A target that exists and is not a file is an ``InputError`` before anything moves.
    Existing targets are renamed aside (``.NAME.*.old`` beside them) before the new files go in; if a step
    fails, the new files go back where they came from and the old ones back in place, then the error propagates;
    on success the old ones are deleted. (A process killed midway leaves the old files as those ``.old`` siblings.)"""
    moves = {Path(t): (None if s is None else Path(s)) for t, s in moves.items()}
    for target in moves:
        if os.path.lexists(target) and not target.is_file():
            raise InputError("exists and is not a file; nothing was replaced", file=str(target))
    done = []  # (target, its old file set aside or None, whether the new file is in place)
    try:
        for target, new in moves.items():
            aside = None
            if os.path.lexists(target):
                aside = target.with_name(f".{target.name}.{os.urandom(8).hex()}.old")
                if os.path.lexists(aside):  # never over anything, however unlikely the name
                    raise FileExistsError(17, "exists", str(aside))
                os.replace(target, aside)
            done.append((target, aside, False))
            if new is not None:
                os.replace(new, target)
                done[-1] = (target, aside, True)
                record_written(target)
    except BaseException:
        for target, aside, placed in reversed(done):
            try:
                if placed:
                    os.replace(target, moves[target])  # the new file back where it came from
                if aside is not None:
                    os.replace(aside, target)
            except OSError:  # one step failing must not stop the others; the old file stays aside
                pass
        raise
    for _, aside, _ in done:
        if aside is not None:
            Path(aside).unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- output folders: branchgate never deletes or replaces a file it did not write ------------------------------
# The one rule, for every command that writes (``--out``). A folder a command writes holds OUTPUT_MARK, the
# manifest of exactly what it wrote: each file's size and sha256, its folders, and the outputs of other commands
# nested in it. While a command writes in a folder (``claim_output_dir`` until ``mark_output_dir``) OUTPUT_JOURNAL
# beside the manifest lists each file written so far (``atomic_path`` and ``replace_files`` record them, from any
# process), so an interrupted run can resume. A command may write into a folder that is absent, empty, or its own
# earlier output whose every entry the manifest (or journal) lists, unchanged; anything else (a user's file, a
# folder it did not make, a link, a changed file, another command's output) is refused before any work, naming
# the paths (``check_output_dir``). A folder replaced whole (``atomic_dir``) is staged in a new folder beside it
# and swapped in; the previous output goes to a new folder of its own and is deleted only once it is checked
# again to hold nothing but what branchgate wrote. Files of an export are checked the same way, one by one,
# against the export's own record (``check_file_set``).
OUTPUT_MARK = ".branchgate.json"
OUTPUT_JOURNAL = ".branchgate.journal"
MAX_MARK_BYTES = 64 << 20  # a manifest or journal longer than this is not read (its folder is refused)
MAX_OUTPUT_ENTRIES = 1_000_000  # entries checked under one output folder; a folder with more is refused
_SHOWN = 5  # paths named in a refusal
_HASH_CHUNK = 1 << 20


@dataclass
class _Record:
    """What branchgate recorded writing in one folder (its manifest plus, while open, its journal)."""

    command: str
    files: dict = field(default_factory=dict)  # relative POSIX path -> [size, sha256]
    dirs: set = field(default_factory=set)
    outputs: dict = field(default_factory=dict)  # relative path of a nested output folder -> its command
    open: bool = False  # a command is writing here (or was, and was interrupted)


def check_output_dir(out: str | Path, inputs=(), kind: str = "", in_place: bool = False) -> Path:
    """Refuse an output folder ``kind`` (the command) may not write, before any work; returns ``Path(out)``.

    Refused (``InputError`` naming the path): ``out`` equal to, inside or a parent of any of ``inputs``; an
    existing file; a folder holding anything ``kind`` did not write there (``output_problems``); a folder that
    cannot be created or written where the command writes (``out``'s parent, which takes the staging folder of
    an ``atomic_dir``, or with ``in_place`` ``out`` itself). Nothing is created or changed here."""
    out = Path(out)
    real = Path(os.path.realpath(out))
    for given in inputs:
        if given is None or str(given) == "":
            continue
        inp = Path(os.path.realpath(given))
        how = (
            "is" if inp == real else "is inside" if inp in real.parents else "contains" if real in inp.parents else None
        )
        if how:
            raise InputError(f"{how} the input {given}; an output folder must lie apart from every input", str(out))
    _refuse_non_folder(out)
    if out.is_dir():
        _refuse_foreign(out, kind)
    _check_writable(out if in_place and out.is_dir() else out.parent, str(out))
    return out


def output_problems(folder: str | Path, kind: str) -> list[str]:
    """Why ``kind`` may not write into the existing folder ``folder`` (empty: it may): each entry that its
    manifest does not list as written by ``kind`` and unchanged since, as ``"PATH (why)"``."""
    folder = Path(folder)
    try:
        with os.scandir(folder) as it:
            names = sorted(e.name for _, e in zip(range(_SHOWN + 1), it, strict=False))
    except OSError as exc:
        return [f"{folder} (cannot be listed: {exc.strerror or exc})"]
    if not names:
        return []
    rec = _read_record(folder)
    if rec is None:
        shown = ", ".join(names[:_SHOWN]) + (", …" if len(names) > _SHOWN else "")
        return [f"{shown} (no {OUTPUT_MARK} here: no branchgate command wrote this folder)"]
    if rec.command != kind:
        return [f"{OUTPUT_MARK} (this folder is the output of `branchgate {rec.command}`)"]
    return _foreign(folder, rec, "", [MAX_OUTPUT_ENTRIES])


def is_output_of(folder: str | Path, kind: str) -> bool:
    """Whether ``folder`` is an output folder of the command ``kind`` (its manifest says so)."""
    rec = _read_record(Path(folder))
    return rec is not None and rec.command == kind


def claim_output_dir(out: str | Path, kind: str) -> Path:
    """Start writing into ``out`` (checked by ``check_output_dir``) in place: create it, open its journal and
    manifest (keeping what an earlier run of ``kind`` recorded there), and record it in the output folder it lies
    in, if any. ``mark_output_dir`` closes it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rec = _read_record(out)
    if rec is None or rec.command != kind:
        rec = _Record(kind)
    with open(out / OUTPUT_JOURNAL, "a", encoding="utf-8"):
        pass
    _write_mark(out, rec, complete=False)
    _record_output(out, kind)
    return out


def mark_output_dir(folder: str | Path, kind: str) -> None:
    """Close ``folder``, which ``kind`` has written: its manifest lists every file now in it (size, sha256),
    its folders and the nested outputs of other commands; the journal goes; the output folder it lies in, if
    any, records it."""
    folder = Path(folder)
    _write_mark(folder, _inventory(folder, kind), complete=True)
    (folder / OUTPUT_JOURNAL).unlink(missing_ok=True)
    _record_output(folder, kind)


@contextmanager
def atomic_dir(path: str | Path, kind: str | None = None):
    """Yield a new staging folder (beside ``path``) that replaces ``path`` whole only if the block succeeds.

    ``kind`` (the command, e.g. "dataset build"): ``path`` must pass ``check_output_dir`` for it, before and
    again after the block (anything added meanwhile stops it: nothing is replaced); the new folder gets its
    manifest; the previous output is set aside in a new folder and deleted only if it still holds nothing but
    what ``kind`` wrote (else it stays there, with a warning). Without ``kind`` (a cache's folder) the previous
    folder is replaced whole. A ``path`` that exists and is not a folder is refused either way. The staging
    folder is removed on any failure; it is the only folder this removes unchecked (it made it)."""
    path = Path(path)
    if kind:
        check_output_dir(path, (), kind)
    else:
        _refuse_non_folder(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        if kind:
            with open(tmp / OUTPUT_JOURNAL, "a", encoding="utf-8"):
                pass
            _write_mark(tmp, _Record(kind), complete=False)
        yield tmp
        if kind:
            _write_mark(tmp, _inventory(tmp, kind), complete=True)
            (tmp / OUTPUT_JOURNAL).unlink(missing_ok=True)
            check_output_dir(path, (), kind)  # nothing of the user's appeared there while the block ran
        _swap_in(tmp, path, kind)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if kind:
        _record_output(path, kind)


def check_file_set(targets, record: str | Path, kind: str, name: str = "--out") -> None:
    """Refuse, before any work, to write the files ``targets`` (one command's file set, e.g. an export's model,
    twin, tokenizer and card) unless each is absent or a regular file that ``record`` (the set's own manifest,
    written by ``write_file_set``) lists as written by ``kind`` and unchanged since; and unless their folder
    can be created and written. ``InputError`` names the file."""
    record = Path(record)
    listed = _read_file_record(record, kind)
    if listed is None:
        raise InputError(
            f"exists and `branchgate {kind}` did not write it: move it away, or choose another {name}", str(record)
        )
    for target in map(Path, targets):
        if not os.path.lexists(target):
            continue
        if target.is_symlink() or not target.is_file():
            raise InputError("exists and is not a file: refusing to replace it", str(target))
        digest = listed.get(target.name)
        if digest is None or not _same(target, digest):
            raise InputError(
                f"exists and `branchgate {kind}` did not write it (or it changed since; {record.name} lists what it "
                f"wrote). branchgate never replaces a file it did not write: choose another {name}, or move the "
                "file away yourself",
                str(target),
            )
    folder = record.parent
    if os.path.lexists(folder) and not folder.is_dir():
        raise InputError(f"cannot be created: {folder} is not a folder", str(record.parent))
    _check_writable(folder, str(folder))


def write_file_set(moves: dict, record: str | Path, kind: str, name: str = "--out") -> None:
    """Move a checked file set into place (``replace_files``: ``{target: new file or None}``) once
    ``check_file_set`` passes again, then record in ``record`` what is now ``kind``'s."""
    record = Path(record)
    check_file_set(list(moves), record, kind, name)
    listed = _read_file_record(record, kind) or {}
    try:
        replace_files(moves)
    except OSError as exc:
        raise InputError(f"cannot write the files ({exc.strerror or exc}); the previous ones are kept", name) from None
    for target, new in moves.items():
        listed[Path(target).name] = None if new is None else _digest(Path(target))
    listed = {k: v for k, v in listed.items() if v is not None and (record.parent / k).is_file()}
    atomic_write_json(record, {"command": kind, "created_by": f"branchgate {__version__}", "files": listed})


def record_written(path: str | Path) -> None:
    """Note in the journal of the output folder being written that holds ``path`` (if any) that branchgate
    wrote it, as it is now. Best effort: an unrecorded file makes a later run refuse, never delete."""
    path = Path(path)
    if path.name in (OUTPUT_MARK, OUTPUT_JOURNAL):
        return
    try:
        real = Path(os.path.realpath(path.parent)) / path.name
        folder = _enclosing_output(real.parent)
        if folder is not None and _is_open(folder):
            size, sha = _digest(real)
            _append_journal(folder, {"file": real.relative_to(folder).as_posix(), "size": size, "sha256": sha})
    except (OSError, ValueError):
        pass


def _refuse_foreign(out: Path, kind: str) -> None:
    problems = output_problems(out, kind)
    if problems:
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        raise InputError(
            f"holds what `branchgate {kind}` did not write: {'; '.join(problems[:_SHOWN])}{more}. branchgate never "
            "deletes or replaces a file it did not write: choose a new or empty folder, or move those away yourself",
            str(out),
        )


def _check_writable(target: Path, where: str) -> None:
    """``target``, or its nearest existing parent, is a folder this process may create files in."""
    while not target.exists() and not target.is_symlink() and target != target.parent:
        target = target.parent
    if not target.is_dir():
        raise InputError(f"cannot be created: {target} is not a folder", where)
    if not os.access(target, os.W_OK | os.X_OK):
        raise InputError(f"cannot be written: {target} is read-only (permission denied)", where)


def _foreign(folder: Path, rec: _Record, prefix: str, budget: list) -> list[str]:
    """Every entry under ``folder`` that ``rec`` does not list unchanged (nested outputs checked against their
    own manifests); ``budget`` bounds the entries visited across the recursion."""
    found: list[str] = []
    stack = [""]
    while stack and len(found) <= 100:
        sub = stack.pop()
        try:
            with os.scandir(folder / sub if sub else folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            found.append(f"{prefix}{sub}/ (cannot be listed: {exc.strerror or exc})")
            continue
        if sub and not entries and sub not in rec.dirs and not rec.open:
            found.append(f"{prefix}{sub}/ (a folder branchgate did not make)")
        for e in entries:
            budget[0] -= 1
            if budget[0] < 0:
                return [*found, f"{prefix or '.'} (more than {MAX_OUTPUT_ENTRIES:,} entries: not checked)"]
            rel = f"{sub}/{e.name}" if sub else e.name
            shown = prefix + rel
            if not sub and (e.name == OUTPUT_MARK or (e.name == OUTPUT_JOURNAL and rec.open)):
                continue  # the manifest (read as ``rec``); the journal only while the manifest says it is open
            if e.is_symlink():
                found.append(f"{shown} (a link branchgate did not make)")
            elif e.is_dir():
                inner = Path(e.path)
                if os.path.lexists(inner / OUTPUT_MARK):
                    nested = _read_record(inner)
                    if nested is None or rec.outputs.get(rel) != nested.command:
                        found.append(f"{shown}/ (an output folder not recorded here)")
                    else:
                        found += _foreign(inner, nested, f"{shown}/", budget)
                else:
                    stack.append(rel)
            elif e.is_file():
                digest = rec.files.get(rel)
                if digest is None:
                    found.append(f"{shown} (not written by branchgate)")
                elif not _same(Path(e.path), digest):
                    found.append(f"{shown} (changed since branchgate wrote it)")
            else:
                found.append(f"{shown} (not a regular file)")
    return found


def _inventory(folder: Path, kind: str) -> _Record:
    """Everything now in ``folder`` (written by ``kind``) as a record: files with size and sha256, folders,
    nested output folders by their command. Links are not recorded (branchgate makes none)."""
    rec = _Record(kind)
    stack = [""]
    budget = MAX_OUTPUT_ENTRIES
    while stack and budget > 0:
        sub = stack.pop()
        with os.scandir(folder / sub if sub else folder) as it:
            entries = list(it)
        for e in entries:
            budget -= 1
            rel = f"{sub}/{e.name}" if sub else e.name
            if (not sub and e.name in (OUTPUT_MARK, OUTPUT_JOURNAL)) or e.is_symlink():
                continue
            if e.is_dir():
                nested = _read_record(Path(e.path)) if os.path.lexists(Path(e.path) / OUTPUT_MARK) else None
                if nested is not None:
                    rec.outputs[rel] = nested.command
                else:
                    rec.dirs.add(rel)
                    stack.append(rel)
            elif e.is_file():
                rec.files[rel] = _digest(Path(e.path))
    return rec


def _read_record(folder: Path) -> _Record | None:
    """``folder``'s manifest (plus its journal while open), or None when it has none or it cannot be read."""
    m = _read_mark(folder)
    if m is None:
        return None
    files, dirs, outputs = (m.get(k) for k in ("files", "dirs", "outputs"))
    rec = _Record(
        m["command"],
        {k: v for k, v in files.items() if _rel_ok(k) and _digest_ok(v)} if isinstance(files, dict) else {},
        {d for d in dirs if _rel_ok(d)} if isinstance(dirs, list) else set(),
        {k: v for k, v in outputs.items() if _rel_ok(k) and isinstance(v, str)} if isinstance(outputs, dict) else {},
    )
    journal = folder / OUTPUT_JOURNAL
    if m.get("complete") is False and journal.is_file() and not journal.is_symlink():
        rec.open = True
        try:
            lines = read_bounded(journal, str(journal), MAX_MARK_BYTES).splitlines()
        except Exception:  # noqa: BLE001 - an unreadable journal records nothing: its files are refused, not lost
            lines = []
        for line in lines:
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if not isinstance(j, dict):
                continue
            if _rel_ok(j.get("file")) and _digest_ok([j.get("size"), j.get("sha256")]):
                rec.files[j["file"]] = [j["size"], j["sha256"]]
            elif _rel_ok(j.get("output")) and isinstance(j.get("command"), str):
                rec.outputs[j["output"]] = j["command"]
    return rec


def _read_mark(folder: Path) -> dict | None:
    """``folder``'s manifest as a dict with a ``command``, or None (none, unreadable, not a manifest)."""
    mark = folder / OUTPUT_MARK
    try:
        if mark.is_symlink() or not mark.is_file() or mark.stat().st_size > MAX_MARK_BYTES:
            return None
        m = json.loads(mark.read_bytes())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("command"), str) else None


def _read_file_record(record: Path, kind: str) -> dict | None:
    """The files (name -> digest) a file set's ``record`` lists: {} when it does not exist, None when it is not
    a record of ``kind``."""
    if not os.path.lexists(record):
        return {}
    try:
        if record.is_symlink() or not record.is_file() or record.stat().st_size > MAX_MARK_BYTES:
            return None
        m = json.loads(record.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("command") != kind or not isinstance(m.get("files"), dict):
        return None
    return {k: v for k, v in m["files"].items() if isinstance(k, str) and "/" not in k and _digest_ok(v)}


def _write_mark(folder: Path, rec: _Record, complete: bool) -> None:
    atomic_write_json(
        folder / OUTPUT_MARK,
        {
            "command": rec.command,
            "created_by": f"branchgate {__version__}",
            "complete": complete,
            "files": dict(sorted(rec.files.items())),
            "dirs": sorted(rec.dirs),
            "outputs": dict(sorted(rec.outputs.items())),
        },
    )


def _record_output(folder: Path, kind: str) -> None:
    """Record ``folder`` (``kind``'s output) in the output folder it lies in, if any: in its journal while that
    one is open, else in its manifest."""
    real = Path(os.path.realpath(folder))
    parent = _enclosing_output(real.parent)
    if parent is None:
        return
    rel = real.relative_to(parent).as_posix()
    if _is_open(parent):
        _append_journal(parent, {"output": rel, "command": kind})
        return
    rec = _read_record(parent)
    if rec is not None and rec.outputs.get(rel) != kind:
        rec.outputs[rel] = kind
        rec.dirs.discard(rel)
        _write_mark(parent, rec, complete=True)


def _is_open(folder: Path) -> bool:
    """Whether a command is writing in the output folder ``folder`` (its manifest says so, its journal is there)."""
    m = _read_mark(folder)
    journal = folder / OUTPUT_JOURNAL
    return m is not None and m.get("complete") is False and journal.is_file() and not journal.is_symlink()


def _enclosing_output(start: Path) -> Path | None:
    """The nearest of ``start`` and its parents that holds an output manifest."""
    for folder in (start, *start.parents):
        if (folder / OUTPUT_MARK).is_file():
            return folder
    return None


def _append_journal(folder: Path, entry: dict) -> None:
    with open(folder / OUTPUT_JOURNAL, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, ensure_ascii=False) + "\n")  # one short append: whole even across processes


def _swap_in(tmp: Path, path: Path, kind: str | None) -> None:
    """Put the staging folder ``tmp`` at ``path``; a previous folder there goes aside, then (``_remove_previous``)."""
    if not (path.is_dir() and any(path.iterdir())):
        os.replace(tmp, path)  # absent, or an empty folder
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
    os.replace(path, aside)  # onto the empty folder just made
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(aside, path)  # the previous output back in place
        raise
    _remove_previous(aside, kind)


def _remove_previous(aside: Path, kind: str | None) -> None:
    """Delete the previous output set aside at ``aside`` if it holds only what ``kind`` wrote (without ``kind``,
    a cache's folder: whole); else keep it there and say so."""
    problems = output_problems(aside, kind) if kind else []
    if problems:
        log.warning(
            "the previous output, moved to %s, holds what branchgate did not write (%s): it stays there",
            aside,
            "; ".join(problems[:_SHOWN]),
        )
        return
    shutil.rmtree(aside, ignore_errors=True)


def _refuse_non_folder(path: Path) -> None:
    if (path.exists() or path.is_symlink()) and not path.is_dir():
        raise InputError("is an existing file (or a link to one), not a folder: refusing to replace it", str(path))


def _digest(path: Path) -> list:
    """[size, sha256 hex] of a file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            size += len(chunk)
            h.update(chunk)
    return [size, h.hexdigest()]


def _same(path: Path, digest) -> bool:
    """Whether the file at ``path`` still has the recorded ``[size, sha256]``."""
    try:
        return path.stat().st_size == digest[0] and _digest(path) == list(digest)
    except OSError:
        return False


def _rel_ok(rel) -> bool:
    return isinstance(rel, str) and rel != "" and not rel.startswith("/") and ".." not in rel.split("/")


def _digest_ok(d) -> bool:
    return (
        isinstance(d, list)
        and len(d) == 2
        and isinstance(d[0], int)
        and not isinstance(d[0], bool)
        and isinstance(d[1], str)
        and len(d[1]) == 64
    )


@contextmanager
def locked(path: str | Path):
    """Hold an exclusive advisory lock for a read-modify-write of the file ``path``. The lock file lives in the
    cache folder (``default_cache_dir()/locks``), named by ``path``'s real location: nothing is left beside
    ``path``. Without advisory locks (not POSIX) the last writer wins."""
    key = hashlib.sha256(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    folder = default_cache_dir() / "locks"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fh = open(folder / f"{key}.lock", "a")  # noqa: SIM115 - held for the block
    except OSError as exc:
        raise InputError(f"cannot take a lock in {folder} ({exc.strerror or exc})", str(path)) from None
    with fh:
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:
            pass
        yield


# -- reading JSON from untrusted files -------------------------------------------------------------------
MAX_JSON_DEPTH = 100  # deeper documents are refused: they break pydantic dumps and recursive readers later
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


MAX_READ_BYTES = 256 << 20  # a file read whole (the gate's input, its run state): more is refused, not read
_READ_CHUNK = 1 << 20
_UTF_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def read_bounded(source, name: str, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of a file the user gave (a path, or an open stream such as stdin), read whole but never past
    ``limit``: a longer input (a device such as /dev/zero, the wrong file) is refused after ``limit`` bytes.
    Every failure is an ``InputError`` naming ``name``."""
    try:
        if hasattr(source, "read"):
            data = _read_at_most(source, limit)
        else:
            with open(source, "rb") as fh:
                data = _read_at_most(fh, limit)
    except IsADirectoryError:
        raise InputError("is a folder, not a file", name) from None
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", name) from None
    if len(data) > limit:
        raise InputError(f"longer than {limit:,} bytes (a device or the wrong file?): not read further", name)
    return data


def _read_at_most(fh, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``fh`` (a text stream's characters as UTF-8), in chunks."""
    out = bytearray()
    while len(out) <= limit:
        chunk = fh.read(_READ_CHUNK)
        if not chunk:
            break
        out += chunk.encode("utf-8", "surrogateescape") if isinstance(chunk, str) else chunk
    return bytes(out)


def wide_encoding(head: bytes) -> str | None:
    """ "UTF-16" or "UTF-32" when a file's first bytes are such text (a byte-order mark, or NUL in every other
    byte: ASCII as UTF-16), else None."""
    name = next((n for bom, n in _UTF_BOMS if head.startswith(bom)), None)
    if name is None and len(head) >= 4 and b"\x00" in head:
        even, odd = head[0::2], head[1::2]
        if (even.count(0) == len(even)) != (odd.count(0) == len(odd)):
            name = "UTF-16"
    return name


def decode_text(data: bytes, file: str | None = None, line: int | None = None) -> str:
    """``data`` as UTF-8 text (a leading UTF-8 byte-order mark dropped); UTF-16/32 text (a byte-order mark, or
    NUL in every other byte) or bytes that are not UTF-8 are an ``InputError`` naming ``file`` and the line."""
    name = wide_encoding(data[:8192])
    if name:
        raise InputError(f"{name} text, not UTF-8 (save it as UTF-8)", file, line)
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        at = line if line is not None else data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"not UTF-8 text (byte {exc.start})", file, at) from None


def load_json(text: str | bytes, file: str | None = None, line: int | None = None):
    """Parse one JSON document from a file the user gave: the one loader every reader and the gate CLI use.

    Every failure is an ``InputError`` naming ``file`` (and ``line``): invalid or truncated JSON, text that is
    not UTF-8, integers beyond Python's digit limit, nesting deeper than ``MAX_JSON_DEPTH`` (also raised for
    documents too deep for the parser itself). Lone surrogates (``"\\ud800"``, valid JSON escapes but not
    text) are replaced by U+FFFD, so every string loaded can be encoded as UTF-8 and hashed."""
    if isinstance(text, bytes):
        text = decode_text(text, file, line)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"invalid JSON ({exc.msg} at column {exc.colno})", file, line if line is not None else exc.lineno
        ) from None
    except RecursionError:
        raise InputError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", file, line) from None
    except ValueError as exc:  # e.g. an integer with more digits than int() converts
        raise InputError(f"invalid JSON value ({str(exc).split(';')[0][:120]})", file, line) from None
    deep = text.count("[") + text.count("{") > MAX_JSON_DEPTH
    if deep or _SURROGATE_ESCAPE.search(text):
        obj = _checked(obj, file, line)
    return obj


def _checked(obj, file, line):
    """``obj`` with lone surrogates replaced, refusing nesting deeper than ``MAX_JSON_DEPTH`` (iterative)."""

    def fix(s: str) -> str:
        return _LONE_SURROGATE.sub("\ufffd", s) if _has_surrogate(s) else s

    root = [obj]
    stack = [(root, 0, 0)]  # (container, key, depth of the value at container[key])
    while stack:
        holder, key, depth = stack.pop()
        value = holder[key]
        if isinstance(value, str):
            holder[key] = fix(value)
        elif isinstance(value, (list, dict)):
            if depth >= MAX_JSON_DEPTH:
                raise InputError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", file, line)
            if isinstance(value, list):
                stack.extend((value, i, depth + 1) for i in range(len(value)))
            else:
                if any(_has_surrogate(k) for k in value):
                    items = [(fix(k), v) for k, v in value.items()]
                    value.clear()
                    value.update(items)
                stack.extend((value, k, depth + 1) for k in value)
    return root[0]


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True
