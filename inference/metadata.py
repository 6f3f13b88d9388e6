"""The ONNX controller's metadata contract: which ``metadata_props`` a controller carries and what this
branchgate can run (core-safe: standard library only). Export (``export.controller``) writes them; the Gate
checks them at load.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from branchgate import __version__
from branchgate.errors import MismatchError
from branchgate.features import FEATURE_NAMES

GRAPH_IO_VERSIONS = {"1"}
SCHEMA_VERSION = 1  # newest controller schema version (training.checkpoint) this Gate understands
REQUIRED_METADATA = (
    "branchgate_version",
    "schema_version",
    "graph_io_version",
    "encoder",
    "dim",
    "max_length",
    "tau",
    "feature_names",
    "tokenizer_file",
    "tokenizer_sha256",
)
# Metadata ``stage``: what the controller decides. ``pre`` (pre-retrieval: which candidate sub-queries to expand)
# or ``read`` (after a search: which of its hits to read); the same graph, its inputs mapped differently
# (``inference.gate``). Optional: a controller without it (exported before the read gate) is ``pre``.
STAGES = ("pre", "read")
PARTS = "tower,head"  # metadata ``parts``: the graph's text tower and head can run alone (export.parts)
# The graph's inputs and outputs (export.graph, graph_io_version 1); ``D`` is metadata ``dim``.
GRAPH_INPUTS = {
    "input_ids": 2,
    "attention_mask": 2,
    "cached_emb": 2,
    "root_idx": 1,
    "frame_idx": 1,
    "goal_idx": 1,
    "retained_idx": 1,
    "cand_idx": 1,
    "features": 2,
}
GRAPH_OUTPUTS = {"p_keep": 1, "utility": 1, "text_emb": 2}
MAX_DIM, MAX_LENGTH = 1 << 16, 1 << 16  # sanity bounds: larger values are not a model this Gate can serve
# An encoder's fingerprint: the first FINGERPRINT_WIDTH components of its unit vectors of these probe texts (a few
# tokens each, so no max_length cuts them). ``check_fingerprint`` holds weights to the encoder id they carry.
FINGERPRINT_PROBES = ("Why are bees dying?", "soil erosion", "Ünïcödé café")
FINGERPRINT_WIDTH, FINGERPRINT_TOL = 8, 1e-3
FINGERPRINT_TOL_INT8 = 0.05  # an int8 graph's vectors are ~0.02 off (other encoders' differ by ~0.1 somewhere)
ENCODER_FINGERPRINTS = {
    "sentence-transformers/all-MiniLM-L6-v2": (
        (0.0708, -0.0257, 0.0881, 0.0386, 0.0435, 0.0297, 0.0239, -0.0412),
        (-0.0035, 0.0005, 0.1136, -0.0225, 0.012, -0.0344, 0.0112, 0.003),
        (-0.0068, -0.0624, -0.0062, 0.0024, -0.096, 0.0171, 0.0621, -0.0383),
    ),
}


@dataclass
class ControllerNumbers:
    """The numeric metadata a Gate runs on, checked (``controller_numbers``)."""

    dim: int
    max_length: int
    tau: float
    pad_token_id: int = 0
    feature_range: dict[str, tuple[float, float]] = field(default_factory=dict)  # FEATURE_NAMES → (min, max)
    root_tau: float | None = None  # the root frame's own threshold (``decide.threshold_at``); None: tau everywhere


def check_metadata(meta: Mapping[str, str], where: str = "controller", expected_encoder: str | None = None) -> None:
    """Raise ``MismatchError`` naming the key when this Gate cannot run the model as intended."""
    for key in REQUIRED_METADATA:
        if key not in meta:
            raise MismatchError(
                f"{where}: metadata key {key!r} is missing (not a branchgate controller, "
                f"or exported by an incompatible branchgate)"
            )
    if meta["graph_io_version"] not in GRAPH_IO_VERSIONS:
        raise MismatchError(
            f"{where}: metadata graph_io_version={meta['graph_io_version']!r} is not supported by "
            f"branchgate {__version__} (supports {sorted(GRAPH_IO_VERSIONS)}); upgrade branchgate"
        )
    try:
        schema = int(meta["schema_version"])
    except ValueError:
        raise MismatchError(
            f"{where}: metadata schema_version={meta['schema_version']!r} is not a version number"
        ) from None
    if schema > SCHEMA_VERSION:
        raise MismatchError(
            f"{where}: metadata schema_version={schema} is newer than this branchgate understands "
            f"({SCHEMA_VERSION}); upgrade branchgate"
        )
    if _version_tuple(meta["branchgate_version"]) > _version_tuple(__version__):
        raise MismatchError(
            f"{where}: metadata branchgate_version={meta['branchgate_version']!r} is newer than the "
            f"installed branchgate {__version__}; upgrade branchgate"
        )
    try:
        names = tuple(json.loads(meta["feature_names"]))
    except (ValueError, TypeError):
        raise MismatchError(f"{where}: metadata feature_names is not a JSON list") from None
    if names != FEATURE_NAMES:
        raise MismatchError(
            f"{where}: metadata feature_names={list(names)} differs from the features this Gate "
            f"computes {list(FEATURE_NAMES)}"
        )
    if expected_encoder is not None and meta["encoder"] != expected_encoder:
        raise MismatchError(f"{where}: metadata encoder={meta['encoder']!r} but {expected_encoder!r} was expected")
    controller_stage(meta, where)
    controller_numbers(meta, where)


def controller_stage(meta: Mapping[str, str], where: str = "controller") -> str:
    """The controller's ``stage`` (``STAGES``): ``pre`` when the metadata has no ``stage`` key; any other value
    than ``pre`` or ``read`` is a ``MismatchError`` naming the key."""
    stage = meta.get("stage", "pre")
    if stage not in STAGES:
        raise MismatchError(
            f"{where}: metadata stage={str(stage)[:80]!r} is not a stage this branchgate runs "
            f"({' or '.join(repr(s) for s in STAGES)}); upgrade branchgate or re-export the controller"
        )
    return stage


def check_fingerprint(encoder_id: str, vectors, where: str = "controller", tol: float = FINGERPRINT_TOL) -> None:
    """``MismatchError`` unless ``vectors`` (an encoder's vectors of ``FINGERPRINT_PROBES``) fit the id
    ``encoder_id``: an encoder in ``ENCODER_FINGERPRINTS`` must give its own fingerprint (within ``tol``), and any
    other id but a ``local:DIR#hash`` one (named by its files' content) must not give a listed encoder's."""
    got = [[float(x) for x in v[:FINGERPRINT_WIDTH]] for v in vectors]

    def gap(ref) -> float:
        if [len(r) for r in ref] != [len(g) for g in got]:
            return math.inf
        return max(abs(a - b) if math.isfinite(b) else math.inf for r, g in zip(ref, got) for a, b in zip(r, g))

    own = ENCODER_FINGERPRINTS.get(encoder_id)
    if own is not None:
        if not gap(own) <= tol:
            raise MismatchError(
                f"{where}: the encoder weights are not {encoder_id[:200]!r}: their vectors of fixed probe "
                f"texts differ from that encoder's by up to {gap(own):.3g} (> {tol:g})"
            )
        return
    if encoder_id.startswith("local:"):
        return
    for known, ref in ENCODER_FINGERPRINTS.items():
        if gap(ref) <= tol:
            raise MismatchError(
                f"{where}: the encoder is recorded as {encoder_id[:200]!r}, but its weights are {known!r} "
                f"(their vectors of fixed probe texts are that encoder's)"
            )


def controller_numbers(meta: Mapping[str, str], where: str = "controller") -> ControllerNumbers:
    """``dim``, ``max_length``, ``tau``, ``pad_token_id``, the optional ``feature_range`` (JSON
    ``{feature: [min, max]}`` of the train split; absent in controllers exported before it existed) and the
    optional ``root_tau`` (the root frame's threshold; absent: ``tau`` at every depth), parsed and
    range-checked; ``MismatchError`` naming the key otherwise."""
    dim = _integer(meta, "dim", where, 1, MAX_DIM)
    max_length = _integer(meta, "max_length", where, 1, MAX_LENGTH)
    pad = _integer(meta, "pad_token_id", where, 0, 1 << 31, default=0)
    tau = _threshold(meta, "tau", where)
    root_tau = _threshold(meta, "root_tau", where) if meta.get("root_tau") not in (None, "") else None
    return ControllerNumbers(dim, max_length, tau, pad, _feature_range(meta.get("feature_range"), where), root_tau)


def _threshold(meta, key: str, where: str) -> float:
    try:
        value = float(meta[key])
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise MismatchError(f"{where}: metadata {key}={meta[key]!r} is not a number in [0, 1]")
    return value


def _integer(meta, key: str, where: str, lo: int, hi: int, default: int | None = None) -> int:
    if key not in meta and default is not None:
        return default
    text = str(meta[key]).strip()
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise MismatchError(f"{where}: metadata {key}={meta[key]!r} is not an integer in [{lo}, {hi}]")
    return int(text)


def _feature_range(text, where: str) -> dict[str, tuple[float, float]]:
    if text in (None, ""):
        return {}
    bad = MismatchError(
        f"{where}: metadata feature_range must be a JSON object {{feature: [min, max]}} over "
        f"{list(FEATURE_NAMES)} with finite min <= max"
    )
    try:
        obj = json.loads(text) if len(text) < 10_000 else None
    except (ValueError, RecursionError):
        raise bad from None
    if not isinstance(obj, dict) or not set(obj) <= set(FEATURE_NAMES):
        raise bad
    out = {}
    for name, pair in obj.items():
        ok = (
            isinstance(pair, list)
            and len(pair) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in pair)
        )
        if not ok or pair[0] > pair[1]:
            raise bad
        out[name] = (float(pair[0]), float(pair[1]))
    return out


