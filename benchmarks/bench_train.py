"""Training throughput: embedding (cold cache), fitting (warm cache), wall time on >= 50k decisions.

    python benchmarks/bench_train.py [--rows 60000] [--epochs 10] [--cold-decisions 300] [--out DIR]

Uses SYNTHETIC decision rows (branchgate.data.synthetic, planted signal) and the packaged encoder:
- cold: a fresh cache; every distinct text of ``--cold-decisions`` decision points is encoded (per-run
  qualifiers make almost every text distinct) → decision points/s and candidate rows/s of embedding.
- warm: the >= 50k-row dataset (texts drawn from a fixed vocabulary) embedded once, then the DataModule
  setup is timed again on the warm cache (lookups + grouping only).
- fit: ``branchgate train`` (quickstart config, early stopping off, ``--epochs``) on those rows → decision
  points/s and rows/s of fitting, and the wall time of the whole command (fit + τ + test + baselines + plots).
Prints the figures and writes them to OUT/bench_train.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def rows_to_runs(rows: int) -> int:
    from branchgate.data.synthetic import synthetic_rows

    per_run = len(synthetic_rows(n_runs=200, seed=123)) / 200
    return int(rows / per_run * 1.03) + 1


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=60000, help="candidate rows for the fit timing (>= 50k)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--cold-decisions", type=int, default=300, help="decision points embedded with a cold cache")
    p.add_argument("--batch-decisions", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="torch threads for fitting")
    p.add_argument("--encode-threads", type=int, default=2, help="torch threads for encoding")
    p.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(a.encode_threads)
    work = Path(a.out or tempfile.mkdtemp(prefix="bench_train."))
    work.mkdir(parents=True, exist_ok=True)
    figures: dict = {
        "data": "synthetic (branchgate.data.synthetic)",
        "encoder": "packaged all-MiniLM-L6-v2",
        "threads_fit": a.threads,
        "threads_encode": a.encode_threads,
        "cpu_count": os.cpu_count(),
    }
    figures["cold"] = cold_embedding(work, a.cold_decisions)
    print("cold cache:", figures["cold"], flush=True)
    big, cache, figures["warm_setup"] = warm_setup(work, a.rows)
    print("warm setup:", figures["warm_setup"], flush=True)
    torch.set_num_threads(a.threads)
    figures["fit"] = fit(work, big, cache, a)
    print("fit:", figures["fit"], flush=True)
    (work / "bench_train.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"figures written to {work / 'bench_train.json'}")
    return 0


def cold_embedding(work: Path, cold_decisions: int) -> dict:
    """1. Cold-cache embedding of the distinct texts of about ``cold_decisions`` decision points."""
    import datasets

    from branchgate.data.decision_batches import TextTable, build_decisions
    from branchgate.data.embedding_cache import EmbeddingCache
    from branchgate.data.synthetic import write_synthetic_dataset
    from branchgate.models.encoder import Encoder

    cold_runs = max(1, cold_decisions // 3)
    cold_ds = write_synthetic_dataset(work / "cold_ds", n_runs=cold_runs, seed=11, unique_texts=True)
    dsd = datasets.load_from_disk(str(cold_ds))
    texts = TextTable()
    sets = [build_decisions(name, dsd[name], texts) for name in dsd]
    t0 = time.perf_counter()
    encoder = Encoder.load("packaged")
    load_s = time.perf_counter() - t0
    cold_cache = work / "cold.sqlite"
    cold_cache.unlink(missing_ok=True)
    cache = EmbeddingCache(encoder, cold_cache)
    t0 = time.perf_counter()
    cache.get(texts.texts[1:])
    cold_s = time.perf_counter() - t0
    n_dec = sum(len(s) for s in sets)
    n_rows = sum(s.n_rows for s in sets)
    out = {
        "decision_points": n_dec,
        "rows": n_rows,
        "distinct_texts": len(texts) - 1,
        "misses": cache.misses,
        "encoder_load_seconds": round(load_s, 2),
        "seconds": round(cold_s, 2),
        "decision_points_per_s": round(n_dec / cold_s, 1),
        "rows_per_s": round(n_rows / cold_s, 1),
        "texts_per_s": round(cache.misses / cold_s, 1),
    }
    cache.close()
    return out


def warm_setup(work: Path, rows: int) -> tuple[Path, Path, dict]:
    """2. A dataset of about ``rows`` candidate rows embedded once, then its DataModule setup timed on the warm
    cache; returns the dataset, the cache and the figures."""
    from branchgate.data.datamodule import DecisionDataModule
    from branchgate.data.synthetic import write_synthetic_dataset

    big = write_synthetic_dataset(work / "big_ds", n_runs=rows_to_runs(rows), seed=12)
    cache = work / "warm.sqlite"
    DecisionDataModule(str(big), encoder="packaged", cache=str(cache), show_progress=True).setup("fit")
    t0 = time.perf_counter()
    dm = DecisionDataModule(str(big), encoder="packaged", cache=str(cache), show_progress=False)
    dm.setup("fit")
    warm_s = time.perf_counter() - t0
    n_dec = sum(len(s) for s in dm.sets.values())
    n_rows = sum(s.n_rows for s in dm.sets.values())
    return (
        big,
        cache,
        {
            "decision_points": n_dec,
            "rows": n_rows,
            "misses": dm.cache_stats["misses"],
            "seconds": round(warm_s, 2),
            "rows_per_s": round(n_rows / warm_s, 1),
        },
    )


def fit(work: Path, big: Path, cache: Path, a: argparse.Namespace) -> dict:
    """3. ``branchgate train`` on the warm cache: fitting throughput and the whole command's wall time."""
    from branchgate.training.fit import train

    t0 = time.perf_counter()
    metrics = train(
        [
            "--config",
            str(Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"),
            "--data.dataset",
            str(big),
            "--data.cache",
            str(cache),
            "--data.show_progress",
            "false",
            "--data.batch_decisions",
            str(a.batch_decisions),
            "--out",
            str(work / "run"),
            "--wandb.mode",
            "disabled",
            "--trainer.max_epochs",
            str(a.epochs),
            "--early_stopping.patience",
            str(10**6),
            "--trainer.enable_progress_bar",
            "false",
            "--threads",
            str(a.threads),
        ]
    )
    wall = time.perf_counter() - t0
    train_dec = metrics["n_decision_points"]["train"]
    train_rows = metrics["n_rows"]["train"]
    epochs = a.epochs
    fit_s = metrics["fit_seconds"]
    return {
        "train_decision_points": train_dec,
        "train_rows": train_rows,
        "total_rows": sum(metrics["n_rows"].values()),
        "epochs": epochs,
        "fit_seconds_incl_validation": fit_s,
        "decision_points_per_s": round(train_dec * epochs / fit_s, 1),
        "rows_per_s": round(train_rows * epochs / fit_s, 1),
        "train_command_wall_seconds": round(wall, 1),
        "test_auroc": metrics["auroc"],
    }


if __name__ == "__main__":
    sys.exit(main())
