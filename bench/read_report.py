"""The read stage in the bench's report: the targets of two learned stages (``read_targets``), the read gates'
Markdown section and their findings. ``report.py`` calls these; ``bench/run_order.py`` puts ``read`` in the report.
"""

from __future__ import annotations

import numpy as np

from branchgate.bench.sweeps import BOTH_FAMILY, BOTH_REVERSE_FAMILY, FLOOR_FAMILY, READ_FAMILY, looser_families


def _f(v, fmt=".3f") -> str:
    """A figure for a report table: ``fmt`` of ``v``, "–" when it is None."""
    return "–" if v is None else format(v, fmt)


def _mc(d: dict, fmt=".3f") -> str:
    """A mean and its 95% interval (``{"mean", "ci95"}``) as "m [lo, hi]"."""
    lo, hi = d.get("ci95") or (None, None)
    return f"{_f(d.get('mean'), fmt)} [{_f(lo, fmt)}, {_f(hi, fmt)}]"


TOKEN_SHARE = 0.30  # the two-stage target: KPR (as a share of unpruned) at this share of unpruned tokens
CURVES = ("gate", READ_FAMILY, FLOOR_FAMILY, BOTH_FAMILY, BOTH_REVERSE_FAMILY)
COMPARISONS = {
    "read_vs_pre": "the read gate alone − the pre gate alone, at each pre-gate point's tokens",
    "both_vs_pre": "both stages − the pre gate alone, at each pre-gate point's tokens",
    "both_vs_read": "both stages − the read gate alone, at each read-gate point's tokens",
    "reverse_vs_pre": "both stages (pre τ swept) − the pre gate alone",
    "floor_vs_read": "read gate with the floor at the root − without",
}


def curves(policies: dict) -> list[str]:
    """The learned curves of a report's ``policies``: ``CURVES``, then both stages at each looser pre τ."""
    return [*CURVES, *looser_families(p["family"] for p in policies.values())]


def targets(policies: dict, share: float = TOKEN_SHARE) -> dict:
    """Per learned curve (``curves``): KPR as a share of unpruned KPR at ``share`` of unpruned tokens (linear
    between the curve's points; None outside it) and its best point within that many tokens (None: none that
    cheap). ``{"token_share", "unpruned": {"tokens", "kpr"}, CURVE: {"kpr_share_at", "best_within"}}``."""
    none = policies.get("none")
    if not none or not none["tokens"]["mean"] or not none["kpr"]["mean"]:
        return {}
    tok0, kpr0 = none["tokens"]["mean"], none["kpr"]["mean"]
    out = {"token_share": share, "unpruned": {"tokens": tok0, "kpr": kpr0}}
    for fam in curves(policies):
        pts = sorted(
            (
                (p["tokens"]["mean"] / tok0, p["kpr"]["mean"] / kpr0, name)
                for name, p in policies.items()
                if p["family"] == fam
            ),
        )
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        at = float(np.interp(share, xs, ys)) if xs[0] <= share <= xs[-1] else None
        within = [p for p in pts if p[0] <= share]
        best = max(within, key=lambda p: p[1]) if within else None
        out[fam] = {
            "kpr_share_at": at,
            "best_within": None if best is None else {"point": best[2], "token_share": best[0], "kpr_share": best[1]},
        }
    return out


