"""`branchgate env build`: a local retrieval environment from benchmark data."""

from __future__ import annotations

import argparse
import json
import logging

from branchgate.errors import BranchgateError
from branchgate.pipeline import env as envmod
from branchgate.pipeline.env_build import build

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        required=True,
        choices=["drgym", "musique"],
        help="drgym: the DeepResearchGym layout (queries/, key_point/, Searcho1_ClueWeb22/); "
        "musique: MuSiQue JSON (questions with paragraphs + decompositions, optional *_corpus.json)",
    )
    parser.add_argument(
        "--src",
        required=True,
        action="append",
        metavar="DIR",
        help="source folder; repeat to merge several folders of the same layout",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="environment folder to write (replaced atomically)")
    parser.add_argument(
        "--chunk-words", type=int, default=120, help="drgym passage length target in words (default 120)"
    )
    parser.add_argument(
        "--max-queries", type=int, default=None, help="keep only the first N queries (and their documents)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the distractor chunk lengths (default 0)")
    parser.add_argument(
        "--unit",
        choices=["passage", "page"],
        default="passage",
        help="passage: documents chunked to --chunk-words (default); page: one passage per document, a search hit "
        "is a whole page with its title (its first line) and opening words, as a search engine lists it",
    )
    parser.add_argument(
        "--agent-queries",
        action="store_true",
        help="drgym: the offline planner also asks each question's Search-o1 searches, as real-text candidates "
        "(then judge its controllers on other questions' logs: they have seen these queries)",
    )
    parser.add_argument("--dense", action="store_true", help="also cache passage embeddings for the dense retriever")
    parser.add_argument("--encoder", default="auto", help="encoder for --dense (auto | packaged | hub id | local dir)")


def run(args) -> int:
    if args.chunk_words < 10:
        raise BranchgateError("--chunk-words must be at least 10")
    out = build(
        args.format,
        args.src,
        args.out,
        chunk_words=args.chunk_words,
        seed=args.seed,
        max_queries=args.max_queries,
        unit=args.unit,
        agent_queries=args.agent_queries,
    )
    if args.dense:
        from branchgate.data.embedding_cache import EmbeddingCache
        from branchgate.models.encoder import Encoder
        from branchgate.pipeline.retrieve import DenseIndex

        env = envmod.load(out)
        cache = EmbeddingCache(Encoder.load(args.encoder))
        DenseIndex.build(out, env.texts, lambda t: cache.get(t, show_progress=True), cache.encoder_id)
    m = json.loads((out / "manifest.json").read_text())
    pw = m["passage_words"]
    print(
        f"environment {out}: {m['n_queries']} queries, {m['n_key_points']} key points, {m['n_passages']} passages "
        f"({m['n_relevant_passages']} relevant)"
    )
    print(
        f"  passage words: relevant median {pw['relevant'].get('median')} / other median {pw['other'].get('median')} "
        f"(KS {pw['ks_statistic']})"
    )
    print(
        f"  reachable KPR: mean {m['reachable_kpr']['mean']}, min {m['reachable_kpr']['min']}, "
        f"{m['reachable_kpr']['n_below_1']} queries below 1; "
        f"unreachable key points: {m['unreachable_key_points']['count']}"
    )
    if m["skipped"]:
        print(f"  skipped {len(m['skipped'])} records (listed in manifest.json), e.g. {m['skipped'][0]}")
    return 0
