"""Where ``branchgate serve`` keeps its budgeted runs: a store of run records, shared by every worker that opens it.

    runs = Runs(gate, open_store("sqlite:runs.db"))     # or "memory" (the default), "redis://127.0.0.1:6379/0"
    status = runs.open("r1", budget_nodes=12, budget_tokens=None, defer=True, owner=None)
    answer = runs.call("r1", lambda run: run.select(state, candidates).to_json(), owner=None)

A record is a run's whole state (``RunGate.to_json()``: spending, reservations, deferred candidates, decision
count) and the API key that opened it, stored as JSON under a version number. ``Runs.call`` loads the record,
applies one request to a ``RunGate`` rebuilt from it, and writes it back only if the version is still the one it
read (compare-and-set); when another request (in this process or another worker) changed the run meanwhile, it
starts again from the new record. So every request is applied once, against the budget the previous one left,
and a run never spends past its budget however many workers and clients share it. A request that fails (bad
input) writes nothing: the run stays as it was. Within one process, requests on one run also wait for each other
(striped locks), so compare-and-set retries happen only between processes.

Stores (``open_store``):

- ``memory``: this process only; a restart forgets every run (one worker; ``create_app``'s default);
- ``sqlite:PATH``: a file (stdlib ``sqlite3``, WAL, synchronous=FULL): a restarted server carries on every open
  run; several workers on one machine may share it (``branchgate serve``'s default: ``serve/runs.db`` under the
  cache folder);
- ``redis://HOST:PORT/DB`` (the ``redis`` extra): several workers or replicas; the compare-and-set and the run
  count are Lua scripts, each atomic in Redis.

Every store also counts requests per API key per minute (``hit``) for the rate limit, shared the same way.
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import json
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from branchgate.errors import BranchgateError, InputError
from branchgate.inference.run_gate import RunGate

CAS_TRIES = 200  # compare-and-set attempts of one request before it is answered 429 (the run is too busy)
STRIPES = 64  # in-process locks that requests on one run share (by a hash of its id)
APPLICATION_ID = 0x62676174  # "bgat": marks a SQLite file as a branchgate run store


class StoreError(BranchgateError):
    """A request the run store refuses: an HTTP status, a message and the field at fault."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


# -- stores -------------------------------------------------------------------------------------------------------
class MemoryStore:
    """Run records in this process's memory (the default: one worker; a restart forgets them)."""

    name = "memory"

    def __init__(self):
        self._runs: dict[str, list] = {}  # run_id -> [version, last used, record JSON]
        self._hits: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def get(self, run_id: str):
        with self._lock:
            entry = self._runs.get(run_id)
            return None if entry is None else (entry[2], entry[0])

    def create(self, run_id: str, record: str, now: float, max_runs: int, ttl: float) -> str:
        with self._lock:
            if run_id in self._runs:
                return "exists"
            if len(self._runs) >= max_runs:
                for k in [k for k, e in self._runs.items() if e[1] < now - ttl]:
                    del self._runs[k]
            if len(self._runs) >= max_runs:
                return "full"
            self._runs[run_id] = [1, now, record]
            return "ok"

    def replace(self, run_id: str, version: int, record: str, now: float) -> bool:
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is None or entry[0] != version:
                return False
            self._runs[run_id] = [version + 1, now, record]
            return True

    def delete(self, run_id: str, version: int) -> bool:
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is None or entry[0] != version:
                return False
            del self._runs[run_id]
            return True

    def count(self) -> int:
        return len(self._runs)

    def hit(self, key: str, window: int) -> int:
        with self._lock:
            for old in [k for k in self._hits if k[1] < window]:
                del self._hits[old]
            self._hits[(key, window)] = n = self._hits.get((key, window), 0) + 1
            return n


