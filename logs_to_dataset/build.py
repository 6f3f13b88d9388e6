"""Build the decision dataset from trace files: read → decision points → embed → label → write.

Outcomes for bad input (each tested):

| input | default | ``strict`` |
|---|---|---|
| bad record (invalid JSON line, missing field, truncated last line, bad log event) \
| skipped, listed in manifest ``skipped`` | ``InputError`` (exit 2) |
| unreadable file (empty, binary, not UTF-8, truncated JSON document) | skipped, listed in ``skipped`` \
| ``InputError`` (exit 2) |
| run without ``run_start`` / run_id already read from another file | run skipped, listed in ``skipped`` \
| ``InputError`` (exit 2) |
| unknown event type | kept as ``raw`` (not used for rows) | same |
| schema version newer than this branchgate | ``SchemaVersionError`` (exit 2) | same |
| file no reader recognises (inside a directory) | listed in manifest ``ignored_files`` | same |
| partial run (no ``run_end``, or its ``status`` not "ok": crashed, truncated, incomplete) \
| ``--partial-runs keep`` (default): kept, counted in manifest ``partial_runs``, one warning line; ``skip``: left \
out, counted there and listed in ``skipped`` | same |
| file that cannot be opened (permission denied), looping or dangling symlink | listed in ``skipped`` \
| ``InputError`` (exit 2) for unreadable files |
| nothing parsed at all | no dataset written; ``OUT/manifest.json`` records what was read and skipped (unless OUT \
already holds a dataset); the message names the first skipped records; exit 1 | exit 2 at the first bad record |
| unknown ``--labels``, ``--labels judge`` without ``--llm-url``/``--llm-model``, ``--labels judge`` or \
``returns`` with ``--stage read`` | ``InputError`` (exit 2) before reading | same |
| ``--stage read``: a run without ``results`` events (a version 1 trace) | no rows; counted in manifest \
``read.runs_without_results`` | same |
| run without what ``--labels`` needs (no key-point labels / no report citing evidence) \
| counted in manifest ``label_missing``; all its candidates label −1 (``excluded``) | same |

Label sources (``--labels``; ``logs_to_dataset/label_sources.py`` defines them):

| source | utility g of an expanded branch | default threshold (manifest ``label_threshold_rule``) |
|---|---|---|
| ``auto`` (default) | ``keypoints`` when the run's evidence has key-point labels, else ``teacher:<teacher>`` \
| as below |
| ``keypoints`` | new ground-truth key points its evidence covers | 1 |
| ``returns[:γ]`` | the same, plus γ^k × those its expanded descendants k levels below first cover (γ = 0.5) | 1 |
| ``citations`` | its new evidence items the final ``report`` cites (``cited_ids``) | 1 |
| ``teacher:NAME`` | the teacher's set gain of its evidence given C_t | ``positive_rate`` (0.1) of the train split's \
utilities positive |
| ``judge`` | key points an LLM judge finds new (``logs_to_dataset/judge.py``) | the judge's |

Stages (``--stage``): ``pre`` (default) makes one row per candidate of each frame (``labels.RowBuilder``); ``read``
one row per new hit of each search's result list (``read_rows.ReadRowBuilder``: the same teachers, label rule,
embedding path, row store and manifest; its label sources are listed in ``read_rows``).

Output (written atomically): ``datasets.DatasetDict`` (train / validation / test, split by run) saved
with ``save_to_disk`` plus ``manifest.json``.

Reading is a stream: one file's runs at a time, a batch of runs (about ``batch_texts`` texts) waiting for
embeddings, then their rows written to disk at once (``RowSpill``; in memory stay only ``labels.LabelRecords``,
the few fields labelling and the manifest read, so memory is flat in the number of runs) and read back
memory-mapped for the write. Embedding (``--embed``): ``onnx`` (default) through the encoder's fp32 ONNX text
tower in ``--workers`` processes, checked against the torch encoder before the first text
(``export/onnx_encoder.py``); ``torch`` through sentence-transformers. Same vectors within 1e-6, same rows.

(The read → label flow and its counting of what was skipped are one job; the manifest and messages are
``build_report.py``; the rows' storage and write are ``row_store.py``.)

Over 400 lines: the build's steps (read, decision points, embed, rows, labels, write) in order around one settings
object; its report, row store and Ray engine are apart.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from branchgate.data.dataset_schema import SPLITS, check_stage, features, split_of
from branchgate.errors import InputError
from branchgate.export.onnx_encoder import EMBED_MODES, describe
from branchgate.fileio import check_output_dir
from branchgate.logs_to_dataset.build_report import (
    KEYPOINT_STATS,
    NothingParsed,  # noqa: F401  (build raises it; importable from here)
    _count_keypoints,
    _manifest,
    _nothing_parsed,
    _partial_warning,
)
from branchgate.logs_to_dataset.decision_points import (
    DEFERRAL_COUNTS,
    check_split_by,
    partial_reason,
    run_decisions,
    split_key,
)
from branchgate.logs_to_dataset.label_sources import DEFAULT_POSITIVE_RATE, run_info
from branchgate.logs_to_dataset.labels import PRUNED_LABELS, LabelRecords, RowBuilder
from branchgate.logs_to_dataset.read_rows import READ_COUNTS, ReadRowBuilder, check_read_labels, read_run
from branchgate.logs_to_dataset.readers import discover, input_files, read_file
from branchgate.logs_to_dataset.readers.searcho1 import use_keypoints
from branchgate.logs_to_dataset.row_store import OUTPUT_KIND, RowSpill, write_dataset
from branchgate.logs_to_dataset.traces import ReadReport
from branchgate.models import teachers as T

log = logging.getLogger(__name__)

DEFAULT_TEACHER = "sc"
BATCH_TEXTS = 512  # texts per embedding batch (whole runs): large, length-sorted batches for the encoder
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
    check_output_dir(out, [*traces, None if keypoints in (None, "", "none", "auto") else keypoints, cache], OUTPUT_KIND)


@dataclass(frozen=True)
class BuildSettings:
    """What one build does: ``dataset build``'s options (one field each), plus ``encoder_obj``, ``runs`` and
    ``engine`` of the Python API. Built once (``build``, ``build_cli.settings_from_args``, ``ray_build``) and read
    by every step; ``build``'s docstring says what each does."""

    traces: list
    out: str | Path
    teacher: str = DEFAULT_TEACHER
    fmt: str | None = None
    encoder: str = "auto"
    strict: bool = False
    label_threshold: float | None = None
    cache: str | Path | None = None
    pruned_labels: str = "excluded"
    progress: bool | None = None
    encoder_obj: object = None
    batch_texts: int = BATCH_TEXTS
    keypoints: str | Path | None = "auto"
    labels: str = "auto"
    positive_rate: float = DEFAULT_POSITIVE_RATE
    label_options: dict | None = None
    partial_runs: str = "keep"
    engine: object = None
    embed: str = "onnx"
    workers: int | None = None
    runs: object = None
    split_by: str = "run"
    stage: str = "pre"


