"""PNG plots of a test evaluation: ROC, PR, reliability diagram, keep rate and recall vs τ."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from branchgate.fileio import atomic_path
from branchgate.training.metrics import reliability

PLOTS = ["roc.png", "pr.png", "reliability.png", "keep_recall_vs_tau.png"]


def _save(fig, path: Path) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")


def write_plots(
    out: str | Path, labels, model_scores, model_probs, tau: float, baselines: dict | None = None
) -> list[Path]:
    """``baselines``: name → test scores (same rows). Rows with label -1 are left out of label curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import precision_recall_curve, roc_curve

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    labels = np.asarray(labels)
    m = labels >= 0
    y = labels[m]
    curves = {"model (p_keep)": np.asarray(model_scores)[m]}
    for name, s in (baselines or {}).items():
        curves[name] = np.asarray(s)[m]
    written = []
    both = len(np.unique(y)) == 2

    fig, ax = plt.subplots(figsize=(5, 5))
    if both:
        for i, (name, s) in enumerate(curves.items()):
            fpr, tpr, _ = roc_curve(y, s)
            ax.plot(fpr, tpr, lw=2.2 if i == 0 else 1.0, label=name)
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC (test)")
    ax.legend(fontsize=7, loc="lower right")
    _save(fig, out / "roc.png")
    plt.close(fig)
    written.append(out / "roc.png")

    fig, ax = plt.subplots(figsize=(5, 5))
    if both:
        for i, (name, s) in enumerate(curves.items()):
            prec, rec, _ = precision_recall_curve(y, s)
            ax.plot(rec, prec, lw=2.2 if i == 0 else 1.0, label=name)
        ax.axhline(y.mean(), color="k", ls=":", lw=0.8)
    ax.set(xlabel="recall", ylabel="precision", title="Precision-recall (test)", ylim=(0, 1.02))
    ax.legend(fontsize=7, loc="upper right")
    _save(fig, out / "pr.png")
    plt.close(fig)
    written.append(out / "pr.png")

    fig, ax = plt.subplots(figsize=(5, 5))
    bins = reliability(np.asarray(model_probs)[m], y)
    if bins:
        px, py, n = zip(*bins)
        ax.plot(px, py, "o-", label="model")
        for a, b, c in bins:
            ax.annotate(str(c), (a, b), fontsize=6, xytext=(3, -8), textcoords="offset points")
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set(
        xlabel="predicted p_keep",
        ylabel="observed positive rate",
        title="Reliability (test, counts per bin)",
        xlim=(0, 1),
        ylim=(0, 1),
    )
    ax.legend(fontsize=7)
    _save(fig, out / "reliability.png")
    plt.close(fig)
    written.append(out / "reliability.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    grid = np.linspace(0, 1, 101)
    all_scores = np.asarray(model_scores)
    keep = [(all_scores >= t).mean() if len(all_scores) else 0 for t in grid]
    pos = curves["model (p_keep)"][y == 1]
    recall = [(pos >= t).mean() if len(pos) else 0 for t in grid]
    ax.plot(grid, keep, label="keep rate")
    ax.plot(grid, recall, label="recall of positives")
    ax.axvline(tau, color="k", ls="--", lw=0.8, label=f"τ = {tau:.3f}")
    ax.set(
        xlabel="τ (keep when p_keep ≥ τ)", ylabel="fraction", title="Keep rate and recall vs τ (test)", ylim=(0, 1.02)
    )
    ax.legend(fontsize=7)
    _save(fig, out / "keep_recall_vs_tau.png")
    plt.close(fig)
    written.append(out / "keep_recall_vs_tau.png")
    return written
