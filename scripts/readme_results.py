"""Put a ``branchgate bench`` report into the docs and the README, so that no result there is typed by hand.

    python3 scripts/readme_results.py BENCH_OUT [--commit SHA]

Copies BENCH_OUT/report.json to ``benchmarks/results/bench_report.json`` and its plots to ``docs/bench/``,
replaces the text of ``docs/results.md`` between the ``bench-results`` markers with ``bench.report.markdown`` of
that report, and the README's three headline numbers between its ``headline`` markers. ``tests/test_docs.py``
checks that both are exactly the rendering of the stored report.

Every figure shown on more than one user page (README.md and docs/ without docs/research/) sits between
``<!-- fig:NAME -->`` and ``<!-- /fig -->`` markers and is written here, from the stored report (``figures``) or,
for figures measured elsewhere, from ``docs/figures.json`` (each with the page that measured it), so that no
two pages can disagree. ``python3 scripts/readme_results.py --figures`` rewrites only those.
"""

from __future__ import annotations

import argparse
import json
import re
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
FIGURES = ROOT / "docs" / "figures.json"
FIG = re.compile(r"<!-- fig:([\w.-]+) -->(.*?)<!-- /fig -->", re.S)


def user_pages() -> list[Path]:
    """The pages a user reads: the README and the site without its research notes."""
    docs = ROOT / "docs"
    return [README, *sorted(p for p in docs.rglob("*.md") if not p.is_relative_to(docs / "research"))]


def figures(report: dict) -> dict[str, str]:
    """Every shared figure's text: those of the stored bench report, then ``docs/figures.json``'s."""
    none, t = report["policies"]["none"], report["timings"]
    deep = report["offline_eval_by_depth"]["depth1+"]["gate"]
    real_ds, real = next(iter(report["real"].items()))
    out = {
        "bench.train": str(report["queries"]["train"]),
        "bench.eval": str(report["queries"]["eval"]),
        "bench.minutes": f"{t['total'] / 60:.0f}",
        "bench.commit": str(report.get("commit", "")),
        "sim.nodes": f"{none['nodes']['mean']:.1f}",
        "sim.tokens": f"{none['tokens']['mean']:,.0f}",
        "sim.kpr": f"{none['kpr']['mean']:.3f}",
        "gate.auroc_depth1": f"{deep['auroc']:.3f}",
        "gate.real.auroc": f"{real['gate']['auroc']:.3f}",
        "gate.real.decisions": str(real["gate"]["n_rows"]),
        "gate.real.dataset": real_ds,
    }
    stored = json.loads(FIGURES.read_text(encoding="utf-8"))
    out.update({name: fig["text"] for name, fig in stored.items() if not name.startswith("_")})
    return out


def fill_figures(text: str, figs: dict[str, str], where: str = "") -> str:
    """``text`` with each marker's figure written in; an unknown name is an error naming it."""

    def one(m: re.Match) -> str:
        if m.group(1) not in figs:
            raise SystemExit(f"{where}: unknown figure {m.group(1)!r} (known: {', '.join(sorted(figs))})")
        return f"<!-- fig:{m.group(1)} -->{figs[m.group(1)]}<!-- /fig -->"

    return FIG.sub(one, text)


def public_command(command: str) -> str:
    """The bench command as a reader can run it: no machine's absolute paths (``--env /x/env`` → ``--env ENV``;
    a path under the data folder next to the clone → ``../shared/...``)."""
    toks, out = command.split(), []
    for i, tok in enumerate(toks):
        if tok.startswith("/"):
            tok = "../shared/" + tok.split("/shared/", 1)[1] if "/shared/" in tok else toks[i - 1].lstrip("-").upper()
        out.append(tok)
    return " ".join(out)


def block(report: dict) -> str:
    from branchgate.bench.report import markdown

    report = {**report, "command": public_command(report.get("command", ""))}
    text = markdown(report, level=2, images=IMAGES, title="Results of `branchgate bench`", fold=True)
    return text.replace("<details>", '<details markdown="1">')  # mkdocs (md_in_html) renders the tables inside


