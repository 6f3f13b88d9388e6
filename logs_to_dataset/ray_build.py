"""``branchgate dataset build --engine ray``: the same build, with embedding and row building on Ray Data.

The build itself is ``logs_to_dataset/build.py``'s: reading, decision points, partial runs, skipped records,
label thresholds (``RowBuilder.finalize``), the manifest and the atomic write all run there, on the driver,
exactly as for ``--engine local``. ``RayEngine`` replaces only the two per-batch steps of its ``flush``:

1. ``embed``: the batch's texts the embedding cache lacks go through a Ray Data ``map_batches`` over an
   encoder actor pool (``_EncoderActor``: one encoder per actor, ``num_cpus`` threads each); the vectors are
   written as Parquet shards (``WORK/embed-N/``), read back on the driver and stored in the same
   ``EmbeddingCache`` (so its hits/misses count as in a local build, and ``train`` then finds every text).
2. ``rows``: the batch's runs, sharded by a hash of their run id, each with the vectors of its own texts, go
   through ``map_batches`` (tasks) calling ``RowBuilder.rows`` (teacher scores, realized utilities); each
   run's rows are written as one Parquet record (``WORK/rows-N/``) and read back in the order the runs were
   read, so the ``DatasetDict`` equals the local build's row for row.

Ray is the ``ray`` extra (``pip install 'branchgate[ray]'``), imported only here and only when used.
``ray.init()`` connects to ``RAY_ADDRESS`` when set (a cluster), else starts a local Ray; an already
initialised Ray is used as it is. On a cluster, ``work_dir`` must be storage every node sees.
``--labels judge`` is refused: its LLM calls and their statistics belong to the driver. Both stages (``--stage``)
run here: the builder (``RowBuilder`` or ``read_rows.ReadRowBuilder``) names its rows' columns (``builder.stage``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from branchgate.data.dataset_schema import features
from branchgate.errors import BranchgateError, InputError
from branchgate.export.onnx_encoder import OnnxEncoder
from branchgate.logs_to_dataset.build import BuildSettings, check_build_output, run_build
from branchgate.models.encoder import Encoder, LazyEncoder

RAY_HINT = "pip install 'branchgate[ray]'"
# texts per build.py flush: large batches, so each Ray job has enough work to amortise its start (actors
# load the encoder once per job); the driver holds one batch's runs and vectors at a time
RAY_BATCH_TEXTS = 200_000


def require_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise BranchgateError(f"--engine ray needs Ray Data, which is not installed: {RAY_HINT}") from None
    return ray


def build_ray(
    traces,
    out,
    *,
    num_actors: int | None = None,
    work_dir: str | Path | None = None,
    gpus_per_actor: float = 0,
    batch_texts: int = RAY_BATCH_TEXTS,
    **options,
) -> dict:
    """``build.build`` with ``RayEngine``: same arguments (``options``: ``build.BuildSettings``), same outputs
    (dataset and manifest); ``ray_run_build`` says the rest."""
    return ray_run_build(
        BuildSettings(traces, out, batch_texts=batch_texts, **options),
        num_actors=num_actors,
        work_dir=work_dir,
        gpus_per_actor=gpus_per_actor,
    )


def ray_run_build(
    settings, *, num_actors: int | None = None, work_dir: str | Path | None = None, gpus_per_actor: float = 0
) -> dict:
    """``build.run_build`` of ``settings`` (a ``build.BuildSettings``) with ``RayEngine``.

    ``num_actors`` (default: the settings' ``workers``, the CLI's ``--workers``): encoder actors (default: Ray's
    CPUs, at most 8), each embedding in one process the way the local build's ``embed`` says (``onnx``: the
    exported tower, ``torch``: sentence-transformers; ``export/onnx_encoder.py``). ``work_dir``: where the Parquet
    shards go (default: a temporary folder beside ``out``, removed afterwards). ``gpus_per_actor`` > 0: each
    encoder actor reserves that many GPUs and encodes on CUDA (``embed="torch"`` only; not covered by the CPU
    tests). The driver's encoder is the local build's (``onnx_encoder.build_encoder``), with one process: the
    driver exports and parity-checks the ONNX tower once, the actors open the same cached tower."""
    s = settings
    check_build_output(s.out, s.traces, s.keypoints, s.cache)  # before any folder is made
    ray = require_ray()
    if str(s.labels).split(":")[0] == "judge":
        raise InputError(
            "--labels judge is not supported with --engine ray (its LLM calls run on the driver); use --engine local",
            "--labels",
        )
    num_actors = num_actors or s.workers
    encoder_obj = s.encoder_obj
    if encoder_obj is None:
        from branchgate.export.onnx_encoder import build_encoder

        encoder_obj = build_encoder(s.encoder, s.embed, 1)
    if not ray.is_initialized():
        ray.init(include_dashboard=False, configure_logging=False)
    if s.progress is False:
        ray.data.DataContext.get_current().enable_progress_bars = False
    out = Path(s.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    own = work_dir is None
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.ray-", dir=out.parent)) if own else Path(work_dir)
    engine = RayEngine(work, num_actors, gpus_per_actor)
    try:
        return run_build(replace(s, encoder_obj=encoder_obj, engine=engine, workers=None))
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


class RayEngine:
    """The ``engine`` of ``build.build``: ``embed(cache, texts)`` and ``rows(builder, pending, vectors, dim)``."""

    def __init__(self, work: Path, num_actors: int | None = None, gpus_per_actor: float = 0):
        self.ray = require_ray()
        self.gpus = float(gpus_per_actor or 0)
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        gpus = int(self.ray.cluster_resources().get("GPU", 0) // self.gpus) if self.gpus else 0
        self.num_actors = max(1, num_actors or (gpus or min(cpus, 8)))
        self.cpus_per_actor = max(1, cpus // self.num_actors)
        self.cpus = cpus
        self.step = 0

    def _dir(self, what: str) -> str:
        self.step += 1
        return str(self.work / f"{what}-{self.step}")

    # -- 1. embeddings -------------------------------------------------------------------------------
    def embed(self, cache, texts: list[str]) -> np.ndarray:
        """``cache.get(texts)``, its misses encoded by the actor pool in one Ray job."""
        real, chunk = cache.encoder, cache.chunk_size
        cache.encoder, cache.chunk_size = _PoolEncoder(self, real), max(1, len(texts))
        try:
            return cache.get(texts)
        finally:
            cache.encoder, cache.chunk_size = real, chunk

    def encode(self, encoder, texts: list[str], batch_size: int) -> np.ndarray:
        import pyarrow.parquet as pq
        import ray.data

        if not texts:
            return np.zeros((0, int(encoder.dim)), dtype=np.float32)
        if callable(getattr(encoder, "prepare", None)):
            encoder.prepare()  # the ONNX tower: exported (once, cached) and parity-checked here, opened by the actors
        dim = int(encoder.dim)
        path = self._dir("embed")
        blocks = max(1, min(-(-len(texts) // 256), 4 * self.num_actors))  # a small job loads one encoder
        ds = ray.data.from_items([{"i": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=blocks)
        ds = ds.map_batches(
            _EncoderActor,
            fn_constructor_kwargs={
                "encoder": _portable(encoder),
                "threads": self.cpus_per_actor,
                "batch_size": batch_size,
                "device": "cuda" if self.gpus else "cpu",
            },
            batch_size=max(batch_size, 256),
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=min(self.num_actors, blocks)),
            num_cpus=self.cpus_per_actor,
            num_gpus=self.gpus or None,
        )
        ds.write_parquet(path)
        table = pq.read_table(path)
        order = np.argsort(np.asarray(table.column("i").to_numpy()), kind="stable")
        blobs = table.column("vec").to_pylist()
        vecs = np.stack([np.frombuffer(blobs[j], dtype=np.float32) for j in order])
        if vecs.shape != (len(texts), dim):
            raise BranchgateError(
                f"ray build: {vecs.shape[0]} vectors of width {vecs.shape[1]} for "
                f"{len(texts)} texts of width {dim} (in {path})"
            )
        return vecs

    # -- 2. rows ---------------------------------------------------------------------------------------
    def rows(self, builder, pending: list, vectors: dict, dim: int) -> list[list[dict]]:
        """``builder.rows`` of every pending run, on Ray, in ``pending``'s order; the runs' uncovered labels
        (``builder.missing``) are counted back into ``builder``."""
        import pyarrow.parquet as pq
        import ray.data

        items = []
        for i, (_, rd, info) in enumerate(pending):
            texts = builder.texts(rd, info)
            vecs = np.stack([vectors[t] for t in texts]).astype(np.float32, copy=False)
            items.append({"shard": _shard(rd.run_id), "run": i, "payload": (rd, info, texts, vecs.tobytes())})
        items.sort(key=lambda x: (x["shard"], x["run"]))  # runs sharded by run id
        blocks = max(1, min(len(items), 4 * self.cpus))
        path = self._dir("rows")
        ds = ray.data.from_items(items, override_num_blocks=blocks)
        ds = ds.map_batches(
            _rows_batch,
            fn_kwargs={"builder": builder, "dim": dim, "schema": _row_schema(list(builder.teachers), builder.stage)},
            batch_format="numpy",
            batch_size=None,
            num_cpus=1,
        )
        ds.write_parquet(path)
        table = pq.read_table(path, schema=_run_schema(_row_schema(list(builder.teachers), builder.stage)))
        made: list = [None] * len(pending)
        for rec in table.to_pylist():
            made[rec["run"]] = rec["rows"]
            for kind, reason, n in json.loads(rec["missing"]):
                builder.missing[(kind, reason)] += n
        lost = [i for i, m in enumerate(made) if m is None]
        if lost:
            raise BranchgateError(f"ray build: no rows came back for {len(lost)} run(s) (in {path})")
        return made


class _PoolEncoder:
    """What the ``EmbeddingCache`` encodes its misses with during ``RayEngine.embed``: the actor pool."""

    def __init__(self, engine: RayEngine, real):
        self.engine, self.real, self.id = engine, real, real.id

    @property
    def dim(self):
        return self.real.dim

    def encode(self, texts, batch_size: int = 64, **_):
        return self.engine.encode(self.real, list(texts), batch_size)


def _portable(encoder):
    """What an actor rebuilds the driver's encoder from: the ONNX tower's encoder, or a sentence-transformers
    encoder, by its spec (and window); anything else (an encoder object passed to ``build``) as itself."""
    if isinstance(encoder, OnnxEncoder):
        kind, spec, kw = _portable(encoder.torch_encoder)
        if kind != "spec":
            return ("object", encoder, {})
        return ("onnx", spec, {"load": kw, "cache_dir": encoder.cache_dir})
    if isinstance(encoder, LazyEncoder):
        return ("spec", encoder.spec, dict(encoder._kwargs))
    if isinstance(encoder, Encoder):
        return ("spec", encoder.spec, {"max_length": encoder.max_length})
    return ("object", encoder, {})


class _EncoderActor:
    """One encoder per actor, loaded once; a batch of ``{"i", "text"}`` → ``{"i", "vec"}`` (float32 bytes)."""

    def __init__(self, encoder, threads: int, batch_size: int, device: str = "cpu"):
        kind, obj, kw = encoder
        if kind == "onnx":  # one process, one onnxruntime thread (more actors rather than threads)
            from branchgate.export.onnx_encoder import OnnxEncoder
            from branchgate.models.encoder import LazyEncoder

            obj = OnnxEncoder(LazyEncoder(obj, **kw["load"]), workers=1, cache_dir=kw["cache_dir"])
        else:
            import torch

            torch.set_num_threads(max(1, threads))
        if kind == "spec":
            from branchgate.models.encoder import Encoder

            obj = Encoder(obj, device=device, **kw)
        self.encoder, self.batch_size = obj, batch_size

    def __call__(self, batch: dict) -> dict:
        vecs = np.asarray(
            self.encoder.encode([str(t) for t in batch["text"]], batch_size=self.batch_size), dtype=np.float32
        )
        return {"i": np.asarray(batch["i"], dtype=np.int64), "vec": np.array([v.tobytes() for v in vecs], dtype=object)}


def _rows_batch(batch, builder, dim: int, schema):
    """A block of runs → one record per run: its index, its rows, the labels it lacked (``builder.missing``)."""
    import pyarrow as pa

    builder = copy.copy(builder)  # its own count of the runs it cannot label (``missing``), sent back per run
    out = {"run": [], "rows": [], "missing": []}
    for run, (rd, info, texts, blob) in zip(batch["run"].tolist(), batch["payload"]):
        vecs = np.frombuffer(blob, dtype=np.float32).reshape(len(texts), dim)
        builder.missing = Counter()
        rows = builder.rows(rd, dict(zip(texts, vecs)), dim, info)
        out["run"].append(run)
        out["rows"].append(rows)
        out["missing"].append(json.dumps([[k, r, n] for (k, r), n in sorted(builder.missing.items())]))
    return pa.table(out, schema=_run_schema(schema))


def _row_schema(teacher_names, stage: str = "pre"):
    """The dataset's columns as Arrow types, floats kept at float64 (rows are labelled on the driver from
    these utilities, as in a local build) and ``label`` nullable (set by ``RowBuilder.finalize``)."""
    import pyarrow as pa

    fields = []
    for f in features(teacher_names, stage).arrow_schema:
        fields.append(pa.field(f.name, pa.float64()) if pa.types.is_floating(f.type) else f)
    return pa.schema(fields)


def _run_schema(row_schema):
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("run", pa.int64()),
            pa.field("rows", pa.list_(pa.struct(list(row_schema)))),
            pa.field("missing", pa.string()),
        ]
    )


def _shard(run_id: str, shards: int = 1 << 16) -> int:
    return int(hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:8], 16) % shards
