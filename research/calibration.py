"""The simulator against the real Search-o1 logs on the DeepResearchGym dev set (issue 65): the calibration table
of ``bench/calibration.py`` (read-stage shape, every teacher's per-row AUROC at both stages, DPP's replay frontier).

    branchgate env build --format drgym --src ../shared/data/drgym --unit page --out env_page
    branchgate simulate --env env_page --queries q.txt --top-k 5 --out sim          # q.txt: the dev queries
    branchgate dataset build --traces sim/traces --stage read --labels keypoints --encoder packaged --out sim_read
    branchgate dataset build --traces sim/traces --labels keypoints --encoder packaged --out sim_pre
    branchgate dataset build --traces ../shared/data/drgym/Searcho1_ClueWeb22 --stage read --labels keypoints \
        --encoder packaged --out real_read         # and the same without --stage read: real_pre
    python3 -m research.calibration --sim sim/traces --sim-pre sim_pre --sim-read sim_read \
        --real ../shared/data/drgym/Searcho1_ClueWeb22 --real-pre real_pre --real-read real_read [--json OUT]

Every figure is computed the same way on both sides; the simulator's come from simulated runs, the real ones from
the logs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from branchgate.bench.calibration import calibrate, table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m research.calibration", description=__doc__.split("\n")[0])
    p.add_argument("--sim", action="append", default=[], help="simulated trace folder (repeatable)")
    p.add_argument("--sim-pre", help="the simulated runs' pre-retrieval dataset")
    p.add_argument("--sim-read", help="the simulated runs' read dataset")
    p.add_argument("--real", action="append", default=[], help="real trace folder (repeatable)")
    p.add_argument("--real-pre", help="the real runs' pre-retrieval dataset")
    p.add_argument("--real-read", help="the real runs' read dataset")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    cal = calibrate(
        {"traces": a.sim, "pre": a.sim_pre, "read": a.sim_read},
        {"traces": a.real, "pre": a.real_pre, "read": a.real_read},
    )
    print("\n".join(table(cal)))
    if a.json:
        Path(a.json).write_text(json.dumps(cal, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
