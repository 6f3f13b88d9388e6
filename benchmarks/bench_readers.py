"""Reader throughput and dataset-build phase times on real Search-o1 traces.

    python benchmarks/bench_readers.py [PATH] [--repeat 3] [--limit 100] [--cache PATH] [--encoder packaged]

PATH defaults to ../shared/data/drgym/Searcho1_ClueWeb22 (next to the repository). Prints

1. reading (all files, best and median of ``--repeat``): events/s, files/s, MB/s of input bytes
   (``.a`` + ``.q``), runs and events;
2. ``dataset build`` on the first ``--limit`` traces (0 = all), split into parse / embed / teacher /
   write seconds. Without ``--cache`` a fresh temporary embedding cache is used, so "embed" is the cold
   cost of encoding every text once; pass the default cache path to measure a warm rebuild.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO.parent / "shared" / "data" / "drgym" / "Searcho1_ClueWeb22"


def bench_read(path: Path, repeat: int) -> None:
    from branchgate.logs_to_dataset.readers import read_runs
    from branchgate.logs_to_dataset.traces import ReadReport

    times, report = [], None
    for _ in range(repeat):
        report = ReadReport()
        t = time.perf_counter()
        n_runs = sum(1 for _ in read_runs([path], report=report))
        times.append(time.perf_counter() - t)
    best, med = min(times), statistics.median(times)
    mb = report.bytes / 1e6
    print(f"reading {path}")
    print(
        f"  {n_runs} runs, {report.events} events, {report.files} trace files ({dict(report.formats)}), "
        f"{mb:.1f} MB, {len(report.skipped)} skipped"
    )
    for label, s in (("best", best), ("median", med)):
        print(
            f"  {label:6s} {s:7.3f} s  {report.events / s:10.0f} events/s  {report.files / s:8.0f} files/s  "
            f"{mb / s:7.1f} MB/s"
        )


def bench_build(path: Path, limit: int, cache: str | None, encoder: str) -> None:
    from branchgate.logs_to_dataset.build import build

    files = sorted(path.glob("*.a"))
    if limit:
        files = files[:limit]
    with tempfile.TemporaryDirectory() as tmp:
        cache_path = cache or str(Path(tmp) / "embeddings.sqlite")
        t = time.perf_counter()
        m = build(files, Path(tmp) / "ds", encoder=encoder, cache=cache_path, progress=False)
        total = time.perf_counter() - t
    tm, c = m["timings"], m["embedding_cache"]
    print(
        f"dataset build on {len(files)} traces "
        f"({'cold temporary' if not cache else 'given'} cache, encoder {m['encoder']})"
    )
    print(
        f"  {m['n_runs']['total']} runs → {m['n_decisions']['total']} decisions; "
        f"embeddings {c['misses']} encoded, {c['hits']} cached"
    )
    for phase in ("load_s", "hash_s", "parse_s", "embed_s", "teacher_s", "write_s"):
        print(f"  {phase[:-2]:8s} {tm.get(phase, 0.0):8.2f} s")
    print(
        f"  total    {total:8.2f} s"
        + (f"   ({c['misses'] / tm['embed_s']:.1f} texts encoded/s)" if c["misses"] and tm.get("embed_s") else "")
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", nargs="?", default=str(DEFAULT))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--limit", type=int, default=100, help="traces for the build benchmark (0 = all)")
    ap.add_argument("--cache", default=None, help="embedding cache to use (default: a fresh temporary one)")
    ap.add_argument("--encoder", default="packaged")
    ap.add_argument("--skip-build", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = Path(args.path)
    if not path.is_dir():
        print(f"bench_readers: {path} not found (needs ../shared/data)", file=sys.stderr)
        return 2
    bench_read(path, args.repeat)
    if not args.skip_build:
        bench_build(path, args.limit, args.cache, args.encoder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
