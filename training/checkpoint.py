"""Controller files: ``controller.safetensors`` (what ``branchgate train`` ships) and, read safely, Lightning ``.ckpt``.

``controller.safetensors`` — the file export / evaluate / bench-gate take. Tensors: the ValueNet state dict
under its own names (weights plus the standardisation and keep-calibration buffers). Header metadata: one
entry ``branchgate`` holding JSON ::

    {"format": "branchgate-controller", "net": ValueNet.config(), "meta": {...META_KEYS..., "standardisation": ...,
     "stage": "pre" | "read", ...}}

``meta.stage`` is the gate the controller was trained for, its dataset's stage (``dataset_schema.STAGES``);
``load_controller`` gives "pre" for a file written before it existed, and refuses an unknown one.

Weights and config live in one file, so they cannot be separated. Reading it uses ``safetensors`` only: no
pickle, nothing in the file can run code.

A Lightning ``.ckpt`` (written during training for resuming; the LightningModule's ``on_save_checkpoint``
adds the same ``branchgate`` entry next to ``state_dict``) is a pickle. ``load_controller`` opens one only
with ``torch.load(weights_only=True)`` and refuses a file that needs anything more (``InputError``).

Loading needs neither the dataset nor Lightning.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch

from branchgate import __version__
from branchgate.data.dataset_schema import STAGES, check_stage
from branchgate.errors import InputError, MismatchError
from branchgate.fileio import atomic_path, load_json
from branchgate.inference.metadata import MAX_DIM, MAX_LENGTH
from branchgate.models.value_model import FEATURE_NAMES, ValueNet
from branchgate.training.metrics import clean

CONTROLLER_SCHEMA_VERSION = 1
CONTROLLER_FILE = "controller.safetensors"
FORMAT = "branchgate-controller"
METADATA_KEY = "branchgate"
META_KEYS = [
    "encoder",
    "encoder_path",
    "dim",
    "max_length",
    "tau",
    "feature_names",
    "schema_version",
    "data_sha256",
    "branchgate_version",
]
_NUMBER = (int, float)
# Field → allowed JSON types (bool is rejected separately where a number is meant).
_NET_TYPES = {"dim": int, "hidden": int, "dropout": _NUMBER, "mmr_lambda": _NUMBER, "towers": str, "order": bool}
_NET_OPTIONAL = ("towers", "order")  # files written before these options: full towers, order an input (the defaults)
_META_TYPES = {
    "encoder": str,
    "encoder_path": (str, type(None)),
    "dim": int,
    "max_length": int,
    "tau": (*_NUMBER, type(None)),
    "feature_names": list,
    "schema_version": int,
    "data_sha256": (str, type(None)),
    "branchgate_version": str,
    "calibration": (dict, type(None)),
    "standardisation": dict,
    "feature_range": (dict, type(None)),
    "stage": str,
}
# Buffers a controller file may lack (written before they existed): their defaults mean "no effect".
OPTIONAL_BUFFERS = ("feature_min", "feature_max")


def make_meta(
    encoder,
    tau: float | None = None,
    data_sha256: str | None = None,
    feature_range: dict | None = None,
    stage: str = "pre",
    **extra,
) -> dict:
    """Checkpoint metadata for a controller trained on ``encoder`` (an ``Encoder`` or ``EncoderSpec`` plus dim).
    ``feature_range``: the train split's ``{feature: [min, max]}`` (``train_feature_range``); the file stores the
    ValueNet's own range buffers (``checkpoint_entry``), which the net clamps its structured features to.
    ``stage``: the gate it was trained for, its dataset's (``dataset_schema.dataset_stage``): "pre" (candidate
    sub-queries) or "read" (a search's hits)."""
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
        "feature_range": feature_range,
        "stage": check_stage(stage, "stage"),
    }
    meta.update(extra)
    return meta


def train_feature_range(features) -> dict | None:
    """``{feature: [min, max]}`` over the rows of a [N, F] structured-feature array (None when N = 0)."""
    import numpy as np

    a = np.asarray(features, dtype=np.float64)
    if a.ndim != 2 or not len(a):
        return None
    return {name: [float(a[:, j].min()), float(a[:, j].max())] for j, name in enumerate(FEATURE_NAMES)}


def checkpoint_entry(net: ValueNet, meta: dict) -> dict:
    """The ``branchgate`` entry: ``{"format", "net": ValueNet.config(), "meta": meta + standardisation}``."""
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"controller meta lacks {missing}")
    return {
        "format": FORMAT,
        "net": net.config(),
        "meta": dict(meta, standardisation=net.standardisation(), feature_range=net.feature_range()),
    }