class SqliteStore:
    """Run records in a SQLite file (WAL, synchronous=FULL; one connection per thread)."""

    name = "sqlite"
    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, version INTEGER NOT NULL, used REAL NOT NULL, "
        "record TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS runs_used ON runs (used)",
        "CREATE TABLE IF NOT EXISTS hits (key TEXT NOT NULL, window INTEGER NOT NULL, n INTEGER NOT NULL, "
        "PRIMARY KEY (key, window))",
    )

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._local = threading.local()
        where = str(self.path)
        if self.path.exists() and not self.path.is_file():
            raise InputError("is not a regular file: the run store is one SQLite file", where)
        if self.path.exists() and _application_id(self.path) != APPLICATION_ID:  # read-only look: nothing written
            raise InputError("exists and is not a branchgate run store: give a new path", where)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = self._db()
            with db:
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                for sql in self.SCHEMA:
                    db.execute(sql)
        except (sqlite3.DatabaseError, OSError) as exc:
            raise InputError(f"cannot keep runs here ({exc})", where) from None

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            self._local.db = db
        return db

    def get(self, run_id: str):
        row = self._db().execute("SELECT record, version FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def create(self, run_id: str, record: str, now: float, max_runs: int, ttl: float) -> str:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
                return "exists"
            if db.execute("SELECT count(*) FROM runs").fetchone()[0] >= max_runs:
                db.execute("DELETE FROM runs WHERE used < ?", (now - ttl,))
                if db.execute("SELECT count(*) FROM runs").fetchone()[0] >= max_runs:
                    return "full"
            db.execute("INSERT INTO runs VALUES (?, 1, ?, ?)", (run_id, now, record))
            return "ok"
        finally:
            db.execute("COMMIT")

    def replace(self, run_id: str, version: int, record: str, now: float) -> bool:
        cur = self._db().execute(
            "UPDATE runs SET version = version + 1, used = ?, record = ? WHERE run_id = ? AND version = ?",
            (now, record, run_id, version),
        )
        return cur.rowcount == 1

    def delete(self, run_id: str, version: int) -> bool:
        cur = self._db().execute("DELETE FROM runs WHERE run_id = ? AND version = ?", (run_id, version))
        return cur.rowcount == 1

    def count(self) -> int:
        return self._db().execute("SELECT count(*) FROM runs").fetchone()[0]

    def hit(self, key: str, window: int) -> int:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM hits WHERE window < ?", (window,))
            db.execute(
                "INSERT INTO hits VALUES (?, ?, 1) ON CONFLICT (key, window) DO UPDATE SET n = n + 1", (key, window)
            )
            return db.execute("SELECT n FROM hits WHERE key = ? AND window = ?", (key, window)).fetchone()[0]
        finally:
            db.execute("COMMIT")


class RedisStore:
    """Run records in Redis (the ``redis`` extra): a hash per run, a sorted set of runs by last use; every
    change a Lua script (atomic in Redis)."""

    name = "redis"
    CREATE = """
    if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
    if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then
      local idle = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[4])
      for _, id in ipairs(idle) do redis.call('DEL', ARGV[5] .. id); redis.call('ZREM', KEYS[2], id) end
      if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return 'full' end
    end
    redis.call('HSET', KEYS[1], 'v', 1, 'rec', ARGV[1])
    redis.call('ZADD', KEYS[2], ARGV[2], ARGV[6])
    return 'ok'
    """
    REPLACE = """
    if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
    redis.call('HSET', KEYS[1], 'v', tonumber(ARGV[1]) + 1, 'rec', ARGV[2])
    redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
    return 1
    """
    DELETE = """
    if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[2], ARGV[2])
    return 1
    """

    def __init__(self, url: str, prefix: str = "branchgate:"):
        try:
            import redis
        except ModuleNotFoundError:
            raise BranchgateError("redis is not installed (pip install 'branchgate[redis]')") from None
        self.client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        try:
            self.client.ping()
        except redis.RedisError as exc:
            raise InputError(f"cannot reach Redis ({exc})", "--store") from None
        self.prefix = prefix
        self._create = self.client.register_script(self.CREATE)
        self._replace = self.client.register_script(self.REPLACE)
        self._delete = self.client.register_script(self.DELETE)

    def _key(self, run_id: str) -> str:
        return f"{self.prefix}run:{run_id}"

    @property
    def _index(self) -> str:
        return f"{self.prefix}runs"

    def get(self, run_id: str):
        version, record = self.client.hmget(self._key(run_id), ["v", "rec"])
        return None if version is None else (record, int(version))

    def create(self, run_id: str, record: str, now: float, max_runs: int, ttl: float) -> str:
        args = [record, now, max_runs, now - ttl, f"{self.prefix}run:", run_id]
        return self._create(keys=[self._key(run_id), self._index], args=args)

    def replace(self, run_id: str, version: int, record: str, now: float) -> bool:
        return self._replace(keys=[self._key(run_id), self._index], args=[version, record, now, run_id]) == 1

    def delete(self, run_id: str, version: int) -> bool:
        return self._delete(keys=[self._key(run_id), self._index], args=[version, run_id]) == 1

    def count(self) -> int:
        return int(self.client.zcard(self._index))

    def hit(self, key: str, window: int) -> int:
        name = f"{self.prefix}hits:{window}:{key}"
        pipe = self.client.pipeline()
        pipe.incr(name)
        pipe.expire(name, 120)
        return int(pipe.execute()[0])


def _application_id(path: Path) -> int | None:
    """A SQLite file's application id, read without writing (None: not a SQLite file)."""
    try:
        with closing(sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)) as db:
            return db.execute("PRAGMA application_id").fetchone()[0]
    except sqlite3.DatabaseError:
        return None


