"""Export a trained controller to ONNX: encoder + towers + heads in one graph, with parity checks.

    report = export_controller(
        "run/controller.safetensors", "out/controller.onnx", int8=True, parity_dataset="out/dataset"
    )

Writes, beside ``controller.onnx``: ``controller.int8.onnx`` (dynamic int8 quantisation),
``controller.tokenizer.json`` (the encoder's tokenizer, read by the Gate with ``tokenizers``) and
``controller.md`` (model card), and ``.controller.onnx.branchgate.json``, the record of what the export wrote; the set
replaces an earlier export's whole or not at all, and never a file this export did not write
(``fileio.check_file_set``, checked before any work).
Both graphs get skippable tower and head parts (``export.parts``).
Metadata (``metadata_props``) records the encoder, feature schema, standardisation, τ, versions and the
training-data hash; ``Gate.load`` validates it. The encoder's weights must give the probe-text fingerprint of
the encoder the checkpoint names (``inference.metadata.check_fingerprint``), so the label is never another's.

Parity: the torch text tower must reproduce the encoder's own embeddings (what training used) within
``tol``; the fp32 graph, run through the Gate, must match the torch model (encoder + ValueNet) on the
parity decisions within ``tol`` in p_keep (max |Δ|), and, on a dataset, the training path itself
(``export.parity.training_scores``) within ``tol`` too; the int8 graph's AUROC on the labelled decisions
must be within ``auroc_tol`` of the fp32 graph's. A model that fails is not written unless ``force``.

Over 400 lines: the export's steps and their parity checks in the order they run; the file's metadata is apart
(``onnx_metadata.py``).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from branchgate import __version__
from branchgate.errors import BranchgateError, InputError, MismatchError
from branchgate.export.card import model_card
from branchgate.export.graph import (
    DYNAMIC_AXES,
    INPUT_NAMES,
    OUTPUT_NAMES,
    ControllerGraph,
    eager_attention,
    set_attention,
)
from branchgate.export.onnx_metadata import OPSET, metadata, tokenizer_json, write_metadata
from branchgate.export.packed_tower import PackedBertTower, supports
from branchgate.export.parity import auroc, load_decisions, max_diff, run_gate, tower_vs_encoder, training_scores
from branchgate.export.torch_ref import TorchController
from branchgate.features import FEATURE_NAMES
from branchgate.fileio import check_file_set, write_file_set
from branchgate.inference.metadata import FINGERPRINT_PROBES, PARTS, check_fingerprint
from branchgate.models.encoder import Encoder, recorded_spec

log = logging.getLogger(__name__)

DEFAULT_TAU = 0.5


class ParityError(BranchgateError):
    """The exported graph does not reproduce the torch model; ``report`` holds the figures."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


OUTPUT_KIND = "export"  # the command named in the export's record (``fileio.check_file_set``)


def paths_for(out: str | Path) -> dict[str, Path]:
    """The files one export writes, named after ``out`` (``controller.onnx`` → ``controller.int8.onnx``, ...),
    and ``record``, its list of what it wrote."""
    out = Path(out)
    if out.suffix != ".onnx" or out.name == ".onnx":
        raise InputError("the output must be a .onnx file path", "--out")
    stem = out.name[: -len(".onnx")]
    return {
        "fp32": out,
        "int8": out.with_name(f"{stem}.int8.onnx"),
        "tokenizer": out.with_name(f"{stem}.tokenizer.json"),
        "card": out.with_name(f"{stem}.md"),
        "record": out.with_name(f".{out.name}.branchgate.json"),
    }


def checked_paths(out: str | Path) -> dict[str, Path]:
    """``paths_for(out)`` once none of its files is one the export may not replace (``fileio.check_file_set``:
    each absent, or written by an earlier export and unchanged) and its folder can be written; before any work."""
    paths = paths_for(out)
    check_file_set([p for k, p in paths.items() if k != "record"], paths["record"], OUTPUT_KIND)
    return paths


