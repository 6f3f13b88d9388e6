"""Read an ONNX file's ``metadata_props`` without loading the model (standard library only).

An ONNX file is one protobuf ``ModelProto``; its metadata entries are top-level field 14
(``StringStringEntryProto``: key = field 1, value = field 2). The scan reads the top-level field headers and
seeks past everything else (the graph is almost all of the file), so it costs a few reads, not a model load.
"""

from __future__ import annotations

import io
from pathlib import Path

from branchgate.errors import BranchgateError
from branchgate.inference.metadata import controller_stage
from branchgate.pretrained import is_pretrained, resolve

METADATA_FIELD = 14
MAX_ENTRY_BYTES = 16 << 20  # one metadata entry; a larger one is a crafted file, not a controller


def controller_path(path: str | Path) -> Path:
    """The controller file ``path`` names: the file itself, ``controller.onnx`` in a folder, or a packaged
    ``pretrained:NAME`` (``branchgate.pretrained``: the stage's shipped int8 file)."""
    if is_pretrained(path):
        return resolve(path)[2]
    path = Path(path)
    if path.is_dir():
        path = path / "controller.onnx"
    if not path.is_file():
        raise BranchgateError(f"{path}: no such controller file (export one with `branchgate export`)")
    return path


def read_stage(path: str | Path) -> str:
    """The ``stage`` of the controller ``path`` names (``metadata.controller_stage``: ``pre`` or ``read``), read
    from its metadata without loading the model."""
    path = controller_path(path)
    return controller_stage(read_metadata(path), str(path))


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata_props of an ONNX file, without running it."""
    path = Path(path)
    if not path.is_file():
        raise BranchgateError(f"{path}: no such controller file")
    props: dict[str, str] = {}
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            while f.tell() < size:
                field, wire = _key(f)
                if wire == 0:
                    _varint(f)
                elif wire == 1 or wire == 5:
                    f.seek(8 if wire == 1 else 4, 1)
                elif wire == 2:
                    length = _varint(f)
                    if length > size - f.tell():
                        raise ValueError(f"field {field} claims {length} bytes, past the end of the file")
                    if field == METADATA_FIELD:
                        if length > MAX_ENTRY_BYTES:
                            raise ValueError(f"metadata entry of {length} bytes (at most {MAX_ENTRY_BYTES})")
                        key, value = _entry(_read(f, length))
                        props[key] = value
                    else:
                        f.seek(length, 1)
                else:
                    raise ValueError(f"wire type {wire}")
            if f.tell() != size:
                raise ValueError("truncated")
    except (ValueError, EOFError, UnicodeDecodeError, OSError) as exc:
        raise BranchgateError(f"{path}: not a loadable ONNX model (unreadable protobuf: {exc})") from None
    return props


def _varint(f) -> int:
    shift = value = 0
    while True:
        byte = f.read(1)
        if not byte:
            raise EOFError("unexpected end of file")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("bad varint")


def _key(f) -> tuple[int, int]:
    key = _varint(f)
    return key >> 3, key & 7


def _entry(data: bytes) -> tuple[str, str]:
    f, out = io.BytesIO(data), {1: "", 2: ""}
    while f.tell() < len(data):
        field, wire = _key(f)
        if wire != 2:
            raise ValueError("bad metadata entry")
        out[field] = _read(f, _varint(f)).decode("utf-8")
    return out[1], out[2]


def _read(f, length: int) -> bytes:
    if length > MAX_ENTRY_BYTES:
        raise ValueError(f"field of {length} bytes in a metadata entry")
    data = f.read(length)
    if len(data) != length:
        raise EOFError("unexpected end of file")
    return data
