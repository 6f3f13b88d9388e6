"""The bench's outputs: ``report.json`` (keys documented in ARCHITECTURE.md), ``report.md`` (the same as
tables) and ``kpr_vs_tokens.png`` (every policy family as a curve of KPR against tokens, 95% intervals), with ``--real``
also ``real_auroc.png`` (each scorer's AUROC on the real decisions, 95% intervals)."""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__"):  # the repository root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

from pathlib import Path

from branchgate.fileio import atomic_path, atomic_write_json, atomic_write_text

REPORT_KEYS = ("policies", "gate_vs", "offline", "offline_by_depth", "real", "labels", "by_labels", "encoder", "timings")
PLOT = "kpr_vs_tokens.png"
REAL_PLOT = "real_auroc.png"


def _f(v, fmt=".3f") -> str:
    return "–" if v is None else format(v, fmt)


def _mc(d: dict, fmt=".3f") -> str:
    lo, hi = d.get("ci95") or (None, None)
    return f"{_f(d.get('mean'), fmt)} [{_f(lo, fmt)}, {_f(hi, fmt)}]"


def markdown(report: dict) -> str:
    lab = report["labels"]
    by = report.get("by_labels") or {}
    lines = ["# branchgate bench", "", f"Labels: `{lab['source']}` (threshold {_f(lab.get('threshold'), '.4g')}"
             f"{'; ' + lab['threshold_rule'] if lab.get('threshold_rule') else ''}); encoder: `{report['encoder']}`; "
             f"{report['queries']['train']} train and {report['queries']['eval']} eval queries. "
             "Every KPR is ground-truth key-point recall on the eval queries, whatever the gate was trained on.", ""]
    if len(by) > 1:
        lines += _sources_tables(report)
    lines += ["## Closed loop (eval queries; mean [95% CI over queries])", "",
              "| policy | spec | runs | nodes | tokens | KPR |", "|---|---|---|---|---|---|"]
    for name, p in report["policies"].items():
        lines.append(f"| {name} | `{p['spec']}` | {p['runs']} | {_mc(p['nodes'], '.2f')} | {_mc(p['tokens'], '.0f')} "
                     f"| {_mc(p['kpr'])} |")
    lines += ["", f"## Gate vs each baseline at its token budget (gate KPR − baseline KPR, paired over queries; "
              f"labels `{lab['source']}`)", "", "| baseline | tokens | Δ KPR [95% CI] | |", "|---|---|---|---|"]
    for name, g in report["gate_vs"].items():
        lines.append(f"| {name} | {g['tokens']:.0f} | {_mc(g['kpr_delta'], '+.3f')} | "
                     f"{'outside the gate sweep (clamped)' if g['extrapolated'] else ''} |")
    sections = [(src, res) for src, res in by.items()] or [(lab["source"], report)]
    for src, res in sections:
        lines += ["", f"## Offline (labels `{src}`: the dataset's test split, its own labels; 95% CI over runs)", ""]
        lines += _offline_table(res["offline"])
        for stratum, table in res["offline_by_depth"].items():
            lines += ["", f"### {stratum}", ""] + _offline_table(table)
    for ds, table in real_tables(report).items():
        lines += ["", f"## Real decisions: {ds} (labelled by their own key points)", "",
                  "| scorer | AUROC [95% CI] | AUPRC | first gate − scorer [95% CI] |", "|---|---|---|---|"]
        for name, m in table.items():
            d = m.get("delta_vs_gate")
            lines.append(f"| {name} | {_mc({'mean': m['auroc'], 'ci95': m['ci95']})} | {_f(m.get('auprc'))} "
                         f"| {_mc(d, '+.3f') if d else ''} |")
    lines += ["", "## Timings (seconds; 0 = reused)", "", "| step | s |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in report["timings"].items()]
    lines += ["", f"![KPR vs tokens]({PLOT})", ""] + ([f"![AUROC on real decisions]({REAL_PLOT})", ""] if report["real"] else [])
    return "\n".join(lines)


def real_tables(report: dict) -> dict[str, dict]:
    """Per ``--real`` dataset: every label source's gate (named by its curve) and then the teachers."""
    by = report.get("by_labels") or {}
    out: dict[str, dict] = {}
    for ds, table in report["real"].items():
        gates = {res["family"]: res["real"][ds]["gate"] for res in by.values() if ds in res.get("real", {})}
        out[ds] = {**(gates or {"gate": table["gate"]}), **{k: v for k, v in table.items() if k != "gate"}}
    return out


def _sources_tables(report: dict) -> list[str]:
    by = report["by_labels"]
    lines = ["## Label sources compared (one gate per source)", "",
             "| labels | gate | threshold | train positive rate | AUROC on own test labels | "
             + " | ".join(f"AUROC on {ds}" for ds in report["real"]) + " |",
             "|---|---|---|---|---|" + "---|" * len(report["real"])]
    for src, res in by.items():
        g = res["offline"].get("gate", {})
        real = [_mc({"mean": res["real"][ds]["gate"]["auroc"], "ci95": res["real"][ds]["gate"]["ci95"]})
                for ds in report["real"]]
        lines.append(f"| `{src}` | {res['family']} | {_f(res['labels'].get('threshold'), '.4g')} "
                     f"| {_f((res['labels'].get('positive_rate') or {}).get('train'))} "
                     f"| {_mc({'mean': g.get('auroc'), 'ci95': g.get('ci95_auroc')})} | " + " | ".join(real)
                     + (" |" if real else "|"))
    baselines = list(next(iter(by.values()))["gate_vs"])
    lines += ["", "Each gate's KPR at a baseline's token budget minus the baseline's (paired over eval queries; "
              "* = outside the gate's τ sweep, clamped):", "",
              "| baseline | tokens | " + " | ".join(res["family"] for res in by.values()) + " |",
              "|---|---|" + "---|" * len(by)]
    for b in baselines:
        cells = []
        for res in by.values():
            g = res["gate_vs"].get(b)
            cells.append("" if g is None else _mc(g["kpr_delta"], "+.3f") + (" *" if g["extrapolated"] else ""))
        tokens = next(iter(by.values()))["gate_vs"][b]["tokens"]
        lines.append(f"| {b} | {tokens:.0f} | " + " | ".join(cells) + " |")
    return lines + [""]


def _offline_table(table: dict) -> list[str]:
    rows = ["| scorer | AUROC [95% CI] | AUPRC | top-1 | rows |", "|---|---|---|---|---|"]
    for name, m in table.items():
        rows.append(f"| {name} | {_mc({'mean': m['auroc'], 'ci95': m['ci95_auroc']})} | {_f(m['auprc'])} "
                    f"| {_f(m['top1'])} | {m['n_rows']} |")
    return rows


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams: dict[str, list] = {}
    for name, p in report["policies"].items():
        fams.setdefault(p["family"], []).append(p)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for fam, pts in fams.items():
        pts = sorted(pts, key=lambda p: p["tokens"]["mean"] or 0)
        x = [p["tokens"]["mean"] for p in pts]
        y = [p["kpr"]["mean"] for p in pts]
        lo = [p["kpr"]["mean"] - (p["kpr"]["ci95"][0] if p["kpr"]["ci95"][0] is not None else p["kpr"]["mean"]) for p in pts]
        hi = [(p["kpr"]["ci95"][1] if p["kpr"]["ci95"][1] is not None else p["kpr"]["mean"]) - p["kpr"]["mean"] for p in pts]
        style = dict(marker="*", markersize=14, linestyle="none", color="black") if fam == "none" else \
            dict(marker="o", linewidth=2.5 if fam.startswith("gate") else 1.2)
        ax.errorbar(x, y, yerr=[lo, hi], label=fam, capsize=2, **style)
    ax.set_xlabel("tokens per run (mean)")
    ax.set_ylabel("key-point recall (mean, 95% CI)")
    sources = ", ".join(report.get("by_labels") or [report["labels"]["source"]])
    ax.set_title(f"closed loop on {report['queries']['eval']} eval queries (gate labels: {sources})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def plot_real(report: dict, path: Path) -> None:
    """AUROC of every scorer on each ``--real`` dataset, with 95% intervals over runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    real = real_tables(report)
    fig, axes = plt.subplots(1, len(real), figsize=(6 * len(real), 4), squeeze=False)
    for ax, (ds, table) in zip(axes[0], real.items()):
        names = list(table)
        y = [table[n]["auroc"] or 0.0 for n in names]
        err = [[max(0.0, v - (table[n]["ci95"][0] if table[n]["ci95"][0] is not None else v)) for n, v in zip(names, y)],
               [max(0.0, (table[n]["ci95"][1] if table[n]["ci95"][1] is not None else v) - v) for n, v in zip(names, y)]]
        ax.bar(names, y, yerr=err, capsize=3, color=["tab:blue" if n.startswith("gate") else "tab:gray" for n in names])
        ax.axhline(0.5, color="black", linewidth=0.8, linestyle=":")
        ax.set_ylim(0, 1)
        ax.set_title(f"real decisions: {ds}")
        ax.set_ylabel("AUROC (95% CI over runs)")
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def write(out: Path, report: dict) -> dict[str, Path]:
    paths = {"json": out / "report.json", "md": out / "report.md", "png": out / PLOT}
    atomic_write_json(paths["json"], report)
    plot(report, paths["png"])
    if report["real"]:
        paths["real_png"] = out / REAL_PLOT
        plot_real(report, paths["real_png"])
    atomic_write_text(paths["md"], markdown(report))
    return paths
