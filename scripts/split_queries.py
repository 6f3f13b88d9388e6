"""Split an environment's query ids into disjoint train and eval files for ``branchgate bench``.

    python3 scripts/split_queries.py ENV_DIR OUT_DIR [--eval-fraction 0.25] [--seed 0]

Writes OUT_DIR/train.txt and OUT_DIR/eval.txt (one id per line): a seeded shuffle of the ids in
ENV_DIR/queries.jsonl, the last ``eval-fraction`` of it held out. The same arguments give the same files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def split(ids: list[str], eval_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    if not 0 < eval_fraction < 1:
        raise SystemExit(f"--eval-fraction must lie in (0, 1), got {eval_fraction}")
    order = sorted(dict.fromkeys(ids))
    random.Random(seed).shuffle(order)
    n_eval = max(1, round(len(order) * eval_fraction))
    return sorted(order[n_eval:]), sorted(order[:n_eval])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("env")
    ap.add_argument("out")
    ap.add_argument("--eval-fraction", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    path = Path(args.env) / "queries.jsonl"
    ids = [str(json.loads(line)["id"]) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    train, ev = split(ids, args.eval_fraction, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", train), ("eval", ev)):
        (out / f"{name}.txt").write_text("\n".join(part) + "\n", encoding="utf-8")
    print(f"{len(train)} train and {len(ev)} eval query ids of {path} (seed {args.seed}) in {out}")


if __name__ == "__main__":
    main()
