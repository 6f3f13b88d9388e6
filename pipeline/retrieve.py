"""Retrieval over an environment's passages: BM25 (bm25s, built once and saved) and optional dense.

Both return ``[(passage_index, score), ...]`` best first, ties broken by passage index so results are
deterministic. Zero-score BM25 hits (no query term in the passage) are dropped.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from branchgate.errors import BranchgateError, MismatchError
from branchgate.fileio import atomic_write_json
from branchgate.pipeline.textutil import STOPWORDS

log = logging.getLogger(__name__)

BM25_PARAMS = {"k1": 1.5, "b": 0.75, "method": "lucene"}
BM25_DIR = "bm25"
DENSE_DIR = "dense"


def _bm25s():
    try:
        import bm25s
    except ImportError:
        raise BranchgateError("retrieval needs bm25s: pip install 'branchgate[train]'") from None
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it sets its own logger to DEBUG: not the user's business
    return bm25s


def _tokenize(texts: list[str]):
    return _bm25s().tokenize(texts, stopwords=sorted(STOPWORDS), show_progress=False)


def _top(scores: np.ndarray, k: int, drop_zero: bool) -> list[tuple[int, float]]:
    if len(scores) == 0 or k <= 0:
        return []
    k = min(k, len(scores))
    cand = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    # widen to every passage tied with the k-th score so the tie-break by index is exact
    kth = scores[cand].min()
    cand = np.flatnonzero(scores >= kth)
    order = sorted(cand.tolist(), key=lambda i: (-float(scores[i]), i))[:k]
    return [(i, float(scores[i])) for i in order if not (drop_zero and scores[i] <= 0)]


class BM25Index:
    def __init__(self, model):
        self.model = model
        self.vocab = model.vocab_dict

    @classmethod
    def build(cls, texts: list[str]) -> BM25Index:
        bm25s = _bm25s()
        model = bm25s.BM25(k1=BM25_PARAMS["k1"], b=BM25_PARAMS["b"], method=BM25_PARAMS["method"])
        model.index(_tokenize(texts), show_progress=False)
        return cls(model)

    def save(self, path: str | Path) -> None:
        self.model.save(str(path))

    @classmethod
    def load(cls, path: str | Path, n_passages: int) -> BM25Index:
        try:
            model = _bm25s().BM25.load(str(path))
        except Exception as exc:  # corrupt or partial index folder
            raise BranchgateError(f"{path}: cannot load the BM25 index ({exc}); rebuild the environment") from None
        n = int(model.scores.get("num_docs", -1))
        if n != n_passages:
            raise MismatchError(
                f"{path}: BM25 index has {n} passages, passages file has {n_passages}; rebuild the environment"
            )
        return cls(model)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        tokens = _bm25s().tokenize([query], stopwords=sorted(STOPWORDS), return_ids=False, show_progress=False)[0]
        tokens = [t for t in dict.fromkeys(tokens) if t in self.vocab]
        if not tokens:
            return []
        return _top(np.asarray(self.model.get_scores(tokens), dtype=np.float64), k, drop_zero=True)


class DenseIndex:
    """Cosine search over cached passage embeddings (``dense/<slug>.npy`` + ``.json`` in the env)."""

    def __init__(self, matrix: np.ndarray, encoder_id: str):
        self.matrix = matrix
        self.encoder_id = encoder_id

    @staticmethod
    def slug(encoder_id: str) -> str:
        return "".join(c if c.isalnum() else "_" for c in encoder_id)

    @classmethod
    def build(cls, env_dir: Path, texts: list[str], embed, encoder_id: str) -> DenseIndex:
        matrix = np.asarray(embed(texts), dtype=np.float32)
        folder = Path(env_dir) / DENSE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / f"{cls.slug(encoder_id)}.npy", matrix.astype(np.float16))
        atomic_write_json(
            folder / f"{cls.slug(encoder_id)}.json",
            {"encoder": encoder_id, "n": len(texts), "dim": int(matrix.shape[1])},
        )
        return cls(matrix, encoder_id)

    @classmethod
    def load(cls, env_dir: Path, encoder_id: str, n_passages: int) -> DenseIndex:
        folder = Path(env_dir) / DENSE_DIR
        meta_path = folder / f"{cls.slug(encoder_id)}.json"
        if not meta_path.exists():
            have = sorted(p.stem for p in folder.glob("*.json")) if folder.exists() else []
            raise BranchgateError(
                f"{env_dir}: no dense embeddings for encoder {encoder_id!r} (have: {have or 'none'}); "
                f"build them with `branchgate env build ... --dense --encoder ...`"
            )
        meta = json.loads(meta_path.read_text())
        matrix = np.load(folder / f"{cls.slug(encoder_id)}.npy").astype(np.float32)
        if matrix.shape[0] != n_passages or meta.get("n") != n_passages:
            raise MismatchError(f"{meta_path}: {matrix.shape[0]} embeddings for {n_passages} passages; rebuild them")
        return cls(matrix, encoder_id)

    def search_vector(self, qvec: np.ndarray, k: int) -> list[tuple[int, float]]:
        return _top(self.matrix @ np.asarray(qvec, dtype=np.float32).reshape(-1), k, drop_zero=False)