def open_store(spec: str | None):
    """The store ``spec`` names: ``memory`` (or None), ``sqlite:PATH``, ``redis://...`` (``rediss://`` too)."""
    if spec in (None, "", "memory"):
        return MemoryStore()
    if spec.startswith("sqlite:"):
        path = spec.removeprefix("sqlite:")
        if not path:
            raise InputError("give a file: sqlite:PATH", "--store")
        return SqliteStore(path)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(spec)
    raise InputError(f"must be memory, sqlite:PATH or redis://HOST:PORT/DB, got {spec[:80]!r}", "--store")


# -- runs on a store ----------------------------------------------------------------------------------------------
class Runs:
    """The budgeted runs of a server: at most ``max_runs`` open in the store (idle ones past ``ttl`` seconds may make
    room for a new one); each request applied once by compare-and-set (the module docstring)."""

    def __init__(self, gate, store=None, max_runs: int = 10_000, ttl: float = 3600.0):
        self.gate, self.store = gate, store if store is not None else MemoryStore()
        self.max_runs, self.ttl = int(max_runs), float(ttl)
        self._stripes = [threading.Lock() for _ in range(STRIPES)]

    def __len__(self) -> int:
        return self.store.count()

    def open(self, run_id: str, budget_nodes, budget_tokens, defer: bool, owner: str | None = None) -> dict:
        """Open a run; its status. 409 when ``run_id`` is open, 429 when ``max_runs`` are (none idle)."""
        run = self.gate.run(budget_nodes=budget_nodes, budget_tokens=budget_tokens, defer=defer, run_id=run_id)
        found = self.store.create(run_id, _record(run, owner), time.time(), self.max_runs, self.ttl)
        if found == "exists":
            raise StoreError(409, f"run {run_id!r} is already open (close it, or open another run_id)", "run_id")
        if found == "full":
            raise StoreError(429, f"{self.max_runs} runs are open (the server's --max-runs): close some first")
        return run.status()

    def call(self, run_id: str, fn: Callable, owner: str | None = None, close: bool = False):
        """``fn(run)`` on the run's state now, written back by compare-and-set (``close``: the run is removed);
        404 for a run not open, 403 for a run another API key opened."""
        with self._stripes[zlib.crc32(run_id.encode()) % STRIPES]:
            for _ in range(CAS_TRIES):
                found = self.store.get(run_id)
                if found is None:
                    raise StoreError(404, f"no open run {run_id!r} (never opened, closed, or dropped)", "run_id")
                text, version = found
                record = json.loads(text)
                if record.get("owner") != owner:
                    raise StoreError(403, f"run {run_id!r} was opened with another API key", "run_id")
                run = RunGate.from_json(record["state"], self.gate, f"run {run_id}")
                out = fn(run)
                done = (
                    self.store.delete(run_id, version)
                    if close
                    else self.store.replace(run_id, version, _record(run, owner), time.time())
                )
                if done:
                    return out
        raise StoreError(429, f"run {run_id!r} is too busy (other requests kept changing it): retry", "run_id")


def _record(run, owner: str | None) -> str:
    return json.dumps({"owner": owner, "state": run.to_json()}, ensure_ascii=False)
