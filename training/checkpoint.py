"""Controller checkpoints: a Lightning ``.ckpt`` carrying the ValueNet weights plus a ``branchgate`` entry.

Layout read by ``load_controller`` (and written both by the LightningModule's ``on_save_checkpoint`` and by
``save_controller`` for a minimal file)::

    {"state_dict": {"net.<param>": tensor, ...},          # ValueNet weights incl. standardisation buffers
     "branchgate": {"net": ValueNet.config(), "meta": {...META_KEYS...}}}

Loading needs neither the dataset nor Lightning.
"""

from __future__ import annotations

from pathlib import Path

import torch

from branchgate import __version__
from branchgate.errors import InputError, MismatchError
from branchgate.fileio import atomic_path
from branchgate.models.value_model import FEATURE_NAMES, ValueNet

CONTROLLER_SCHEMA_VERSION = 1
META_KEYS = ["encoder", "encoder_path", "dim", "max_length", "tau", "feature_names", "schema_version",
             "data_sha256", "branchgate_version"]


def make_meta(encoder, tau: float | None = None, data_sha256: str | None = None, **extra) -> dict:
    """Checkpoint metadata for a controller trained on ``encoder`` (an ``Encoder`` or ``EncoderSpec`` plus dim)."""
    spec = getattr(encoder, "spec", encoder)
    meta = {
        "encoder": spec.id,
        "encoder_path": spec.path,
        "dim": int(getattr(encoder, "dim", extra.pop("dim", 0)) or 0),
        "max_length": int(getattr(encoder, "max_length", extra.pop("max_length", 0)) or 0),
        "tau": None if tau is None else float(tau),
        "feature_names": list(FEATURE_NAMES),
        "schema_version": CONTROLLER_SCHEMA_VERSION,
        "data_sha256": data_sha256,
        "branchgate_version": __version__,
    }
    meta.update(extra)
    return meta


def checkpoint_entry(net: ValueNet, meta: dict) -> dict:
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"controller meta lacks {missing}")
    return {"net": net.config(), "meta": dict(meta, standardisation=net.standardisation())}


def save_controller(path: str | Path, net: ValueNet, meta: dict) -> Path:
    """Write a minimal controller checkpoint (same layout as the trained .ckpt), atomically."""
    path = Path(path)
    obj = {"state_dict": {f"net.{k}": v.detach().cpu() for k, v in net.state_dict().items()},
           "branchgate": checkpoint_entry(net, meta)}
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return path


def read_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise InputError("checkpoint not found", file=str(path))
    try:
        # Lightning checkpoints hold plain containers; fall back to full unpickling only for our own files.
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:
            raise InputError(f"cannot read checkpoint: {exc}", file=str(path)) from None
    if not isinstance(ckpt, dict) or "branchgate" not in ckpt or "state_dict" not in ckpt:
        raise InputError("not a branchgate controller checkpoint (no 'branchgate' entry)", file=str(path))
    return ckpt


def load_controller(path: str | Path) -> tuple[ValueNet, dict]:
    """The trained ValueNet (eval mode, CPU) and its metadata (``META_KEYS`` + ``standardisation``)."""
    ckpt = read_checkpoint(path)
    entry = ckpt["branchgate"]
    meta = dict(entry["meta"])
    if meta.get("schema_version", CONTROLLER_SCHEMA_VERSION) > CONTROLLER_SCHEMA_VERSION:
        raise MismatchError(f"{path}: controller schema {meta.get('schema_version')} is newer than this "
                            f"branchgate ({CONTROLLER_SCHEMA_VERSION}); upgrade branchgate")
    if list(meta.get("feature_names", FEATURE_NAMES)) != FEATURE_NAMES:
        raise MismatchError(f"{path}: checkpoint features {meta.get('feature_names')} != {FEATURE_NAMES}")
    net = ValueNet(**entry["net"])
    state = {k[len("net."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("net.")}
    for key, value in (("keep_scale", 1.0), ("keep_shift", 0.0)):  # checkpoints from before keep calibration
        state.setdefault(key, torch.tensor(value))
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        raise InputError(f"checkpoint weights do not fit the ValueNet: {exc}", file=str(path)) from None
    net.eval()
    return net, meta
