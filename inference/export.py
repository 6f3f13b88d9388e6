"""Export a trained controller to ONNX: encoder + towers + heads in one graph, with parity checks.

    report = export_controller("model.ckpt", "out/controller.onnx", int8=True, parity_dataset="out/dataset")

Writes, beside ``controller.onnx``: ``controller.int8.onnx`` (dynamic int8 quantisation),
``controller.tokenizer.json`` (the encoder's tokenizer, read by the Gate with ``tokenizers``) and
``controller.md`` (model card). Both graphs get skippable tower and head parts (``inference.parts``).
Metadata (``metadata_props``) records the encoder, feature schema, standardisation, τ, versions and the
training-data hash; ``Gate.load`` validates it.

Parity: the torch text tower must reproduce the encoder's own embeddings (what training used) within
``tol``; the fp32 graph, run through the Gate, must match the torch model (encoder + ValueNet) on the
parity decisions within ``tol`` in p_keep (max |Δ|); the int8 graph's AUROC on the labelled decisions
must be within ``auroc_tol`` of the fp32 graph's. A model that fails is not written unless ``force``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from branchgate import __version__
from branchgate.errors import BranchgateError, InputError, MismatchError
from branchgate.fileio import atomic_write_text
from branchgate.inference.gate import GATE_FEATURES, Gate, as_decision, as_state, decision_texts
from branchgate.inference.graph import (DYNAMIC_AXES, GRAPH_IO_VERSION, INPUT_NAMES, OUTPUT_NAMES, ControllerGraph,
                                        eager_attention, set_attention)
from branchgate.inference.packed_tower import PackedBertTower, supports
from branchgate.inference.parts import PARTS, skippable_parts
from branchgate.texts import candidate_text

log = logging.getLogger(__name__)

OPSET = 17
DEFAULT_TAU = 0.5


class ParityError(BranchgateError):
    """The exported graph does not reproduce the torch model; ``report`` holds the figures."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def paths_for(out: str | Path) -> dict[str, Path]:
    """The files one export writes, named after ``out`` (``controller.onnx`` → ``controller.int8.onnx``, ...)."""
    out = Path(out)
    if out.suffix != ".onnx":
        raise InputError("the output must be a .onnx file path", "--out")
    stem = out.name[: -len(".onnx")]
    return {"fp32": out, "int8": out.with_name(f"{stem}.int8.onnx"),
            "tokenizer": out.with_name(f"{stem}.tokenizer.json"), "card": out.with_name(f"{stem}.md")}


def export_controller(ckpt: str | Path, out: str | Path, int8: bool = True, parity_dataset: str | Path | None = None,
                      force: bool = False, **kwargs) -> dict:
    """Export a controller checkpoint (``training.checkpoint``) to ``out``; returns the report dict.

    Raises ``ParityError`` (nothing written) when a parity check fails and ``force`` is false.
    Other keyword arguments go to ``export_model``.
    """
    from branchgate.training.checkpoint import load_controller

    net, meta = load_controller(ckpt)
    return export_model(net, meta, out, int8=int8, parity_dataset=parity_dataset, force=force,
                        source=str(ckpt), **kwargs)


