"""A bench report's KPR-against-tokens plot restricted to chosen curves (the full plot draws every family).

python3 -m research.frontier_plot OUT/report.json PNG FAMILY [FAMILY ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from branchgate.bench.report import plot


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("png")
    ap.add_argument("families", nargs="+")
    a = ap.parse_args(argv)
    report = json.loads(Path(a.report).read_text())
    known = {p["family"] for p in report["policies"].values()}
    missing = [f for f in a.families if f not in known]
    if missing:
        raise SystemExit(f"{a.report}: no curve {', '.join(missing)} (known: {', '.join(sorted(known))})")
    plot(report, Path(a.png), families=a.families)


if __name__ == "__main__":
    main()
