"""The bench's outputs: ``report.json`` (keys documented in ARCHITECTURE.md), ``report.md`` (the same as
tables) and ``kpr_vs_tokens.png`` (every policy family as a curve of KPR against tokens, 95% intervals), with ``--real``
also ``real_auroc.png`` (each scorer's AUROC on the real decisions, 95% intervals).

Over 400 lines: the report's one schema (``REPORT_KEYS``) and its Markdown rendering, kept together so that a key
and the table showing it change in one place.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from branchgate.bench import read_report
from branchgate.bench.read_report import _f, _mc
from branchgate.bench.sweeps import VARIANTS
from branchgate.fileio import atomic_path, atomic_write_json, atomic_write_text

REPORT_KEYS = (
    "policies",
    "gate_vs",
    "offline",
    "offline_by_depth",
    "offline_eval_by_depth",
    "real",
    "real_by_depth",
    "labels",
    "by_labels",
    "budgets",
    "read",
    "read_targets",
    "findings",
    "encoder",
    "timings",
)  # "budgets" only when the budgets step ran (policies.budget_fractions); "read", "read_targets" with gate_stages read
COLLAPSE = 0.10  # a τ sweep whose token range is below this share of the unpruned tokens offers no cost control
OVERFIT = 0.15  # own-label AUROC this far above the real-decision AUROC: the labels do not transfer
ROOT_GAP = 0.10  # pooled AUROC this far above depth ≥ 1: the pooled figure mostly measures the root frame
REAL_STRATA = {
    "depth0": "the root frame: a sequential agent's first search, before any search state",
    "depth1+": "below the root: each judged against the searches before it",
}
PLOT = "kpr_vs_tokens.png"
REAL_PLOT = "real_auroc.png"


def markdown(
    report: dict, level: int = 1, images: str = "", title: str = "branchgate bench", fold: bool = False
) -> str:
    """The report as Markdown: ``level`` is the title's heading level (sections one deeper), ``images`` the
    folder the PNG links point into (README: ``docs/bench/``); ``fold`` puts the long tables (every policy
    point, the per-depth offline tables) in collapsed ``<details>`` blocks."""
    opened, closed = (lambda what: [f"<details><summary>{what}</summary>", ""]), (["", "</details>"] if fold else [])
    h = "#" * (level + 1)
    lab = report["labels"]
    by = report.get("by_labels") or {}
    lines = [f"{'#' * level} {title}", ""]
    if report.get("command"):
        lines += [
            f"Made by `{report['command']}`" + (f" at commit {report['commit']}" if report.get("commit") else "") + ".",
            "",
        ]
    lines += [
        f"Labels: `{lab['source']}` (threshold {_f(lab.get('threshold'), '.4g')}"
        f"{'; ' + lab['threshold_rule'] if lab.get('threshold_rule') else ''}); encoder: `{report['encoder']}`; "
        f"{report['queries']['train']} train and {report['queries']['eval']} eval queries. "
        "Every KPR is ground-truth key-point recall on the eval queries, whatever the gate was trained on.",
        "",
    ]
    if report.get("findings"):
        lines += [f"{h} Findings (stated by the bench from the figures below)", ""]
        lines += [f"- {f}" for f in report["findings"]] + [""]
    if len(by) > 1 or any(res.get(v) for res in by.values() for v in VARIANTS):
        lines += _sources_tables(report, h)
    lines += [f"![KPR vs tokens]({images}{PLOT})", ""]
    lines += [f"{h} Closed loop (eval queries; mean [95% CI over queries])", ""]
    lines += opened(f"Every policy point ({len(report['policies'])})") if fold else []
    lines += ["| policy | spec | runs | nodes | tokens | KPR |", "|---|---|---|---|---|---|"]
    for name, p in report["policies"].items():
        lines.append(
            f"| {name} | `{p['spec']}` | {p['runs']} | {_mc(p['nodes'], '.2f')} | {_mc(p['tokens'], '.0f')} "
            f"| {_mc(p['kpr'])} |"
        )
    lines += closed
    if report.get("budgets"):
        lines += [""] + budget_table(report["budgets"], h)
    if report.get("calibration"):  # bench/calibration.py, with --real
        lines += ["", f"{h} The simulator against the real logs (unpruned eval runs vs the first --real)", ""]
        lines += report["calibration"]["table"]
    if report.get("read"):
        lines += [""] + read_report.section(report, h)
    if report.get("real_track"):  # bench/real_track.py, with --real and a read stage
        from branchgate.bench import real_track

        lines += ["", *real_track.markdown(report["real_track"], h, f"{images}{real_track.PLOT}")]
    lines += [
        "",
        f"{h} Gate vs each baseline at its token budget (gate KPR − baseline KPR, paired over queries; "
        f"labels `{lab['source']}`)",
        "",
        "| baseline | tokens | Δ KPR [95% CI] | |",
        "|---|---|---|---|",
    ]
    for name, g in report["gate_vs"].items():
        lines.append(f"| {name} | {g['tokens']:.0f} | {_mc(g['kpr_delta'], '+.3f')} | {_outside(g)} |")
    for ds, table in real_tables(report).items():
        lines += [
            "",
            f"{h} Real decisions: {ds} (labelled by their own key points; 95% CI over runs)",
            "",
            "| scorer | AUROC [95% CI] | AUPRC | first gate − scorer [95% CI] |",
            "|---|---|---|---|",
        ]
        for name, m in table.items():
            d = m.get("delta_vs_gate")
            lines.append(
                f"| {name} | {_mc({'mean': m['auroc'], 'ci95': m['ci95']})} | {_f(m.get('auprc'))} "
                f"| {_mc(d, '+.3f') if d else ''} |"
            )
    if report["real"]:
        lines += ["", f"![AUROC on real decisions]({images}{REAL_PLOT})"]
    for ds, strata in (report.get("real_by_depth") or {}).items():
        for stratum, table in strata.items():
            lines += [
                "",
                f"{h} Real decisions: {ds}, {stratum} (the first gate; {_rows(table)} decisions; "
                f"{REAL_STRATA.get(stratum, stratum)})",
                "",
                "| scorer | AUROC [95% CI] | gate − scorer [95% CI] |",
                "|---|---|---|",
            ]
            for name, m in table.items():
                d = m.get("delta_vs_gate")
                lines.append(
                    f"| {name} | {_mc({'mean': m['auroc'], 'ci95': m['ci95']})} | {_mc(d, '+.3f') if d else ''} |"
                )
    sections = [(src, res) for src, res in by.items()] or [(lab["source"], report)]
    for src, res in sections:
        lines += ["", f"{h} Offline (labels `{src}`: the dataset's test split, its own labels; 95% CI over runs)", ""]
        lines += _offline_table(res["offline"])
        lines += [""] + opened("By depth") if fold else []
        for stratum, table in res["offline_by_depth"].items():
            lines += ["", f"{h}# {stratum}", ""] + _offline_table(table)
        lines += closed
        for stratum, table in (res.get("offline_eval_by_depth") or {}).items():
            lines += [
                "",
                f"{h} Offline on the eval queries' unpruned runs, {stratum} (gate trained on `{src}`; every "
                "candidate labelled by its key points; queries never trained on; 95% CI over runs)",
                "",
            ]
            lines += _offline_table(table, deltas=True)
    lines += ["", f"{h} Timings (seconds; 0 = reused)", "", "| step | s |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in report["timings"].items()]
    return "\n".join(lines) + "\n"


def budget_table(b: dict, h: str = "##") -> list[str]:
    """The "Budgets" section: each budgeted point (budget = a fraction of each query's own unpruned tokens), then
    the budgeted gate's KPR minus each baseline's at the same budget, paired over queries."""
    lines = [
        f"{h} Budgets (per query: budget = fraction × that query's unpruned tokens; {b['queries']} eval queries; "
        "mean [95% CI over queries])",
        "",
        f"Runs over their budget: **{b['violations']}** of {b['checked_runs']} (tokens counted from each trace's "
        "llm_call events).",
        "",
        "| fraction | policy | budget (mean tokens) | tokens | share of budget | nodes | KPR |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in sorted(b["policies"].items(), key=lambda kv: (kv[1]["fraction"], kv[0])):
        lines.append(
            f"| {p['fraction']:g} | {name} | {_f(p.get('budget_tokens'), '.0f')} | {_mc(p['tokens'], '.0f')} "
            f"| {_mc(p['budget_share'], '.2f')} | {_mc(p['nodes'], '.2f')} | {_mc(p['kpr'])} |"
        )
    lines += ["", "| fraction | comparison | Δ KPR [95% CI] | queries |", "|---|---|---|---|"]
    for f, table in b["vs"].items():
        for name, d in table.items():
            lines.append(f"| {f} | {name} | {_mc(d['kpr_delta'], '+.3f')} | {d['queries']} |")
    return lines


def budget_findings(b: dict) -> list[str]:
    """The budgets step in sentences: the violation count, then per comparison which fractions it wins, ties, loses."""
    v = b["violations"]
    lead = (
        "no run exceeded its budget" if not v else f"{v} run{' exceeded its' if v == 1 else 's exceeded their'} budget"
    )
    out = [
        f"Budgets: {lead} ({b['checked_runs']} runs checked against their own llm_call tokens"
        + (
            f"; {b['total_mismatches']} runs reported totals that differ from their llm_call events"
            if b.get("total_mismatches")
            else ""
        )
        + ")."
    ]
    names = list(dict.fromkeys(name for table in b["vs"].values() for name in table))
    for name in names:
        verdict = {1: [], 0: [], -1: []}
        for f, table in b["vs"].items():
            if name in table:
                verdict[_sig(table[name]["kpr_delta"])].append(f"{float(f):.0%}")
        out.append(
            f"Budgets, {name} (paired KPR over queries, 95% intervals): better at "
            f"{', '.join(verdict[1]) or '–'}, tied at {', '.join(verdict[0]) or '–'}, worse at "
            f"{', '.join(verdict[-1]) or '–'} of the unpruned tokens."
        )
    return out


def _outside(g: dict) -> str:
    side = g.get("outside") or ("outside" if g.get("extrapolated") else None)
    return {
        "cheaper": "cheaper than every gate point: gate at its cheapest (spends more)",
        "dearer": "dearer than every gate point: gate at its dearest (spends less)",
        "outside": "outside the gate sweep (clamped)",
    }.get(side, "")


def _sig(d: dict) -> int:
    """+1 when an interval lies above zero, -1 below, 0 when it contains zero (or is missing)."""
    lo, hi = d.get("ci95") or (None, None)
    return 0 if lo is None or hi is None else (1 if lo > 0 else -1 if hi < 0 else 0)


def findings(report: dict) -> list[str]:
    """Plain statements of what the figures show, the unwelcome ones included: which baselines each gate beats,
    ties or loses to at their budgets, a τ sweep that collapses, labels the gate fits but that do not transfer
    to real decisions, and a pooled AUROC that mostly measures the root frame."""
    out = []
    pol = report["policies"]

    verdict = partial(curve_verdict, pol)
    for src, res in (report.get("by_labels") or {}).items():
        fam = res["family"]
        for curve, vs in _curves(res):
            out += verdict(curve, src, vs)
        own = (res["offline"].get("gate") or {}).get("auroc")
        for ds, table in res["real"].items():
            g = table.get("gate", {}).get("auroc")
            if own is not None and g is not None and own - g > OVERFIT:
                out.append(
                    f"`{fam}` fits its own labels (test AUROC {own:.3f}) far better than it ranks the real "
                    f"decisions of {ds} ({g:.3f}): its labels do not carry what makes a branch valuable."
                )
            worse = [(k, m) for k, m in table.items() if k != "gate" and _sig(m.get("delta_vs_gate") or {}) < 0]
            if worse:
                k, m = max(worse, key=lambda km: km[1]["auroc"] or 0)
                out.append(
                    f"On {ds}, `{fam}` (AUROC {g:.3f}) ranks below {len(worse)} teacher(s), the best {k} "
                    f"({m['auroc']:.3f}; gate − {k} {_mc(m['delta_vs_gate'], '+.3f')})."
                )
        deep = (res.get("offline_eval_by_depth") or {}).get("depth1+") or {}
        rivals = [(k, m) for k, m in deep.items() if k != "gate" and m.get("delta_vs_gate")]
        if deep.get("gate", {}).get("auroc") is not None and rivals:
            k, m = min(rivals, key=lambda km: (km[1]["delta_vs_gate"].get("ci95") or [float("inf")])[0])
            ahead = all(_sig(r["delta_vs_gate"]) > 0 for _, r in rivals)
            out.append(
                f"Within depth ≥ 1 on the eval queries' unpruned runs ({deep['gate']['n_rows']} candidates), "
                f"`{fam}` (AUROC {deep['gate']['auroc']:.3f}) is "
                + ("ahead of every teacher" if ahead else "not ahead of every teacher")
                + f"; the closest, {k} ({m['auroc']:.3f}): gate − {k} {_mc(m['delta_vs_gate'], '+.3f')}."
            )
    out += read_report.findings(report, verdict)
    if report.get("budgets"):
        out += budget_findings(report["budgets"])
    gate = report["offline"].get("gate") or {}
    deep = (report.get("offline_by_depth") or {}).get("depth1+", {}).get("gate") or {}
    if gate.get("auroc") is not None and deep.get("auroc") is not None and gate["auroc"] - deep["auroc"] > ROOT_GAP:
        out.append(
            f"The pooled offline AUROC ({gate['auroc']:.3f}) mostly measures the root frame: within depth ≥ 1 "
            f"the gate scores {deep['auroc']:.3f}."
        )
    return out


def curve_verdict(pol: dict, curve: str, src: str, vs: dict) -> list[str]:
    """The findings of one learned curve (``gate_vs`` ``vs``): which baselines it beats, ties or loses to at their
    budgets, and whether its τ sweep collapses (``pol``: the report's policies)."""
    unpruned = (pol.get("none") or {}).get("tokens", {}).get("mean")
    verdict = {1: [], 0: [], -1: []}
    unfair = []  # the gate cannot spend as little as the baseline, or spends less and does not win
    for name, g in vs.items():
        sig = _sig(g["kpr_delta"])
        if name == "none":
            continue
        if g.get("outside") == "cheaper" or (g.get("outside") == "dearer" and sig <= 0):
            unfair.append(name)
        else:
            verdict[sig].append(name)
    out = [
        f"`{curve}` (labels `{src}`), at each baseline's token budget: beats {len(verdict[1])} "
        f"({', '.join(verdict[1]) or '–'}), ties {len(verdict[0])} ({', '.join(verdict[0]) or '–'}), "
        f"loses to {len(verdict[-1])} ({', '.join(verdict[-1]) or '–'}) (95% intervals over queries)"
        + (f"; outside its τ sweep, not compared: {', '.join(unfair)}" if unfair else "")
        + "."
    ]
    toks = [p["tokens"]["mean"] for p in pol.values() if p["family"] == curve and p["tokens"]["mean"] is not None]
    if unpruned and len(toks) > 1 and (max(toks) - min(toks)) < COLLAPSE * unpruned:
        out.append(
            f"`{curve}`'s τ sweep collapses: its {len(toks)} points all cost {min(toks):.0f}–"
            f"{max(toks):.0f} tokens ({100 * min(toks) / unpruned:.0f}–{100 * max(toks) / unpruned:.0f}% "
            "of unpruned), so τ gives no control over cost."
        )
    return out


def _curves(res: dict) -> list[tuple[str, dict]]:
    """A label source's gate curves and their ``gate_vs``: the threshold gate, then each variant that ran."""
    return [(res["family"], res["gate_vs"])] + [(res[v]["family"], res[v]["gate_vs"]) for v in VARIANTS if res.get(v)]


def _rows(table: dict) -> str:
    n = (table.get("gate") or {}).get("n_rows")
    return "–" if n is None else str(n)


def real_tables(report: dict) -> dict[str, dict]:
    """Per ``--real`` dataset: every label source's gate (named by its curve) and then the teachers."""
    by = report.get("by_labels") or {}
    out: dict[str, dict] = {}
    for ds, table in report["real"].items():
        gates = {res["family"]: res["real"][ds]["gate"] for res in by.values() if ds in res.get("real", {})}
        out[ds] = {**(gates or {"gate": table["gate"]}), **{k: v for k, v in table.items() if k != "gate"}}
    return out


def _sources_tables(report: dict, h: str = "##") -> list[str]:
    by = report["by_labels"]
    lines = [
        f"{h} Label sources compared (one gate per source)",
        "",
        "| labels | gate | threshold | train positive rate | AUROC on own test labels | "
        + " | ".join(f"AUROC on {ds}" for ds in report["real"])
        + " |",
        "|---|---|---|---|---|" + "---|" * len(report["real"]),
    ]
    for src, res in by.items():
        g = res["offline"].get("gate", {})
        real = [
            _mc({"mean": res["real"][ds]["gate"]["auroc"], "ci95": res["real"][ds]["gate"]["ci95"]})
            for ds in report["real"]
        ]
        lines.append(
            f"| `{src}` | {res['family']} | {_f(res['labels'].get('threshold'), '.4g')} "
            f"| {_f((res['labels'].get('positive_rate') or {}).get('train'))} "
            f"| {_mc({'mean': g.get('auroc'), 'ci95': g.get('ci95_auroc')})} | "
            + " | ".join(real)
            + (" |" if real else "|")
        )
    baselines = list(next(iter(by.values()))["gate_vs"])
    curves = [c for res in by.values() for c in _curves(res)]
    lines += [
        "",
        "Each gate's KPR at a baseline's token budget minus the baseline's (paired over eval queries; "
        "↓ = the baseline is cheaper than the gate's cheapest point, ↑ = dearer than its dearest: the gate's "
        "end point is used):",
        "",
        "| baseline | tokens | " + " | ".join(name for name, _ in curves) + " |",
        "|---|---|" + "---|" * len(curves),
    ]
    for b in baselines:
        cells = []
        for _, vs in curves:
            g = vs.get(b)
            cells.append(
                ""
                if g is None
                else _mc(g["kpr_delta"], "+.3f")
                + ({"cheaper": " ↓", "dearer": " ↑"}.get(g.get("outside"), " *" if g["extrapolated"] else ""))
            )
        tokens = next(iter(by.values()))["gate_vs"][b]["tokens"]
        lines.append(f"| {b} | {tokens:.0f} | " + " | ".join(cells) + " |")
    return lines + [""]


def _offline_table(table: dict, deltas: bool = False) -> list[str]:
    """Each scorer's AUROC, AUPRC, top-1 and rows; with ``deltas`` also gate − scorer (paired over runs)."""
    extra = (" gate − scorer [95% CI] |", "---|") if deltas else ("", "")
    rows = ["| scorer | AUROC [95% CI] | AUPRC | top-1 | rows |" + extra[0], "|---|---|---|---|---|" + extra[1]]
    for name, m in table.items():
        d = m.get("delta_vs_gate") if deltas else None
        rows.append(
            f"| {name} | {_mc({'mean': m['auroc'], 'ci95': m['ci95_auroc']})} | {_f(m['auprc'])} "
            f"| {_f(m['top1'])} | {m['n_rows']} |" + ((f" {_mc(d, '+.3f')} |" if d else " |") if deltas else "")
        )
    return rows


def _learned(family: str) -> bool:
    """A curve of a learned gate (pre-retrieval, read, or both): drawn bold in the plot."""
    return family.startswith(("gate", "read_gate"))


def plot(report: dict, path: Path, families: list[str] | None = None) -> None:
    """KPR against tokens, every policy family a curve (``families``: only these, and the unpruned point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams: dict[str, list] = {}
    for _name, p in report["policies"].items():
        if families is None or p["family"] in families or p["family"] == "none":
            fams.setdefault(p["family"], []).append(p)
    fig, ax = plt.subplots(figsize=(8, 5.5) if len(fams) <= 24 else (12, 8))
    gates = [f for f in fams if _learned(f)]
    others = [f for f in fams if f != "none" and not _learned(f)]
    styles = curve_styles(gates, others, plt)
    for fam, pts in fams.items():
        pts = sorted(pts, key=lambda p: p["tokens"]["mean"] or 0)
        x = [p["tokens"]["mean"] for p in pts]
        y = [p["kpr"]["mean"] for p in pts]
        lo = [p["kpr"]["ci95"][0] if p["kpr"]["ci95"][0] is not None else p["kpr"]["mean"] for p in pts]
        hi = [p["kpr"]["ci95"][1] if p["kpr"]["ci95"][1] is not None else p["kpr"]["mean"] for p in pts]
        if fam == "none":  # the no-pruning point: a star with its interval
            ax.errorbar(
                x,
                y,
                yerr=[[a - b for a, b in zip(y, lo)], [b - a for a, b in zip(y, hi)]],
                label="no pruning",
                marker="*",
                markersize=14,
                linestyle="none",
                color="black",
                capsize=3,
            )
            continue
        gate = _learned(fam)
        (line,) = ax.plot(
            x,
            y,
            marker=styles[fam][2],
            linewidth=2.5 if gate else 1.2,
            markersize=5 if gate else 4,
            label=fam,
            zorder=3 if gate else 2,
            color=styles[fam][0],
            linestyle=styles[fam][1],
        )
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15 if gate else 0.06, linewidth=0)
    ax.set_xlabel("tokens per run (mean)")
    ax.set_ylabel("key-point recall (mean; bands: 95% CI over queries)")
    sources = ", ".join(report.get("by_labels") or [report["labels"]["source"]])
    ax.set_title(f"closed loop on {report['queries']['eval']} eval queries (gate labels: {sources})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


BASELINE_COLOURS = (  # hues apart from the gates' (tab10's first six) and from one another
    "#e377c2", "#bcbd22", "#17becf", "#7f7f7f", "#1b9e77", "#7570b3", "#e6ab02", "#a6761d", "#000080", "#66a61e",
    "#f781bf", "#999900",
)  # fmt: skip
BASELINE_MARKERS = "s^vDPX<>ph*d"


def curve_styles(gates: list[str], others: list[str], plt) -> dict[str, tuple]:
    """(colour, line style, marker) per family, never the same twice: the gates take tab10's strong colours with
    round markers, each baseline a colour of ``BASELINE_COLOURS`` and a marker of its own; past a palette's end
    the colours come round again with another line style."""
    strong = plt.get_cmap("tab10").colors[:6]
    out = {}
    for i, fam in enumerate(gates):
        out[fam] = (strong[i % 6], ("-", "--", ":", "-.")[i // 6 % 4], "o")
    n = len(BASELINE_COLOURS)
    for i, fam in enumerate(others):
        out[fam] = (BASELINE_COLOURS[i % n], ("-", "--", ":", "-.")[i // n % 4], BASELINE_MARKERS[i % n])
    return out


def plot_real(report: dict, path: Path) -> None:
    """AUROC of every scorer on each ``--real`` dataset, with 95% intervals over runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    real = real_tables(report)
    fig, axes = plt.subplots(1, len(real), figsize=(6 * len(real), 4), squeeze=False)
    for ax, (ds, table) in zip(axes[0], real.items()):
        names = list(table)
        y = [table[n]["auroc"] or 0.0 for n in names]
        err = [
            [max(0.0, v - (table[n]["ci95"][0] if table[n]["ci95"][0] is not None else v)) for n, v in zip(names, y)],
            [max(0.0, (table[n]["ci95"][1] if table[n]["ci95"][1] is not None else v) - v) for n, v in zip(names, y)],
        ]
        ax.bar(names, y, yerr=err, capsize=3, color=["tab:blue" if n.startswith("gate") else "tab:gray" for n in names])
        ax.axhline(0.5, color="black", linewidth=0.8, linestyle=":")
        ax.legend(
            handles=[
                Patch(color="tab:blue", label="learned gate"),
                Patch(color="tab:gray", label="teacher (heuristic)"),
                Line2D([], [], color="black", linewidth=0.8, linestyle=":", label="chance (0.5)"),
            ],
            fontsize=8,
            loc="upper center",
            ncol=3,
        )
        ax.set_ylim(0, 1.12)
        ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
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
    if report.get("real_track"):
        from branchgate.bench import real_track

        paths["real_track_png"] = out / real_track.PLOT
        real_track.plot(report["real_track"], paths["real_track_png"])
    atomic_write_text(paths["md"], markdown(report))
    return paths