def check_graph(inputs: Sequence, outputs: Sequence, dim: int, where: str = "controller") -> None:
    """The session's inputs and outputs (onnxruntime ``NodeArg`` s: ``name``, ``shape``) are those of a
    branchgate controller graph (``GRAPH_INPUTS``, ``GRAPH_OUTPUTS``) whose embedding width is ``dim``."""
    ins = {a.name: list(a.shape or []) for a in inputs}
    outs = {a.name: list(a.shape or []) for a in outputs}
    for kind, shapes, expected in (("inputs", ins, GRAPH_INPUTS), ("outputs", outs, GRAPH_OUTPUTS)):
        if set(shapes) != set(expected):
            raise MismatchError(
                f"{where}: graph {kind} {sorted(shapes)} are not a branchgate controller's "
                f"{sorted(expected)} (metadata from another model?)"
            )
        for name, rank in expected.items():
            if len(shapes[name]) != rank:
                raise MismatchError(
                    f"{where}: graph {kind[:-1]} {name!r} has shape {shapes[name]}, expected rank {rank}"
                )
    for name, d in (("cached_emb", ins["cached_emb"][1]), ("text_emb", outs["text_emb"][1])):
        if isinstance(d, int) and d != dim:
            raise MismatchError(f"{where}: metadata dim={dim} but the graph's {name!r} is {d} wide")
    feats = ins["features"][1]
    if isinstance(feats, int) and feats != len(FEATURE_NAMES):
        raise MismatchError(f"{where}: graph input 'features' has {feats} columns, expected {len(FEATURE_NAMES)}")


def _version_tuple(text: str) -> tuple[int, int]:
    parts = []
    for piece in str(text).split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (2 - len(parts)))
