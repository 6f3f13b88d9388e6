"""Put a ``branchgate bench`` report into the docs and the README, so that no result there is typed by hand.

    python3 scripts/readme_results.py BENCH_OUT [--commit SHA]

Copies BENCH_OUT/report.json to ``benchmarks/results/bench_report.json`` and its plots to ``docs/bench/``,
replaces the text of ``docs/results.md`` between the ``bench-results`` markers with ``bench.report.markdown`` of
that report, and the README's three headline numbers between its ``headline`` markers. ``tests/test_docs.py``
checks that both are exactly the rendering of the stored report.
"""

from __future__ import annotations

import argparse
import json
import shutil
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "benchmarks" / "results" / "bench_report.json"
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
IMAGES = "bench/"  # the plots' folder, relative to the page (docs/bench/)
BEGIN = "<!-- bench-results:begin (scripts/readme_results.py writes this block; edit the bench, not the text) -->"
END = "<!-- bench-results:end -->"
HEAD_BEGIN = "<!-- headline:begin (scripts/readme_results.py writes these lines from the stored bench report) -->"
HEAD_END = "<!-- headline:end -->"


def block(report: dict) -> str:
    from branchgate.bench.report import markdown

    text = markdown(report, level=2, images=IMAGES, title="Results of `branchgate bench`", fold=True)
    return text.replace("<details>", '<details markdown="1">')  # mkdocs (md_in_html) renders the tables inside


def headline(report: dict) -> str:
    """Three numbers of the first label source's learned gate — the read gate when the report has one, else the
    pre-retrieval gate: its tokens and recall against the unpruned agent, its margin over the closest baseline
    compared inside its τ sweep, and its AUROC on the first real dataset."""
    read = next(iter((report.get("read") or {}).values()), None)
    bullets = _read_bullets(report, read) if read else _pre_bullets(report)
    bullets += [_margin(*_closest(read["gate_vs"] if read else report["gate_vs"]))]
    bullets += [
        _real(
            *next(iter((read["real_read"] if read else report["real"]).items())),
            "read decisions" if read else "decisions",
        )
    ]
    lines = [f"On {report['queries']['eval']} held-out DeepResearchGym queries ([all results](docs/results.md)):", ""]
    lines += [
        textwrap.fill(b, 116, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False) for b in bullets
    ]
    return "\n".join(lines) + "\n"


def _ci(d: dict, fmt: str = ".3f") -> str:
    lo, hi = d["ci95"]
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


def _pre_bullets(report: dict) -> list[str]:
    gate, none = report["policies"]["gate"], report["policies"]["none"]
    t, k = gate["tokens"]["mean"], gate["kpr"]["mean"]
    return [
        f"**{100 * t / none['tokens']['mean']:.0f}% of the tokens, {100 * k / none['kpr']['mean']:.0f}% of the "
        f"key-point recall** of the unpruned agent ({t:,.0f} against {none['tokens']['mean']:,.0f} tokens a query; "
        f"KPR {k:.3f} against {none['kpr']['mean']:.3f})."
    ]


def _read_bullets(report: dict, read: dict) -> list[str]:
    t = report["read_targets"]
    share, at = t["token_share"], t[read["family"]]["kpr_share_at"]
    pre = (t.get("gate") or {}).get("kpr_share_at")
    return [
        f"**{100 * share:.0f}% of the tokens, {100 * at:.1f}% of the key-point recall** of the unpruned agent, with "
        f"the read gate choosing which search results to read from their snippets (interpolated along its τ sweep; "
        f"the pre-retrieval gate alone: {100 * pre:.1f}%)."
    ]


def _closest(gate_vs: dict) -> tuple[str, dict]:
    inside = {k: g for k, g in gate_vs.items() if k != "none" and not g.get("outside")}
    return min(inside.items(), key=lambda kv: kv[1]["kpr_delta"]["mean"])


def _margin(rival: str, vs: dict) -> str:
    return (
        f"**{vs['kpr_delta']['mean']:+.3f} KPR {_ci(vs['kpr_delta'], '+.3f')}** over the closest baseline at its own "
        f"token budget ({rival}, {vs['tokens']:,.0f} tokens; paired over queries, 95% interval)."
    )


def _real(ds: str, table: dict, what: str) -> str:
    best = max((k for k in table if k not in ("gate", "rank")), key=lambda k: table[k]["auroc"])
    return (
        f"**AUROC {table['gate']['auroc']:.3f} {_ci(table['gate'])}** on {ds}'s {table['gate']['n_rows']} real "
        f"{what}, never trained on (the best heuristic, {best}: {table[best]['auroc']:.3f}; gate − {best} "
        f"{table[best]['delta_vs_gate']['mean']:+.3f} {_ci(table[best]['delta_vs_gate'], '+.3f')})."
    )


def replace_block(text: str, new: str, begin: str = BEGIN, end: str = END) -> str:
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"expected one {begin!r} … {end!r} pair of markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{new}{end}{tail}"


def write(report: dict) -> None:
    """The results page's block and the README's headline from ``report``."""
    PAGE.write_text(replace_block(PAGE.read_text(encoding="utf-8"), block(report)), encoding="utf-8")
    README.write_text(
        replace_block(README.read_text(encoding="utf-8"), headline(report), HEAD_BEGIN, HEAD_END), encoding="utf-8"
    )


def main() -> None:
    from branchgate.bench.report import PLOT, REAL_PLOT

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the bench's --out folder")
    ap.add_argument("--commit", default=None, help="commit of the code that ran the bench (recorded in the block)")
    args = ap.parse_args()
    out = Path(args.out)
    report = json.loads((out / "report.json").read_text())
    if args.commit:
        report["commit"] = args.commit
    STORED.parent.mkdir(parents=True, exist_ok=True)
    STORED.write_text(json.dumps(report, indent=1) + "\n")  # key order is table order
    images = PAGE.parent / IMAGES
    images.mkdir(parents=True, exist_ok=True)
    for name in (PLOT, REAL_PLOT):
        if (out / name).is_file():
            shutil.copyfile(out / name, images / name)
    write(report)
    print(
        f"docs/results.md and the README headline from {out / 'report.json'} ({len(report['policies'])} policies); "
        f"stored {STORED}"
    )


if __name__ == "__main__":
    main()
