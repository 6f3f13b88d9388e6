"""The common-sense check: does a controller keep what plainly helps and drop what plainly does not?

The suite (``data/samples/common_sense/{pre,read}.json``, shipped with the package) holds hand-written decisions
across many domains, at both stages: a research question with sub-queries that plainly help answer it and ones
that plainly do not (pre-retrieval), and a question, the sub-query searched and the hits its search listed, title
and opening words (read). Each decision is given to the controller as one decision (its items in a fixed mixed
order; read hits ranked in that order), at the root (depth 0, nothing retained or read), with the controller's
default τ.

    python3 -m branchgate.bench.common_sense pretrained:read path/to/controller.onnx

Figures per controller (``check``): ``pair_accuracy`` = the share of (relevant, irrelevant) pairs of a decision
the controller's score orders relevant first (a tie counts half); ``irrelevant_kept`` and ``relevant_kept`` = the
shares kept at the default τ. Passing (``PASS``): pair accuracy ≥ 0.95, irrelevant kept ≤ 0.10, relevant kept
≥ 0.80. A teacher behind the Gate's interface (``TeacherGate``) is scored by its teacher's score, in the
teacher's direction.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from branchgate.errors import InputError
from branchgate.inference.gate import Gate

STAGES = ("pre", "read")
PASS = {"pair_accuracy": 0.95, "irrelevant_kept": 0.10, "relevant_kept": 0.80}
MAX_ITEMS = 64  # items of one decision (the suite's files are bounded by this)
MAX_DECISIONS = 1000


def suite_dir() -> Path:
    return Path(str(files("branchgate.data") / "samples" / "common_sense"))


@dataclass
class Decision:
    id: str
    stage: str
    domain: str
    question: str
    query: str  # read: the sub-query searched ("" at the pre stage)
    items: list  # pre: sub-query strings; read: {"title", "snippet"} dicts; in the order shown
    relevant: list[bool]  # per item


def _shuffled(key: str, rel: list, irr: list) -> tuple[list, list[bool]]:
    """Relevant and irrelevant items in one fixed mixed order (seeded by the decision's id)."""
    pairs = [(x, True) for x in rel] + [(x, False) for x in irr]
    random.Random(int(hashlib.sha256(key.encode()).hexdigest()[:12], 16)).shuffle(pairs)
    return [x for x, _ in pairs], [r for _, r in pairs]


def load(stage: str, path: Path | None = None) -> list[Decision]:
    """The suite's decisions of ``stage`` (from ``path``, default the shipped ``<stage>.json``)."""
    if stage not in STAGES:
        raise InputError(f"unknown stage {stage!r}; one of {', '.join(STAGES)}", "stage")
    path = Path(path) if path is not None else suite_dir() / f"{stage}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the common-sense suite ({exc})", str(path)) from None
    raw = data.get("decisions") if isinstance(data, dict) else None
    if not isinstance(raw, list) or not raw or len(raw) > MAX_DECISIONS:
        raise InputError(f"expected 1..{MAX_DECISIONS} decisions under 'decisions'", str(path))
    out = []
    for n, d in enumerate(raw):
        where = f"decisions[{n}]"
        rel, irr = (
            d.get("relevant") if isinstance(d, dict) else None,
            d.get("irrelevant") if isinstance(d, dict) else None,
        )
        if not isinstance(rel, list) or not isinstance(irr, list) or not rel or not irr:
            raise InputError(f"{where}: needs non-empty 'relevant' and 'irrelevant' lists", str(path))
        if len(rel) + len(irr) > MAX_ITEMS or not isinstance(d.get("question"), str):
            raise InputError(f"{where}: needs a 'question' and at most {MAX_ITEMS} items", str(path))
        for item in rel + irr:
            ok = (
                isinstance(item, str)
                if stage == "pre"
                else isinstance(item, dict) and isinstance(item.get("title"), str)
            )
            if not ok:
                raise InputError(f"{where}: every item must be a {'string' if stage == 'pre' else 'hit with a title'}",
                                 str(path))  # fmt: skip
        items, flags = _shuffled(f"{stage}/{d.get('id', n)}", rel, irr)
        out.append(
            Decision(
                str(d.get("id", n)),
                stage,
                str(d.get("domain", "")),
                d["question"],
                str(d.get("query", "")),
                items,
                flags,
            )  # fmt: skip
        )
    return out


