"""Rebuild the bundled MuSiQue sample environment (``data/samples/musique_sample``) from the MuSiQue data.

python3 scripts/build_sample.py --src ../shared/data/musique
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from branchgate.fileio import atomic_write_json
from branchgate.pipeline.env_build import build_musique
from branchgate.pipeline.sample import ATTRIBUTION, SAMPLE_DIR, SAMPLE_QUERIES


def build_sample(src: str, out: Path = SAMPLE_DIR, n: int = SAMPLE_QUERIES) -> Path:
    path = build_musique([src], out, max_queries=n)
    shutil.rmtree(path / "bm25", ignore_errors=True)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["name"] = "musique_sample"
    manifest["sources"] = ["MuSiQue (musique_train.json, as in OSU-NLP-Group/HippoRAG data/)"]
    manifest["license"] = "CC BY 4.0"
    manifest["attribution"] = ATTRIBUTION
    atomic_write_json(path / "manifest.json", manifest)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Rebuild the bundled MuSiQue sample environment.")
    ap.add_argument("--src", required=True, help="folder with musique_train.json (e.g. ../shared/data/musique)")
    ap.add_argument("--out", default=str(SAMPLE_DIR))
    ap.add_argument("-n", type=int, default=SAMPLE_QUERIES, help="number of questions")
    args = ap.parse_args(argv)
    path = build_sample(args.src, Path(args.out), args.n)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    print(f"sample environment {path}: {size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
