"""The frozen encoder's text tower as an fp32 ONNX graph: the dataset build's fast embedding path. (Exporting
the tower and recording its parity reference, with torch: ``onnx_tower.py``.)

    tower = prepare_tower(encoder)         # exported once per encoder, cached; needs torch only then
    vecs = embed_texts(texts, tower)       # [N, dim] float32: Encoder.encode's vectors (≤ 1e-6), no torch
    enc = OnnxEncoder(spec, workers=2)     # Encoder-like (id, dim, max_length, encode) for EmbeddingCache

Tokens: the Gate's tokenising (``inference.gate_texts.padded_tokens``: the ASCII WordPiece fast path, else
``tokenizers``), truncated at max_length, texts as given (as sentence-transformers tokenises them).
Bucketing: the texts of a call are sorted by token length and cut into batches of at most ``batch_size``
texts and ``TOKEN_BUDGET`` padded tokens, each split further where lengths jump
(``inference.schedule.length_buckets``). A batch's vectors depend only on its texts, and batches are formed
the same way whatever the number of workers, so ``workers=1`` and ``workers=N`` give identical vectors.
Workers: ``OnnxEncoder(workers=N)`` runs batches in N spawned processes, each owning one onnxruntime session
with one intra-op thread; ``workers=1`` runs them in this process. A worker exits by itself within a second of
its parent's death (a killed build leaves no process behind).

Parity (``check_parity``): before its first text, ``OnnxEncoder`` embeds ``PARITY_PROBES`` (empty, blank,
unicode, over-long texts, ...) through its own path (its workers) and compares them with the torch
encoder's vectors of the same probes; a component differing by more than ``PARITY_TOL`` (1e-6) raises
``TowerParityError`` naming the folder and the worst probe. The torch vectors are computed at export and
kept beside the tower (``reference.npy``) with the versions of torch, transformers, sentence-transformers and
tokenizers; when any of them (or the probes) changed, or with ``live_parity=True``, they are computed again
with the torch encoder before the check (the tower key already covers the model's files), so a build on a
known stack need not import torch at all. There is no silent fallback: a failed check is an error (exit 2),
and the old path stays one flag away, ``--embed torch`` (``build(embed="torch")``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import numpy as np

from branchgate.errors import BranchgateError, MismatchError
from branchgate.export.onnx_tower import (  # noqa: F401  (importable here)
    PARITY_PROBES,
    TOWER_FORMAT,
    Tower,
    _loaded,
    export_tower,
    prepare_tower,
    record_reference,
    recorded_reference,
    torch_stack,
    tower_dir,
    tower_key,
)
from branchgate.inference.gate_texts import padded_tokens
from branchgate.inference.schedule import length_buckets
from branchgate.inference.wordpiece import checked_wordpiece
from branchgate.models.encoder import Encoder, LazyEncoder, resolve

PARITY_TOL = 1e-6
TOKEN_BUDGET = 8192  # padded tokens per graph run (64 texts of 128 tokens)
BUCKET_OVERHEAD_TOKENS = 16  # one extra run costs about as much as this many padded tokens
EMBED_MODES = ("onnx", "torch")


class TowerParityError(MismatchError):
    """The ONNX tower does not reproduce the torch encoder within ``PARITY_TOL``."""


# -- running (numpy, onnxruntime, tokenizers; the tower's export: onnx_tower.py) ------------------------
class _Runner:
    """One process's onnxruntime session (1 intra-op thread) and tokenizer for a tower."""

    def __init__(self, tower: Tower):
        from tokenizers import Tokenizer

        self.tower = tower
        meta = tower.meta
        self.dim, self.max_length, self.pad_id = int(meta["dim"]), int(meta["max_length"]), int(meta["pad_token_id"])
        tok_text = (tower.path / "tokenizer.json").read_text(encoding="utf-8")
        if hashlib.sha256(tok_text.encode("utf-8")).hexdigest() != meta.get("tokenizer_sha256"):
            raise MismatchError(f"{tower.path / 'tokenizer.json'}: does not match tower.json (tokenizer_sha256)")
        self.tokenizer = Tokenizer.from_str(tok_text)
        self.tokenizer.enable_truncation(max_length=self.max_length)
        self.tokenizer.no_padding()
        self.wordpiece = checked_wordpiece(tok_text, self.tokenizer, self.max_length)
        self._session = None

    @property
    def session(self):
        """Built on first use: a process that only tokenises and batches for its workers never builds one."""
        if self._session is None:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            try:
                self._session = ort.InferenceSession(str(self.tower.onnx), opts, providers=["CPUExecutionProvider"])
            except Exception as exc:
                raise BranchgateError(
                    f"{self.tower.onnx}: not a loadable ONNX model "
                    f"({(str(exc).splitlines() or [''])[0][:200]}); delete {self.tower.path} to "
                    "export it again, or use --embed torch"
                ) from None
        return self._session

    def tokens(self, texts: list[str]) -> dict[str, np.ndarray]:
        return padded_tokens(texts, self.tokenizer, self.wordpiece, self.pad_id)

    def batches(self, texts: list[str], batch_size: int = 64) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(row indices, input_ids, attention_mask) per graph run: sorted by token length, similar lengths together."""
        if not texts:
            return []
        tokens = self.tokens(list(texts))
        lengths = tokens["attention_mask"].sum(1)
        order = np.argsort(lengths, kind="stable")
        out, start, n = [], 0, len(order)
        while start < n:
            end = start + 1  # sorted ascending: the last row of a batch is its longest
            while end < n and end - start < batch_size and (end - start + 1) * int(lengths[order[end]]) <= TOKEN_BUDGET:
                end += 1
            chunk = order[start:end]
            for g in length_buckets(lengths[chunk], BUCKET_OVERHEAD_TOKENS):
                idx = chunk[g]
                width = int(lengths[idx].max())
                out.append((idx, tokens["input_ids"][idx, :width], tokens["attention_mask"][idx, :width]))
            start = end
        return out

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feed = {
            "input_ids": np.ascontiguousarray(input_ids, np.int64),
            "attention_mask": np.ascontiguousarray(attention_mask, np.int64),
        }
        return np.asarray(self.session.run(["text_emb"], feed)[0], np.float32)


_RUNNERS: dict[str, _Runner] = {}  # one per tower folder and process


def _runner(tower) -> _Runner:
    tower = tower if isinstance(tower, Tower) else Tower.open(tower)
    key = str(tower.path.resolve())
    if key not in _RUNNERS:
        _RUNNERS[key] = _Runner(tower)
    return _RUNNERS[key]


def embed_texts(texts, tower, batch_size: int = 64) -> np.ndarray:
    """Unit-norm float32 embeddings [len(texts), dim] of ``texts`` through an exported tower (a ``Tower`` or
    its folder), in this process (one session per process, one thread). What ``OnnxEncoder`` computes per
    worker; for engines that distribute batches themselves (``OnnxEncoder(...).prepare()`` once first: the
    export and the parity check; it returns the ``Tower`` to pass here)."""
    r = _runner(tower)
    texts = list(texts)
    out = np.zeros((len(texts), r.dim), np.float32)
    for idx, ids, mask in r.batches(texts, batch_size):
        out[idx] = r.run(ids, mask)
    return out


def _run_batch(tower_path: str, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:  # a worker's task
    return _runner(tower_path).run(ids, mask)


def _watch_parent(ppid: int, every: float = 1.0) -> None:
    """A worker's watchdog: exit when the process that started it is gone (killed builds leave no workers)."""
    while True:
        time.sleep(every)
        if os.getppid() != ppid:
            os._exit(0)