def save_controller(path: str | Path, net: ValueNet, meta: dict) -> Path:
    """Write ``net`` and ``meta`` as one safetensors controller file (see the module docstring), atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    entry = clean(checkpoint_entry(net, meta))  # numpy scalars → Python, NaN/inf → None
    text = json.dumps(entry, allow_nan=False, ensure_ascii=False)
    tensors = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={METADATA_KEY: text})
    return path


def load_controller(path: str | Path) -> tuple[ValueNet, dict]:
    """The trained ValueNet (eval mode, CPU) and its metadata (``META_KEYS`` + ``standardisation``).

    ``path`` is a ``controller.safetensors`` (read without pickle) or a Lightning ``.ckpt`` (read only with
    ``torch.load(weights_only=True)``). Every problem is an ``InputError`` / ``MismatchError`` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("controller checkpoint not found", file=str(path))
    with path.open("rb") as fh:
        head = fh.read(9)
    # safetensors: an 8-byte header length, then the JSON header; torch.save: a zip archive or a bare pickle.
    if head[8:9] != b"{" and (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        entry, state = _read_torch_checkpoint(path)
    else:
        entry, state = _read_safetensors(path)
    return _build(path, entry, state)


def read_lightning_checkpoint(path: str | Path) -> dict:
    """A Lightning ``.ckpt`` as a dict, loaded with ``torch.load(weights_only=True)`` only (never full unpickling)."""
    path = Path(path)
    if not path.is_file():
        raise InputError("checkpoint not found", file=str(path))
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
        needs = next((line for line in lines if "GLOBAL" in line), None)  # the weights_only unpickler's refusal
        why = (
            f"it is a pickle that needs more than tensors and plain containers ({needs})"
            if needs
            else f"torch.load(weights_only=True) cannot read it ({next((x for x in lines if x), type(exc).__name__)})"
        )
        raise InputError(
            f"cannot be loaded safely: {why}; branchgate never unpickles anything else. Use the "
            f"{CONTROLLER_FILE} that `branchgate train` writes",
            file=str(path),
        ) from None
    if not isinstance(ckpt, dict):
        raise InputError(f"not a checkpoint (a {type(ckpt).__name__}, not a dict)", file=str(path))
    return ckpt


def _read_torch_checkpoint(path: Path) -> tuple[object, object]:
    ckpt = read_lightning_checkpoint(path)
    if METADATA_KEY not in ckpt or "state_dict" not in ckpt:
        raise InputError(
            f"not a branchgate controller checkpoint (no '{METADATA_KEY}' entry); use the "
            f"{CONTROLLER_FILE} that `branchgate train` writes",
            file=str(path),
        )
    state = ckpt["state_dict"]
    if not isinstance(state, dict):
        raise InputError("'state_dict' is not a dict of tensors", file=str(path))
    return ckpt[METADATA_KEY], {
        k[len("net.") :]: v for k, v in state.items() if isinstance(k, str) and k.startswith("net.")
    }


def _read_safetensors(path: Path) -> tuple[object, dict]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            header = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for bad headers and truncated data
        raise InputError(f"not a readable safetensors controller file ({_first_line(exc)})", file=str(path)) from None
    if METADATA_KEY not in header:
        raise InputError(
            f"not a branchgate controller file: the safetensors metadata has no '{METADATA_KEY}' entry", file=str(path)
        )
    try:
        entry = load_json(header[METADATA_KEY], str(path))
    except InputError as exc:
        raise InputError(f"metadata entry '{METADATA_KEY}' is not valid JSON ({exc.reason})", file=str(path)) from None
    return entry, state


def _build(path: Path, entry, state: dict) -> tuple[ValueNet, dict]:
    """Validate the ``branchgate`` entry and the tensors, then the ValueNet in eval mode."""
    where = str(path)
    if not isinstance(entry, dict):
        raise InputError(f"'{METADATA_KEY}' entry is a {type(entry).__name__}, not an object", file=where)
    if entry.get("format", FORMAT) != FORMAT:
        raise InputError(f"'{METADATA_KEY}.format' is {entry['format']!r}, not {FORMAT!r}", file=where)
    for section in ("net", "meta"):
        if not isinstance(entry.get(section), dict):
            raise InputError(f"'{METADATA_KEY}.{section}' is missing or not an object", file=where)
    net_cfg, meta = dict(entry["net"]), dict(entry["meta"])
    _check_fields(where, "net", net_cfg, _NET_TYPES, required=[k for k in _NET_TYPES if k not in _NET_OPTIONAL])
    _check_fields(where, "meta", meta, _META_TYPES, required=META_KEYS + ["standardisation"])
    _check_values(where, meta)
    version = meta["schema_version"]
    if version > CONTROLLER_SCHEMA_VERSION:
        raise MismatchError(
            f"{where}: controller schema_version {version} is newer than this branchgate "
            f"({CONTROLLER_SCHEMA_VERSION}); upgrade branchgate"
        )
    if version < 1:
        raise InputError(f"unknown controller schema_version {version}", file=where)
    if meta["feature_names"] != FEATURE_NAMES:
        raise MismatchError(
            f"{where}: checkpoint features (meta.feature_names) {meta['feature_names']} != {FEATURE_NAMES}"
        )
    if meta.get("stage", "pre") not in STAGES:
        raise InputError(
            f"'{METADATA_KEY}.meta.stage' must be one of {', '.join(STAGES)}, got {meta['stage']!r}", file=where
        )
    if meta["dim"] and meta["dim"] != net_cfg["dim"]:
        raise MismatchError(f"{where}: meta.dim {meta['dim']} != net.dim {net_cfg['dim']}")
    bad = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor) or not v.is_floating_point())
    if bad:
        raise InputError(f"weights {bad} are not floating-point tensors", file=where)
    _check_finite(where, state)
    with torch.device("meta"):  # sizes checked against the weights before any memory is allocated
        _load_weights(where, _value_net(where, net_cfg), state)
    net = _load_weights(where, _value_net(where, net_cfg), state)
    net.eval()
    meta["standardisation"] = net.standardisation()  # from the buffers just loaded: one source of truth
    meta["feature_range"] = net.feature_range()  # the train split's structured-feature range (None: older file)
    meta["stage"] = meta.get("stage", "pre")  # files written before the read gate are pre-retrieval controllers
    return net, meta