def export_controller(
    ckpt: str | Path,
    out: str | Path,
    int8: bool = True,
    parity_dataset: str | Path | None = None,
    force: bool = False,
    **kwargs,
) -> dict:
    """Export a controller checkpoint (``training.checkpoint``) to ``out``; returns the report dict.

    Raises ``ParityError`` (nothing written) when a parity check fails and ``force`` is false.
    Other keyword arguments go to ``export_model``.
    """
    from branchgate.training.checkpoint import load_controller

    checked_paths(out)  # before the checkpoint is even read
    net, meta = load_controller(ckpt)
    return export_model(
        net, meta, out, int8=int8, parity_dataset=parity_dataset, force=force, source=str(ckpt), **kwargs
    )


def export_model(
    net,
    meta: dict,
    out: str | Path,
    *,
    encoder=None,
    int8: bool = True,
    parity_dataset: str | Path | None = None,
    force: bool = False,
    tol: float = 1e-4,
    auroc_tol: float = 0.01,
    max_decisions: int = 200,
    split: str = "test",
    source: str | None = None,
) -> dict:
    """Export an in-memory ValueNet + its checkpoint metadata (see ``export_controller``): check the checkpoint
    against its encoder, score the parity decisions with torch, write the graphs to a scratch folder beside
    ``out``, check them there, then move the whole file set into place."""
    t0 = time.perf_counter()
    paths = checked_paths(out)
    encoder = checked_encoder(meta, encoder, source)
    tau, notes = meta.get("tau"), []
    if tau is None:
        tau = DEFAULT_TAU
        notes.append(f"checkpoint has no calibrated tau; using {DEFAULT_TAU}")
    decisions = load_decisions(parity_dataset, split, max_decisions)
    net = net.eval()
    ref, tower_diff, trained = torch_scores(net, encoder, decisions)
    failures = _tower_failures(tower_diff, tol, encoder.id, force, source)
    tower = encoder.torch_module().eval()
    graph = ControllerGraph(graph_tower(tower), net).eval()
    tmp = _scratch_dir(paths["fp32"])
    previous_attention = eager_attention(tower.transformer)
    try:
        tmp_paths = {k: tmp / p.name for k, p in paths.items() if k != "record"}
        tok_text = tokenizer_json(encoder)
        tmp_paths["tokenizer"].write_text(tok_text, encoding="utf-8")
        props = metadata(meta, encoder, float(tau), tok_text, paths["tokenizer"].name, net)
        props["text_tower"] = "packed" if isinstance(graph.tower, PackedBertTower) else "padded"
        raw = trace_graph(graph, encoder, tmp / "raw.onnx")
        notes += _write_fp32(raw, tmp_paths["fp32"], props, encoder.dim)
        set_attention(tower.transformer, previous_attention)
        t_export = time.perf_counter() - t0
        fp32 = run_gate(tmp_paths["fp32"], decisions)
        labels = (
            np.concatenate([np.asarray(lab, np.float64) for _, _, lab in decisions.items])
            if decisions.items
            else np.zeros(0)
        )
        report = {
            "out": str(paths["fp32"]),
            "source": source,
            "encoder": encoder.id,
            "tau": float(tau),
            "branchgate_version": __version__,
            "exporter": f"torch.onnx (TorchScript, opset {OPSET})",
            "parity": {
                "decisions": len(decisions.items),
                "candidates": int(sum(len(c) for _, c, _ in decisions.items)),
                "source": decisions.note,
            },
            "notes": [n for n in notes if n],
        }
        failures += _fp32_parity(report["parity"], ref, fp32, trained, labels, tower_diff, tol)
        if int8:
            _quantize(raw, tmp_paths["int8"], props, encoder.dim)
            q = run_gate(tmp_paths["int8"], decisions)
            failures += _int8_parity(report, fp32, q, labels, tau, auroc_tol)
        report["passed"] = not failures
        report["failures"] = failures
        report["forced"] = bool(failures and force)
        if failures and not force:
            raise ParityError(
                "parity check failed, nothing written (--force writes it anyway): " + "; ".join(failures), report
            )
        moves = _file_set(report, paths, tmp_paths, int8)
        report["export_s"] = round(t_export, 2)
        report["total_s"] = round(time.perf_counter() - t0, 2)
        tmp_paths["card"].write_text(model_card(report, props, meta), encoding="utf-8")
        moves[paths["card"]] = tmp_paths["card"]
        # the whole set (model, twin, tokenizer, card) or, on any failure, the old one; checked again first
        write_file_set(moves, paths["record"], OUTPUT_KIND)
        return report
    finally:
        set_attention(tower.transformer, previous_attention)
        shutil.rmtree(tmp, ignore_errors=True)


