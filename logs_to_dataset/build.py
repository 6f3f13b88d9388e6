"""Build the decision dataset from trace files: read → decision points → embed → label → write.

Outcomes for bad input (each tested):

| input | default | ``strict`` |
|---|---|---|
| bad record (invalid JSON line, missing field, truncated last line, bad log event) | skipped, listed in manifest ``skipped`` | ``InputError`` (exit 2) |
| unreadable file (empty, binary, not UTF-8, truncated JSON document) | skipped, listed in ``skipped`` | ``InputError`` (exit 2) |
| run without ``run_start`` / run_id already read from another file | run skipped, listed in ``skipped`` | ``InputError`` (exit 2) |
| unknown event type | kept as ``raw`` (not used for rows) | same |
| schema version newer than this branchgate | ``SchemaVersionError`` (exit 2) | same |
| file no reader recognises (inside a directory) | listed in manifest ``ignored_files`` | same |
| partial run (no ``run_end``, or its ``status`` not "ok": crashed, truncated, incomplete) | ``--partial-runs keep`` (default): kept, counted in manifest ``partial_runs``, one warning line; ``skip``: left out, counted there and listed in ``skipped`` | same |
| file that cannot be opened (permission denied), looping or dangling symlink | listed in ``skipped`` | ``InputError`` (exit 2) for unreadable files |
| nothing parsed at all | no dataset written; ``OUT/manifest.json`` records what was read and skipped (unless OUT already holds a dataset); the message names the first skipped records; exit 1 | exit 2 at the first bad record |
| unknown ``--labels``, ``--labels judge`` without ``--llm-url``/``--llm-model`` | ``InputError`` (exit 2) before reading | same |
| run without what ``--labels`` needs (no key-point labels / no report citing evidence) | counted in manifest ``label_missing``; all its candidates label −1 (``excluded``) | same |

Label sources (``--labels``; ``logs_to_dataset/label_sources.py`` defines them):

| source | utility g of an expanded branch | default threshold (manifest ``label_threshold_rule``) |
|---|---|---|
| ``auto`` (default) | ``keypoints`` when the run's evidence has key-point labels, else ``teacher:<teacher>`` | as below |
| ``keypoints`` | new ground-truth key points its evidence covers | 1 |
| ``returns[:γ]`` | the same, plus γ^k × those its expanded descendants k levels below first cover (γ = 0.5) | 1 |
| ``citations`` | its new evidence items the final ``report`` cites (``cited_ids``) | 1 |
| ``teacher:NAME`` | the teacher's set gain of its evidence given C_t | ``positive_rate`` (0.1) of the train split's utilities positive |
| ``judge`` | key points an LLM judge finds new (``logs_to_dataset/judge.py``) | the judge's |

Output (written atomically): ``datasets.DatasetDict`` (train / validation / test, split by run) saved
with ``save_to_disk`` plus ``manifest.json``.

Reading is a stream: one file's runs at a time, a batch of runs (about ``batch_texts`` texts) waiting for
embeddings, then their rows written to disk at once (``RowSpill``; in memory stay only ``labels.LabelRecords``,
the few fields labelling and the manifest read, so memory is flat in the number of runs) and read back
memory-mapped for the write. Embedding (``--embed``): ``onnx`` (default) through the encoder's fp32 ONNX text
tower in ``--workers`` processes, checked against the torch encoder before the first text
(``models/onnx_encoder.py``); ``torch`` through sentence-transformers. Same vectors within 1e-6, same rows.

(The read → label flow and its counting of what was skipped are one job; the manifest and messages are
``build_report.py``; the rows' storage and write are ``row_store.py``.)
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from branchgate.errors import InputError
from branchgate.fileio import check_output_dir
from branchgate.data.schema import SPLITS, features
from branchgate.logs_to_dataset.build_report import (KEYPOINT_STATS, _count_keypoints, _manifest, _nothing_parsed,
                                                     _partial_warning)
from branchgate.logs_to_dataset.build_report import NothingParsed  # noqa: F401  (build raises it; importable from here)
from branchgate.logs_to_dataset.decisions import (DEFERRAL_COUNTS, check_split_by, partial_reason, run_decisions,
                                                  split_key, split_of)
from branchgate.logs_to_dataset.label_sources import DEFAULT_POSITIVE_RATE, run_info
from branchgate.logs_to_dataset.labels import PRUNED_LABELS, LabelRecords, RowBuilder
from branchgate.logs_to_dataset.readers import discover, input_files, read_file
from branchgate.logs_to_dataset.row_store import OUTPUT_KIND, RowSpill, write_dataset
from branchgate.logs_to_dataset.traces import ReadReport

log = logging.getLogger(__name__)

DEFAULT_TEACHER = "sc"
PARTIAL_RUNS = ("keep", "skip")


def sha256_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def check_build_output(out, traces, keypoints=None, cache=None) -> None:
    """Refuse an ``--out`` the build may not write (``fileio.check_output_dir``), before any work: it must lie
    apart from the traces, the key-point folder and the cache, and be new, empty or an earlier dataset."""
    check_output_dir(out, [*traces, None if keypoints in (None, "", "none", "auto") else keypoints, cache],
                     OUTPUT_KIND)


def build(traces: list[str | Path], out: str | Path, teacher: str = DEFAULT_TEACHER, fmt: str | None = None,
          encoder: str = "auto", strict: bool = False, label_threshold: float | None = None,
          cache: str | Path | None = None, pruned_labels: str = "excluded", progress: bool | None = None,
          encoder_obj=None, batch_texts: int = 512, keypoints: str | Path | None = "auto", labels: str = "auto",
          positive_rate: float = DEFAULT_POSITIVE_RATE, label_options: dict | None = None,
          partial_runs: str = "keep", engine=None, embed: str = "onnx", workers: int | None = None,
          runs=None, split_by: str = "run") -> dict:
    """Build the dataset at ``out`` and return its manifest. Raises ``NothingParsed`` if no run was read.

    ``labels``: the label source (``logs_to_dataset.label_sources``: auto, keypoints, returns[:γ], citations,
    judge, teacher:NAME). A teacher's threshold, without ``label_threshold``, is set so that ``positive_rate`` of the
    train split's realized utilities are positive. ``label_options`` go to the source (judge: llm_url,
    llm_model, ...). The manifest records each kind's ``label_threshold``, ``label_threshold_rule`` and its
    positive rate per split, and counts the runs a source could not label (``label_missing``).

    ``keypoints``: where the Search-o1 reader finds DeepResearchGym key points ("auto": the sibling
    ``key_point/`` folder of the traces; a directory; None / "none": no key-point labels). The manifest's
    ``keypoints`` section counts runs with ground truth, evidence labelled and key points reachable.

    Texts are embedded through the ``EmbeddingCache`` in batches of whole runs (about ``batch_texts``
    texts per cache call), so the encoder sees large, length-sorted batches.

    ``partial_runs``: "keep" (default) or "skip" runs without a normal ``run_end`` (``decisions.partial_reason``);
    either way they are counted in the manifest's ``partial_runs`` and a kept one gives a warning line.

    ``embed``: "onnx" (default) embeds through the encoder's exported fp32 text tower in ``workers`` processes
    (default: the available cores), checked against the torch encoder first (``models.onnx_encoder``: same
    vectors within 1e-6, else ``TowerParityError``); "torch" through sentence-transformers. An ``encoder_obj``
    is used as it is (and left open: an ``OnnxEncoder``'s workers are the caller's to ``close``). The
    manifest's ``embedder`` says which ran.

    ``split_by``: "run" (default: ``split_of(run_id)``) or "question" (every run of one root question in one
    split: ``decisions.split_key``); recorded in the manifest's ``split_by``.

    ``runs``: canonical runs (``readers.Run``) from any iterable, read after ``traces`` and consumed lazily:
    like files, one run at a time; the rows built from them go to disk as they are built.

    ``engine``: None (here) or what embeds a batch's texts and builds its runs' rows elsewhere with these same
    functions: ``embed(cache, texts)`` and ``rows(builder, pending, vectors, dim)`` (``ray_build.RayEngine``).
    """
    from branchgate.logs_to_dataset.readers.searcho1 import use_keypoints

    check_split_by(split_by)  # an unknown --split-by fails before any work
    check_build_output(out, traces, keypoints, cache)
    spill = RowSpill(out)  # the rows on disk until the write; removed however the build ends
    try:
        with use_keypoints(keypoints):
            return _build(traces, out, teacher, fmt, encoder, strict, label_threshold, cache, pruned_labels, progress,
                          encoder_obj, batch_texts, keypoints, labels, positive_rate, label_options, partial_runs,
                          engine, embed, workers, runs, spill, split_by)
    finally:
        spill.remove()


def _build(traces, out, teacher, fmt, encoder, strict, label_threshold, cache, pruned_labels, progress,
           encoder_obj, batch_texts, keypoints, labels, positive_rate, label_options, partial_runs, engine,
           embed="onnx", workers=None, extra_runs=None, spill=None, split_by="run") -> dict:
    from tqdm.auto import tqdm

    from branchgate.data.embedding_cache import EmbeddingCache
    from branchgate.models import teachers as T
    from branchgate.models.onnx_encoder import EMBED_MODES

    if pruned_labels not in PRUNED_LABELS:
        raise InputError(f"--pruned-labels must be one of {', '.join(PRUNED_LABELS)}, got {pruned_labels!r}")
    if partial_runs not in PARTIAL_RUNS:
        raise InputError(f"must be one of {', '.join(PARTIAL_RUNS)}, got {partial_runs!r}", "--partial-runs")
    if teacher not in T.NAMES:
        raise InputError(f"unknown teacher {teacher!r}; valid names: {', '.join(T.NAMES)}")
    if embed not in EMBED_MODES:
        raise InputError(f"must be one of {', '.join(EMBED_MODES)}, got {embed!r}", "--embed")
    if workers is not None and int(workers) < 1:
        raise InputError(f"must be ≥ 1, got {workers}", "--workers")
    models = {name: T.get(name) for name in T.NAMES}
    builder = RowBuilder(models, teacher, label_threshold, pruned_labels, labels=labels, positive_rate=positive_rate,
                         label_options=label_options)  # a bad --labels fails before reading
    timings = Counter()
    t0 = time.perf_counter()
    report = ReadReport()
    found = discover(traces, fmt, report, strict)
    files = input_files(found)
    source_sha = sha256_files(files)
    timings["hash_s"] += time.perf_counter() - t0

    loaded: dict = {}

    def embeddings():
        """The encoder and its cache, loaded on first use (a bad input fails before the slow load)."""
        if not loaded:
            from branchgate.models.onnx_encoder import build_encoder

            t = time.perf_counter()
            enc = build_encoder(encoder, embed, workers, encoder_obj)  # onnx: weights load at its first new text
            loaded["encoder"], loaded["cache"] = enc, EmbeddingCache(enc, cache)
            builder.max_chars = 10 * int(getattr(enc, "max_length", 0) or 256)  # beyond the encoder's window
            timings["load_s"] += time.perf_counter() - t
        return loaded["cache"]

    rows = LabelRecords(SPLITS)  # per row only what labelling and the manifest read; the rows go to ``spill``
    spill = spill if spill is not None else RowSpill(out)
    spill.feats = features(list(models))
    n_runs, n_frames = Counter(), Counter()
    seen: dict[str, str] = {}
    kinds: Counter = Counter()
    problems: Counter = Counter()
    deferral: Counter = Counter()  # deferred / dropped-by-budget candidates (``RunDecisions.deferral``)
    kp_stats: Counter = Counter()
    partial = {"action": partial_runs, "runs": 0, "reasons": Counter(), "list": []}
    pending: list = []  # runs waiting for embeddings: texts of several runs are encoded in one batch
    n_pending = 0

    def flush() -> None:
        nonlocal n_pending
        if not pending:
            return
        emb_cache = embeddings()
        t = time.perf_counter()
        texts = list(dict.fromkeys(x for _, rd, info in pending for x in builder.texts(rd, info)))
        vecs = emb_cache.get(texts) if engine is None else engine.embed(emb_cache, texts)
        vectors = dict(zip(texts, vecs))
        timings["embed_s"] += time.perf_counter() - t
        t = time.perf_counter()
        made = None if engine is None else engine.rows(builder, pending, vectors, vecs.shape[1])
        for i, (split, rd, info) in enumerate(pending):
            new = builder.rows(rd, vectors, vecs.shape[1], info) if made is None else made[i]
            rows.add(split, new)
            spill.add(split, new)
            kinds.update(r["utility_kind"] for r in new)
        timings["teacher_s"] += time.perf_counter() - t - spill.take_time()
        pending.clear()
        n_pending = 0

    bar = tqdm(found, desc="dataset build", unit="file", disable=(not progress) if progress is not None else None,
               file=sys.stderr)

    def sources():
        """Runs one file (then the ``runs`` iterable) at a time: nothing is read ahead of the build."""
        for path, reader in bar:
            yield read_file(path, reader, strict, report)
            bar.set_postfix(runs=sum(n_runs.values()), rows=len(rows))
        if extra_runs is not None:
            yield iter(extra_runs)

    try:
        for runs in sources():
            while True:
                t = time.perf_counter()
                run = next(runs, None)
                if run is None:
                    timings["parse_s"] += time.perf_counter() - t
                    break
                try:
                    if run.run_id in seen:
                        raise InputError(f"run {run.run_id!r} was already read from {seen[run.run_id]} (skipped)", run.file)
                    rd = run_decisions(run.run_id, run.events, run.file)
                except InputError as exc:
                    report.skip(run.file, None, exc.reason, strict)
                    continue
                finally:
                    timings["parse_s"] += time.perf_counter() - t
                seen[run.run_id] = run.file
                why = partial_reason(run.events)
                if why:
                    partial["runs"] += 1
                    partial["reasons"][why] += 1
                    partial["list"].append({"file": run.file, "run_id": run.run_id, "reason": why})
                    if partial_runs == "skip":
                        report.skip(run.file, None, f"partial run {run.run_id!r}: {why} (--partial-runs skip)")
                        continue
                problems.update(rd.problems)
                deferral.update(rd.deferral)
                _count_keypoints(kp_stats, run, rd)
                split = split_of(split_key(rd.run_id, rd.root_query, split_by))
                n_runs[split] += 1
                n_frames[split] += sum(1 for f in rd.frames if f.candidates)
                if rd.n_decisions:
                    info = run_info(run.events)
                    pending.append((split, rd, info))
                    n_pending += len(builder.texts(rd, info))
                if n_pending >= batch_texts:
                    flush()
        flush()
    finally:
        bar.close()
        if loaded and encoder_obj is None and callable(getattr(loaded["encoder"], "close", None)):
            loaded["encoder"].close()  # the ONNX path's worker processes (an encoder_obj is the caller's)
    total_runs = sum(n_runs.values())
    partial_section = {"action": partial_runs, "runs": partial["runs"], "reasons": dict(sorted(partial["reasons"].items())),
                       "list": partial["list"]}
    if total_runs == 0:
        if loaded:
            loaded["cache"].close()
        _nothing_parsed(traces, out, report, files, fmt, partial_section)

    emb_cache = embeddings()  # loads the encoder now only if no run had decisions: the manifest records its id
    builder.fitted = builder.finalize(rows)
    source_stats = getattr(builder.source, "stats", None)  # e.g. the judge's calls, cache hits and tokens
    source_stats = source_stats() if callable(source_stats) else None
    if callable(getattr(builder.source, "close", None)):
        builder.source.close()
    manifest = _manifest(rows, n_runs, n_frames, report, files, source_sha, teacher, builder, kinds, models,
                         loaded["encoder"], emb_cache, problems, pruned_labels, fmt)
    if source_stats is not None:
        manifest["label_source_stats"] = source_stats
    manifest["keypoints"] = {"source": "none" if keypoints in (None, "", "none") else str(keypoints),
                             **{k: int(kp_stats[k]) for k in KEYPOINT_STATS}}
    manifest["partial_runs"] = partial_section
    manifest["split_by"] = split_by
    manifest["deferral"] = {k: int(deferral[k]) for k in DEFERRAL_COUNTS}
    from branchgate.models.onnx_encoder import describe

    manifest["embedder"] = describe(loaded["encoder"])
    if partial_section["runs"] and partial_runs == "keep":
        manifest["warnings"].append(_partial_warning(partial_section))
    emb_cache.close()
    write_dataset(out, rows, spill, manifest, timings)
    return manifest
