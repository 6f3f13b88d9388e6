"""LightningDataModule over a decision dataset's splits, training on cached embeddings.

``setup`` embeds every distinct text of all splits once through the content-addressed EmbeddingCache
(the encoder's weights load only on a cache miss), groups rows into decision points and serves
batches of decision points padded to the batch's largest K and R.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from branchgate.data.dataset_schema import SPLITS
from branchgate.data.decision_batches import TextTable, build_decisions, check_encoder, load_decision_dataset
from branchgate.data.embedding_cache import EmbeddingCache
from branchgate.models.encoder import LazyEncoder, resolve

log = logging.getLogger(__name__)
# the splits a ``setup`` stage needs labelled rows in; any other stage (fit: training ends on the test split)
# every split
STAGE_SPLITS = {"test": ("test",), "predict": ()}


class DecisionDataModule(L.LightningDataModule):
    def __init__(
        self,
        dataset: str,
        encoder: str = "auto",
        cache: str | None = None,
        batch_decisions: int = 128,
        show_progress: bool = True,
    ):
        """
        Args:
            dataset: directory written by ``branchgate dataset build`` (HF DatasetDict + manifest.json).
            encoder: ``auto`` (bge-small if available, else the packaged MiniLM with a warning), ``packaged``,
                a hub id or a local directory. Must match the encoder recorded in the dataset's manifest.
            cache: embedding cache file (SQLite); default ``$BRANCHGATE_CACHE/embeddings.sqlite``.
            batch_decisions: decision points (frames) per batch.
            show_progress: progress bar while embedding new texts.
        """
        super().__init__()
        self.save_hyperparameters()
        self.dataset_path = str(dataset)
        self.encoder_name = encoder
        self.cache_path = cache
        self.batch_decisions = int(batch_decisions)
        self.show_progress = show_progress
        self.splits = None  # DatasetDict
        self.manifest: dict = {}
        self.sets: dict = {}
        self.table: torch.Tensor | None = None
        self.encoder = None
        self.encoder_spec = None  # set to an EncoderSpec to bypass name resolution (evaluation of a checkpoint)
        self.cache_stats: dict = {}

    # -- setup -------------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.sets:
            return

        self.splits, self.manifest = load_decision_dataset(self.dataset_path)
        spec = self.encoder_spec or resolve(self.encoder_name)
        check_encoder(self.manifest["encoder"], spec.id, f"{self.dataset_path}/manifest.json")
        self.encoder = LazyEncoder(spec)
        texts = TextTable()
        self.sets = {name: build_decisions(name, self.splits[name], texts) for name in SPLITS}
        cache = EmbeddingCache(self.encoder, self.cache_path)
        try:
            table = texts.embed(cache, show_progress=self.show_progress)
            self.cache_stats = {**cache.stats(), "distinct_texts": len(texts) - 1}
        finally:
            cache.close()
        self.table = torch.from_numpy(table)
        log.info(
            "embeddings: %d distinct texts, cache hits %d, misses %d (%s)",
            len(texts) - 1,
            self.cache_stats["hits"],
            self.cache_stats["misses"],
            self.cache_stats["path"],
        )
        for name in SPLITS:
            s = self.sets[name]
            log.info("%s: %d decision points, %d rows, %d labelled", name, len(s), s.n_rows, int((s.label >= 0).sum()))
        self.require_labels(*STAGE_SPLITS.get(stage, SPLITS))

    def require_labels(self, *splits: str) -> None:
        """Refuse (``InputError``) a split among ``splits`` without a labelled row."""
        for name in splits:
            s = self.sets[name]
            if not (s.label >= 0).any():
                from branchgate.errors import InputError

                runs = self.manifest.get("n_runs", {})
                raise InputError(
                    f"the {name} split has no labelled rows ({len(s)} decision points, "
                    f"runs per split {runs}); splits are by run hash, so add more runs",
                    file=self.dataset_path,
                )

    # -- info used by the model --------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def data_sha256(self) -> str:
        src = self.manifest.get("source_sha256")
        if src:
            return str(src)
        return hashlib.sha256((Path(self.dataset_path) / "manifest.json").read_bytes()).hexdigest()

    def train_stats(self) -> dict:
        """Class balance and utility scale on the train split (labelled / finite rows only)."""
        s = self.sets["train"]
        lab = s.label[s.label >= 0]
        n_pos, n_neg = int((lab == 1).sum()), int((lab == 0).sum())
        u = s.utility[np.isfinite(s.utility)]
        return {
            "n_pos": n_pos,
            "n_neg": n_neg,
            "pos_weight": float(n_neg / n_pos) if n_pos and n_neg else 1.0,
            "depth_weights": depth_weights(s.features[:, 0], s.label),
            "utility_mean": float(u.mean()) if len(u) else 0.0,
            "utility_std": float(u.std()) if len(u) > 1 and u.std() > 0 else 1.0,
        }

    # -- loaders -----------------------------------------------------------------------------------------
    def loader(self, split: str, shuffle: bool = False) -> DataLoader:
        s, table = self.sets[split], self.table
        return DataLoader(
            range(len(s)),
            batch_size=self.batch_decisions,
            shuffle=shuffle,
            collate_fn=lambda idx: s.batch(idx, table),
            num_workers=0,
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")


def depth_weights(depth: np.ndarray, label: np.ndarray) -> list[list[float]]:
    """Per-depth BCE weights ``[[w_neg, w_pos], ...]`` indexed by depth (the last entry serves every deeper row):
    within each depth the positive and negative rows weigh the same in total, and each depth keeps its share of
    the labelled rows. Depths with one class only get weight 1 for both classes."""
    lab = label >= 0
    d = np.asarray(depth, dtype=np.int64)[lab]
    y = np.asarray(label)[lab]
    out: list[list[float]] = []
    for k in range(int(d.max()) + 1 if len(d) else 1):
        yk = y[d == k]
        n_pos, n_neg = int((yk == 1).sum()), int((yk == 0).sum())
        out.append([len(yk) / (2 * n_neg), len(yk) / (2 * n_pos)] if n_pos and n_neg else [1.0, 1.0])
    return out
