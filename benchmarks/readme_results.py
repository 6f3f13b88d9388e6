"""Put a ``branchgate bench`` report into the README, so that no result there is typed by hand.

    python3 benchmarks/readme_results.py BENCH_OUT [--readme README.md] [--commit SHA]

Copies BENCH_OUT/report.json to ``benchmarks/results/bench_report.json`` and its plots to ``docs/bench/``, and
replaces the README's text between the ``bench-results`` markers with ``bench.report.markdown`` of that
report. ``tests/test_bench.py`` checks that the README block is exactly the rendering of the stored report.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "benchmarks" / "results" / "bench_report.json"
IMAGES = "docs/bench/"
BEGIN = "<!-- bench-results:begin (benchmarks/readme_results.py writes this block; edit the bench, not the text) -->"
END = "<!-- bench-results:end -->"


def block(report: dict) -> str:
    from branchgate.bench.report import markdown

    return markdown(report, level=3, images=IMAGES, title="Results of `branchgate bench`", fold=True)


def replace_block(readme: str, text: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README has no {BEGIN!r} … {END!r} markers")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{text}{END}{tail}"


def main() -> None:
    from branchgate.bench.report import PLOT, REAL_PLOT

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the bench's --out folder")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--commit", default=None, help="commit of the code that ran the bench (recorded in the block)")
    args = ap.parse_args()
    out = Path(args.out)
    report = json.loads((out / "report.json").read_text())
    if args.commit:
        report["commit"] = args.commit
    STORED.parent.mkdir(parents=True, exist_ok=True)
    STORED.write_text(json.dumps(report, indent=1) + "\n")  # key order is table order
    (ROOT / IMAGES).mkdir(parents=True, exist_ok=True)
    for name in (PLOT, REAL_PLOT):
        if (out / name).is_file():
            shutil.copyfile(out / name, ROOT / IMAGES / name)
    readme = Path(args.readme)
    readme.write_text(replace_block(readme.read_text(encoding="utf-8"), block(report)), encoding="utf-8")
    print(f"README results from {out / 'report.json'} ({len(report['policies'])} policies); stored {STORED}")


if __name__ == "__main__":
    main()
