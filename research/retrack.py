"""The real track's tables and replay frontiers again, from folds ``research.learn_real track`` already trained.

    python3 -m research.retrack TRACK START DEV HELDOUT TRACES [--cache emb.sqlite] --out OUT

For a change in the replay or the tables that leaves the trained models as they are (as the replay's follow-up rule
for chain agents did, docs/research/learn-from-real-logs.md): ``bench.real_track.judge`` on ``TRACK/finetuned`` and
``TRACK/real_only``, the held-out queries as the evaluation. Writes OUT/track.json, OUT/track.md and
OUT/real_track.png as ``learn_real track`` does (``learn_real.write_track``); trains nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from branchgate.bench import real_track
from research.learn_real import write_track


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("track", "start", "dev", "heldout", "traces"):
        ap.add_argument(name)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--out", required=True, help="the folder for track.json, track.md and real_track.png")
    a = ap.parse_args(argv)
    track = Path(a.track)
    res = real_track.judge(
        a.start, a.dev, track / "finetuned", track / "real_only", [a.traces], cache=a.cache,
        evals={"held-out queries": (a.heldout, [a.traces])},
    )  # fmt: skip
    write_track(res, Path(a.out))


if __name__ == "__main__":
    main()
