"""The dataset build's ONNX embedding path (export/onnx_encoder.py): the same dataset as the torch path, the
same vectors whatever the number of workers, a loud parity failure on a bad tower, runs read as a stream."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from branchgate.errors import BranchgateError
from branchgate.export.onnx_encoder import (
    PARITY_PROBES,
    PARITY_TOL,
    OnnxEncoder,
    TowerParityError,
    embed_texts,
    prepare_tower,
    tower_dir,
)
from branchgate.logs_to_dataset.build import build

FIX = Path(__file__).parent / "fixtures"
TRACES = [FIX / "canonical", FIX / "searcho1", FIX / "gptr"]  # 7 runs of three formats, teacher-labelled
KW = dict(progress=False, keypoints="none", batch_texts=64)


@pytest.fixture(scope="module")
def towers(encoder, tmp_path_factory):
    """A tower cache folder holding the packaged encoder's exported tower (exported once for this module)."""
    root = tmp_path_factory.mktemp("towers")
    prepare_tower(encoder, root)
    return root


@pytest.fixture(scope="module")
def torch_built(encoder, tmp_path_factory):
    d = tmp_path_factory.mktemp("torch")
    manifest = build(TRACES, d / "ds", encoder_obj=encoder, cache=d / "emb.sqlite", **KW)
    return manifest, d


@pytest.fixture(scope="module")
def onnx_built(encoder, towers, tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx")
    enc = OnnxEncoder(encoder, workers=2, cache_dir=towers)
    try:
        manifest = build(TRACES, d / "ds", encoder_obj=enc, cache=d / "emb.sqlite", **KW)
    finally:
        enc.close()  # its two worker processes
    return manifest, d


def _rows(path):
    import datasets

    return datasets.load_from_disk(str(path))


def _same_rows(a, b, atol: float) -> None:
    """Same splits, columns and rows; float columns within ``atol`` (0: bit for bit, NaN where NaN)."""
    assert list(a) == list(b)
    for split in a:
        assert a[split].column_names == b[split].column_names and len(a[split]) == len(b[split])
        for col in a[split].column_names:
            x, y = a[split][col], b[split][col]
            if getattr(a[split].features[col], "dtype", None) == "float32":
                np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol=atol, rtol=0)
            else:
                assert x == y, (split, col)


def _vectors(cache_path) -> dict:
    import sqlite3

    db = sqlite3.connect(str(cache_path))
    try:
        return {(e, k): np.frombuffer(v, np.float32) for e, k, v in db.execute("SELECT encoder, key, vec FROM emb")}
    finally:
        db.close()


def test_onnx_build_is_the_torch_build(torch_built, onnx_built, encoder):
    (mt, dt), (mo, do) = torch_built, onnx_built
    assert mo["embedder"]["path"] == "onnx" and mo["embedder"]["workers"] == 2
    assert mo["embedder"]["parity_max_abs_diff"] <= PARITY_TOL
    assert mt["embedder"]["path"] == "torch"
    # the encoder recorded everywhere is the same id; the caches hold the same texts under it
    assert mo["encoder"] == mt["encoder"] == encoder.id
    assert mo["embedding_cache"]["encoder"] == mt["embedding_cache"]["encoder"] == encoder.id
    assert mo["embedding_cache"]["misses"] == mt["embedding_cache"]["misses"] > 30
    vt, vo = _vectors(dt / "emb.sqlite"), _vectors(do / "emb.sqlite")
    assert vt.keys() == vo.keys() and {e for e, _ in vt} == {encoder.id}
    assert max(float(np.abs(vt[k] - vo[k]).max()) for k in vt) <= 1e-6
    # the same dataset, row by row: every column equal, floats (teacher scores of those vectors) within 1e-5
    a = _rows(dt / "ds")
    _same_rows(a, _rows(do / "ds"), atol=1e-5)
    assert sum(len(a[s]) for s in a) == mt["n_decisions"]["total"] > 0
    for key in ("n_runs", "n_decisions", "labels", "label_threshold", "label_kinds", "encoder_dim"):
        assert mo[key] == mt[key], key


def test_workers_do_not_change_the_output(onnx_built, encoder, towers, tmp_path):
    _, do = onnx_built
    one = OnnxEncoder(encoder, workers=1, cache_dir=towers)
    m = build(TRACES, tmp_path / "ds", encoder_obj=one, cache=tmp_path / "emb.sqlite", **KW)
    assert m["embedder"]["workers"] == 1
    v1, v2 = _vectors(tmp_path / "emb.sqlite"), _vectors(do / "emb.sqlite")
    assert v1.keys() == v2.keys() and all(np.array_equal(v1[k], v2[k]) for k in v1)  # bit for bit
    _same_rows(_rows(tmp_path / "ds"), _rows(do / "ds"), atol=0.0)
    # embed_texts (the per-batch function for other engines) is the same path, in this process
    texts = list(PARITY_PROBES) + ["varroa mites", "x " * 300, "水土流失"]
    got = embed_texts(texts, prepare_tower(encoder, towers))
    assert np.array_equal(got, one.encode(texts))
    assert float(np.abs(got - encoder.encode(texts)).max()) <= 1e-6


