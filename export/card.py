"""The model card written beside an exported controller, rendered from the template ``card.md``."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from string import Template


def _fmt(v) -> str:
    return "n/a" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))


def _share(v) -> str:
    """A fraction as the console prints it: ``1.0`` → ``100.0%``."""
    return "n/a" if v is None else f"{100 * v:.1f}%"


INTRO = {
    "pre": (
        "A learned **pre-retrieval controller** for deep-research agents: given the state of one decision point "
        "(root\nquery, frame query, parent goal, retained branches, depth) and its candidate subqueries, it predicts "
        "for each\ncandidate the probability that expanding it is worth it (`p_keep`) and its marginal utility (`ĝ`). "
        "Keep a\ncandidate when `p_keep ≥ τ`; when none passes, the top-1 is kept."
    ),
    "read": (
        "A learned **read controller** for deep-research agents: after a sub-query's search returns its hits and "
        "before\nany is read, given the run's question, the sub-query, its goal and the texts already read, it "
        "predicts for each new\nhit (title and snippet) the probability that reading it is worth it (`p_keep`) and "
        "its marginal utility (`ĝ`).\nRead a hit when `p_keep ≥ τ`; when none passes, none is read (the branch ends; "
        '`floor="root"` keeps the top hit\nat the root frame).'
    ),
}
USE = {
    "pre": (
        "sel = gate.select(\n"
        '    {"root_query": "...", "frame_query": "...", "parent_goal": "", "retained": [], "depth": 0},\n'
        '    [{"query": "...", "goal": "..."}],\n'
        ")\n"
        "sel.kept, sel.p_keep, sel.utility, sel.fallback"
    ),
    "read": (
        "sel = gate.select(\n"
        '    {"root_query": "...", "query": "the sub-query searched", "goal": "", "read": [], "read_ids": [], '
        '"depth": 1},\n'
        '    [{"title": "...", "snippet": "...", "id": "https://...", "rank": 0}],\n'
        ")\n"
        "sel.kept, sel.p_keep, sel.utility, sel.not_new  # kept may be empty: read nothing"
    ),
}


def model_card(report: dict, props: dict, meta: dict) -> str:
    """Markdown for one export: the model, its files, the parity figures and how to use it."""
    par = report["parity"]
    out = report["files"]
    calib = meta.get("calibration") if isinstance(meta.get("calibration"), dict) else None
    packed = props.get("text_tower") == "packed"
    parity = [
        f"- Decisions: {par['decisions']} ({par['candidates']} candidates) — {par['source']}",
        "- torch text tower vs the encoder's own embeddings: "
        f"max |Δ| = {_fmt(par.get('tower_max_abs_diff_embedding'))}",
        f"- fp32 ONNX vs torch: max |Δp_keep| = {_fmt(par['fp32_max_abs_diff_p_keep'])} "
        f"(tolerance {par['tolerance']:g}), "
        f"max |Δĝ| = {_fmt(par['fp32_max_abs_diff_utility'])}",
    ]
    if "training_max_abs_diff_p_keep" in par:
        parity.append(
            f"- fp32 Gate vs the training path (`branchgate evaluate`'s scoring) on the dataset's rows: "
            f"max |Δp_keep| = {_fmt(par['training_max_abs_diff_p_keep'])}, AUROC "
            f"{_fmt(par.get('training_auroc'))} vs {_fmt(par.get('fp32_auroc'))}"
        )
    auc = f"- AUROC torch {_fmt(par['torch_auroc'])}, fp32 {_fmt(par['fp32_auroc'])}"
    if "int8_auroc" in par:
        auc += (
            f", int8 {_fmt(par.get('int8_auroc'))} (|Δ| {_fmt(par.get('int8_auroc_delta'))}, tolerance "
            f"{par.get('auroc_tolerance')}); int8 max |Δp_keep| vs fp32 = {_fmt(par.get('int8_max_abs_diff_p_keep'))}, "
            f"same keep decision at τ for {_share(par.get('int8_same_keep_at_tau'))} of candidates"
        )
    parity.append(auc)
    parity.append(
        f"- Passed: {report['passed']}"
        + (" (FORCED despite: " + "; ".join(report["failures"]) + ")" if report["forced"] else "")
    )
    parity += [f"- Note: {n}" for n in report["notes"]]
    sizes = report["sizes_mb"]
    labels = ""
    if meta.get("label_kind"):
        labels = (
            f"- Labels: {meta.get('label_kind')} ≥ {meta.get('label_threshold')}"
            + (f", teacher `{meta['teacher']}`" if meta.get("teacher") else "")
            + "\n"
        )
    stage = props.get("stage", "pre")
    values = {
        "intro": INTRO[stage],
        "stage": stage,
        "use": USE[stage],
        "items_key": "hits" if stage == "read" else "candidates",
        "seen": "hit titles and snippets (before the page is read)" if stage == "read" else "pre-retrieval text",
        "model_file": Path(out["fp32"]).name,
        "encoder": props["encoder"],
        "dim": props["dim"],
        "max_length": props["max_length"],
        "pooling": props["pooling"],
        "tower": (
            "packed BERT (dense layers run on real tokens only, padding enters attention only; the same "
            "embeddings as the encoder)"
            if packed
            else "the encoder's transformer on padded batches"
        ),
        "parts": (
            "Tower and head are skippable parts (an empty `input_ids` runs the head alone, an empty `cand_idx` "
            "the tower alone): on ≥ 2 cores the Gate encodes a decision's new texts as two groups at once, then "
            "runs the head"
            if props.get("parts")
            else "One graph run per decision (tower and head not separable)"
        ),
        "net": props["net"],
        "feature_names": props["feature_names"],
        "tau": f"{float(props['tau']):.4f}",
        "calibration": f" (calibrated: {calib.get('method')})" if calib else "",
        "root_tau": (
            f"; at the root frame (depth 0) τ = {float(props['root_tau']):.4f}, fixed in training "
            "(`calibration.root_tau`)"
            if props.get("root_tau")
            else ""
        ),
        "p_keep": (
            "Platt-scaled on the validation split, a calibrated probability"
            if calib and calib.get("platt")
            else "the keep head's sigmoid (not recalibrated)"
        ),
        "labels": labels,
        "int8": (
            f"`{Path(out['int8']).name}`: dynamic int8 quantisation (weights int8 per channel, activations "
            "quantised at run time)"
            if "int8" in out
            else "no int8 twin (export with --int8)"
        ),
        "data_sha256": props["data_sha256"] or "unknown",
        "schema_version": props["schema_version"],
        "trained_with": props["trained_with"] or "unknown",
        "branchgate_version": props["branchgate_version"],
        "exporter": report["exporter"],
        "graph_io_version": props["graph_io_version"],
        "files": "\n".join(
            f"- `{Path(p).name}` ({sizes[k]} MB)" if k in sizes else f"- `{Path(p).name}`" for k, p in out.items()
        ),
        "parity": "\n".join(parity),
    }
    template = Template(files("branchgate.export").joinpath("card.md").read_text(encoding="utf-8"))
    return template.substitute(values)