def headline(report: dict) -> str:
    """Three numbers of the first label source's learned gate — the read gate when the report has one, else the
    pre-retrieval gate — real logs first: its AUROC on the first real dataset; then, in the simulator, its tokens
    and recall against the unpruned agent and its margin over the closest baseline compared inside its τ sweep."""
    read = next(iter((report.get("read") or {}).values()), None)
    real = _real(
        *next(iter((read["real_read"] if read else report["real"]).items())),
        "read decisions" if read else "pre-retrieval decisions (the bench's gate)",
    )
    sim = _read_bullets(report, read) if read else _pre_bullets(report)
    sim += [_margin(*_closest(read["gate_vs"] if read else report["gate_vs"]))]
    wrap = lambda b: textwrap.fill(b, 116, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False)  # noqa: E731
    lines = ["On real logs, never trained on ([all results](docs/results.md)):", "", wrap(_finetuned()), wrap(real), ""]
    lines += [f"In the simulator, on {report['queries']['eval']} held-out DeepResearchGym queries:", ""]
    lines += [wrap(b) for b in sim]
    return "\n".join(lines) + "\n"


def _finetuned() -> str:
    """The read gate fine-tuned on real logs (``docs/figures.json``; measured in learn-from-real-logs.md)."""
    f = {k: v["text"] for k, v in json.loads(FIGURES.read_text(encoding="utf-8")).items() if not k.startswith("_")}
    return (
        f"Fine-tuned on real Search-o1 logs (`train --init-from pretrained:read`), the read gate scores **AUROC "
        f"{f['finetune.real.auroc']} per hit** on {f['finetune.real.runs']} runs of held-out queries, DPP "
        f"{f['finetune.real.dpp']} ({f['finetune.real.delta']}); out of fold it does not beat DPP, and replayed it "
        f"keeps {f['finetune.real.kept55']} of the key points at 55% of the tokens (DPP "
        f"{f['finetune.real.dpp_kept55']}): [details](docs/research/learn-from-real-logs.md)."
    )


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
        f"**AUROC {table['gate']['auroc']:.3f} {_ci(table['gate'])}** ranking {table['gate']['n_rows']} real "
        f"{what} of {ds} (the best heuristic, {best}: {table[best]['auroc']:.3f}; gate − {best} "
        f"{table[best]['delta_vs_gate']['mean']:+.3f} {_ci(table[best]['delta_vs_gate'], '+.3f')})."
    )


def replace_block(text: str, new: str, begin: str = BEGIN, end: str = END) -> str:
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"expected one {begin!r} … {end!r} pair of markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{new}{end}{tail}"


def write(report: dict) -> None:
    """The results page's block, the README's headline and every page's shared figures from ``report``."""
    PAGE.write_text(replace_block(PAGE.read_text(encoding="utf-8"), block(report)), encoding="utf-8")
    write_figures(report)


def write_headline(report: dict) -> None:
    """The README's headline (it reads the stored report and docs/figures.json)."""
    README.write_text(
        replace_block(README.read_text(encoding="utf-8"), headline(report), HEAD_BEGIN, HEAD_END), encoding="utf-8"
    )


def write_figures(report: dict) -> None:
    write_headline(report)
    figs = figures(report)
    for page in user_pages():
        text = page.read_text(encoding="utf-8")
        new = fill_figures(text, figs, str(page.relative_to(ROOT)))
        if new != text:
            page.write_text(new, encoding="utf-8")


def main() -> None:
    from branchgate.bench.report import PLOT, REAL_PLOT

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="the bench's --out folder")
    ap.add_argument(
        "--figures",
        action="store_true",
        help="only rewrite the shared figures and the README headline from the stored report",
    )
    ap.add_argument("--commit", default=None, help="commit of the code that ran the bench (recorded in the block)")
    args = ap.parse_args()
    if args.figures or not args.out:
        write_figures(json.loads(STORED.read_text()))
        print(f"the shared figures of {len(user_pages())} pages from {STORED} and {FIGURES}")
        return
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