def export_model(net, meta: dict, out: str | Path, *, encoder=None, int8: bool = True,
                 parity_dataset: str | Path | None = None, force: bool = False, tol: float = 1e-4,
                 auroc_tol: float = 0.01, max_decisions: int = 200, split: str = "test",
                 source: str | None = None) -> dict:
    """Export an in-memory ValueNet + its checkpoint metadata (see ``export_controller``)."""
    import torch

    t0 = time.perf_counter()
    paths = paths_for(out)
    names = list(meta.get("feature_names") or [])
    if tuple(names) != GATE_FEATURES:
        raise MismatchError(f"checkpoint feature_names={names} differ from the Gate's {list(GATE_FEATURES)}")
    encoder = encoder or load_encoder(meta)
    if encoder.id != meta.get("encoder"):
        raise MismatchError(f"checkpoint was trained with encoder {meta.get('encoder')!r}, export got {encoder.id!r}")
    if int(meta.get("dim") or encoder.dim) != encoder.dim:
        raise MismatchError(f"checkpoint dim={meta.get('dim')} but encoder {encoder.id!r} has dim {encoder.dim}")
    tau = meta.get("tau")
    notes = []
    if tau is None:
        tau = DEFAULT_TAU
        notes.append(f"checkpoint has no calibrated tau; using {DEFAULT_TAU}")
    decisions, source_note = load_decisions(parity_dataset, split, max_decisions)

    net = net.eval()
    from branchgate.inference.torch_ref import TorchController

    # The torch reference runs the encoder exactly as training embedded the texts (its default attention).
    reference = TorchController(net, encoder)
    with torch_threads(1):  # one thread: robust on a shared machine, where OpenMP barriers stall
        ref = [reference.predict(s, c) for s, c, _ in decisions]
        tower_diff = tower_vs_encoder(reference, encoder, decisions)
    tower = encoder.torch_module().eval()
    graph = ControllerGraph(graph_tower(tower), net).eval()
    paths["fp32"].parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export.", dir=paths["fp32"].parent))
    previous_attention = eager_attention(tower.transformer)
    try:
        tmp_paths = {k: tmp / p.name for k, p in paths.items()}
        tok_text = tokenizer_json(encoder)
        tmp_paths["tokenizer"].write_text(tok_text, encoding="utf-8")
        props = metadata(meta, encoder, float(tau), tok_text, paths["tokenizer"].name, net)
        props["text_tower"] = "packed" if isinstance(graph.tower, PackedBertTower) else "padded"
        raw = tmp / "raw.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            register_onnx_ops()
            torch.onnx.export(graph, example_inputs(encoder, len(GATE_FEATURES)), str(raw), dynamo=False,
                              input_names=INPUT_NAMES, output_names=OUTPUT_NAMES, dynamic_axes=DYNAMIC_AXES,
                              opset_version=OPSET, do_constant_folding=True)
        try:  # the tower and head as skippable parts (see inference.parts)
            write_metadata(raw, tmp_paths["fp32"], dict(props, precision="fp32", parts=PARTS), parts=encoder.dim)
            props["parts"] = PARTS
        except ValueError as exc:
            notes.append(f"tower and head not separable ({exc}): the Gate runs each decision as one graph run")
            write_metadata(raw, tmp_paths["fp32"], dict(props, precision="fp32"))
        set_attention(tower.transformer, previous_attention)
        t_export = time.perf_counter() - t0
        fp32 = _run_gate(tmp_paths["fp32"], decisions)
        labels = np.concatenate([np.asarray(lab, np.float64) for _, _, lab in decisions]) if decisions else np.zeros(0)
        report = {
            "out": str(paths["fp32"]), "source": source, "encoder": encoder.id, "tau": float(tau),
            "branchgate_version": __version__, "exporter": f"torch.onnx (TorchScript, opset {OPSET})",
            "parity": {"decisions": len(decisions), "candidates": int(sum(len(c) for _, c, _ in decisions)),
                       "source": source_note},
            "notes": [n for n in notes if n],
        }
        par = report["parity"]
        par["fp32_max_abs_diff_p_keep"] = _max_diff([r[0] for r in ref], [f[0] for f in fp32])
        par["fp32_max_abs_diff_utility"] = _max_diff([r[1] for r in ref], [f[1] for f in fp32])
        par["tower_max_abs_diff_embedding"] = tower_diff
        par["tolerance"] = tol
        p_torch = np.concatenate([r[0] for r in ref]) if ref else np.zeros(0)
        p_fp32 = np.concatenate([f[0] for f in fp32]) if fp32 else np.zeros(0)
        par["torch_auroc"] = auroc(labels, p_torch)
        par["fp32_auroc"] = auroc(labels, p_fp32)
        failures = []
        if tower_diff > tol:
            failures.append(f"the torch text tower differs from the encoder's own embeddings (what training used) "
                            f"by {tower_diff:.3g} > {tol:g}: the towers do not reproduce encoder {encoder.id!r}")
        if par["fp32_max_abs_diff_p_keep"] > tol:
            failures.append(f"fp32 max |Δp_keep| = {par['fp32_max_abs_diff_p_keep']:.3g} > {tol:g}")
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            qraw = tmp / "quant.onnx"
            with _quiet_root_logger():  # the quantizer logs every tensor at INFO on the root logger
                # from the graph without parts: the quantizer leaves MatMuls inside If branches alone
                quantize_dynamic(str(raw), str(qraw), weight_type=QuantType.QInt8, per_channel=True)
            write_metadata(qraw, tmp_paths["int8"], dict(props, precision="int8"), parts=encoder.dim if "parts" in props else 0)
            qraw.unlink()
            q = _run_gate(tmp_paths["int8"], decisions)
            p_int8 = np.concatenate([x[0] for x in q]) if q else np.zeros(0)
            par["int8_max_abs_diff_p_keep"] = _max_diff([f[0] for f in fp32], [x[0] for x in q])
            # share of candidates whose keep decision at τ is the same in int8 as in fp32 (reported, not checked)
            par["int8_same_keep_at_tau"] = float(np.mean((p_int8 >= tau) == (p_fp32 >= tau))) if len(p_fp32) else None
            par["int8_auroc"] = auroc(labels, p_int8)
            par["auroc_tolerance"] = auroc_tol
            if par["int8_auroc"] is None or par["fp32_auroc"] is None:
                par["int8_auroc_delta"] = None
                report["notes"].append("int8 AUROC not checked: the parity decisions have no labels of both classes")
            else:
                par["int8_auroc_delta"] = abs(par["int8_auroc"] - par["fp32_auroc"])
                if par["int8_auroc_delta"] > auroc_tol:
                    failures.append(f"int8 AUROC {par['int8_auroc']:.4f} vs fp32 {par['fp32_auroc']:.4f} "
                                    f"(|Δ| {par['int8_auroc_delta']:.4f} > {auroc_tol:g})")
        report["passed"] = not failures
        report["failures"] = failures
        report["forced"] = bool(failures and force)
        if failures and not force:
            raise ParityError("parity check failed, nothing written (--force writes it anyway): " + "; ".join(failures),
                              report)
        files = {"fp32": paths["fp32"], "tokenizer": paths["tokenizer"]}
        if int8:
            files["int8"] = paths["int8"]
        report["files"] = {k: str(p) for k, p in files.items()}
        report["files"]["card"] = str(paths["card"])
        report["sizes_mb"] = {k: round(tmp_paths[k].stat().st_size / 2**20, 2) for k in files}
        report["export_s"] = round(t_export, 2)
        report["total_s"] = round(time.perf_counter() - t0, 2)
        for key, path in files.items():
            shutil.move(str(tmp_paths[key]), str(path))
        if not int8 and paths["int8"].exists():  # a twin left by an earlier export no longer matches
            paths["int8"].unlink()
            report["notes"].append(f"removed the stale {paths['int8'].name} of an earlier export")
        atomic_write_text(paths["card"], model_card(report, props, meta))
        return report
    finally:
        set_attention(tower.transformer, previous_attention)
        shutil.rmtree(tmp, ignore_errors=True)


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
    from branchgate.models.encoder import Encoder, recorded_spec

    max_length = int(meta["max_length"]) if meta.get("max_length") else None
    return Encoder(recorded_spec(meta.get("encoder"), meta.get("encoder_path")), max_length=max_length)


