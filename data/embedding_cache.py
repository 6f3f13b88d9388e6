"""Content-addressed embedding cache: (encoder id, sha256(text)) → float32 vector, on disk (SQLite).

Because the encoder is frozen, each distinct text is encoded once across epochs, runs and datasets.
Hits and misses are counted so callers can report them.

A cache file that cannot serve is an ``InputError`` naming it, before anything is written to it: a folder, a
file that is not SQLite, an SQLite database that is not an embedding cache (it is never changed), a file that
cannot be opened or written; and, when read, a stored vector that is not finite, all zero or not the encoder's width
(NaN or zero rows would silently zero every teacher score: no encoder gives a zero vector for a text, so one is a
damaged or edited cache). An encoder that gives a NaN or all-zero vector is an error too, and nothing is stored.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from pathlib import Path

import numpy as np

from branchgate.errors import InputError
from branchgate.fileio import default_cache_dir

log = logging.getLogger(__name__)


def _progress(total: int, show: bool):
    if not show or total < 1:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="embedding new texts", unit="text", leave=False)


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


COLUMNS = ["encoder", "key", "vec"]  # the ``emb`` table


def _open(path: Path) -> sqlite3.Connection:
    """The cache at ``path``, created if new; an ``InputError`` naming it when it cannot be one (module docstring)."""
    if path.is_dir():
        raise InputError("is a folder; the embedding cache is a file (e.g. FOLDER/embeddings.sqlite)", str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"embedding cache cannot be created here ({exc.strerror or exc})", str(path)) from None
    db = None
    try:
        db = sqlite3.connect(str(path), check_same_thread=False, timeout=60)
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "emb" not in tables:
            raise InputError(
                "is an SQLite database but not an embedding cache (no table 'emb'); it was not changed", str(path)
            )
        if "emb" in tables and [row[1] for row in db.execute("PRAGMA table_info(emb)")] != COLUMNS:
            raise InputError(
                f"has a table 'emb' whose columns are not {COLUMNS}: not an embedding cache; it was not changed",
                str(path),
            )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE IF NOT EXISTS emb (encoder TEXT, key TEXT, vec BLOB, PRIMARY KEY (encoder, key))")
        db.commit()
        return db
    except sqlite3.Error as exc:
        if db is not None:
            db.close()
        what = "is not an SQLite embedding cache" if "not a database" in str(exc) else "embedding cache cannot be used"
        raise InputError(f"{what} ({exc})", str(path)) from None
    except InputError:
        db.close()
        raise


class EmbeddingCache:
    def __init__(self, encoder, path: str | Path | None = None, batch_size: int = 64, chunk_size: int = 2048):
        self.encoder = encoder
        self.batch_size = batch_size
        self.chunk_size = chunk_size
        self.path = Path(path) if path else default_cache_dir() / "embeddings.sqlite"
        self._lock = threading.Lock()
        self._db = _open(self.path)
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
                for key, blob in self._sql(q, [self.encoder_id, *chunk]):
                    found[key] = self._stored(blob)
        dim = getattr(self.encoder, "dim", None) or (len(next(iter(found.values()))) if found else 0)
        widths = {len(v) for v in found.values()} - {dim}
        if widths:
            raise InputError(
                f"holds vectors of width {min(widths)} for encoder {self.encoder_id!r}, whose vectors "
                f"have {dim} (written by another build of that encoder, or edited): use another cache file",
                str(self.path),
            )
        missing = [k for k in unique if k not in found]
        self.hits += len(unique) - len(missing)
        self.misses += len(missing)
        if missing:
            first = {}
            for k, t in zip(keys, texts):
                first.setdefault(k, t)
            # Encode and store in chunks so an interrupted run keeps what it already paid for.
            bar = _progress(len(missing), show_progress)
            for i in range(0, len(missing), self.chunk_size):
                chunk = missing[i : i + self.chunk_size]
                vecs = np.asarray(
                    self.encoder.encode([first[k] for k in chunk], batch_size=self.batch_size), np.float32
                )
                if not np.isfinite(vecs).all():
                    raise InputError(f"encoder {self.encoder_id!r} gave non-finite (NaN/inf) vectors; none were stored")
                if vecs.size and not np.any(vecs, axis=-1).all():
                    raise InputError(f"encoder {self.encoder_id!r} gave an all-zero vector; none were stored")
                with self._lock:
                    self._sql(
                        "INSERT OR REPLACE INTO emb VALUES (?, ?, ?)",
                        [(self.encoder_id, k, v.tobytes()) for k, v in zip(chunk, vecs)],
                        many=True,
                    )
                found.update(zip(chunk, vecs))
                if bar is not None:
                    bar.update(len(chunk))
            if bar is not None:
                bar.close()
        dim = dim or (len(next(iter(found.values()))) if found else 0)
        if not texts:
            return np.zeros((0, dim), dtype=np.float32)
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)

    def _stored(self, blob) -> np.ndarray:
        """A stored vector, checked: float32 bytes, every component finite, not all zero."""
        if not isinstance(blob, bytes) or len(blob) % 4:
            raise InputError(f"holds a vector for encoder {self.encoder_id!r} that is not float32 data", str(self.path))
        vec = np.frombuffer(blob, dtype=np.float32)
        if not np.isfinite(vec).all():
            raise InputError(
                f"holds non-finite (NaN/inf) vectors for encoder {self.encoder_id!r} (a damaged or "
                "edited cache): use another cache file",
                str(self.path),
            )
        if vec.size and not vec.any():
            raise InputError(
                f"holds all-zero vectors for encoder {self.encoder_id!r} (no encoder gives one for a text: a damaged "
                "or edited cache; every teacher score would be 0): use another cache file",
                str(self.path),
            )
        return vec

    def _sql(self, query: str, args, many: bool = False):
        """Run one statement (committing a write); an SQLite failure is an ``InputError`` naming the cache."""
        try:
            if many:
                self._db.executemany(query, args)
                self._db.commit()
                return []
            return self._db.execute(query, args).fetchall()
        except sqlite3.Error as exc:
            raise InputError(f"embedding cache cannot be used ({exc})", str(self.path)) from None

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "path": str(self.path), "encoder": self.encoder_id}

    def close(self) -> None:
        with self._lock:
            self._db.close()
