"""The dataset build's ONNX text tower on disk (run by ``onnx_encoder.py``): exporting it with torch, and the
torch encoder's vectors of the parity probes recorded beside it.

Export: the tower ``branchgate export`` puts in the controller graph (``export.controller.graph_tower`` over
``Encoder.torch_module``: the packed BERT tower, else ``TextTower``), alone: ``input_ids``, ``attention_mask``
[N, L] int64 → ``text_emb`` [N, D], with the encoder's tokenizer (``export.controller.tokenizer_json``).
Cached in ``<cache folder>/onnx_encoders/<name>-<key>/`` (``tower.onnx``, ``tokenizer.json``, ``tower.json``),
written atomically; the key hashes the encoder id, the content hash of its files, its max_length and
``TOWER_FORMAT``, so a changed model never reuses an old export.
Beside it, ``reference.npy`` / ``reference.json``: the torch encoder's vectors of ``PARITY_PROBES``, with the
probes' hash and the versions of the torch stack that computed them (``record_reference``; reused while they
match, ``recorded_reference``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from branchgate import __version__
from branchgate.errors import BranchgateError
from branchgate.fileio import atomic_dir, atomic_path, atomic_write_json, default_cache_dir
from branchgate.models.encoder import LazyEncoder, content_hash

log = logging.getLogger(__name__)

TOWER_FORMAT = 1  # bump when the exported tower changes (it is part of the cache key)
PARITY_PROBES = (
    "",
    " ",
    "\n\t",
    "a",
    "Why are bees dying?",
    "What's the U.S. GDP growth (2023-24)? e.g. $1,234.5bn; see [ref] #3 & @x ~ok",
    "水土流失的原因是什么？",
    "ñandú 🦤 <b>&amp;</b> Ünïcödé café naïve",
    "Ελληνικά и русский текст, عربى",
    "e\u0301 combining accents and zero\u200bwidth",
    "neonicotinoid pesticides and honeybee colony losses in field studies across Europe " * 3,
    "x " * 400,  # beyond the window: truncated
    " ".join(f"token{i} of a long passage about colony collapse disorder" for i in range(60)),
    "  leading and trailing blanks  ",
    "[CLS] [SEP] [MASK] [UNK] special-looking tokens",
)


@dataclass(frozen=True)
class Tower:
    """An exported text tower: its folder and ``tower.json`` (encoder, dim, max_length, pad_token_id, ...)."""

    path: Path
    meta: dict

    @property
    def onnx(self) -> Path:
        return self.path / "tower.onnx"

    @classmethod
    def open(cls, path: str | Path) -> Tower:
        path = Path(path)
        try:
            meta = json.loads((path / "tower.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BranchgateError(f"{path}: not an exported text tower ({exc})") from None
        return cls(path, meta)


def tower_key(spec, max_length: int) -> str:
    h = content_hash(Path(spec.path))
    raw = json.dumps([TOWER_FORMAT, spec.id, h, int(max_length)])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def tower_dir(spec, max_length: int, cache_dir: str | Path | None = None) -> Path:
    root = Path(cache_dir) if cache_dir else default_cache_dir() / "onnx_encoders"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.id.rpartition("#")[0] or spec.id)[-60:]
    return root / f"{name}-{tower_key(spec, max_length)}"


def prepare_tower(encoder, cache_dir: str | Path | None = None) -> Tower:
    """The exported tower of ``encoder`` (an ``Encoder``, or a ``LazyEncoder``: loaded only to export),
    exporting it first when the cache lacks it."""
    spec = encoder.spec
    folder = tower_dir(spec, encoder.max_length, cache_dir)
    if (folder / "tower.json").is_file() and (folder / "tower.onnx").is_file():
        return Tower.open(folder)
    export_tower(_loaded(encoder), folder)
    return Tower.open(folder)


def export_tower(encoder, folder: str | Path) -> Tower:
    """Export ``encoder``'s text tower (fp32) and tokenizer to ``folder`` (replaced atomically)."""
    import torch

    from branchgate.export.controller import graph_tower
    from branchgate.export.graph import eager_attention, set_attention
    from branchgate.export.onnx_metadata import OPSET, tokenizer_json
    from branchgate.export.packed_tower import PackedBertTower

    tower = encoder.torch_module().eval()
    module = graph_tower(tower)
    feats = encoder.features(["what caused the decline", "a second, somewhat longer text to pad the batch", "x"])
    tok_text = tokenizer_json(encoder)
    meta = {
        "format": TOWER_FORMAT,
        "encoder": encoder.id,
        "dim": int(encoder.dim),
        "max_length": int(encoder.max_length),
        "pooling": encoder.pooling_mode,
        "pad_token_id": int(encoder.tokenizer.pad_token_id or 0),
        "text_tower": "packed" if isinstance(module, PackedBertTower) else "padded",
        "tokenizer_sha256": hashlib.sha256(tok_text.encode("utf-8")).hexdigest(),
        "branchgate_version": __version__,
        "torch": torch.__version__,
        "opset": OPSET,
    }
    previous = eager_attention(tower.transformer)  # the eager path's masking exports exactly
    try:
        with atomic_dir(folder) as tmp, torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                (feats["input_ids"].long(), feats["attention_mask"].long()),
                str(Path(tmp) / "tower.onnx"),
                dynamo=False,
                input_names=["input_ids", "attention_mask"],
                output_names=["text_emb"],
                dynamic_axes={"input_ids": {0: "N", 1: "L"}, "attention_mask": {0: "N", 1: "L"}, "text_emb": {0: "N"}},
                opset_version=OPSET,
                do_constant_folding=True,
            )
            (Path(tmp) / "tokenizer.json").write_text(tok_text, encoding="utf-8")
            atomic_write_json(Path(tmp) / "tower.json", meta)
    finally:
        set_attention(tower.transformer, previous)
    log.info("exported the text tower of %s to %s", encoder.id, folder)
    tower = Tower.open(folder)
    record_reference(tower, encoder)
    return tower