def graph_tower(tower):
    """The text tower to export: the packed BERT tower (same embeddings, dense layers on real tokens only)
    when the encoder is a BERT it reproduces, else the padded ``TextTower`` itself."""
    if supports(tower.transformer):
        return PackedBertTower(tower.transformer, tower.pooling).eval()
    return tower


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
        "feature_names": json.dumps(list(GATE_FEATURES)),
        "standardisation": json.dumps(std) if std is not None else "in-graph",
        "data_sha256": str(meta.get("data_sha256") or ""),
        "tokenizer_file": tok_name,
        "tokenizer_sha256": hashlib.sha256(tok_text.encode("utf-8")).hexdigest(),
        "pad_token": str(tokenizer.pad_token or "[PAD]"),
        "pad_token_id": str(int(tokenizer.pad_token_id or 0)),
        "net": json.dumps(net.config()) if hasattr(net, "config") else "{}",
        "opset": str(OPSET),
    }


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
    model.doc_string = "branchgate pre-retrieval controller: token ids of one decision → p_keep, utility"
    onnx.save(model, str(dst))


def example_inputs(encoder, n_features: int):
    """Tracing inputs with every dynamic axis > 1 and distinct sizes (N=3, L, M=2, R=2, K=3)."""
    import torch

    texts = ["what caused the decline", "a second, somewhat longer text to pad the batch", "third"]
    feats = encoder.features(texts)
    d = encoder.dim
    cached = torch.nn.functional.normalize(torch.randn(2, d), dim=-1)
    idx = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    features = torch.tensor([[1.0, i, 3.0, 2.0] for i in range(3)])[:, :n_features]
    return (feats["input_ids"].long(), feats["attention_mask"].long(), cached, idx(3), idx(0), idx(5), idx(4, 1),
            idx(2, 1, 5), features)


