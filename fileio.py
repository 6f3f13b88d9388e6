"""Atomic output: write to a temporary sibling, then rename into place."""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__"):  # the repository root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import json
import re
import os
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
    """Where caches live (embeddings, LLM judge replies): ``$BRANCHGATE_CACHE``, else ``~/.cache/branchgate``."""
    return Path(os.environ.get("BRANCHGATE_CACHE", Path.home() / ".cache" / "branchgate"))


def atomic_write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: str | Path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_dir(path: str | Path):
    """Yield a temporary directory that replaces ``path`` only if the block succeeds.

    Replacing an existing folder takes two renames (old aside, new in). Should the process die between them,
    ``path`` is missing and ``.<name>.old`` holds the previous output: the next ``atomic_dir(path)`` (or
    ``recover_dir(path)``) puts it back first, and an exception between them puts it back at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(path)
    old = path.with_name(f".{path.name}.old")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    moved = False
    try:
        yield tmp
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
    if not path.exists() and old.is_dir():
        os.replace(old, path)
        return True
    return False


# -- reading JSON from untrusted files -------------------------------------------------------------------
MAX_JSON_DEPTH = 100  # deeper documents are refused: they break pydantic dumps and recursive readers later
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def load_json(text: str | bytes, file: str | None = None, line: int | None = None):
    """Parse one JSON document from a file the user gave: the one loader every reader and the gate CLI use.

    Every failure is an ``InputError`` naming ``file`` (and ``line``): invalid or truncated JSON, text that is
    not UTF-8, integers beyond Python's digit limit, nesting deeper than ``MAX_JSON_DEPTH`` (also raised for
    documents too deep for the parser itself). Lone surrogates (``"\\ud800"``, valid JSON escapes but not
    text) are replaced by U+FFFD, so every string loaded can be encoded as UTF-8 and hashed."""
    from branchgate.errors import InputError

    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"not UTF-8 text (byte {exc.start})", file, line) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg} at column {exc.colno})", file,
                         line if line is not None else exc.lineno) from None
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