def section(report: dict, h: str = "##") -> list[str]:
    """The "Read gate" section of ``report.md``: the two-stage targets, each read gate's labels, offline and real
    tables (per hit and per search), and the paired comparisons between the learned curves."""
    read = report.get("read") or {}
    if not read:
        return []
    lines = [f"{h} Read gate (which hits of a search to read, from their titles and snippets)", ""]
    t = report.get("read_targets") or {}
    if t:
        lines += [
            f"At {100 * t['token_share']:.0f}% of unpruned tokens ({t['unpruned']['tokens']:.0f}; unpruned KPR "
            f"{t['unpruned']['kpr']:.3f}), each learned curve's KPR as a share of unpruned KPR:",
            "",
            "| curve | KPR share at that budget | best point within it | its tokens share | its KPR share |",
            "|---|---|---|---|---|",
        ]
        for fam in [k for k in t if k not in ("token_share", "unpruned")]:
            if fam in t:
                b = t[fam]["best_within"] or {}
                lines.append(
                    f"| {fam} | {_f(t[fam]['kpr_share_at'])} | {b.get('point', '–')} | {_f(b.get('token_share'))} "
                    f"| {_f(b.get('kpr_share'))} |"
                )
        lines.append("")
    for src, res in read.items():
        lab = res.get("labels") or {}
        lines += [
            f"{h}# `{res['family']}` (labels `{src}`, threshold {_f(lab.get('threshold'), '.4g')}, "
            f"τ {_f(res.get('tau'))})",
            "",
        ]
        lines += _scorer_table("Offline: its dataset's test split", res.get("offline"))
        lines += _scorer_table(
            "Offline: the eval queries' unpruned runs (every new hit labelled)", res.get("offline_eval")
        )
        for ds, table in (res.get("real_read") or {}).items():
            lines += _scorer_table(f"Real read decisions: {ds}, per hit (95% CI over runs)", table, real=True)
        for ds, table in (res.get("real_read_search") or {}).items():
            lines += _scorer_table(
                f"Real read decisions: {ds}, per search (does any hit add a key point; a scorer's best hit)",
                table,
                real=True,
            )
        for key, what in COMPARISONS.items():
            if res.get(key):
                lines += [
                    f"{what} (paired over queries):",
                    "",
                    "| at point | tokens | Δ KPR [95% CI] |",
                    "|---|---|---|",
                ]
                lines += _delta_rows(res[key])
        for family, cmp in (res.get("both_pre") or {}).items():
            lines += [
                f"`{family}` − the pre gate alone and − the read gate alone, at each of their points' tokens "
                "(paired over queries):",
                "",
                "| at point | tokens | Δ KPR [95% CI] |",
                "|---|---|---|",
                *_delta_rows({**cmp["vs_pre"], **cmp["vs_read"]}),
            ]
    return lines


def _delta_rows(table: dict) -> list[str]:
    return [f"| {p} | {g['tokens']:.0f} | {_mc(g['kpr_delta'], '+.3f')} |" for p, g in table.items()] + [""]


def _scorer_table(title: str, table: dict | None, real: bool = False) -> list[str]:
    if not table:
        return []
    lines = [
        f"{title}:",
        "",
        "| scorer | AUROC [95% CI] | AUPRC | gate − scorer [95% CI] | rows |",
        "|---|---|---|---|---|",
    ]
    for name, m in table.items():
        ci = m.get("ci95") if real else m.get("ci95_auroc")
        d = m.get("delta_vs_gate")
        lines.append(
            f"| {name} | {_mc({'mean': m.get('auroc'), 'ci95': ci})} | {_f(m.get('auprc'))} "
            f"| {_mc(d, '+.3f') if d else ''} | {m.get('n_rows', '–')} |"
        )
    return lines + [""]


def findings(report: dict, verdict) -> list[str]:
    """The read gates' findings: each learned curve against every baseline at its budget (``verdict``: the
    report's sentence for one curve), the two-stage target, and the real read decisions against the best teacher."""
    out = []
    for src, res in (report.get("read") or {}).items():
        curves = [(res["family"], res["gate_vs"])]
        curves += [(res[k]["family"], res[k]["gate_vs"]) for k in ("both", "reverse", "floor") if res.get(k)]
        curves += [(family, cmp["gate_vs"]) for family, cmp in (res.get("both_pre") or {}).items()]
        for curve, vs in curves:
            out += verdict(curve, src, vs)
        for ds, table in (res.get("real_read") or {}).items():
            rivals = [(k, m) for k, m in table.items() if k not in ("gate", "rank") and m.get("auroc") is not None]
            if not rivals or table.get("gate", {}).get("auroc") is None:
                continue
            k, m = max(rivals, key=lambda km: km[1]["auroc"])
            out.append(
                f"On the real read decisions of {ds}, `{res['family']}` (labels `{src}`) scores AUROC "
                f"{table['gate']['auroc']:.3f}; the best teacher on the same snippets, {k}, {m['auroc']:.3f} "
                f"(gate − {k} {_mc(m.get('delta_vs_gate'), '+.3f')}, 95% CI over runs)."
            )
    t = report.get("read_targets") or {}
    best = [(fam, t[fam]["best_within"]) for fam in t if isinstance(t[fam], dict) and t[fam].get("best_within")]
    if best:
        parts = [f"`{b['point']}` {b['kpr_share']:.3f} at {100 * b['token_share']:.0f}%" for _, b in best]
        out.append(
            f"Within {100 * t['token_share']:.0f}% of unpruned tokens, each learned curve's best point keeps, as a "
            f"share of unpruned KPR: {'; '.join(parts)}."
        )
    return out