def load_decisions(dataset: str | Path | None, split: str = "test", max_decisions: int = 200):
    """Parity decisions ``[(DecisionState, candidate_texts, labels)]`` from a decision dataset's split
    (grouped by frame, candidates by ``order``), or the built-in samples when no dataset is given."""
    if dataset is None:
        from branchgate.inference.samples import sample_decisions

        out = [(*as_decision(s, cands), [-1] * len(cands)) for s, cands in sample_decisions()]
        return out[:max_decisions], "built-in sample decisions (no labels)"
    try:
        import datasets
    except ImportError:
        raise BranchgateError("a parity dataset needs the train extra (pip install 'branchgate[train]')") from None
    path = Path(dataset)
    if not path.exists():
        raise InputError("no such dataset directory", str(path))
    try:
        data = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise InputError(f"not a saved decision dataset ({exc})", str(path)) from None
    if isinstance(data, datasets.DatasetDict):
        chosen = next((s for s in (split, "validation", "train") if s in data and len(data[s])), None)
        if chosen is None:
            raise InputError("the dataset has no rows to check parity on", str(path))
        note = f"{path} split {chosen}" + ("" if chosen == split else f" ({split!r} is empty or missing)")
        data = data[chosen]
    else:
        note = str(path)
    need = ["run_id", "frame_id", "root_query", "frame_query", "parent_goal", "retained", "query", "goal", "depth",
            "order", "label"]
    missing = [c for c in need if c not in data.column_names]
    if missing:
        raise InputError(f"dataset lacks columns {missing}", str(path))
    cols = data.select_columns(need)[:]
    frames: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(cols["run_id"], cols["frame_id"])):
        frames.setdefault(key, []).append(i)
    out = []
    for key in sorted(frames)[:max_decisions]:
        rows = sorted(frames[key], key=lambda i: cols["order"][i])
        r0 = rows[0]
        state = as_state({"root_query": cols["root_query"][r0], "frame_query": cols["frame_query"][r0],
                          "parent_goal": cols["parent_goal"][r0], "retained": list(cols["retained"][r0] or []),
                          "depth": int(cols["depth"][r0] or 0)})
        cands = [candidate_text(cols["query"][i], cols["goal"][i]) for i in rows]
        out.append((state, cands, [int(cols["label"][i]) for i in rows]))
    return out, f"{note}: {len(out)} of {len(frames)} decisions"


def _run_gate(path: Path, decisions) -> list[tuple[np.ndarray, np.ndarray]]:
    gate = Gate.load(path, threads=2)  # as on a multi-core machine: text groups (one thread each), then the head
    return [gate.predict(s, c) for s, c, _ in decisions]


def tower_vs_encoder(reference, encoder, decisions, limit: int = 64) -> float:
    """Max |Δ| between the torch text tower's embeddings (which the graph reproduces) and the encoder's own
    ``encode`` (which training used) on up to ``limit`` non-empty texts of the parity decisions."""
    texts = [(t or "").strip() for state, cands, _ in decisions for t in decision_texts(state, cands)]
    texts = list(dict.fromkeys(t for t in texts if t))[:limit]
    return _max_diff([reference.embed(texts)], [encoder.encode(texts)]) if texts else 0.0


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    diffs = [float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(a, b) if len(x)]
    return max(diffs) if diffs else 0.0


def auroc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """AUROC over rows labelled 0/1 (other labels ignored); None without both classes."""
    from branchgate.training.metrics import safe_auroc

    labels = np.asarray(labels)
    keep = (labels == 0) | (labels == 1)
    return safe_auroc(labels[keep], np.asarray(scores, np.float64)[keep])


