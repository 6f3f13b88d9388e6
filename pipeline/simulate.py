"""Many queries through the reference pipeline: parallel over queries, resumable, one trace file per run.

Output folder::

    OUT/simulate.json          the configuration (a rerun with another configuration is refused)
    OUT/traces/<run_id>.jsonl  one canonical trace per run, renamed into place when the run ends
    OUT/summary.json           mean totals over every finished run in OUT

A rerun skips runs whose trace exists; an interrupted run leaves only a hidden temporary file.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

from branchgate.errors import BranchgateError, InputError, MismatchError
from branchgate.fileio import atomic_path, atomic_write_json, check_output_dir, claim_output_dir, mark_output_dir
from branchgate.logs_to_dataset.traces import TraceWriter
from branchgate.pipeline import env as envmod
from branchgate.pipeline import generate, stage_policies
from branchgate.pipeline.config import Config, check_snippet_words
from branchgate.pipeline.run import Runner

log = logging.getLogger(__name__)
OUTPUT_KIND = "simulate"  # the command named in the output folder's mark (``fileio.check_output_dir``)

SUMMARY_KEYS = (
    "nodes",
    "retrieval_calls",
    "search_calls",
    "hits_offered",
    "hits_read",
    "tokens",
    "kpr",
    "wall_s",
    "kpr_before_synthesis",
    "n_candidates",
    "n_expanded",
    "n_pruned_pre",
    "n_evidence",
    "n_context",
    "n_final",
)


def select_queries(env, runs: int | None, queries_file: str | None) -> list[tuple[str, int]]:
    """``(query id, repetition)`` per run: the env's queries (or those listed in ``queries_file``, one id
    per line or JSON lines with ``id``) in order, cycling with a new repetition index past the end."""
    ids = [q.id for q in env.queries]
    if queries_file:
        path = Path(queries_file)
        if not path.is_file():
            raise InputError("queries file not found", str(path))
        ids = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("{"):
                try:
                    qid = str(json.loads(line)["id"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise InputError("expected a JSON object with 'id'", str(path), lineno) from None
            else:
                qid = line
            if qid not in env.query_by_id:
                raise InputError(f"query id {qid!r} is not in the environment {env.path}", str(path), lineno)
            ids.append(qid)
        if not ids:
            raise InputError("no query id listed", str(path))
    n = len(ids) if runs is None else runs
    if n < 1:
        raise BranchgateError("--runs must be ≥ 1")
    return [(ids[k % len(ids)], k // len(ids)) for k in range(n)]


def run_id_of(qid: str, rep: int, cfg: Config) -> str:
    return f"{qid}.r{rep}.{cfg.tag()}"


# -- worker side ---------------------------------------------------------------------------------------

_RUNNER: Runner | None = None


def make_runner(env_path, cfg: Config, gen_kw: dict, threads: int | None = None, encoder=None) -> Runner:
    """A Runner for ``cfg`` over an environment (a loaded ``Env`` or its path); ``encoder`` (an already
    loaded ``Encoder``) replaces ``Encoder.load(cfg.encoder)``."""
    env = env_path if isinstance(env_path, envmod.Env) else envmod.load(env_path)
    try:  # one BLAS thread as well: teachers' small SVDs/matmuls spin on shared cores (3× slower measured)
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads or 1)
    except ImportError:
        pass
    runner = Runner(env, cfg, generate.make(cfg.generator, env, **gen_kw))
    if runner.embed_any or cfg.retriever == "dense":
        import torch

        # one intra-op thread: the pipeline's encoder calls are small, and on shared cores extra threads
        # spin (measured 20× slower for two short texts); parallelism comes from --workers
        torch.set_num_threads(threads or 1)
        from branchgate.data.embedding_cache import EmbeddingCache
        from branchgate.models.encoder import Encoder

        cache = EmbeddingCache(encoder if encoder is not None else Encoder.load(cfg.encoder))
        runner.embedder, runner.encoder_id = cache.get, cache.encoder_id
    return runner


def _init_worker(env_path, cfg_dict, gen_kw, threads):
    global _RUNNER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _RUNNER = make_runner(env_path, Config(**cfg_dict), gen_kw, threads)


def _do_run(job):
    return run_one(_RUNNER, *job)


def run_one(runner: Runner, qid: str, rep: int, out: str) -> tuple[str, dict]:
    run_id = run_id_of(qid, rep, runner.cfg)
    final = Path(out) / "traces" / f"{run_id}.jsonl"
    with atomic_path(final) as tmp, TraceWriter(tmp) as writer:
        totals = runner.run(runner.env.query_by_id[qid], run_id, writer, rep=rep)
    return run_id, totals


def spawn_map(fn, jobs: list, workers: int, initializer, initargs: tuple):
    """``fn(job)`` for every job in ``workers`` spawned processes (each set up once by ``initializer``),
    yielding results as they finish; the pool is closed cleanly, or terminated on an error or interrupt."""
    import multiprocessing as mp

    pool = mp.get_context("spawn").Pool(min(workers, len(jobs)), initializer=initializer, initargs=initargs)
    try:
        yield from pool.imap_unordered(fn, jobs)
        pool.close()  # let workers exit cleanly (terminate() leaks their semaphores)
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


# -- driver --------------------------------------------------------------------------------------------


def simulate(
    env_path: str,
    cfg: Config,
    out: str | Path,
    runs: int | None = None,
    queries_file: str | None = None,
    workers: int = 1,
    gen_kw: dict | None = None,
    progress: bool = True,
    encoder=None,
) -> dict:
    from tqdm.auto import tqdm

    gen_kw = gen_kw or {}
    stages = (
        (cfg.pre, "pre_retrieval"),
        (cfg.read, "read"),
        (cfg.post, "post_retrieval"),
        (cfg.synth, "pre_synthesis"),
    )
    policies = [stage_policies.parse(spec, stage) for spec, stage in stages]  # fail fast on a bad spec
    gates = [getattr(p, "path", None) for p in policies]  # controller files: inputs, like the env and query file
    if cfg.breadth < 1 or cfg.depth < 1 or cfg.top_k < 1 or cfg.oversample < 1:
        raise BranchgateError("--breadth, --depth and --top-k must be ≥ 1 and --oversample ≥ 1")
    check_snippet_words(cfg.snippet_words)
    for policy in policies:
        policy.check()  # a controller is loaded once here: one given to the wrong stage fails before any run
    if cfg.retriever not in ("bm25", "dense"):
        raise BranchgateError(f"unknown retriever {cfg.retriever!r}: bm25 | dense")
    env = env_path if isinstance(env_path, envmod.Env) else envmod.load(env_path)  # a path or a loaded Env
    env_path = str(env.path)
    out = check_output_dir(
        out, [env_path, queries_file, cfg.budget_reference or None, *gates], OUTPUT_KIND, in_place=True
    )
    claim_output_dir(out, OUTPUT_KIND)  # closed (mark_output_dir) once every run is written
    (out / "traces").mkdir(parents=True, exist_ok=True)
    conf = {
        "config": cfg.record(),
        "env": env_path,
        "env_fingerprint": env.fingerprint(),
        "tag": cfg.tag(),
        "generator_options": {k: v for k, v in gen_kw.items() if k != "api_key"},
    }
    conf_path = out / "simulate.json"
    if conf_path.exists():
        old = json.loads(conf_path.read_text())
        if (old.get("config"), old.get("env_fingerprint")) != (conf["config"], conf["env_fingerprint"]):
            raise MismatchError(f"{out} holds runs of another configuration ({conf_path}); use a new --out folder")
    else:
        atomic_write_json(conf_path, conf)
    jobs = [(qid, rep, str(out)) for qid, rep in select_queries(env, runs, queries_file)]
    todo = [j for j in jobs if not (out / "traces" / f"{run_id_of(j[0], j[1], cfg)}.jsonl").exists()]
    if len(todo) < len(jobs):
        log.info("resuming: %d of %d runs already finished in %s", len(jobs) - len(todo), len(jobs), out)
    bar = tqdm(total=len(todo), desc="runs", unit="run", disable=not progress)
    try:
        if workers <= 1 or len(todo) <= 1:
            runner = make_runner(env, cfg, gen_kw, encoder=encoder) if todo else None
            for job in todo:
                run_one(runner, *job)
                bar.update(1)
        else:
            for _ in spawn_map(_do_run, todo, workers, _init_worker, (env_path, asdict(cfg), gen_kw, 1)):
                bar.update(1)
    finally:
        bar.close()
    summary = summarize(out, [run_id_of(q, r, cfg) for q, r, _ in jobs])
    atomic_write_json(out / "summary.json", {**summary, "config": conf})
    mark_output_dir(out, OUTPUT_KIND)
    return summary


def read_totals(path: Path) -> dict | None:
    """The ``run_end`` totals of a finished trace (its last line)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 65536))
        tail = fh.read().decode("utf-8", errors="replace").strip().splitlines()
    if not tail:
        return None
    try:
        last = json.loads(tail[-1])
    except json.JSONDecodeError:
        return None
    return last.get("totals") if last.get("type") == "run_end" else None