def checked_encoder(meta: dict, encoder, source: str | None):
    """The encoder to export with (``encoder``, else the checkpoint's: ``load_encoder``), once the checkpoint has
    the Gate's feature names and the encoder is the one it names (id, probe-text fingerprint: the ONNX is
    labelled with it, dim); else ``MismatchError``."""
    names = list(meta.get("feature_names") or [])
    if tuple(names) != FEATURE_NAMES:
        raise MismatchError(f"checkpoint feature_names={names} differ from the Gate's {list(FEATURE_NAMES)}")
    encoder = encoder or load_encoder(meta)
    if encoder.id != meta.get("encoder"):
        raise MismatchError(f"checkpoint was trained with encoder {meta.get('encoder')!r}, export got {encoder.id!r}")
    check_fingerprint(encoder.id, encoder.encode(list(FINGERPRINT_PROBES)), source or "checkpoint")
    if int(meta.get("dim") or encoder.dim) != encoder.dim:
        raise MismatchError(f"checkpoint dim={meta.get('dim')} but encoder {encoder.id!r} has dim {encoder.dim}")
    return encoder


def torch_scores(net, encoder, decisions):
    """(the torch reference's (p_keep, utility) per decision, max |Δ| of its text tower vs the encoder's own
    embeddings, the training path's p_keep per decision or None without a dataset). The reference runs the
    encoder exactly as training embedded the texts (its default attention), each distinct text once."""
    reference = TorchController(net, encoder, cache=True)
    with torch_threads(1):  # one thread: robust on a shared machine, where OpenMP barriers stall
        ref = [reference.predict(s, c) for s, c, _ in decisions.items]
        tower_diff = tower_vs_encoder(reference, encoder, decisions)
        trained = training_scores(net, encoder, decisions) if decisions.dset is not None else None
    return ref, tower_diff, trained


def _tower_failures(tower_diff: float, tol: float, encoder_id: str, force: bool, source: str | None) -> list[str]:
    """Checked first: the Gate refuses a graph that does not embed as its encoder (``ParityError`` unless
    ``force``)."""
    if not tower_diff > tol:  # written so that a NaN difference passes this check
        return []
    failures = [
        f"the torch text tower differs from the encoder's own embeddings (what training used) "
        f"by {tower_diff:.3g} > {tol:g}: the towers do not reproduce encoder {encoder_id!r}"
    ]
    if not force:
        raise ParityError(
            "parity check failed, nothing written (--force writes it anyway): " + failures[0],
            {
                "passed": False,
                "failures": failures,
                "source": source,
                "encoder": encoder_id,
                "parity": {"tower_max_abs_diff_embedding": tower_diff, "tolerance": tol},
            },
        )
    return failures


def _scratch_dir(fp32: Path) -> Path:
    """A new folder beside the model for the export's files until they move into place."""
    try:
        fp32.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".export.", dir=fp32.parent))
    except OSError as exc:
        raise InputError(f"cannot write the export's folder ({exc.strerror or exc})", "--out") from None


