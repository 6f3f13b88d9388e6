"""Where a dataset build keeps its rows: on disk from the moment they are built, then the atomic write.

``RowSpill`` appends each batch's rows to one Arrow stream file per split in a temporary folder next to the
output; ``write_dataset`` maps them back, sets the labels ``RowBuilder.finalize`` gave the compact
``LabelRecords`` and saves the ``DatasetDict`` with its manifest atomically (``logs_to_dataset/build.py`` runs
both).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from branchgate.data.dataset_schema import SPLITS
from branchgate.fileio import atomic_dir, atomic_write_json
from branchgate.logs_to_dataset.labels import LabelRecords

WRITE_CHUNK_ROWS = 2048  # rows converted to Arrow at a time when spilling them to disk
OUTPUT_KIND = "dataset build"  # the command named in the output folder's mark (``fileio.check_output_dir``)


class RowSpill:
    """The rows as they are built, written at once to one Arrow stream file per split (the format
    ``datasets.Dataset.from_file`` memory-maps), in a temporary folder next to ``out`` (``remove``: at the end,
    on error too). Only ``LabelRecords`` stay in memory, so the build's memory does not grow with the rows."""

    def __init__(self, out):
        self.out = Path(out)
        self.feats = None  # the dataset's ``features``, set by the build before the first rows
        self.dir: Path | None = None
        self.writers: dict = {}
        self.seconds = 0.0  # spent writing since the last ``take_time``

    def add(self, split: str, rows: list[dict]) -> None:
        import pyarrow as pa

        if not rows:
            return
        t = time.perf_counter()
        if self.dir is None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.dir = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.rows.", dir=self.out.parent))
        schema = self.feats.arrow_schema
        if split not in self.writers:
            self.writers[split] = pa.ipc.new_stream(str(self.path(split)), schema)
        for i in range(0, len(rows), WRITE_CHUNK_ROWS):
            chunk = rows[i : i + WRITE_CHUNK_ROWS]
            self.writers[split].write_batch(
                pa.RecordBatch.from_pydict({name: [r[name] for r in chunk] for name in schema.names}, schema=schema)
            )
        self.seconds += time.perf_counter() - t

    def take_time(self) -> float:
        t, self.seconds = self.seconds, 0.0
        return t

    def path(self, split: str) -> Path:
        return self.dir / f"{split}.arrow"

    def dataset(self, split: str, labels: list):
        """The split's rows, memory-mapped, with ``labels`` (the finalized ones) as their ``label`` column."""
        from datasets import Dataset

        feats = self.feats
        if split not in self.writers:
            return Dataset.from_dict({name: [] for name in feats}, features=feats)
        self.writers.pop(split).close()
        ds = Dataset.from_file(str(self.path(split)), in_memory=False)
        if len(ds) != len(labels):
            raise RuntimeError(f"dataset build: {len(ds)} rows written for {split}, {len(labels)} labelled")
        ds = ds.remove_columns("label").add_column("label", labels, feature=feats["label"])
        ds = ds.select_columns(list(feats))
        return ds if ds.features == feats else ds.cast(feats)

    def remove(self) -> None:
        for w in self.writers.values():
            w.close()
        self.writers.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def write_dataset(out, rows: LabelRecords, spill: RowSpill, manifest, timings) -> None:
    """Write the dataset: the spilled rows, read back memory-mapped, with the labels ``finalize`` set."""
    from datasets import DatasetDict
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    t = time.perf_counter()
    dd = {split: spill.dataset(split, rows.labels(split)) for split in SPLITS}
    with atomic_dir(out, OUTPUT_KIND) as tmp:
        # one shard per split: an empty split saved with zero shards cannot be loaded back
        DatasetDict(dd).save_to_disk(str(tmp), num_shards={s: 1 for s in SPLITS})
        timings["write_s"] += time.perf_counter() - t + spill.take_time()
        manifest["timings"] = {k: round(v, 3) for k, v in sorted(timings.items())}
        atomic_write_json(Path(tmp) / "manifest.json", manifest)
