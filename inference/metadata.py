"""The ONNX controller's metadata contract: which ``metadata_props`` a controller carries and what this
branchgate can run (core-safe: standard library only). Export (``export.controller``) writes them; the Gate
checks them at load.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from branchgate import __version__
from branchgate.errors import MismatchError
from branchgate.features import FEATURE_NAMES

GRAPH_IO_VERSIONS = {"1"}
SCHEMA_VERSION = 1  # newest controller schema version (training.checkpoint) this Gate understands
REQUIRED_METADATA = ("branchgate_version", "schema_version", "graph_io_version", "encoder", "dim", "max_length",
                     "tau", "feature_names", "tokenizer_file")
PARTS = "tower,head"  # metadata ``parts``: the graph's text tower and head can run alone (export.parts)


def check_metadata(meta: Mapping[str, str], where: str = "controller", expected_encoder: str | None = None) -> None:
    """Raise ``MismatchError`` naming the key when this Gate cannot run the model as intended."""
    for key in REQUIRED_METADATA:
        if key not in meta:
            raise MismatchError(f"{where}: metadata key {key!r} is missing (not a branchgate controller, "
                                f"or exported by an incompatible branchgate)")
    if meta["graph_io_version"] not in GRAPH_IO_VERSIONS:
        raise MismatchError(f"{where}: metadata graph_io_version={meta['graph_io_version']!r} is not supported by "
                            f"branchgate {__version__} (supports {sorted(GRAPH_IO_VERSIONS)}); upgrade branchgate")
    try:
        schema = int(meta["schema_version"])
    except ValueError:
        raise MismatchError(f"{where}: metadata schema_version={meta['schema_version']!r} is not a version number") from None
    if schema > SCHEMA_VERSION:
        raise MismatchError(f"{where}: metadata schema_version={schema} is newer than this branchgate understands "
                            f"({SCHEMA_VERSION}); upgrade branchgate")
    if _version_tuple(meta["branchgate_version"]) > _version_tuple(__version__):
        raise MismatchError(f"{where}: metadata branchgate_version={meta['branchgate_version']!r} is newer than the "
                            f"installed branchgate {__version__}; upgrade branchgate")
    try:
        names = tuple(json.loads(meta["feature_names"]))
    except (ValueError, TypeError):
        raise MismatchError(f"{where}: metadata feature_names is not a JSON list") from None
    if names != FEATURE_NAMES:
        raise MismatchError(f"{where}: metadata feature_names={list(names)} differs from the features this Gate "
                            f"computes {list(FEATURE_NAMES)}")
    if expected_encoder is not None and meta["encoder"] != expected_encoder:
        raise MismatchError(f"{where}: metadata encoder={meta['encoder']!r} but {expected_encoder!r} was expected")


def _version_tuple(text: str) -> tuple[int, int]:
    parts = []
    for piece in str(text).split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (2 - len(parts)))
