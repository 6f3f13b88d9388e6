"""``branchgate train --init-from CONTROLLER``: start training from a trained controller instead of random weights.

``CONTROLLER`` is one of

- a ``controller.safetensors`` (or a Lightning ``.ckpt``) that ``branchgate train`` wrote: its exact weights;
- an exported ``.onnx`` (fp32 or int8): an export does not record the checkpoint it was made from, so the value
  network's weights are read from the graph's initializers (int8 weights dequantised: ``(q − zero_point) ·
  scale``, per output column). Pass the export's ``controller.safetensors`` instead when you have it: the int8
  weights are a rounded copy;
- ``pretrained:pre`` / ``pretrained:read`` (or ``-model``/``-teacher``: the same file): the packaged int8 graph,
  read as any ``.onnx`` (the package ships no safetensors).

What the start fixes and what training changes (``apply_start``):

- the architecture (``hidden``, ``towers``, ``order``, ``dropout``, ``mmr_lambda``) comes from the start; the
  ``--model.*`` network options are ignored (the optimiser and loss options still apply);
- the scalar-feature and utility standardisation stay the start's (refitting them would move every input the
  weights were fitted to); the structured-feature range becomes the union of the start's and the new train split's;
- frozen (``--freeze``): ``towers`` (default) keeps the state and candidate towers' weights fixed and trains the
  MLP, the heads and the wide path; ``none`` trains every weight; ``mlp`` trains only the heads and the wide path.
  The sentence encoder (the text tower of the exported graph) is always frozen: training reads its embeddings
  from the cache.

Checked before anything trains (``check_start``): the start's stage (pre / read) and encoder must be the dataset's,
and its feature names the Gate's; each mismatch is a ``MismatchError`` naming both sides.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from branchgate.data.dataset_schema import dataset_stage
from branchgate.data.decision_batches import check_encoder
from branchgate.errors import InputError, MismatchError
from branchgate.models.value_model import FEATURE_NAMES, SCALAR_NAMES, ValueNet
from branchgate.pretrained import is_pretrained, resolve

FREEZE = ("towers", "none", "mlp")
_LINEARS = ("state_tower.1", "cand_tower.1", "mlp.0", "mlp.3", "heads", "wide")


def load_start(source: str) -> tuple[ValueNet, dict, str]:
    """``(net, meta, how)`` of ``source`` (see the module docstring); ``how`` says where the weights came from."""
    if is_pretrained(source):
        _, _, path = resolve(source)
        net, meta = onnx_start(path)
        return net, meta, f"{source}: the packaged int8 graph's weights, dequantised ({path.name})"
    path = Path(source)
    if not path.is_file():
        raise InputError("no such controller (a controller.safetensors, an .onnx export or pretrained:NAME)", source)
    if path.suffix == ".onnx":
        net, meta = onnx_start(path)
        return net, meta, f"{path}: the graph's weights (int8 dequantised); its source checkpoint gives exact ones"
    from branchgate.training.checkpoint import load_controller

    net, meta = load_controller(path)
    return net, meta, f"{path}: its weights"


def onnx_start(path: Path) -> tuple[ValueNet, dict]:
    """The ValueNet and checkpoint-like meta of an exported controller graph (module docstring)."""
    import onnx
    from onnx import numpy_helper

    where = str(path)
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError and friends
        raise InputError(f"not a readable ONNX file ({str(exc).splitlines()[0] if str(exc) else exc})", where) from None
    props = {p.key: p.value for p in model.metadata_props}
    for key in ("net", "encoder", "dim", "feature_names", "stage"):
        if key not in props:
            raise InputError(f"not a branchgate controller export: metadata has no {key!r}", where)
    try:
        net = ValueNet(**json.loads(props["net"]))
    except (TypeError, ValueError) as exc:
        raise InputError(f"metadata 'net' does not describe a ValueNet ({exc})", where) from None
    if json.loads(props["feature_names"]) != FEATURE_NAMES:
        raise MismatchError(f"{where}: features {props['feature_names']} != the Gate's {FEATURE_NAMES}")
    inits = {}
    for graph in _graphs(model.graph):
        inits.update({i.name: numpy_helper.to_array(i) for i in graph.initializer})
    state = _state_from_initializers(net, inits, where)
    net.load_state_dict(state)
    net.eval()
    fr = json.loads(props["feature_range"]) if props.get("feature_range") else None
    if fr:
        net.set_feature_range([fr[n][0] for n in FEATURE_NAMES], [fr[n][1] for n in FEATURE_NAMES])
    meta = {
        "encoder": props["encoder"],
        "encoder_path": None,
        "dim": int(props["dim"]),
        "max_length": int(props.get("max_length") or 0),
        "tau": float(props["tau"]) if props.get("tau") else None,
        "feature_names": list(FEATURE_NAMES),
        "stage": props["stage"],
    }
    return net, meta


def _graphs(graph):
    """The graph and every subgraph (the export's skippable tower/head parts live in ``If`` branches)."""
    import onnx

    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)


