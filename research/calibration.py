"""The simulator against the real Search-o1 logs on the DeepResearchGym dev set (issue 65): the calibration table
of ``bench/calibration.py`` (read-stage shape, every teacher's per-row AUROC at both stages, DPP's replay frontier).

    branchgate env build --format drgym --src ../shared/data/drgym --unit page --out env_page
    branchgate simulate --env env_page --queries q.txt --top-k 5 --out sim          # q.txt: the dev queries
    branchgate dataset build --traces sim/traces --stage read --labels keypoints --encoder packaged --out sim_read
    branchgate dataset build --traces sim/traces --labels keypoints --encoder packaged --out sim_pre
    branchgate dataset build --traces ../shared/data/drgym/Searcho1_ClueWeb22 --stage read --labels keypoints \
        --encoder packaged --out real_read         # and the same without --stage read: real_pre
    python3 -m research.calibration --sim sim/traces --sim-pre sim_pre --sim-read sim_read \
        --real ../shared/data/drgym/Searcho1_ClueWeb22 --real-pre real_pre --real-read real_read [--json OUT] \
        [--env env_page]

With ``--env`` (the page environment the simulation ran in) it also splits the simulated read rows by whether the
hit is a page the real agent got for the same question (its id in that question's Search-o1 trace) and gives the
teachers' AUROC on those alone: the real lists hold only such on-topic pages.

Every figure is computed the same way on both sides; the simulator's come from simulated runs, the real ones from
the logs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from branchgate.bench.calibration import calibrate, table


def same_question(env_dir: str, sim_read: str, real: list[str]) -> dict:
    """The simulated read rows split by whether the hit is a page of the same question's real Search-o1 trace:
    row share, positive rate of each part, every teacher's AUROC on all rows and on the same-question rows."""
    import gzip
    from collections import defaultdict

    import numpy as np
    from sklearn.metrics import roc_auc_score

    from branchgate.bench.calibration import _rows, teachers_of
    from branchgate.logs_to_dataset.drgym import doc_key, trace_documents

    own = defaultdict(set)
    for folder in real:
        for a in sorted(Path(folder).glob("*.a")):
            for doc in trace_documents(a.read_text(encoding="utf-8", errors="replace")):
                own[doc_key(doc.id)].add(a.stem)
    with gzip.open(Path(env_dir) / "passages.jsonl.gz", "rt", encoding="utf-8") as fh:
        doc_of = {r["id"]: doc_key(r["doc"]) for r in map(json.loads, fh)}
    names = teachers_of(sim_read)
    cols = _rows(sim_read, ["run_id", "candidate_id", "label", *(f"teacher_{n}" for n in names)])
    y = cols["label"]
    same = np.array(
        [r.split(".")[0] in own.get(doc_of.get(c, ""), ()) for r, c in zip(cols["run_id"], cols["candidate_id"])]
    )
    ok = y >= 0
    out = {"same_question_share": float(same[ok].mean()), "positive_rate_same": float(y[ok & same].mean()),
           "positive_rate_other": float(y[ok & ~same].mean()), "auroc_all": {}, "auroc_same_question": {}}  # fmt: skip
    for n in names:
        s = cols[f"teacher_{n}"]
        out["auroc_all"][n] = float(roc_auc_score(y[ok], s[ok]))
        out["auroc_same_question"][n] = float(roc_auc_score(y[ok & same], s[ok & same]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m research.calibration", description=__doc__.split("\n")[0])
    p.add_argument("--sim", action="append", default=[], help="simulated trace folder (repeatable)")
    p.add_argument("--sim-pre", help="the simulated runs' pre-retrieval dataset")
    p.add_argument("--sim-read", help="the simulated runs' read dataset")
    p.add_argument("--real", action="append", default=[], help="real trace folder (repeatable)")
    p.add_argument("--real-pre", help="the real runs' pre-retrieval dataset")
    p.add_argument("--real-read", help="the real runs' read dataset")
    p.add_argument("--env", help="the page environment of --sim: split its read rows by same-question pages")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    cal = calibrate(
        {"traces": a.sim, "pre": a.sim_pre, "read": a.sim_read},
        {"traces": a.real, "pre": a.real_pre, "read": a.real_read},
    )
    print("\n".join(table(cal)))
    if a.env and a.sim_read and a.real:
        cal["same_question"] = same_question(a.env, a.sim_read, a.real)
        print(json.dumps(cal["same_question"], indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(cal, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
