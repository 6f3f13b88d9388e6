"""Local retrieval environments: the folder layout, saving it and loading it (building: ``env_build.py``).

An environment folder holds
- ``queries.jsonl``     one query per line: ``id, query, key_points [{id, text}], reachable [ids], meta``
- ``passages.jsonl.gz`` one passage per line: ``id, doc, text, labels`` (key-point ids it covers)
- ``stats.json.gz``     document frequencies of content words (the offline generator's IDF)
- ``bm25/``             the bm25s index (built once; rebuilt in memory when absent, e.g. the bundled sample)
- ``dense/``            optional cached passage embeddings per encoder
- ``manifest.json``     counts, passage-length distributions (relevant vs other), reachable KPR per query,
                        unreachable key points, skipped records.

Formats: ``drgym`` (the upstream DeepResearchGym layout) and ``musique`` (the MuSiQue JSON format).
Key-point ids are ``<query id>#<point number>``, unique across queries, because all queries share one
corpus (a passage can cover key points of several queries); for drgym they come from
``logs_to_dataset/drgym.py``, as in ``branchgate dataset build --format searcho1``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from branchgate import __version__
from branchgate.errors import InputError
from branchgate.fileio import atomic_dir, atomic_write_json
from branchgate.logs_to_dataset.drgym import read_json
from branchgate.pipeline import retrieve
from branchgate.pipeline.textutil import content_words

log = logging.getLogger(__name__)

FORMATS = ("drgym", "musique")
UNITS = ("passage", "page")  # a passage is a chunk of a document, or the whole page (``env_build.py``)
DEFAULT_CHUNK_WORDS = 120
ENV_VERSION = 1
REQUIRED = ("manifest.json", "queries.jsonl", "passages.jsonl.gz")


# ----------------------------------------------------------------------------------------------------------
# saving
# ----------------------------------------------------------------------------------------------------------


def save(
    out: str | Path,
    *,
    fmt: str,
    sources: list[str],
    chunk_words: int,
    seed: int,
    queries: dict[str, dict],
    passages: list[dict],
    unreachable: list[dict],
    notes: Counter,
    skipped: list[dict],
    unit: str = "passage",
) -> Path:
    """Write an environment folder (replaced atomically). Sets each query's ``reachable`` key points (those some
    passage carries) and adds the key points no passage carries to ``unreachable``."""
    covered = {kp for p in passages for kp in p["labels"]}
    per_query = {}
    for qid, q in queries.items():
        kps = [k["id"] for k in q["key_points"]]
        q["reachable"] = [k for k in kps if k in covered]
        per_query[qid] = round(len(q["reachable"]) / len(kps), 4) if kps else 0.0
        for k in q["key_points"]:
            if k["id"] not in covered and not any(u["key_point"] == k["id"] for u in unreachable):
                unreachable.append(
                    {"query": qid, "key_point": k["id"], "reason": "no passage contains any of its spans"}
                )
    lens_rel = [len(p["text"].split()) for p in passages if p["labels"]]
    lens_oth = [len(p["text"].split()) for p in passages if not p["labels"]]
    vals = list(per_query.values())
    manifest = {
        "env_version": ENV_VERSION,
        "format": fmt,
        "sources": [str(Path(s).resolve()) for s in sources],
        "created_by": f"branchgate {__version__}",
        "chunk_words": chunk_words,
        "seed": seed,
        **({"unit": unit} if unit != "passage" else {}),
        "n_queries": len(queries),
        "n_key_points": sum(len(q["key_points"]) for q in queries.values()),
        "n_passages": len(passages),
        "n_relevant_passages": len(lens_rel),
        "passage_words": {
            "relevant": _dist(lens_rel),
            "other": _dist(lens_oth),
            "ks_statistic": _ks(lens_rel, lens_oth),
        },
        "reachable_kpr": {
            "mean": round(float(np.mean(vals)), 4),
            "min": round(float(np.min(vals)), 4),
            "n_below_1": int(sum(v < 1 for v in vals)),
            "per_query": per_query,
        },
        "unreachable_key_points": {"count": len(unreachable), "items": unreachable},
        "notes": dict(sorted(notes.items())),
        "skipped": skipped,
        "retrieval": {
            "bm25": {**retrieve.BM25_PARAMS, "library": "bm25s", "stopwords": "branchgate.pipeline.textutil.STOPWORDS"}
        },
    }
    df = Counter()
    for p in passages:
        df.update(set(content_words(p["text"])))
    with atomic_dir(out, "env build") as tmp:  # the kind: pipeline.env_build.OUTPUT_KIND
        with open(tmp / "queries.jsonl", "w", encoding="utf-8") as fh:
            for q in queries.values():
                fh.write(json.dumps(q, ensure_ascii=False) + "\n")
        with gzip.open(tmp / "passages.jsonl.gz", "wt", encoding="utf-8", compresslevel=6) as fh:
            for p in passages:
                fh.write(json.dumps({k: p[k] for k in ("id", "doc", "text", "labels")}, ensure_ascii=False) + "\n")
        with gzip.open(tmp / "stats.json.gz", "wt", encoding="utf-8") as fh:
            json.dump({"n": len(passages), "df": dict(sorted(df.items()))}, fh, ensure_ascii=False)
        retrieve.BM25Index.build([p["text"] for p in passages]).save(tmp / retrieve.BM25_DIR)
        atomic_write_json(tmp / "manifest.json", manifest)
    return Path(out)


def _dist(xs: list[int]) -> dict:
    if not xs:
        return {"n": 0}
    a = np.asarray(xs)
    q = np.percentile(a, [10, 25, 50, 75, 90])
    return {
        "n": len(xs),
        "mean": round(float(a.mean()), 1),
        "p10": float(q[0]),
        "p25": float(q[1]),
        "median": float(q[2]),
        "p75": float(q[3]),
        "p90": float(q[4]),
    }


def _ks(a: list[int], b: list[int]) -> float | None:
    """Two-sample Kolmogorov–Smirnov statistic (0 = identical length distributions)."""
    if not a or not b:
        return None
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return round(float(np.abs(fa - fb).max()), 4)


# ----------------------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Query:
    id: str
    query: str
    key_points: list[dict]
    reachable: list[str]
    meta: dict

    @property
    def kp_ids(self) -> list[str]:
        return [k["id"] for k in self.key_points]


class Memo:
    """Results of pure functions of an environment (BM25 hits, the offline generator's phrases), kept per
    process so that the closed loop's policies, which run the same queries, compute each once; cleared when
    ``max_items`` is reached."""

    def __init__(self, max_items: int = 200_000):
        self.max_items, self.items = max_items, {}

    def get_or(self, key, compute):
        """The value remembered for ``key``, else ``compute()`` (remembered)."""
        if key not in self.items:
            if len(self.items) >= self.max_items:
                self.items.clear()
            self.items[key] = compute()
        return self.items[key]


class Env:
    """A loaded environment: queries, passages with labels, BM25 index, word statistics."""

    def __init__(
        self,
        path: Path,
        manifest: dict,
        queries: list[Query],
        passages: list[dict],
        df: dict,
        n_docs: int,
        bm25: retrieve.BM25Index,
    ):
        self.path, self.manifest, self.queries = path, manifest, queries
        self.query_by_id = {q.id: q for q in queries}
        self.ids = [p["id"] for p in passages]
        self.texts = [p["text"] for p in passages]
        self.docs = [p["doc"] for p in passages]
        self.labels = [p["labels"] for p in passages]
        self.index_of = {pid: i for i, pid in enumerate(self.ids)}
        self.df, self.n_docs = df, n_docs
        self.bm25 = bm25
        self._dense: dict[str, retrieve.DenseIndex] = {}
        self.name = manifest.get("name") or path.name
        self.unit = manifest.get("unit", "passage")  # "page": a passage is a whole page, its first line its title
        self.memo = Memo()

    def idf(self, word: str) -> float:
        return math.log((self.n_docs + 1) / (self.df.get(word, 0) + 0.5))

    def dense(self, encoder_id: str) -> retrieve.DenseIndex:
        if encoder_id not in self._dense:
            self._dense[encoder_id] = retrieve.DenseIndex.load(self.path, encoder_id, len(self.ids))
        return self._dense[encoder_id]

    def fingerprint(self) -> str:
        """Identity of the environment's content (manifest hash): recorded in every trace's config."""
        text = json.dumps(
            {
                k: self.manifest.get(k)
                for k in ("format", "n_queries", "n_passages", "n_key_points", "chunk_words", "seed", "passage_words")
            }
            | ({"unit": self.unit} if self.unit != "passage" else {}),
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def load(path: str | Path) -> Env:
    """Load an environment folder; ``sample`` is the bundled MuSiQue sample."""
    if str(path) == "sample":
        from branchgate.pipeline.sample import sample_path

        path = sample_path()
    path = Path(path)
    if not path.is_dir():
        raise InputError(
            "environment folder not found (build one with `branchgate env build`, or use --env sample)", str(path)
        )
    missing = [n for n in REQUIRED if not (path / n).exists()]
    if missing:
        raise InputError(
            f"not a branchgate environment: missing {', '.join(missing)} (build it with `branchgate env build`)",
            str(path),
        )
    manifest = read_json(path / "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("env_version", 0) > ENV_VERSION:
        raise InputError(
            f"unsupported environment version {manifest.get('env_version') if isinstance(manifest, dict) else '?'}",
            str(path / "manifest.json"),
        )
    queries = []
    with open(path / "queries.jsonl", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
                queries.append(
                    Query(str(q["id"]), q["query"], q["key_points"], q.get("reachable", []), q.get("meta", {}))
                )
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise InputError(f"bad query record ({exc})", str(path / "queries.jsonl"), lineno) from None
    passages = []
    try:
        with gzip.open(path / "passages.jsonl.gz", "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                try:
                    p = json.loads(line)
                    passages.append(
                        {"id": p["id"], "doc": p.get("doc", ""), "text": p["text"], "labels": p.get("labels") or []}
                    )
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise InputError(f"bad passage record ({exc})", str(path / "passages.jsonl.gz"), lineno) from None
    except (OSError, EOFError) as exc:
        raise InputError(f"cannot read ({exc})", str(path / "passages.jsonl.gz")) from None
    if not queries or not passages:
        raise InputError("environment has no queries or no passages", str(path))
    stats_path = path / "stats.json.gz"
    if stats_path.exists():
        with gzip.open(stats_path, "rt", encoding="utf-8") as fh:
            stats = json.load(fh)
        df, n_docs = stats["df"], int(stats["n"])
    else:
        df = Counter()
        for p in passages:
            df.update(set(content_words(p["text"])))
        df, n_docs = dict(df), len(passages)
    if (path / retrieve.BM25_DIR).is_dir():
        bm25 = retrieve.BM25Index.load(path / retrieve.BM25_DIR, len(passages))
    else:  # the bundled sample ships without its index: building it takes milliseconds
        bm25 = retrieve.BM25Index.build([p["text"] for p in passages])
    return Env(path, manifest, queries, passages, df, n_docs, bm25)