def _state_from_initializers(net: ValueNet, inits: dict, where: str) -> dict:
    """The net's state dict from graph initializers: named tensors (``net.X``) by name, the linear layers' weights
    (exported as anonymous ``[in, out]`` MatMul operands, int8 with a scale and zero point) by their shape."""
    state = {k: v.clone() for k, v in net.state_dict().items()}
    for key in state:
        if f"net.{key}" in inits:
            state[key] = torch.as_tensor(np.array(inits[f"net.{key}"], np.float32)).reshape(state[key].shape)
    matrices = {}
    for name, value in inits.items():
        if name.endswith("_quantized"):
            base = name[: -len("_quantized")]
            scale, zero = inits.get(f"{base}_scale"), inits.get(f"{base}_zero_point")
            if scale is None or zero is None:
                raise InputError(f"int8 weight {name!r} has no scale or zero point", where)
            value = (value.astype(np.float32) - zero.astype(np.float32)) * scale.astype(np.float32)
        elif name.startswith("net.") or value.ndim != 2 or value.dtype != np.float32:
            continue
        matrices.setdefault(tuple(value.shape), []).append((name, value))
    modules = dict(net.named_modules())
    for layer in _LINEARS:
        if layer not in modules:
            continue  # towers "none": no tower layers
        weight = state[f"{layer}.weight"]  # [out, in]; the graph multiplies by its transpose
        found = matrices.get((weight.shape[1], weight.shape[0]), [])
        if f"net.{layer}.weight" in inits:
            continue  # exported under its own name (read above)
        named = [v for n, v in found if n.startswith(f"net.{layer}.weight")]
        if len(named) == 1:
            found = [(layer, named[0])]
        if len(found) != 1:
            raise InputError(
                f"cannot tell which graph weight is {layer} ({len(found)} of shape {tuple(weight.shape[::-1])}); "
                "start from the controller.safetensors the export was made from",
                where,
            )
        state[f"{layer}.weight"] = torch.as_tensor(np.ascontiguousarray(found[0][1].T))
    return state


def check_start(meta: dict, manifest: dict, dataset: str, source: str) -> None:
    """The start fits the dataset: same stage, same encoder (``MismatchError`` naming both)."""
    stage, want = meta.get("stage") or "pre", dataset_stage(manifest)
    if stage != want:
        raise MismatchError(
            f"--init-from {source} is a {stage!r}-stage controller but {dataset} is a {want!r}-stage dataset: "
            f"start a {want} controller from a {want} one (e.g. pretrained:{want})"
        )
    try:
        check_encoder(manifest["encoder"], meta["encoder"], f"{dataset}/manifest.json")
    except MismatchError as exc:
        raise MismatchError(
            f"--init-from {source} was trained on {meta['encoder']!r} embeddings: {exc} (rebuild the dataset with "
            "that encoder, or train from scratch)"
        ) from None


def apply_start(net: ValueNet, freeze: str) -> list[str]:
    """Freeze ``net``'s parameters per ``freeze`` (``FREEZE``); returns the names left trainable."""
    if freeze not in FREEZE:
        raise InputError(f"must be one of {', '.join(FREEZE)}, got {freeze!r}", "--freeze")
    frozen = {"none": (), "towers": ("state_tower.", "cand_tower."), "mlp": ("state_tower.", "cand_tower.", "mlp.")}
    trainable = []
    for name, p in net.named_parameters():
        p.requires_grad_(not name.startswith(frozen[freeze]))
        if p.requires_grad:
            trainable.append(name)
    return trainable


def switch_order_on(net: ValueNet, features) -> None:
    """A start trained without the position input (``order`` false: it read 0) that will now read it: the weights
    reading ``order`` and ``order_frac`` start at 0 (the start's scores are unchanged until training moves them) and
    their standardisation is the new train split's (``features``: its [rows, F] structured features)."""
    f = np.asarray(features, np.float64)
    order, n_cand = f[:, FEATURE_NAMES.index("order")], f[:, FEATURE_NAMES.index("n_candidates")]
    values = {"order": order, "order_frac": order / np.maximum(n_cand - 1.0, 1.0)}
    n_text = net.mlp[0].in_features - len(SCALAR_NAMES)
    with torch.no_grad():
        for name, v in values.items():
            j = SCALAR_NAMES.index(name)
            net.mlp[0].weight[:, n_text + j] = 0.0
            net.wide.weight[:, j] = 0.0
            if len(v):
                net.scalar_mean[j] = float(v.mean())
                net.scalar_std[j] = max(float(v.std()), 1e-6)
    net.order = True


def union_range(net: ValueNet, train_range: dict | None) -> None:
    """Widen the net's structured-feature range to include the new train split's."""
    if train_range is None:
        return
    lo = torch.minimum(net.feature_min, torch.tensor([train_range[n][0] for n in FEATURE_NAMES]))
    hi = torch.maximum(net.feature_max, torch.tensor([train_range[n][1] for n in FEATURE_NAMES]))
    net.set_feature_range(lo, hi)
