"""The bundled sample environment: 40 MuSiQue questions with their paragraphs (CC BY 4.0, see NOTICE).

It ships without its BM25 index (``env.load`` rebuilds it in memory in milliseconds). Rebuild it from the
MuSiQue data with::

    python -m branchgate.pipeline.sample --src ../shared/data/musique
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from branchgate.errors import BranchgateError

SAMPLE_QUERIES = 40
SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "samples" / "musique_sample"
ATTRIBUTION = ("MuSiQue (Trivedi et al., 2022, https://github.com/StonyBrookNLP/musique), CC BY 4.0; "
               "subset as distributed in OSU-NLP-Group/HippoRAG. Questions, decompositions and paragraphs unchanged.")


def sample_path() -> Path:
    if not (SAMPLE_DIR / "manifest.json").exists():
        raise BranchgateError(f"the bundled sample environment is missing ({SAMPLE_DIR}); reinstall branchgate or "
                              "rebuild it with `python -m branchgate.pipeline.sample --src DIR`")
    return SAMPLE_DIR


def build_sample(src: str, out: Path = SAMPLE_DIR, n: int = SAMPLE_QUERIES) -> Path:
    import json

    from branchgate.fileio import atomic_write_json
    from branchgate.pipeline.env import build_musique

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