def model_card(report: dict, props: dict, meta: dict) -> str:
    par = report["parity"]

    def fmt(v):
        return "n/a" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))

    files = report["files"]
    lines = [
        f"# branchgate controller — `{Path(files['fp32']).name}`",
        "",
        "A learned **pre-retrieval controller** for deep-research agents: given the state of one decision point "
        "(root query, frame query, parent goal, retained branches, depth) and its candidate subqueries, it predicts "
        "for each candidate the probability that expanding it is worth it (`p_keep`) and its marginal utility (`ĝ`). "
        "Keep a candidate when `p_keep ≥ τ`; when none passes, the top-1 is kept.",
        "",
        "## Model",
        "",
        f"- Encoder (frozen, inside the graph): `{props['encoder']}` (dim {props['dim']}, max {props['max_length']} tokens, "
        f"{props['pooling']} pooling)",
        "- Text tower in the graph: " + ("packed BERT (dense layers run on real tokens only, padding enters attention only; "
                                          "the same embeddings as the encoder)" if props.get("text_tower") == "packed"
                                          else "the encoder's transformer on padded batches"),
        "- Tower and head are skippable parts (an empty `input_ids` runs the head alone, an empty `cand_idx` the tower "
        "alone): on ≥ 2 cores the Gate encodes a decision's new texts as two groups at once, then runs the head"
        if props.get("parts") else "- One graph run per decision (tower and head not separable)",
        f"- Value network: `{props['net']}`; structured features {props['feature_names']}; standardisation inside the graph",
        f"- τ = {float(props['tau']):.4f}"
        + (f" (calibrated: {meta['calibration'].get('method')})" if isinstance(meta.get("calibration"), dict) else ""),
        "- p_keep: " + ("Platt-scaled on the validation split, a calibrated probability"
                        if isinstance(meta.get("calibration"), dict) and meta["calibration"].get("platt")
                        else "the keep head's sigmoid (not recalibrated)"),
        *([f"- Labels: {meta.get('label_kind')} ≥ {meta.get('label_threshold')}"
           + (f", teacher `{meta['teacher']}`" if meta.get("teacher") else "")] if meta.get("label_kind") else []),
        f"- `{Path(files['int8']).name}`: dynamic int8 quantisation (weights int8 per channel, activations "
        "quantised at run time)" if "int8" in files else "- no int8 twin (export with --int8)",
        f"- Trained on data with sha256 `{props['data_sha256'] or 'unknown'}`, controller schema {props['schema_version']}, "
        f"trained with branchgate {props['trained_with'] or 'unknown'}, exported with branchgate {props['branchgate_version']} "
        f"({report['exporter']}, graph IO v{props['graph_io_version']})",
        "",
        "## Files",
        "",
        *[f"- `{Path(p).name}` ({report['sizes_mb'].get(k, '')} MB)" if k in report["sizes_mb"] else f"- `{Path(p).name}`"
          for k, p in files.items()],
        "",
        "## Parity (checked at export)",
        "",
        f"- Decisions: {par['decisions']} ({par['candidates']} candidates) — {par['source']}",
        f"- torch text tower vs the encoder's own embeddings: max |Δ| = {fmt(par.get('tower_max_abs_diff_embedding'))}",
        f"- fp32 ONNX vs torch: max |Δp_keep| = {fmt(par['fp32_max_abs_diff_p_keep'])} (tolerance {par['tolerance']:g}), "
        f"max |Δĝ| = {fmt(par['fp32_max_abs_diff_utility'])}",
        f"- AUROC torch {fmt(par['torch_auroc'])}, fp32 {fmt(par['fp32_auroc'])}"
        + (f", int8 {fmt(par.get('int8_auroc'))} (|Δ| {fmt(par.get('int8_auroc_delta'))}, tolerance {par.get('auroc_tolerance')}); "
           f"int8 max |Δp_keep| vs fp32 = {fmt(par.get('int8_max_abs_diff_p_keep'))}, same keep decision at τ for "
           f"{fmt(par.get('int8_same_keep_at_tau'))} of candidates" if "int8_auroc" in par else ""),
        f"- Passed: {report['passed']}" + (" (FORCED despite: " + "; ".join(report["failures"]) + ")" if report["forced"] else ""),
        *[f"- Note: {n}" for n in report["notes"]],
        "",
        "## Use",
        "",
        "```python",
        "from branchgate.inference.gate import Gate   # needs only numpy, onnxruntime, tokenizers",
        f"gate = Gate.load(\"{Path(files['fp32']).name}\")",
        "sel = gate.select({\"root_query\": \"...\", \"frame_query\": \"...\", \"parent_goal\": \"\", \"retained\": [], \"depth\": 0},",
        "                  [{\"query\": \"...\", \"goal\": \"...\"}])",
        "sel.kept, sel.p_keep, sel.utility, sel.fallback",
        "```",
        "",
        f"Command line: `echo '{{\"state\": {{...}}, \"candidates\": [...]}}' | branchgate gate --model {Path(files['fp32']).name}`",
        "",
        "## Limits",
        "",
        "- Predicts what a post-retrieval teacher (or key-point gain) would judge, from pre-retrieval text only; "
        "its quality is that of its training runs (see the evaluation report of the checkpoint).",
        "- Texts longer than the encoder's limit are truncated; the Gate caches embeddings of texts it has seen.",
        "- English-centric encoder; other languages are tokenised but score less reliably.",
        "",
    ]
    return "\n".join(lines)