def _corrupt_copy(encoder, towers, root: Path, how: str) -> Path:
    src = tower_dir(encoder.spec, encoder.max_length, towers)
    dst = tower_dir(encoder.spec, encoder.max_length, root)
    if how == "garbage":
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("tower.onnx"))
        (dst / "tower.onnx").write_bytes(b"not an onnx model" * 100)
        return dst
    shutil.copytree(src, dst)
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(dst / "tower.onnx"))
    big = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # e.g. the word embeddings
    w = numpy_helper.to_array(big).copy()
    w *= 1.01  # a valid graph with slightly wrong weights
    big.CopyFrom(numpy_helper.from_array(w, big.name))
    onnx.save(model, str(dst / "tower.onnx"))
    return dst


def test_parity_check_fails_loudly_on_a_mismatched_tower(encoder, towers, tmp_path):
    bad = _corrupt_copy(encoder, towers, tmp_path / "wrong", "weights")
    enc = OnnxEncoder(encoder, workers=1, cache_dir=tmp_path / "wrong")
    with pytest.raises(TowerParityError, match=r"differs from the torch encoder by .* > 1e-06") as exc:
        enc.encode(["any text"])
    assert str(bad) in str(exc.value)  # names the folder to delete
    with pytest.raises(TowerParityError):  # also through the build, before any row is written
        build(
            TRACES,
            tmp_path / "ds",
            encoder_obj=OnnxEncoder(encoder, workers=1, cache_dir=tmp_path / "wrong"),
            cache=tmp_path / "emb.sqlite",
            **KW,
        )
    assert not (tmp_path / "ds" / "dataset_dict.json").exists()
    # the live check (torch now, not the recorded reference vectors) fails the same way
    with pytest.raises(TowerParityError):
        OnnxEncoder(encoder, workers=1, cache_dir=tmp_path / "wrong", live_parity=True).prepare()
    _corrupt_copy(encoder, towers, tmp_path / "garbage", "garbage")
    with pytest.raises(BranchgateError, match="not a loadable ONNX model"):
        OnnxEncoder(encoder, workers=1, cache_dir=tmp_path / "garbage").prepare()


def test_runs_are_read_as_a_stream(encoder, towers, onnx_built, tmp_path, monkeypatch):
    """A generator of runs is consumed one run at a time: texts are embedded before it is exhausted; the rows
    are written in chunks (here of 7 rows) into the same dataset."""
    from branchgate.logs_to_dataset import row_store

    monkeypatch.setattr(row_store, "WRITE_CHUNK_ROWS", 7)
    from branchgate.logs_to_dataset.readers import discover, read_file
    from branchgate.logs_to_dataset.traces import ReadReport

    report = ReadReport()
    runs = [r for path, reader in discover(TRACES, None, report, False) for r in read_file(path, reader, False, report)]
    pulled = []

    def stream():
        for run in runs:
            pulled.append(run.run_id)
            yield run

    class Watch:  # the ONNX encoder, noting how many runs had been read at each call
        def __init__(self, inner):
            self.inner, self.id, self.spec, self.calls = inner, inner.id, inner.spec, []

        dim = property(lambda self: self.inner.dim)
        max_length = property(lambda self: self.inner.max_length)

        def encode(self, texts, **kw):
            self.calls.append(len(pulled))
            return self.inner.encode(texts, **kw)

        def close(self):
            self.inner.close()

    watch = Watch(OnnxEncoder(encoder, workers=1, cache_dir=towers))
    m = build(
        [], tmp_path / "ds", runs=stream(), encoder_obj=watch, cache=tmp_path / "emb.sqlite", **dict(KW, batch_texts=1)
    )
    assert len(runs) >= 5 and len(pulled) == len(runs) and m["n_runs"]["total"] == len(runs)
    assert len(watch.calls) >= 3 and watch.calls[0] < len(runs)  # embedding began after the first run only
    assert watch.calls == sorted(watch.calls)
    a = _rows(tmp_path / "ds")
    assert len(a["train"]) > 7
    # other batches (batch_texts=1) than the reference build: vectors equal within float rounding
    _same_rows(a, _rows(onnx_built[1] / "ds"), atol=1e-6)


