"""Content-addressed embedding cache: (encoder id, sha256(text)) → float32 vector, on disk (SQLite).

Because the encoder is frozen, each distinct text is encoded once across epochs, runs and datasets.
Hits and misses are counted so callers can report them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    return Path(os.environ.get("BRANCHGATE_CACHE", Path.home() / ".cache" / "branchgate"))


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    def __init__(self, encoder, path: str | Path | None = None, batch_size: int = 64):
        self.encoder = encoder
        self.batch_size = batch_size
        self.path = Path(path) if path else default_cache_dir() / "embeddings.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=60)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS emb (encoder TEXT, key TEXT, vec BLOB, PRIMARY KEY (encoder, key))")
        self._db.commit()
        self.hits = 0
        self.misses = 0

    @property
    def encoder_id(self) -> str:
        return self.encoder.id

    def get(self, texts: list[str], show_progress: bool = False) -> np.ndarray:
        """Embeddings for ``texts`` (rows in order), encoding only texts never seen before."""
        keys = [text_key(t) for t in texts]
        found: dict[str, np.ndarray] = {}
        unique = list(dict.fromkeys(keys))
        with self._lock:
            for i in range(0, len(unique), 500):
                chunk = unique[i : i + 500]
                q = f"SELECT key, vec FROM emb WHERE encoder=? AND key IN ({','.join('?' * len(chunk))})"
                for key, blob in self._db.execute(q, [self.encoder_id, *chunk]):
                    found[key] = np.frombuffer(blob, dtype=np.float32)
        missing = [k for k in unique if k not in found]
        self.hits += len(unique) - len(missing)
        self.misses += len(missing)
        if missing:
            first = {}
            for k, t in zip(keys, texts):
                first.setdefault(k, t)
            vecs = self.encoder.encode([first[k] for k in missing], batch_size=self.batch_size, show_progress=show_progress)
            with self._lock:
                self._db.executemany(
                    "INSERT OR REPLACE INTO emb VALUES (?, ?, ?)",
                    [(self.encoder_id, k, v.astype(np.float32).tobytes()) for k, v in zip(missing, vecs)],
                )
                self._db.commit()
            found.update(zip(missing, vecs))
        dim = getattr(self.encoder, "dim", None) or (len(next(iter(found.values()))) if found else 0)
        if not texts:
            return np.zeros((0, dim), dtype=np.float32)
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "path": str(self.path), "encoder": self.encoder_id}

    def close(self) -> None:
        with self._lock:
            self._db.close()