def torch_stack() -> dict[str, str]:
    """Versions of what computes the torch encoder's vectors (read without importing them)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "sentence-transformers", "tokenizers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = ""
    return out


def _probes_sha() -> str:
    return hashlib.sha256(json.dumps(PARITY_PROBES).encode("utf-8")).hexdigest()


def record_reference(tower: Tower, encoder) -> np.ndarray:
    """The torch encoder's vectors of ``PARITY_PROBES``, stored beside the tower (``reference.npy`` and
    ``reference.json``: the probes' hash and the torch stack's versions they were computed with)."""
    vecs = np.asarray(encoder.encode(list(PARITY_PROBES)), np.float32)
    with atomic_path(tower.path / "reference.npy") as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, vecs, allow_pickle=False)
    atomic_write_json(
        tower.path / "reference.json", {"probes_sha256": _probes_sha(), "stack": torch_stack(), "encoder": encoder.id}
    )
    return vecs


def recorded_reference(tower: Tower) -> np.ndarray | None:
    """The recorded torch vectors of the probes, if computed by this torch stack for these probes, else None."""
    try:
        info = json.loads((tower.path / "reference.json").read_text(encoding="utf-8"))
        if info.get("probes_sha256") != _probes_sha() or info.get("stack") != torch_stack():
            return None
        if info.get("encoder") != tower.meta.get("encoder"):
            return None
        vecs = np.load(tower.path / "reference.npy", allow_pickle=False)
    except (OSError, ValueError):
        return None
    return vecs if vecs.shape == (len(PARITY_PROBES), int(tower.meta["dim"])) else None


def _loaded(encoder):
    """The sentence-transformers ``Encoder`` behind ``encoder`` (a ``LazyEncoder`` loads its weights now)."""
    return encoder.load() if isinstance(encoder, LazyEncoder) else encoder