def build(traces: list[str | Path], out: str | Path, **options) -> dict:
    """Build the dataset at ``out`` and return its manifest. Raises ``NothingParsed`` if no run was read.
    ``options``: the fields of ``BuildSettings`` (defaults there), by keyword.

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
    (default: the available cores), checked against the torch encoder first (``export.onnx_encoder``: same
    vectors within 1e-6, else ``TowerParityError``); "torch" through sentence-transformers. An ``encoder_obj``
    is used as it is (and left open: an ``OnnxEncoder``'s workers are the caller's to ``close``). The
    manifest's ``embedder`` says which ran.

    ``stage``: "pre" (default: one row per candidate of each frame) or "read" (one row per new hit of each search's
    result list: ``read_rows``; ``--labels judge`` and ``returns`` are refused there). The manifest records it
    (``stage``) and, for "read", counts runs without results events, read points and hits (``read``).

    ``split_by``: "run" (default: ``split_of(run_id)``) or "question" (every run of one root question in one
    split: ``decisions.split_key``); recorded in the manifest's ``split_by``.

    ``runs``: canonical runs (``readers.Run``) from any iterable, read after ``traces`` and consumed lazily:
    like files, one run at a time; the rows built from them go to disk as they are built.

    ``engine``: None (here) or what embeds a batch's texts and builds its runs' rows elsewhere with these same
    functions: ``embed(cache, texts)`` and ``rows(builder, pending, vectors, dim)`` (``ray_build.RayEngine``).
    """
    return run_build(BuildSettings(traces, out, **options))


