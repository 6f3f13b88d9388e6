"""What an exported controller file says about itself: its ``metadata_props`` (the contract
``inference/metadata.py`` checks when the Gate loads it) and the tokenizer written beside it.

``metadata`` builds the properties from the controller's metadata, encoder, τ and tokenizer text;
``write_metadata`` copies a graph with them (and, when asked, skippable tower and head parts); ``tokenizer_json``
is the encoder's fast tokenizer as the Gate reads it. Used by ``export/controller.py`` and the build's ONNX tower.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from branchgate import __version__
from branchgate.errors import BranchgateError
from branchgate.export.graph import GRAPH_IO_VERSION
from branchgate.export.parts import skippable_parts
from branchgate.features import FEATURE_NAMES
from branchgate.inference.metadata import controller_stage

OPSET = 17  # the ONNX opset of every exported graph
DOC_STRINGS = {  # the model's doc_string, by stage
    "pre": "branchgate pre-retrieval controller: token ids of one decision → p_keep, utility",
    "read": "branchgate read controller (which search hits to read): token ids of one decision → p_keep, utility",
}


def tokenizer_json(encoder) -> str:
    """The encoder's fast tokenizer as tokenizer.json text, without per-call truncation/padding state."""
    from tokenizers import Tokenizer

    backend = getattr(encoder.tokenizer, "backend_tokenizer", None) or getattr(encoder.tokenizer, "_tokenizer", None)
    if backend is None:
        raise BranchgateError(f"encoder {encoder.id!r} has no fast (tokenizers) tokenizer; the Gate needs one")
    tok = Tokenizer.from_str(backend.to_str())
    tok.no_truncation()
    tok.no_padding()
    return tok.to_str()


def metadata(meta: dict, encoder, tau: float, tok_text: str, tok_name: str, net) -> dict[str, str]:
    std = meta.get("standardisation")
    if std is None and hasattr(net, "standardisation"):
        std = net.standardisation()
    tokenizer = encoder.tokenizer
    return {
        "branchgate_version": __version__,
        "trained_with": str(meta.get("branchgate_version", "")),
        "schema_version": str(meta.get("schema_version", 1)),
        "graph_io_version": GRAPH_IO_VERSION,
        "encoder": encoder.id,
        "dim": str(encoder.dim),
        "max_length": str(int(meta.get("max_length") or encoder.max_length)),
        "pooling": encoder.pooling_mode,
        "tau": repr(float(tau)),
        "feature_names": json.dumps(list(FEATURE_NAMES)),
        "standardisation": json.dumps(std) if std is not None else "in-graph",
        "data_sha256": str(meta.get("data_sha256") or ""),
        "tokenizer_file": tok_name,
        "tokenizer_sha256": hashlib.sha256(tok_text.encode("utf-8")).hexdigest(),
        "pad_token": str(tokenizer.pad_token or "[PAD]"),
        "pad_token_id": str(int(tokenizer.pad_token_id or 0)),
        "net": json.dumps(net.config()) if hasattr(net, "config") else "{}",
        "opset": str(OPSET),
        "stage": checkpoint_stage(meta),
        **_feature_range(net),
        **_root_tau(meta),
    }


def checkpoint_stage(meta: dict) -> str:
    """Metadata ``stage``: the checkpoint's ``stage`` (``pre`` when it has none: files written before the read
    gate), held to the Gate's rule (``inference.metadata.controller_stage``)."""
    stage = meta.get("stage")
    return controller_stage({} if stage is None else {"stage": stage}, "checkpoint meta")


def _root_tau(meta: dict) -> dict[str, str]:
    """Metadata ``root_tau``: the root frame's own threshold from the training calibration
    (``calibration.root_tau``), absent when it has none (then τ applies at every depth)."""
    root_tau = (meta.get("calibration") or {}).get("root_tau")
    return {} if root_tau is None else {"root_tau": repr(float(root_tau))}


def _feature_range(net) -> dict[str, str]:
    """Metadata ``feature_range``: the train split's range of each structured feature, which the graph clamps
    to and the Gate reports leaving (absent for a net without one: an older controller)."""
    rng = net.feature_range() if hasattr(net, "feature_range") else None
    return {"feature_range": json.dumps(rng)} if rng else {}


def write_metadata(src: Path, dst: Path, props: dict[str, str], parts: int = 0) -> None:
    """Copy the model at ``src`` to ``dst`` with ``props`` as its metadata; ``parts`` = the embedding dim to
    make tower and head skippable (``ValueError`` when the graph cannot be split), 0 to leave it whole."""
    import onnx

    model = onnx.load(str(src))
    if parts:
        model = skippable_parts(model, parts)
    del model.metadata_props[:]
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)
    model.producer_name = "branchgate"
    model.producer_version = __version__
    model.doc_string = DOC_STRINGS.get(props.get("stage", "pre"), DOC_STRINGS["pre"])
    onnx.save(model, str(dst))
