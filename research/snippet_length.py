"""How the read stage depends on the snippet's length: bench reports made at different ``snippet_words``, side
by side (docs/research/snippet-length.md).

python3 -m research.snippet_length PNG WORDS=OUT/report.json [WORDS=OUT/report.json ...]

Per report: the unpruned run; the read gate's and DPP's curves' KPR share at 30% of unpruned tokens; the read
gate's (``keypoints``) and DPP's AUROC on the read dataset's test split, on the eval queries' unpruned runs and
per hit on each real dataset; the read gate − DPP on snippets and after fetching, paired at DPP's budgets. The
PNG draws each report's read gate and DPP on snippets (threshold and keep-top-k), with the first report's
unpruned point.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from branchgate.bench.read_report import TOKEN_SHARE
from branchgate.bench.report import plot

CURVES = ("read_gate", "dpp@read_threshold", "dpp@read", "dpp@post_threshold")


def share_at(policies: dict, family: str, share: float = TOKEN_SHARE) -> float | None:
    """A curve's KPR as a share of unpruned KPR at ``share`` of unpruned tokens (linear; None outside it)."""
    none = policies["none"]
    tok0, kpr0 = none["tokens"]["mean"], none["kpr"]["mean"]
    pts = sorted(
        (p["tokens"]["mean"] / tok0, p["kpr"]["mean"] / kpr0) for p in policies.values() if p["family"] == family
    )
    if not pts or not pts[0][0] <= share <= pts[-1][0]:
        return None
    return float(np.interp(share, [p[0] for p in pts], [p[1] for p in pts]))


def summary(report: dict) -> dict:
    """The figures of one report (see the module docstring)."""
    read = report["read"]["keypoints"]
    pol = report["policies"]
    tok0 = pol["none"]["tokens"]["mean"]
    auroc = {
        k: {s: (read.get(k) or {}).get(s, {}).get("auroc") for s in ("gate", "dpp")}
        for k in ("offline", "offline_eval")
    }
    real = {
        ds: {s: t.get(s, {}).get("auroc") for s in ("gate", "dpp")} for ds, t in (read.get("real_read") or {}).items()
    }
    versus = {
        b: {"token_share": v["tokens"] / tok0, "kpr_delta": v["kpr_delta"], "outside": v["outside"]}
        for b, v in read["gate_vs"].items()
        if b.startswith(("dpp@read", "dpp@post_threshold"))
    }
    return {
        "unpruned": {"tokens": tok0, "kpr": pol["none"]["kpr"]["mean"]},
        "kpr_share_at_30": {c: share_at(pol, c) for c in CURVES},
        "auroc": auroc,
        "real_auroc": real,
        "read_gate_vs": versus,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("png")
    ap.add_argument("reports", nargs="+", help="WORDS=PATH of a report.json")
    a = ap.parse_args(argv)
    merged: dict = {}
    out = {}
    for i, item in enumerate(a.reports):
        words, _, path = item.partition("=")
        report = json.loads(Path(path).read_text())
        out[words] = summary(report)
        for name, p in report["policies"].items():
            if p["family"] in ("read_gate", "dpp@read_threshold", "dpp@read") or (i == 0 and p["family"] == "none"):
                merged[f"{name} ({words} words)"] = {**p, "family": f"{p['family']} ({words} words)"}
        if i == 0:
            base = report
    print(json.dumps(out, indent=1))
    fams = sorted({p["family"] for p in merged.values()} - {f"none ({a.reports[0].partition('=')[0]} words)"})
    for p in merged.values():
        if p["family"].startswith("none "):
            p["family"] = "none"
    plot({**base, "policies": merged, "by_labels": ["keypoints"]}, Path(a.png), families=fams)


if __name__ == "__main__":
    main()