def trace_graph(graph, encoder, raw: Path) -> Path:
    """``graph`` exported to ONNX at ``raw`` (TorchScript exporter, dynamic axes, opset ``OPSET``)."""
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        register_onnx_ops()
        torch.onnx.export(
            graph,
            example_inputs(encoder, len(FEATURE_NAMES)),
            str(raw),
            dynamo=False,
            input_names=INPUT_NAMES,
            output_names=OUTPUT_NAMES,
            dynamic_axes=DYNAMIC_AXES,
            opset_version=OPSET,
            do_constant_folding=True,
        )
    return raw


def _write_fp32(raw: Path, dst: Path, props: dict, dim: int) -> list[str]:
    """The fp32 model with the tower and head as skippable parts (``export.parts``; ``props["parts"]`` set), or
    whole when they cannot be separated (then a note is returned)."""
    try:
        write_metadata(raw, dst, dict(props, precision="fp32", parts=PARTS), parts=dim)
        props["parts"] = PARTS
        return []
    except ValueError as exc:
        write_metadata(raw, dst, dict(props, precision="fp32"))
        return [f"tower and head not separable ({exc}): the Gate runs each decision as one graph run"]


def _p_keep(outputs) -> np.ndarray:
    """All candidates' p_keep of a list of per-decision (p_keep, utility) outputs, in one array."""
    return np.concatenate([x[0] for x in outputs]) if outputs else np.zeros(0)


def _fp32_parity(par: dict, ref, fp32, trained, labels, tower_diff: float, tol: float) -> list[str]:
    """The fp32 Gate vs the torch reference and the training path, into ``par``; the failures."""
    par["fp32_max_abs_diff_p_keep"] = max_diff([r[0] for r in ref], [f[0] for f in fp32])
    par["fp32_max_abs_diff_utility"] = max_diff([r[1] for r in ref], [f[1] for f in fp32])
    par["tower_max_abs_diff_embedding"] = tower_diff
    par["tolerance"] = tol
    par["torch_auroc"] = auroc(labels, _p_keep(ref))
    par["fp32_auroc"] = auroc(labels, _p_keep(fp32))
    if trained is not None:  # the training path itself, as `branchgate evaluate` scores the dataset
        par["training_max_abs_diff_p_keep"] = max_diff(trained, [f[0] for f in fp32])
        par["training_auroc"] = auroc(labels, np.concatenate(trained) if trained else np.zeros(0))
    failures = []
    if par["fp32_max_abs_diff_p_keep"] > tol:
        failures.append(f"fp32 max |Δp_keep| = {par['fp32_max_abs_diff_p_keep']:.3g} > {tol:g}")
    if "training_max_abs_diff_p_keep" in par and par["training_max_abs_diff_p_keep"] > tol:
        failures.append(
            f"fp32 Gate vs the training path: max |Δp_keep| = {par['training_max_abs_diff_p_keep']:.3g} "
            f"> {tol:g} (the Gate does not compute what training scored)"
        )
    return failures