def run_build(settings: BuildSettings) -> dict:
    """``build`` with its settings made: check them and the output folder, then read, label and write."""
    s = settings
    check_split_by(s.split_by)  # an unknown --split-by fails before any work
    check_build_output(s.out, s.traces, s.keypoints, s.cache)
    spill = RowSpill(s.out)  # the rows on disk until the write; removed however the build ends
    try:
        with use_keypoints(s.keypoints):
            check_settings(s)
            job = _Build(s, spill)  # its label source: a bad --labels fails before reading
            return job.run()
    finally:
        spill.remove()


def check_settings(s: BuildSettings) -> None:
    """An ``InputError`` naming the option when one has no valid value (before any work)."""
    if check_stage(s.stage) == "read":
        check_read_labels(s.labels)
    if s.pruned_labels not in PRUNED_LABELS:
        raise InputError(f"--pruned-labels must be one of {', '.join(PRUNED_LABELS)}, got {s.pruned_labels!r}")
    if s.partial_runs not in PARTIAL_RUNS:
        raise InputError(f"must be one of {', '.join(PARTIAL_RUNS)}, got {s.partial_runs!r}", "--partial-runs")
    if s.teacher not in T.NAMES:
        raise InputError(f"unknown teacher {s.teacher!r}; valid names: {', '.join(T.NAMES)}")
    if s.embed not in EMBED_MODES:
        raise InputError(f"must be one of {', '.join(EMBED_MODES)}, got {s.embed!r}", "--embed")
    if s.workers is not None and int(s.workers) < 1:
        raise InputError(f"must be ≥ 1, got {s.workers}", "--workers")