def summarize(out: Path, run_ids: list[str] | None = None) -> dict:
    """Means (and standard errors) of the run totals of the traces in ``out`` (or of ``run_ids``)."""
    paths = sorted((Path(out) / "traces").glob("*.jsonl"))
    if run_ids is not None:
        wanted = set(run_ids)
        paths = [p for p in paths if p.stem in wanted]
    rows = [t for t in (read_totals(p) for p in paths) if t]
    summary: dict = {"n_runs": len(rows)}
    for key in SUMMARY_KEYS:
        vals = np.array([r[key] for r in rows if key in r], dtype=np.float64)
        if len(vals):
            summary[key] = {
                "mean": float(vals.mean()),
                "se": float(vals.std(ddof=1) / np.sqrt(len(vals))) if len(vals) > 1 else 0.0,
            }
    expanded = sum(r.get("n_expanded", 0) for r in rows)
    gained = sum(r.get("expansions_with_gain", 0) for r in rows)
    summary["frac_expansions_with_gain"] = gained / expanded if expanded else None
    origins: dict[str, list[int]] = {}
    for r in rows:
        for k, v in (r.get("gain_by_origin") or {}).items():
            o = origins.setdefault(k, [0, 0])
            o[0] += v["expanded"]
            o[1] += v["with_gain"]
    summary["frac_with_gain_by_origin"] = {
        k: {"expanded": v[0], "frac": v[1] / v[0] if v[0] else None} for k, v in sorted(origins.items())
    }
    stages: dict[str, list[float]] = {}
    for r in rows:
        for k, v in (r.get("tokens_by_stage") or {}).items():
            stages.setdefault(k, []).append(v)
    summary["tokens_by_stage"] = {k: float(np.mean(v)) for k, v in sorted(stages.items())}
    return summary