def _init_worker(tower_path: str) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True, name="parent-watchdog").start()
    try:
        _ = _runner(tower_path).session  # built once, before the first batch
    except Exception:  # the first task raises it again, with its message (an initializer's error breaks the pool)
        _RUNNERS.pop(str(Path(tower_path).resolve()), None)


def check_parity(vecs: np.ndarray, reference: np.ndarray, where: str, probes=PARITY_PROBES) -> float:
    """Max |Δ| between the ONNX and torch vectors of the probes; ``TowerParityError`` above ``PARITY_TOL``."""
    if vecs.shape != reference.shape:
        raise TowerParityError(
            f"{where}: the ONNX tower gives vectors of shape {vecs.shape}, the torch encoder "
            f"{reference.shape}; delete the folder to export it again, or use --embed torch"
        )
    diff = np.abs(vecs.astype(np.float64) - reference.astype(np.float64)).max(axis=1) if len(vecs) else np.zeros(1)
    worst = float(diff.max()) if np.isfinite(diff).all() else float("inf")
    if not worst <= PARITY_TOL:
        i = int(np.nanargmax(np.where(np.isfinite(diff), diff, np.inf)))
        raise TowerParityError(
            f"{where}: the ONNX text tower differs from the torch encoder by {worst:.3g} > {PARITY_TOL:g} "
            f"(worst probe {probes[i][:40]!r}); delete the folder to export it again, or use --embed torch"
        )
    return worst