def _scores(controller, d: Decision):
    """(score per item, kept indices) of the controller on decision ``d`` at its default τ."""
    if d.stage == "pre":
        state = {"root_query": d.question, "frame_query": d.question, "parent_goal": "", "retained": [], "depth": 0}
        sel = controller.select(state, [{"query": q, "goal": ""} for q in d.items])
    else:
        state = {"root_query": d.question, "query": d.query, "goal": "", "read": [], "read_ids": [], "depth": 0}
        hits = [{"title": h["title"], "snippet": h.get("snippet", ""), "id": f"h{k}", "rank": k}
                for k, h in enumerate(d.items)]  # fmt: skip
        sel = controller.select(state, hits)
    return [float(v) for v in sel.p_keep], set(sel.kept)


def check(controller, stage: str | None = None, decisions: list[Decision] | None = None) -> dict:
    """The suite's figures for ``controller`` (a ``Gate`` or ``TeacherGate``) at ``stage`` (default its own)."""
    stage = stage or getattr(controller, "stage", None) or "pre"
    decisions = load(stage) if decisions is None else decisions
    teacher = getattr(controller, "teacher", None)
    sign = 1.0 if getattr(teacher, "higher_is_better", True) else -1.0
    pairs = right = 0.0
    kept = {True: 0, False: 0}
    total = {True: 0, False: 0}
    worst = []
    for d in decisions:
        s, k = _scores(controller, d)
        rel = [sign * v for v, r in zip(s, d.relevant) if r]
        irr = [sign * v for v, r in zip(s, d.relevant) if not r]
        good = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in rel for b in irr)
        pairs += len(rel) * len(irr)
        right += good
        for j, r in enumerate(d.relevant):
            total[r] += 1
            kept[r] += j in k
        wrong_kept = [d.items[j] for j, r in enumerate(d.relevant) if not r and j in k]
        worst.append((good / (len(rel) * len(irr)), d.id, wrong_kept))
    out = {
        "stage": stage,
        "controller": getattr(controller, "name", type(controller).__name__),
        "decisions": len(decisions),
        "pair_accuracy": round(right / pairs, 4),
        "irrelevant_kept": round(kept[False] / total[False], 4),
        "relevant_kept": round(kept[True] / total[True], 4),
        "worst": [{"id": i, "pair_accuracy": round(a, 3), "irrelevant_kept": w} for a, i, w in sorted(worst)[:5]],
    }
    out["passed"] = passed(out)
    return out


def passed(r: dict) -> bool:
    return (
        r["pair_accuracy"] >= PASS["pair_accuracy"]
        and r["irrelevant_kept"] <= PASS["irrelevant_kept"]
        and r["relevant_kept"] >= PASS["relevant_kept"]
    )


def line(r: dict) -> str:
    """One summary line: ``common sense (read, 27 decisions): order 0.97, irrelevant kept 0.04, relevant kept
    0.85: pass``."""
    verdict = "pass" if r["passed"] else "FAIL"
    return (
        f"common sense ({r['stage']}, {r['decisions']} decisions): order {r['pair_accuracy']:.2f}, "
        f"irrelevant kept {r['irrelevant_kept']:.2f}, relevant kept {r['relevant_kept']:.2f}: {verdict} "
        f"(needs ≥ {PASS['pair_accuracy']:.2f}, ≤ {PASS['irrelevant_kept']:.2f}, ≥ {PASS['relevant_kept']:.2f})"
    )


def check_model(model: str | Path, **load_kw) -> dict:
    """``check`` of the controller at ``model`` (an ONNX file or ``pretrained:NAME``), loaded with ``Gate.load``."""
    return check(Gate.load(model, **load_kw))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m branchgate.bench.common_sense", description=__doc__.split("\n")[0]
    )
    parser.add_argument("models", nargs="+", help="controller.onnx files or pretrained:NAME")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    results = [check_model(m, threads=1) for m in args.models]
    for m, r in zip(args.models, results):
        print(json.dumps({"model": str(m), **r}) if args.json else f"{m}: {line(r)}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