def check_max_length(meta: dict, encoder, where: str) -> None:
    """A checkpoint's ``max_length`` (0: not recorded) is the one its encoder embeds at (``encoder.max_length``);
    else ``MismatchError``: the weights were fitted to other embeddings, or the metadata was edited."""
    recorded = int(meta.get("max_length") or 0)
    if recorded and recorded != int(encoder.max_length):
        raise MismatchError(
            f"{where}: the checkpoint records max_length={recorded}, but its encoder {meta.get('encoder')!r} "
            f"embeds {int(encoder.max_length)} tokens (the weights were fitted to other embeddings, or the "
            "metadata was edited)"
        )


def _check_values(where: str, meta: dict) -> None:
    """The metadata numbers in range: ``dim`` and ``max_length`` integers in [0, the Gate's bound] (0: the
    encoder's own), ``tau`` and ``calibration.root_tau`` null or numbers in [0, 1]."""
    for key, top in (("dim", MAX_DIM), ("max_length", MAX_LENGTH)):
        if not 0 <= meta[key] <= top:
            raise InputError(
                f"'{METADATA_KEY}.meta.{key}' must be an integer in [0, {top}], got {meta[key]!r}", file=where
            )
    for key, value in (("tau", meta["tau"]), ("calibration.root_tau", (meta.get("calibration") or {}).get("root_tau"))):
        ok = value is None or (isinstance(value, _NUMBER) and not isinstance(value, bool) and 0.0 <= value <= 1.0)
        if not ok:  # also refuses nan
            raise InputError(
                f"'{METADATA_KEY}.meta.{key}' must be null or a number in [0, 1], got {value!r}", file=where
            )


def _check_finite(where: str, state: dict) -> None:
    """Weights are finite numbers, but the feature range (±inf: no clamping; never NaN, min <= max), and the
    standardisation's spreads are > 0."""
    bad = []
    for key, value in state.items():
        if key in ("feature_min", "feature_max"):
            ok = not value.isnan().any()
        else:
            ok = bool(value.isfinite().all()) and (key not in ("scalar_std", "utility_std") or bool((value > 0).all()))
        if not ok:
            bad.append(key)
    low, high = state.get("feature_min"), state.get("feature_max")
    if not bad and low is not None and high is not None and low.shape == high.shape and (low > high).any():
        bad = ["feature_min > feature_max"]
    if bad:
        raise InputError(f"weights {sorted(bad)} hold NaN, an infinity or a spread <= 0", file=where)


def _value_net(where: str, net_cfg: dict) -> ValueNet:
    try:
        return ValueNet(**net_cfg)
    except (TypeError, ValueError) as exc:
        raise InputError(f"'{METADATA_KEY}.net' does not describe a ValueNet ({exc})", file=where) from None


def _load_weights(where: str, net: ValueNet, state: dict) -> ValueNet:
    """``net`` with ``state`` loaded (buffers of ``OPTIONAL_BUFFERS`` the file lacks keep their defaults: no
    clamping); on a net built on the meta device this checks the names and shapes only."""
    defaults = net.state_dict()
    state = {**{k: defaults[k] for k in OPTIONAL_BUFFERS if k not in state}, **state}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # copying into meta tensors is a no-op, and torch says so
            net.load_state_dict(state)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())
        raise InputError(f"weights do not fit the ValueNet of '{METADATA_KEY}.net' ({detail})", file=where) from None
    return net


def _check_fields(where: str, section: str, obj: dict, types: dict, required: list[str]) -> None:
    missing = [k for k in required if k not in obj]
    if missing:
        raise InputError(f"'{METADATA_KEY}.{section}' lacks {missing}", file=where)
    for key, allowed in types.items():
        if key not in obj:
            continue
        value = obj[key]
        number_expected = allowed is int or (isinstance(allowed, tuple) and int in allowed)
        if not isinstance(value, allowed) or (number_expected and isinstance(value, bool)):
            raise InputError(
                f"'{METADATA_KEY}.{section}.{key}' has the wrong type ({type(value).__name__}: {value!r})", file=where
            )
    if section == "meta" and not all(isinstance(n, str) for n in obj["feature_names"]):
        raise InputError(f"'{METADATA_KEY}.meta.feature_names' must be a list of strings", file=where)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