def _quantize(raw: Path, dst: Path, props: dict, dim: int) -> None:
    """The int8 twin at ``dst``: ``raw`` dynamically quantised, with ``props`` (parts when the fp32 has them)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    qraw = raw.with_name("quant.onnx")
    with _quiet_root_logger():  # the quantizer logs every tensor at INFO on the root logger
        # from the graph without parts: the quantizer leaves MatMuls inside If branches alone
        quantize_dynamic(str(raw), str(qraw), weight_type=QuantType.QInt8, per_channel=True)
    write_metadata(qraw, dst, dict(props, precision="int8"), parts=dim if "parts" in props else 0)
    qraw.unlink()


def _int8_parity(report: dict, fp32, q, labels, tau: float, auroc_tol: float) -> list[str]:
    """The int8 Gate vs the fp32 one, into ``report["parity"]`` (a note when AUROC cannot be checked); the
    failures."""
    par = report["parity"]
    p_fp32, p_int8 = _p_keep(fp32), _p_keep(q)
    par["int8_max_abs_diff_p_keep"] = max_diff([f[0] for f in fp32], [x[0] for x in q])
    # share of candidates whose keep decision at τ is the same in int8 as in fp32 (reported, not checked)
    par["int8_same_keep_at_tau"] = float(np.mean((p_int8 >= tau) == (p_fp32 >= tau))) if len(p_fp32) else None
    par["int8_auroc"] = auroc(labels, p_int8)
    par["auroc_tolerance"] = auroc_tol
    if par["int8_auroc"] is None or par["fp32_auroc"] is None:
        par["int8_auroc_delta"] = None
        report["notes"].append("int8 AUROC not checked: the parity decisions have no labels of both classes")
        return []
    par["int8_auroc_delta"] = abs(par["int8_auroc"] - par["fp32_auroc"])
    if par["int8_auroc_delta"] > auroc_tol:
        return [
            f"int8 AUROC {par['int8_auroc']:.4f} vs fp32 {par['fp32_auroc']:.4f} "
            f"(|Δ| {par['int8_auroc_delta']:.4f} > {auroc_tol:g})"
        ]
    return []


def _file_set(report: dict, paths: dict, tmp_paths: dict, int8: bool) -> dict:
    """The files to move into place ({final path: scratch file, or None to remove a stale int8 twin}), recorded
    in ``report`` (``files``, ``sizes_mb``); the model card is added last."""
    files = {"fp32": paths["fp32"], "tokenizer": paths["tokenizer"]}
    if int8:
        files["int8"] = paths["int8"]
    report["files"] = {k: str(p) for k, p in files.items()}
    report["files"]["card"] = str(paths["card"])
    report["sizes_mb"] = {k: round(tmp_paths[k].stat().st_size / 2**20, 2) for k in files}
    moves = {path: tmp_paths[key] for key, path in files.items()}
    if not int8 and paths["int8"].exists():  # an earlier export's twin no longer matches (``checked_paths``: its own)
        moves[paths["int8"]] = None
        report["notes"].append(f"removed the stale {paths['int8'].name} of an earlier export")
    return moves


def register_onnx_ops() -> None:
    """Teach the TorchScript ONNX exporter the ops the value network uses beyond standard ONNX:
    ``torch.linalg.inv`` → onnxruntime's Inverse (com.microsoft)."""
    import torch

    torch.onnx.register_custom_op_symbolic("aten::linalg_inv", _inverse, OPSET)


def _inverse(g, matrix):
    return g.op("com.microsoft::Inverse", matrix).setType(matrix.type())


@contextlib.contextmanager
def torch_threads(n: int):
    """Run a block with ``n`` torch intra-op threads, then restore the previous count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _quiet_root_logger():
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


# -- pieces -----------------------------------------------------------------------------------------------
def load_encoder(meta: dict):
    """The checkpoint's encoder (``models.encoder.recorded_spec``); never downloads."""
    max_length = int(meta["max_length"]) if meta.get("max_length") else None
    return Encoder(recorded_spec(meta.get("encoder"), meta.get("encoder_path")), max_length=max_length)


def graph_tower(tower):
    """The text tower to export: the packed BERT tower (same embeddings, dense layers on real tokens only)
    when the encoder is a BERT it reproduces, else the padded ``TextTower`` itself."""
    if supports(tower.transformer):
        return PackedBertTower(tower.transformer, tower.pooling).eval()
    return tower


def example_inputs(encoder, n_features: int):
    """Tracing inputs with every dynamic axis > 1 and distinct sizes (N=3, L, M=2, R=2, K=3)."""
    import torch

    texts = ["what caused the decline", "a second, somewhat longer text to pad the batch", "third"]
    feats = encoder.features(texts)
    d = encoder.dim
    cached = torch.nn.functional.normalize(torch.randn(2, d), dim=-1)
    idx = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    features = torch.tensor([[1.0, i, 3.0, 2.0] for i in range(3)])[:, :n_features]
    return (
        feats["input_ids"].long(),
        feats["attention_mask"].long(),
        cached,
        idx(3),
        idx(0),
        idx(5),
        idx(4, 1),
        idx(2, 1, 5),
        features,
    )