def test_embed_and_workers_options(tmp_path):
    import argparse

    from branchgate.errors import InputError
    from branchgate.logs_to_dataset import build_cli

    parser = argparse.ArgumentParser()
    build_cli.configure(parser)
    args = parser.parse_args(["--traces", "x", "--out", "y"])
    assert args.embed == "onnx" and args.workers is None  # default: ONNX on every available core
    assert parser.parse_args(["--traces", "x", "--out", "y", "--embed", "torch", "--workers", "3"]).workers == 3
    with pytest.raises(InputError, match="--embed"):  # before anything is read or loaded
        build(TRACES, tmp_path / "o", embed="fast", **KW)
    with pytest.raises(InputError, match="--workers"):
        build(TRACES, tmp_path / "o", workers=0, **KW)


def test_rows_go_to_disk_as_they_are_built(encoder, torch_built, tmp_path, monkeypatch):
    """Each batch's rows are written to disk at once; in memory stay only ``LabelRecords`` (flat arrays of what
    labelling and the manifest read, no row dicts) for ``finalize``. The dataset holds those rows, labelled, and
    is the reference build of the same traces (in other batches: within float rounding)."""
    from array import array

    from branchgate.logs_to_dataset.labels import LabelRecords, RowBuilder
    from branchgate.logs_to_dataset.row_store import RowSpill

    seen = {"built": {}, "sizes": [], "spills": []}
    add, finalize = RowSpill.add, RowBuilder.finalize

    def spy_add(self, split, rows):
        add(self, split, rows)
        seen["spills"].append(self)
        seen["built"].setdefault(split, []).extend(dict(r) for r in rows)
        seen["sizes"].append((split, self.path(split).stat().st_size))  # on disk already

    def spy_finalize(self, records):
        seen["records"] = records
        return finalize(self, records)

    monkeypatch.setattr(RowSpill, "add", spy_add)
    monkeypatch.setattr(RowBuilder, "finalize", spy_finalize)
    m = build(TRACES, tmp_path / "ds", encoder_obj=encoder, cache=tmp_path / "emb.sqlite", **dict(KW, batch_texts=8))
    records, built = seen["records"], seen["built"]
    assert isinstance(records, LabelRecords) and len(seen["spills"]) > 2 and len(set(map(id, seen["spills"]))) == 1
    assert all(isinstance(col, array) for cols in records._cols.values() for col in cols.values())
    assert len(records) == m["n_decisions"]["total"] == sum(map(len, built.values()))
    for split in built:  # each batch grew the split's file on disk
        sizes = [n for s, n in seen["sizes"] if s == split]
        assert sizes == sorted(sizes) and sizes[0] > 0 and len(set(sizes)) == len(sizes)
    assert not list(tmp_path.glob(".ds.rows.*"))  # the spill folder is gone
    ds = _rows(tmp_path / "ds")
    for split in ds:
        rows = built.get(split, [])
        assert len(ds[split]) == len(rows)
        for col in ds[split].column_names:
            got, want = ds[split][col], [r[col] for r in rows]
            if col == "label":  # the finalized labels: realized rows 0/1, the others as built
                assert all(g == w if w is not None else g in (0, 1) for g, w in zip(got, want))
            elif getattr(ds[split].features[col], "dtype", None) == "float32":
                np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
            else:
                assert got == want, (split, col)
        assert ds[split]["label"] == records.labels(split)  # as ``finalize`` set them, none left unset
        assert None not in records.labels(split)
    _same_rows(ds, _rows(torch_built[1] / "ds"), atol=1e-6)  # other batches: the same within float rounding


KILLED_PARENT = """
import sys, time
from branchgate.models.encoder import Encoder, resolve
from branchgate.export.onnx_encoder import OnnxEncoder
if __name__ == "__main__":  # the workers are spawned: they import this file
    enc = OnnxEncoder(Encoder(resolve("packaged")), workers=2, cache_dir=sys.argv[1])
    enc.encode(["a first text", "a second one"])
    print("PIDS", *enc._pool._processes, flush=True)
    time.sleep(600)
"""


def test_workers_exit_when_the_build_is_killed(encoder, towers, tmp_path):
    """A build killed (SIGKILL: no clean-up runs) must not leave its embedding workers computing."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(KILLED_PARENT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(towers)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        line = next((ln for ln in proc.stdout if ln.startswith("PIDS")), "")
        workers = [int(p) for p in line.split()[1:]]
        assert len(workers) == 2 and all(Path(f"/proc/{p}").exists() for p in workers)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 15
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if _running(p)]
    assert not alive, f"workers {alive} outlived their killed parent"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False
