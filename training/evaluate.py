"""Score a trained controller on a dataset's splits, calibrate τ, compare with baselines, write metrics + plots.

A controller is scored either as trained (``evaluate_checkpoint``: the ValueNet on the embedding cache,
``predict``) or as deployed (``evaluate_model``: an exported ``controller.onnx``, fp32 or int8, through the Gate
over the dataset's decision points, grouped as training groups them); both report the same metrics
(``write_evaluation``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from branchgate import __version__
from branchgate.data.datamodule import DecisionDataModule
from branchgate.data.dataset_schema import SPLITS, dataset_stage
from branchgate.data.decision_batches import TextTable, build_decisions, check_encoder, load_decision_dataset
from branchgate.errors import MismatchError
from branchgate.fileio import atomic_dir, atomic_write_json, check_output_dir
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import DecisionState
from branchgate.inference.model_file import controller_path
from branchgate.models.encoder import recorded_spec
from branchgate.texts import candidate_text
from branchgate.training.baselines import evaluate_baselines, platt_coefficients
from branchgate.training.metrics import METRIC_KEYS, calibrate_tau, clean, gate_metrics, top1_accuracy
from branchgate.training.plots import write_plots

log = logging.getLogger(__name__)
OUTPUT_KIND = "evaluate"  # the command named in the output folder's mark (``fileio.check_output_dir``)


@torch.no_grad()
def predict(net, dset, table, batch_decisions: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """``(p_keep, utility)`` for every row of the split ``dset`` was built from (split row order)."""
    n = len(dset.decision)
    p_keep, util = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
    was_training = net.training
    net.eval()
    for start in range(0, len(dset), batch_decisions):
        b = dset.batch(np.arange(start, min(start + batch_decisions, len(dset))), table)
        logit, u = net.score_batch(b["root"], b["frame"], b["goal"], b["retained"], b["cand"], b["features"])
        m = b["mask"].numpy()
        rows = dset.row[b["rows"].numpy()[m]]
        p_keep[rows] = torch.sigmoid(logit).numpy()[m]
        util[rows] = u.numpy()[m]
    net.train(was_training)
    return p_keep, util


def _col(split, name, dtype) -> np.ndarray:
    return np.asarray([np.nan if v is None else v for v in split[name]], dtype=dtype)


def calibrate_probabilities(net, dm) -> dict | None:
    """Platt-scale the net's keep logit on the validation split (in place), so p_keep is a calibrated
    probability; the ranking, AUROC and the decisions at a τ recalibrated afterwards are unchanged.
    Returns ``{"scale", "shift"}``, or None (identity kept) without both classes or with a fit that would
    invert the ranking."""
    net.set_keep_calibration(1.0, 0.0)
    p, _ = predict(net, dm.sets["validation"], dm.table)
    p = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
    coef = platt_coefficients(np.log(p) - np.log1p(-p), np.asarray(dm.splits["validation"]["label"], np.int64))
    if coef is None or not coef[0] > 0:
        return None
    net.set_keep_calibration(*coef)
    return {"scale": coef[0], "shift": coef[1]}


def calibrate(net, dm, method: str = "f1", keep_rate: float | None = None, tau: float | None = None) -> float:
    """τ from the validation split."""
    p, _ = predict(net, dm.sets["validation"], dm.table)
    return calibrate_tau(p, np.asarray(dm.splits["validation"]["label"], np.int64), method, keep_rate, tau)


def evaluate(
    net,
    meta: dict,
    dm,
    out: str | Path,
    tau: float,
    calibration: dict | None = None,
    seed: int = 0,
    extra: dict | None = None,
) -> dict:
    """Test-split metrics of the model (at ``tau``) and every baseline → ``out/metrics.json`` + PNG plots."""
    p, u = predict(net, dm.sets["test"], dm.table)
    return write_evaluation(p, u, meta, dm, out, tau, calibration, seed, extra)


def write_evaluation(
    p: np.ndarray,
    u: np.ndarray,
    meta: dict,
    dm,
    out: str | Path,
    tau: float,
    calibration: dict | None = None,
    seed: int = 0,
    extra: dict | None = None,
) -> dict:
    """The metrics of a model's test-split scores ``p`` (p_keep) and ``u`` (utility), in split row order, at ``tau``
    and of every baseline → ``out/metrics.json`` + PNG plots. ``dm``: the dataset's ``splits``, ``sets`` (grouped
    decision points), ``manifest``, ``dataset_path`` and ``cache_stats``."""
    out = Path(out)
    calibration = dict(calibration or {"method": "f1", "keep_rate": None})
    test = dm.splits["test"]
    dset = dm.sets["test"]
    labels, utility = np.asarray(test["label"], np.int64), _col(test, "utility", np.float64)
    model = gate_metrics(p, p, labels, utility, dset.decision, tau, utility_pred=u)
    model["top1_accuracy_utility_head"] = top1_accuracy(u, utility, dset.decision)
    baselines, curves = evaluate_baselines(
        dm.splits,
        dset.decision,
        model["keep_rate"] or 0.0,
        calibration.get("method", "f1"),
        calibration.get("keep_rate"),
        seed,
    )
    metrics = {
        **model,
        "baselines": baselines,
        "encoder": meta.get("encoder"),
        "dataset": str(dm.dataset_path),
        "data_sha256": meta.get("data_sha256"),
        "label_kind": dm.manifest.get("label_kind"),
        "label_threshold": dm.manifest.get("label_threshold"),
        "calibration": calibration,
        "n_decision_points": {name: len(s) for name, s in dm.sets.items()},
        "n_rows": {name: s.n_rows for name, s in dm.sets.items()},
        "embedding_cache": dm.cache_stats,
        "branchgate_version": __version__,
        **(extra or {}),
    }
    metrics = clean(metrics)
    atomic_write_json(out / "metrics.json", metrics)
    write_plots(out, labels, p, p, tau, curves)
    return metrics


def format_table(metrics: dict) -> str:
    """Model vs baselines, one row each."""
    cols = [k for k in METRIC_KEYS if k not in ("precision", "recall")]
    rows = [("model", metrics)] + list(metrics.get("baselines", {}).items())
    width = max(len(name) for name, _ in rows)
    head = f"{'':<{width}}  " + "  ".join(f"{c[:9]:>9}" for c in cols)

    def cell(v):
        return f"{v:>9.4f}" if isinstance(v, (int, float)) else f"{'-':>9}"

    lines = [head] + [f"{name:<{width}}  " + "  ".join(cell(m.get(c)) for c in cols) for name, m in rows]
    return "\n".join(lines)


def checkpoint_data(checkpoint, dataset, cache, stage: str):
    """``(net, meta, dm)``: a trained controller and a decision dataset's data module set up for ``stage``
    (``test``, ``predict``), with the dataset's encoder checked against the checkpoint's (``MismatchError``), and
    the checkpoint's ``max_length`` against that encoder's."""
    from branchgate.training.checkpoint import check_max_length, load_controller

    net, meta = load_controller(checkpoint)
    dm = DecisionDataModule(str(dataset), encoder=meta["encoder"], cache=cache)
    dm.encoder_spec = recorded_spec(meta["encoder"], meta.get("encoder_path"))
    dm.setup(stage)
    check_max_length(meta, dm.encoder, str(checkpoint))
    return net, meta, dm


def evaluate_checkpoint(
    checkpoint: str | Path,
    dataset: str | Path,
    out: str | Path,
    cache: str | None = None,
    recalibrate: str | None = None,
    keep_rate: float | None = None,
    seed: int = 0,
) -> dict:
    """``branchgate evaluate``: recompute metrics.json and plots for a trained controller (``controller.safetensors``;
    a Lightning ``.ckpt`` only if ``torch.load(weights_only=True)`` can read it, see ``training/checkpoint.py``)."""
    check_output_dir(out, [checkpoint, dataset, cache], OUTPUT_KIND)
    net, meta, dm = checkpoint_data(checkpoint, dataset, cache, "test")
    check_same_stage(dm.manifest, meta.get("stage") or "pre", str(checkpoint), dataset)
    calibration = dict(meta.get("calibration") or {"method": "f1", "keep_rate": None})
    tau = meta.get("tau")
    if recalibrate or tau is None:
        dm.require_labels("validation")
        calibration = {"method": recalibrate or calibration.get("method", "f1"), "keep_rate": keep_rate}
        tau = calibrate(net, dm, calibration["method"], keep_rate, meta.get("tau"))
    with atomic_dir(out, OUTPUT_KIND) as tmp:  # metrics.json and the plots replace an earlier evaluation whole
        return evaluate(
            net,
            meta,
            dm,
            tmp,
            float(tau),
            calibration,
            seed=seed,
            extra={"checkpoint": str(checkpoint), "tau_source": "recalibrated" if recalibrate else "checkpoint"},
        )


def evaluate_model(
    model: str | Path,
    dataset: str | Path,
    out: str | Path,
    recalibrate: str | None = None,
    keep_rate: float | None = None,
    seed: int = 0,
    threads: int | None = None,
) -> dict:
    """``branchgate evaluate --model``: the metrics of an exported controller (``controller.onnx`` or its int8 twin)
    as deployed — the Gate scores every decision point of the dataset's test split (``gate_predict``) — the same
    metrics, baselines and plots as ``evaluate_checkpoint``. The dataset's encoder and stage must be the
    controller's (metadata ``encoder``, ``stage``); τ is the controller's (metadata ``tau``; the root frame's
    ``root_tau`` does not apply, as for a checkpoint) unless ``recalibrate``."""
    model = controller_path(model)
    check_output_dir(out, [model, dataset], OUTPUT_KIND)
    gate = Gate.load(model, threads=threads)
    dm = grouped_dataset(dataset)
    check_encoder(dm.manifest["encoder"], gate.encoder, f"{dataset}/manifest.json")
    check_same_stage(dm.manifest, gate.stage, str(gate.path), dataset)
    dm.require_labels("test")
    tau, calibration = gate.tau, {"method": "f1", "keep_rate": None}
    if recalibrate:
        dm.require_labels("validation")
        calibration = {"method": recalibrate, "keep_rate": keep_rate}
        p_val, _ = gate_predict(gate, dm.splits["validation"], dm.sets["validation"])
        labels = np.asarray(dm.splits["validation"]["label"], np.int64)
        tau = calibrate_tau(p_val, labels, recalibrate, keep_rate, gate.tau)
    p, u = gate_predict(gate, dm.splits["test"], dm.sets["test"])
    meta = {"encoder": gate.encoder, "data_sha256": gate.meta.get("data_sha256") or None}
    extra = {
        "model": str(gate.path),
        "precision": gate.meta.get("precision"),
        "stage": gate.stage,
        "tau_source": "recalibrated" if recalibrate else "model",
    }
    with atomic_dir(out, OUTPUT_KIND) as tmp:  # metrics.json and the plots replace an earlier evaluation whole
        return write_evaluation(p, u, meta, dm, tmp, float(tau), calibration, seed=seed, extra=extra)


def check_same_stage(manifest: dict, stage: str, model: str, dataset) -> None:
    """``MismatchError`` unless the dataset's decisions (``dataset_schema.dataset_stage``: the manifest's ``stage``,
    none: ``pre``) are of the controller's ``stage``."""
    have = dataset_stage(manifest, f"{dataset}/manifest.json")
    if have != stage:
        raise MismatchError(
            f"{dataset}/manifest.json: the dataset holds {have!r}-stage decisions (manifest stage) but {model} is a "
            f"{stage!r}-stage controller; evaluate a controller on a dataset of its own stage"
        )


