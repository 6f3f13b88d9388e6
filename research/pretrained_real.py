"""Do the pretrained controllers (trained on the bundled MuSiQue/HotpotQA samples) beat their teachers on the real
Search-o1 decisions? (issue 52, part 3)

Scores the shipped int8 controllers (``pretrained/<stage>/controller.int8.onnx`` through ``Gate.predict``, the
Gate's own path) on the rows of decision datasets built from the real Search-o1 traces, every split, against every
teacher's column on the same rows (and the teacher gate, ``inference.teacher_gate``, whose texts the int8 tower
embeds): AUROC per row (pre: per candidate sub-query; read: per hit, and per search), with each scorer's paired
difference to the controller (``training.stats.scorer_metrics``: bootstrap over runs, 1,000 resamples). With
``--sample-pre`` / ``--sample-read`` also the in-domain figure: the bundled samples' held-out test split (split by
question). ``--write-choice`` records in ``pretrained/<stage>/choice.json`` which of model and best teacher is the
stage's default: the model only when its paired interval against the best teacher lies above zero.

    branchgate dataset build --traces ../shared/data/drgym/Searcho1_ClueWeb22 --labels keypoints \
        --encoder packaged --out real_pre
    branchgate dataset build --traces ../shared/data/drgym/Searcho1_ClueWeb22 --stage read --labels keypoints \
        --encoder packaged --out real_read
    python3 -m research.pretrained_real --real-pre real_pre --real-read real_read \
        [--sample-pre WORK/ds_pre --sample-read WORK/ds_read] [--json OUT] [--write-choice]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from branchgate.inference.inputs import DecisionState
from branchgate.texts import candidate_text
from branchgate.training import stats

SPLITS = ("train", "validation", "test")


def load_rows(dataset: str, splits=SPLITS) -> list[dict]:
    from datasets import load_from_disk

    d = load_from_disk(dataset)
    return [r for s in splits for r in d[s]]


def frames(rows: list[dict]) -> dict:
    by: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        by.setdefault((r["run_id"], r["frame_id"]), []).append(i)
    return by


def model_scores(gate, rows: list[dict], teacher=None) -> np.ndarray:
    """p_keep of every row through ``gate.predict`` (or ``teacher.scores``), one call per decision in its order."""
    out = np.full(len(rows), np.nan)
    for idx in frames(rows).values():
        idx = sorted(idx, key=lambda i: rows[i]["order"])
        first = rows[idx[0]]
        retained = max((rows[i]["retained"] or [] for i in idx), key=len)
        state = DecisionState(
            first["root_query"], first["frame_query"], first["parent_goal"], list(retained), int(first["depth"])
        )
        texts = [candidate_text(rows[i]["query"], rows[i]["goal"]) for i in idx]
        p = teacher.scores(state, texts) if teacher is not None else gate.predict(state, texts)[0]
        out[idx] = p
    return out


def as_rows(rows: list[dict], scorers: dict) -> stats.Rows:
    for c in rows[0]:
        if c.startswith("teacher_"):
            scorers[c[len("teacher_") :]] = np.array([np.nan if r[c] is None else r[c] for r in rows], float)
    return stats.Rows(
        [r["label"] for r in rows],
        [np.nan if r["utility"] is None else r["utility"] for r in rows],
        [r["run_id"] for r in rows],
        [f"{r['run_id']}/{r['frame_id']}" for r in rows],
        [r["depth"] for r in rows],
        scorers,
    )


def table(rows: stats.Rows, boot: int) -> dict:
    return {
        k: {"auroc": m["auroc"], "ci95": m["ci95_auroc"], "delta_vs_model": m.get("delta_vs_gate")}
        for k, m in stats.scorer_metrics(rows, boot, ref="model").items()
    }


def judge(stage: str, dataset: str, boot: int, splits=SPLITS) -> dict:
    from branchgate.inference.gate import Gate
    from branchgate.inference.teacher_gate import TeacherGate
    from branchgate.pretrained import choice

    gate = Gate.load(f"pretrained:{stage}-model", threads=2, cache_size=200_000)
    rows = load_rows(dataset, splits)
    scorers = {"model": model_scores(gate, rows)}
    c = choice(stage)
    for name in c["teacher_taus"]:
        tg = TeacherGate(gate, name, c["teacher_taus"][name])
        scorers[f"teacher_gate:{name}"] = model_scores(gate, rows, tg)
    r = as_rows(rows, scorers)
    out = {
        "rows": int(len(r.labels)),
        "positive": int(r.labels.sum()),
        "runs": len(r.by_run),
        "per_row": table(r, boot),
    }
    if stage == "read":
        out["per_search"] = table(stats.per_decision(r), boot)
    return out


def show(name: str, t: dict) -> None:
    print(f"\n{name}: {t['rows']} labelled rows ({t['positive']} positive) in {t['runs']} runs")
    for unit in [u for u in ("per_row", "per_search") if u in t]:
        print(f"  {unit}: scorer  AUROC [95%]  model − scorer [95%]")
        for scorer, m in sorted(t[unit].items(), key=lambda kv: -(kv[1]["auroc"] or 0)):
            d, (lo, hi) = m["delta_vs_model"], m["ci95"]
            dd = "" if d is None else f"  {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
            print(f"    {scorer:<18} {m['auroc']:.3f} [{lo:.3f}, {hi:.3f}]{dd}")


def decide_default(t: dict) -> dict:
    """The model is the default only when model − best teacher (by AUROC) has its paired interval above zero."""
    per = t["per_row"]
    teachers = {k: v for k, v in per.items() if k != "model" and not k.startswith("teacher_gate")}
    best = max(teachers, key=lambda k: teachers[k]["auroc"] or -1)
    d = teachers[best]["delta_vs_model"]
    wins = d["ci95"][0] is not None and d["ci95"][0] > 0
    return {
        "default": "model" if wins else "teacher",
        "teacher": best,
        "why": (
            f"real Search-o1 ({t['rows']} rows, {t['runs']} runs): model {per['model']['auroc']:.3f} vs {best} "
            f"{teachers[best]['auroc']:.3f} AUROC, model − {best} {d['mean']:+.3f} "
            f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] (paired, over runs): "
            + ("the model is above its best teacher" if wins else "the model is not above its best teacher")
        ),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real-pre", required=True)
    ap.add_argument("--real-read", required=True)
    ap.add_argument("--sample-pre", default=None, help="the build's pre dataset: its test split, in domain")
    ap.add_argument("--sample-read", default=None)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--write-choice", action="store_true")
    a = ap.parse_args(argv)
    out = {}
    for stage, real, sample in (("pre", a.real_pre, a.sample_pre), ("read", a.real_read, a.sample_read)):
        out[stage] = {"real": judge(stage, real, a.boot)}
        show(f"{stage}: real Search-o1", out[stage]["real"])
        if sample:
            out[stage]["in_domain"] = judge(stage, sample, a.boot, ("test",))
            show(f"{stage}: bundled samples, test split", out[stage]["in_domain"])
        out[stage]["choice"] = decide_default(out[stage]["real"])
        print(f"  → default: {out[stage]['choice']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    if a.write_choice:
        from branchgate.pretrained import folder

        for stage in out:
            p = folder(stage) / "choice.json"
            c = json.loads(p.read_text())
            c.update(out[stage]["choice"])
            c["real_search_o1"] = {
                u: {
                    k: {"auroc": v["auroc"], "ci95": v["ci95"], "model_minus": v["delta_vs_model"]}
                    for k, v in t.items()
                }
                for u, t in out[stage]["real"].items()
                if u in ("per_row", "per_search")
            }
            if "in_domain" in out[stage]:
                c["in_domain_test"] = {k: v["auroc"] for k, v in out[stage]["in_domain"]["per_row"].items()}
            p.write_text(json.dumps(c, indent=1) + "\n")


if __name__ == "__main__":
    main()
