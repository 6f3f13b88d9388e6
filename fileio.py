"""Atomic output: write to a temporary sibling, then rename into place."""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


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
    finally:
        Path(tmp).unlink(missing_ok=True)


def default_cache_dir() -> Path:
    """Where caches live (embeddings, LLM judge replies): ``$BRANCHGATE_CACHE`` (when set and not empty), else
    ``~/.cache/branchgate``. ``$BRANCHGATE_CACHE`` naming a file, or a path under one, is an ``InputError``."""
    from branchgate.errors import InputError

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
    from branchgate.errors import InputError

    moves = {Path(t): (None if s is None else Path(s)) for t, s in moves.items()}
    for target in moves:
        if os.path.lexists(target) and not target.is_file():
            raise InputError("exists and is not a file; nothing was replaced", file=str(target))
    done = []  # (target, its old file set aside or None, whether the new file is in place)
    try:
        for target, new in moves.items():
            aside = None
            if os.path.lexists(target):
                aside = target.with_name(f".{target.name}.{os.urandom(6).hex()}.old")
                os.replace(target, aside)
            done.append((target, aside, False))
            if new is not None:
                os.replace(new, target)
                done[-1] = (target, aside, True)
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


@contextmanager
def atomic_dir(path: str | Path, kind: str | None = None):
    """Yield a temporary directory that replaces ``path`` only if the block succeeds.

    ``kind`` (the command, e.g. "dataset build"): ``path`` must pass ``check_output_dir`` for it, and the new
    folder gets its ``OUTPUT_MARK``. A ``path`` that exists and is not a folder is refused either way.

    Replacing an existing folder takes two renames (old aside, new in). Should the process die between them,
    ``path`` is missing and ``.<name>.old`` holds the previous output: the next ``atomic_dir(path)`` (or
    ``recover_dir(path)``) puts it back first, and an exception between them puts it back at once."""
    path = Path(path)
    recover_dir(path)
    if kind:
        check_output_dir(path, (), kind)
    else:
        _refuse_non_folder(path)
    old = path.with_name(f".{path.name}.old")
    if old.is_symlink() or (old.exists() and not old.is_dir()):
        from branchgate.errors import InputError

        raise InputError(f"is in the way of replacing {path} (not a folder this command left); move it away", str(old))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    moved = False
    try:
        yield tmp
        if kind:
            mark_output_dir(tmp, kind)
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            moved = True
            os.replace(tmp, path)
            moved = False
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        if moved and not path.exists():
            os.replace(old, path)  # the previous output stays in place
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def recover_dir(path: str | Path) -> bool:
    """Put back the previous output of an ``atomic_dir`` that died between its two renames; True if it did."""
    path = Path(path)
    old = path.with_name(f".{path.name}.old")
    if not path.exists() and not path.is_symlink() and old.is_dir() and not old.is_symlink():
        os.replace(old, path)
        return True
    return False


# -- which folders a command may write ----------------------------------------------------------------------
OUTPUT_MARK = ".branchgate.json"  # {"command": KIND, "created_by": ...}: in every folder a command writes
MAX_MARK_BYTES = 1 << 20

# Folders written before the mark existed, recognised by a file only that command writes there.
_LEGACY_MARKS = {
    "dataset build": ("dataset_dict.json",),
    "env build": ("passages.jsonl.gz",),
    "simulate": ("simulate.json",),
    "bench": ("report.json", "simulate/started.json"),
    "quickstart": ("traces/simulate.json",),
    "train": ("controller.safetensors",),
}


def check_output_dir(out: str | Path, inputs=(), kind: str = "", in_place: bool = False) -> Path:
    """Refuse an output folder ``kind`` (the command) may not write, before any work; returns ``Path(out)``.

    Refused (``InputError`` naming the path): ``out`` equal to, inside or a parent of any of ``inputs``; an
    existing file; a non-empty folder no earlier ``kind`` wrote (``is_output_of``); a folder that cannot be
    created or written where the command writes (``out``'s parent, which takes the temporary sibling of an
    ``atomic_dir``, or with ``in_place`` ``out`` itself). Nothing is created or changed here."""
    from branchgate.errors import InputError

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
    if out.is_dir() and not is_output_of(out, kind) and _has_files(out):
        raise InputError(
            f"is a folder with files that `branchgate {kind}` did not write (no {OUTPUT_MARK}); "
            "choose a new or empty folder",
            str(out),
        )
    target = out if in_place and out.is_dir() else out.parent
    while not target.exists() and not target.is_symlink() and target != target.parent:
        target = target.parent
    if not target.is_dir():
        raise InputError(f"cannot be created: {target} is not a folder", str(out))
    if not os.access(target, os.W_OK | os.X_OK):
        raise InputError(f"cannot be written: {target} is read-only (permission denied)", str(out))
    return out


def is_output_of(folder: str | Path, kind: str) -> bool:
    """Whether ``folder`` holds an earlier output of the command ``kind``: its ``OUTPUT_MARK`` says so (or, for
    folders written before the mark, a file only that command writes there)."""
    folder = Path(folder)
    mark = folder / OUTPUT_MARK
    if mark.is_file():
        try:
            if mark.stat().st_size <= MAX_MARK_BYTES:
                return json.loads(mark.read_bytes()).get("command") == kind
        except (OSError, ValueError, AttributeError):
            pass
        return False
    if kind == "evaluate":  # metrics.json and its plots, nothing else (a training run has them too)
        names = [p.name for p in folder.iterdir()]
        return "metrics.json" in names and all(n == "metrics.json" or n.endswith(".png") for n in names)
    if kind == "dataset build" and [p.name for p in folder.iterdir()] == ["manifest.json"]:
        return _nothing_parsed_manifest(folder / "manifest.json")
    return any((folder / name).is_file() for name in _LEGACY_MARKS.get(kind, ()))


def mark_output_dir(folder: str | Path, kind: str) -> None:
    """Record in ``folder`` that the command ``kind`` wrote it (``OUTPUT_MARK``)."""
    from branchgate import __version__

    atomic_write_json(Path(folder) / OUTPUT_MARK, {"command": kind, "created_by": f"branchgate {__version__}"})


def _refuse_non_folder(path: Path) -> None:
    from branchgate.errors import InputError

    if (path.exists() or path.is_symlink()) and not path.is_dir():
        raise InputError("is an existing file (or a link to one), not a folder: refusing to replace it", str(path))


def _has_files(folder: Path) -> bool:
    """Whether anything but empty folders is under ``folder`` (stops at the first)."""
    return any(not p.is_dir() or p.is_symlink() for p in folder.rglob("*"))


def _nothing_parsed_manifest(path: Path) -> bool:
    """A ``dataset build`` manifest recording that nothing was parsed (written alone into its folder)."""
    try:
        if path.stat().st_size > MAX_MARK_BYTES:
            return False
        m = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return (
        isinstance(m, dict)
        and m.get("error") == "nothing parsed"
        and str(m.get("created_by", "")).startswith("branchgate")
    )


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
    from branchgate.errors import InputError

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
    from branchgate.errors import InputError

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
    from branchgate.errors import InputError

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
    from branchgate.errors import InputError

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