class _Build:
    """One build's state: its rows (on disk in ``spill``; ``rows`` keeps what labelling and the manifest read),
    counts and timings, the runs waiting for embeddings, and the encoder, loaded on first use."""

    def __init__(self, settings: BuildSettings, spill: RowSpill):
        s = self.s = settings
        self.models = {name: T.get(name) for name in T.NAMES}
        self.builder = (ReadRowBuilder if s.stage == "read" else RowBuilder)(
            self.models,
            s.teacher,
            s.label_threshold,
            s.pruned_labels,
            labels=s.labels,
            positive_rate=s.positive_rate,
            label_options=s.label_options,
        )
        self.timings = Counter()
        self.report = ReadReport()
        self.rows = LabelRecords(SPLITS)
        self.spill = spill
        spill.feats = features(list(self.models), s.stage)
        self.n_runs, self.n_frames = Counter(), Counter()
        self.seen: dict[str, str] = {}  # run_id → the file it was read from
        self.kinds: Counter = Counter()
        self.problems: Counter = Counter()
        self.deferral: Counter = Counter()  # deferred / dropped-by-budget candidates (``RunDecisions.deferral``)
        self.kp_stats: Counter = Counter()
        self.read_counts: Counter = Counter()  # the read stage's ``READ_COUNTS``
        self.partial = {"action": s.partial_runs, "runs": 0, "reasons": Counter(), "list": []}
        self.pending: list = []  # runs waiting for embeddings: texts of several runs are encoded in one batch
        self.n_pending = 0
        self.encoder = self.emb_cache = None

    def run(self) -> dict:
        s = self.s
        t0 = time.perf_counter()
        found = discover(s.traces, s.fmt, self.report, s.strict)
        files = input_files(found)
        source_sha = sha256_files(files)
        self.timings["hash_s"] += time.perf_counter() - t0
        self.read(found)
        return self.finish(files, source_sha)

    def embeddings(self):
        """The encoder's ``EmbeddingCache``, loaded on first use (a bad input fails before the slow load)."""
        if self.emb_cache is None:
            from branchgate.data.embedding_cache import EmbeddingCache
            from branchgate.export.onnx_encoder import build_encoder

            s = self.s
            t = time.perf_counter()
            self.encoder = build_encoder(s.encoder, s.embed, s.workers, s.encoder_obj)  # onnx: loads at a new text
            self.emb_cache = EmbeddingCache(self.encoder, s.cache)
            self.builder.max_chars = 10 * int(getattr(self.encoder, "max_length", 0) or 256)  # beyond its window
            self.timings["load_s"] += time.perf_counter() - t
        return self.emb_cache

    def read(self, found) -> None:
        """Every run of the files ``found`` (then of ``runs``), one at a time, into rows."""
        from tqdm.auto import tqdm

        progress = self.s.progress
        bar = tqdm(
            found,
            desc="dataset build",
            unit="file",
            disable=(not progress) if progress is not None else None,
            file=sys.stderr,
        )
        try:
            for runs in self.sources(bar):
                for run in self.timed(runs):
                    self.add(run)
            self.flush()
        finally:
            bar.close()
            close = getattr(self.encoder, "close", None)
            if self.s.encoder_obj is None and callable(close):
                close()  # the ONNX path's worker processes (an encoder_obj is the caller's)

    def sources(self, bar):
        """Runs one file (then the ``runs`` iterable) at a time: nothing is read ahead of the build."""
        for path, reader in bar:
            yield read_file(path, reader, self.s.strict, self.report)
            bar.set_postfix(runs=sum(self.n_runs.values()), rows=len(self.rows))
        if self.s.runs is not None:
            yield iter(self.s.runs)

    def timed(self, runs):
        """The runs of one source, the time taken to read each counted in ``parse_s``."""
        while True:
            t = time.perf_counter()
            run = next(runs, None)
            self.timings["parse_s"] += time.perf_counter() - t
            if run is None:
                return
            yield run

    def add(self, run) -> None:
        """One run: its decision points counted and queued for embedding, or the run skipped and reported."""
        rd = self.decisions(run)
        if rd is None or self.left_out(run):
            return
        unit = rd if self.s.stage == "pre" else self.read_unit(run, rd)  # what the builder makes rows of
        self.problems.update(unit.problems)
        self.deferral.update(unit.deferral)
        _count_keypoints(self.kp_stats, run, rd)
        split = split_of(split_key(rd.run_id, rd.root_query, self.s.split_by))
        self.n_runs[split] += 1
        self.n_frames[split] += unit.n_frames
        if unit.n_decisions:
            info = run_info(run.events)
            self.pending.append((split, unit, info))
            self.n_pending += len(self.builder.texts(unit, info))
        if self.n_pending >= self.s.batch_texts:
            self.flush()

    def read_unit(self, run, rd):
        """The run's ``read_rows.ReadRun``, counted in the manifest's ``read`` section."""
        rr = read_run(run, rd)
        c = self.read_counts
        c["runs_without_results"] += not rr.has_results
        c["read_points"] += len(rr.points)
        c["read_points_with_new_hits"] += rr.n_frames
        c["hits"] += sum(len(p.hits) for p in rr.points)
        c["new_hits"] += rr.n_decisions
        return rr

    def decisions(self, run):
        """The run's ``RunDecisions``, or None when it is skipped (read twice, no run_start: reported)."""
        t = time.perf_counter()
        try:
            if run.run_id in self.seen:
                raise InputError(
                    f"run {run.run_id!r} was already read from {self.seen[run.run_id]} (skipped)", run.file
                )
            rd = run_decisions(run.run_id, run.events, run.file)
        except InputError as exc:
            self.report.skip(run.file, None, exc.reason, self.s.strict)
            return None
        finally:
            self.timings["parse_s"] += time.perf_counter() - t
        self.seen[run.run_id] = run.file
        return rd

    def left_out(self, run) -> bool:
        """Count a partial run (``partial_reason``); True when ``--partial-runs skip`` leaves it out."""
        why = partial_reason(run.events)
        if not why:
            return False
        self.partial["runs"] += 1
        self.partial["reasons"][why] += 1
        self.partial["list"].append({"file": run.file, "run_id": run.run_id, "reason": why})
        if self.s.partial_runs != "skip":
            return False
        self.report.skip(run.file, None, f"partial run {run.run_id!r}: {why} (--partial-runs skip)")
        return True

    def flush(self) -> None:
        """Embed the pending runs' texts in one batch and write their rows."""
        if not self.pending:
            return
        engine, builder = self.s.engine, self.builder
        emb_cache = self.embeddings()
        t = time.perf_counter()
        texts = list(dict.fromkeys(x for _, rd, info in self.pending for x in builder.texts(rd, info)))
        vecs = emb_cache.get(texts) if engine is None else engine.embed(emb_cache, texts)
        vectors = dict(zip(texts, vecs))
        self.timings["embed_s"] += time.perf_counter() - t
        t = time.perf_counter()
        made = None if engine is None else engine.rows(builder, self.pending, vectors, vecs.shape[1])
        for i, (split, rd, info) in enumerate(self.pending):
            new = builder.rows(rd, vectors, vecs.shape[1], info) if made is None else made[i]
            self.rows.add(split, new)
            self.spill.add(split, new)
            self.kinds.update(r["utility_kind"] for r in new)
            self.read_counts["unlabelled_hits"] += sum(1 for r in new if math.isnan(r["utility"]))
        self.timings["teacher_s"] += time.perf_counter() - t - self.spill.take_time()
        self.pending.clear()
        self.n_pending = 0

    def finish(self, files, source_sha) -> dict:
        """Fit the labels' thresholds, write the dataset and its manifest; ``NothingParsed`` when no run was read."""
        s, builder = self.s, self.builder
        partial = {
            "action": s.partial_runs,
            "runs": self.partial["runs"],
            "reasons": dict(sorted(self.partial["reasons"].items())),
            "list": self.partial["list"],
        }
        if sum(self.n_runs.values()) == 0:
            if self.emb_cache is not None:
                self.emb_cache.close()
            _nothing_parsed(s.traces, s.out, self.report, files, s.fmt, partial, s.stage)
        emb_cache = self.embeddings()  # loads the encoder now only if no run had decisions: the manifest names it
        builder.fitted = builder.finalize(self.rows)
        source_stats = getattr(builder.source, "stats", None)  # e.g. the judge's calls, cache hits and tokens
        source_stats = source_stats() if callable(source_stats) else None
        if callable(getattr(builder.source, "close", None)):
            builder.source.close()
        manifest = _manifest(
            self.rows,
            self.n_runs,
            self.n_frames,
            self.report,
            files,
            source_sha,
            s.teacher,
            builder,
            self.kinds,
            self.models,
            self.encoder,
            emb_cache,
            self.problems,
            s.pruned_labels,
            s.fmt,
            s.stage,
        )
        if source_stats is not None:
            manifest["label_source_stats"] = source_stats
        manifest["keypoints"] = {
            "source": "none" if s.keypoints in (None, "", "none") else str(s.keypoints),
            **{k: int(self.kp_stats[k]) for k in KEYPOINT_STATS},
        }
        manifest["partial_runs"] = partial
        manifest["split_by"] = s.split_by
        if s.stage == "read":
            manifest["read"] = {k: int(self.read_counts[k]) for k in READ_COUNTS}
        manifest["deferral"] = {k: int(self.deferral[k]) for k in DEFERRAL_COUNTS}

        manifest["embedder"] = describe(self.encoder)
        if partial["runs"] and s.partial_runs == "keep":
            manifest["warnings"].append(_partial_warning(partial))
        emb_cache.close()
        write_dataset(s.out, self.rows, self.spill, manifest, self.timings)
        return manifest