class OnnxEncoder:
    """An ``Encoder`` stand-in (``id``, ``dim``, ``max_length``, ``encode``) embedding through the exported
    tower, in ``workers`` processes. The torch encoder (``torch_encoder``: an ``Encoder`` or ``LazyEncoder``)
    loads only to export the tower and to check parity, both on the first ``encode`` of a new text."""

    def __init__(
        self, torch_encoder, workers: int | None = None, cache_dir: str | Path | None = None, live_parity: bool = False
    ):
        self.torch_encoder = torch_encoder
        self.live_parity = bool(live_parity)  # embed the probes with torch now even if recorded for this stack
        self.spec, self.id = torch_encoder.spec, torch_encoder.id
        self.workers = int(workers) if workers else available_cores()
        if self.workers < 1:
            raise BranchgateError(f"--workers must be ≥ 1, got {workers}")
        self.cache_dir = cache_dir
        self.tower: Tower | None = None
        self.parity: float | None = None  # max |Δ| on the probes, once checked
        self.prepare_s: float | None = None  # export (first time) + workers' start + parity check
        self._pool = None

    @property
    def dim(self) -> int:
        return int(self.tower.meta["dim"]) if self.tower else int(self.torch_encoder.dim)

    @property
    def max_length(self) -> int:
        return int(self.tower.meta["max_length"]) if self.tower else int(self.torch_encoder.max_length)

    def prepare(self) -> Tower:
        """Export (or find) the tower, start the workers, check parity against the torch encoder."""
        if self.tower is not None:
            return self.tower
        t0 = time.perf_counter()
        tower = prepare_tower(self.torch_encoder, self.cache_dir)
        if tower.meta.get("encoder") != self.id or int(tower.meta.get("format", 0)) != TOWER_FORMAT:
            raise MismatchError(
                f"{tower.path}: exported for encoder {tower.meta.get('encoder')!r} "
                f"(format {tower.meta.get('format')}), not {self.id!r}"
            )
        if self.workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(str(tower.path),),
            )
        reference = {"v": None if self.live_parity else recorded_reference(tower)}

        def torch_vectors():  # while the workers start and embed the probes
            if reference["v"] is None:  # torch stack or probes changed since the export: embed them now
                reference["v"] = record_reference(tower, _loaded(self.torch_encoder))

        try:
            _runner(tower)  # this process tokenises and batches (and runs batches when workers=1)
            got = self._encode(tower, list(PARITY_PROBES), 64, meanwhile=torch_vectors)
            self.parity = check_parity(got, reference["v"], str(tower.path))
        except BaseException:
            self.close()
            raise
        if callable(getattr(self.torch_encoder, "unload", None)):
            self.torch_encoder.unload()  # its weights are not needed any more
        self.tower = tower
        self.prepare_s = time.perf_counter() - t0
        return tower

    def _encode(self, tower: Tower, texts: list[str], batch_size: int, meanwhile=None) -> np.ndarray:
        r = _runner(tower)
        out = np.zeros((len(texts), r.dim), np.float32)
        batches = r.batches(texts, batch_size)
        if self._pool is None:
            if meanwhile is not None:
                meanwhile()
            for idx, ids, mask in batches:
                out[idx] = r.run(ids, mask)
            return out
        # longest first, so the last batches to finish are short ones
        jobs = [(idx, self._pool.submit(_run_batch, str(tower.path), ids, mask)) for idx, ids, mask in batches[::-1]]
        if meanwhile is not None:
            meanwhile()
        from concurrent.futures.process import BrokenProcessPool

        try:
            for idx, job in jobs:
                out[idx] = job.result()
        except BrokenProcessPool:
            self.close()
            raise BranchgateError(
                f"the {self.workers} embedding worker processes stopped (they are spawned: a script that builds "
                'a dataset must guard its entry point with `if __name__ == "__main__":`); use workers=1 '
                "(--workers 1) to embed in this process"
            ) from None
        return out

    def encode(self, texts, batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        if not len(texts):
            return np.zeros((0, self.dim), np.float32)
        return self._encode(self.prepare(), list(texts), batch_size)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def available_cores() -> int:
    """CPU cores this process may run on (its affinity), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def build_encoder(name: str = "auto", embed: str = "onnx", workers: int | None = None, encoder_obj=None):
    """The encoder a dataset build embeds with: ``encoder_obj`` as it is when given (tests, engines; an
    ``OnnxEncoder`` is one), else ``embed="onnx"`` an ``OnnxEncoder`` over encoder ``name`` (its torch
    weights load only for the export and the parity check), ``"torch"`` the sentence-transformers ``Encoder``."""
    if embed not in EMBED_MODES:
        raise BranchgateError(f"--embed must be one of {', '.join(EMBED_MODES)}, got {embed!r}")
    if encoder_obj is not None:
        return encoder_obj
    if embed == "torch":
        from branchgate.models.encoder import Encoder

        return Encoder.load(name)

    return OnnxEncoder(LazyEncoder(resolve(name)), workers=workers)


def describe(encoder) -> dict:
    """The manifest's ``embedder``: how the build embedded (onnx / torch / the given object)."""
    if isinstance(encoder, OnnxEncoder):
        return {
            "path": "onnx",
            "workers": encoder.workers,
            "tower": str(encoder.tower.path) if encoder.tower else None,
            "parity_max_abs_diff": encoder.parity,
            "parity_tolerance": PARITY_TOL,
            "prepare_s": None if encoder.prepare_s is None else round(encoder.prepare_s, 3),
        }

    return {"path": "torch" if isinstance(encoder, Encoder) else type(encoder).__name__}