def grouped_dataset(dataset: str | Path):
    """The dataset's splits grouped into decision points as training groups them
    (``data.decision_batches.build_decisions``), without embedding anything: what the Gate needs to score them."""
    dm = DecisionDataModule(str(dataset), show_progress=False)
    dm.splits, dm.manifest = load_decision_dataset(dataset)
    texts = TextTable()
    dm.sets = {name: build_decisions(name, dm.splits[name], texts) for name in SPLITS}
    return dm


def gate_predict(gate, split, dset) -> tuple[np.ndarray, np.ndarray]:
    """``(p_keep, utility)`` of every row of ``split`` (split row order) by an ONNX ``gate``, decision point by
    decision point (``dataset_decisions``)."""
    n = len(dset.decision)
    p_keep, util = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
    for state, texts, rows in dataset_decisions(split, dset):
        p_keep[rows], util[rows] = gate.predict(state, texts)
    return p_keep, util


def dataset_decisions(split, dset, limit: int | None = None):
    """``(DecisionState, candidate texts, split rows)`` of the first ``limit`` (default: every) decision point of
    ``dset`` (``build_decisions`` of ``split``), as the Gate takes them: the state from the decision's first row
    (its ``retained`` too: a read dataset stores it there only), the candidates in their order as
    ``texts.candidate_text(query, goal)`` (a read dataset's ``query`` holds the hit text, its ``goal`` is empty)."""
    cols = split.select_columns(["root_query", "frame_query", "parent_goal", "retained", "query", "goal", "depth"])[:]
    for d in range(len(dset) if limit is None else min(len(dset), limit)):
        rows = dset.row[dset.cand_ptr[d] : dset.cand_ptr[d + 1]]
        r0 = int(rows[0])
        state = DecisionState(
            cols["root_query"][r0] or "",
            cols["frame_query"][r0] or "",
            cols["parent_goal"][r0] or "",
            list(cols["retained"][r0] or []),
            int(cols["depth"][r0] or 0),
        )
        yield state, [candidate_text(cols["query"][i], cols["goal"][i]) for i in rows], rows
