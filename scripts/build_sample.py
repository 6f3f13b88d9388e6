"""Rebuild a bundled sample environment from the HippoRAG copies of MuSiQue or HotpotQA.

python3 scripts/build_sample.py --src ../shared/data/musique                     # data/samples/musique_sample
python3 scripts/build_sample.py --format hotpotqa --src ../shared/data/hotpotqa -n 70  # data/samples/hotpotqa_sample

HotpotQA questions have no decomposition: each is re-shaped as a MuSiQue question (its ``context`` paragraphs,
``is_supporting`` from ``supporting_facts``; one key point per supporting paragraph, its text the supporting
sentences, labelled on that paragraph) and built by the same MuSiQue builder (``pipeline.env_build``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from branchgate.fileio import atomic_write_json
from branchgate.pipeline.env_build import build_musique
from branchgate.pipeline.sample import (
    ATTRIBUTION,
    HOTPOTQA_ATTRIBUTION,
    HOTPOTQA_DIR,
    SAMPLE_DIR,
    SAMPLE_QUERIES,
)

SOURCES = {
    "musique": ("musique_sample", "MuSiQue (musique_train.json, as in OSU-NLP-Group/HippoRAG data/)", "CC BY 4.0"),
    "hotpotqa": (
        "hotpotqa_sample",
        "HotpotQA (hotpotqa_train.json, as in OSU-NLP-Group/HippoRAG data/)",
        "CC BY-SA 4.0",
    ),
}


def hotpot_as_musique(q: dict) -> dict:
    """One HotpotQA question (``context``: [title, sentences]; ``supporting_facts``: [title, sentence index]) in
    MuSiQue's shape: paragraphs with ``is_supporting`` and one decomposition step per supporting paragraph."""
    facts: dict[str, list[int]] = {}
    for title, i in q.get("supporting_facts") or []:
        facts.setdefault(title, []).append(int(i))
    paras, steps = [], []
    for j, (title, sentences) in enumerate(q.get("context") or []):
        paras.append(
            {"idx": j, "title": title, "paragraph_text": "".join(sentences).strip(), "is_supporting": title in facts}
        )
        if title in facts:
            said = " ".join(sentences[i].strip() for i in sorted(set(facts[title])) if 0 <= i < len(sentences))
            steps.append({"question": said or title, "answer": "", "paragraph_support_idx": j})
    return {
        "id": str(q.get("_id")),
        "question": q.get("question"),
        "answer": q.get("answer"),
        "paragraphs": paras,
        "question_decomposition": steps,
    }


def build_sample(src: str, out: Path = SAMPLE_DIR, n: int = SAMPLE_QUERIES, fmt: str = "musique") -> Path:
    name, source, licence = SOURCES[fmt]
    with tempfile.TemporaryDirectory() as tmp:
        if fmt == "hotpotqa":
            questions = json.loads((Path(src) / "hotpotqa_train.json").read_text())
            (Path(tmp) / "hotpotqa_train.json").write_text(json.dumps([hotpot_as_musique(q) for q in questions]))
            src = tmp
        path = build_musique([src], out, max_queries=n)
    shutil.rmtree(path / "bm25", ignore_errors=True)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["name"] = name
    manifest["sources"] = [source]
    manifest["license"] = licence
    manifest["attribution"] = ATTRIBUTION if fmt == "musique" else HOTPOTQA_ATTRIBUTION
    atomic_write_json(path / "manifest.json", manifest)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Rebuild a bundled sample environment (MuSiQue or HotpotQA).")
    ap.add_argument("--src", required=True, help="folder with musique_train.json or hotpotqa_train.json")
    ap.add_argument("--format", choices=sorted(SOURCES), default="musique")
    ap.add_argument("--out", default=None, help="default: the bundled sample's folder")
    ap.add_argument("-n", type=int, default=SAMPLE_QUERIES, help="number of questions")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else (SAMPLE_DIR if args.format == "musique" else HOTPOTQA_DIR)
    path = build_sample(args.src, out, args.n, args.format)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    print(f"sample environment {path}: {size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
