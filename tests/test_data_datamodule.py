"""DecisionDataModule: grouping into decision points, padding, encoder checks and input errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from branchgate.data.datamodule import DecisionDataModule
from branchgate.data.decision_batches import TextTable, build_decisions
from branchgate.data.embedding_cache import EmbeddingCache
from branchgate.data.synthetic import write_synthetic_dataset
from branchgate.errors import InputError, MismatchError
from branchgate.models.encoder import EncoderUnavailable


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, encoder):
    root = tmp_path_factory.mktemp("dm")
    path = write_synthetic_dataset(root / "ds", n_runs=16, seed=3)
    cache = root / "emb.sqlite"
    import datasets

    dsd = datasets.load_from_disk(str(path))
    texts = TextTable()
    for name in dsd:
        build_decisions(name, dsd[name], texts)
    EmbeddingCache(encoder, cache).get(texts.texts[1:])  # warm with the session's encoder
    return path, cache


def test_setup_groups_rows_into_decisions(dataset):
    path, cache = dataset
    dm = DecisionDataModule(str(path), encoder="packaged", cache=str(cache), batch_decisions=4, show_progress=False)
    dm.setup("fit")
    assert dm.cache_stats["misses"] == 0 and dm.cache_stats["hits"] == dm.cache_stats["distinct_texts"]
    assert not dm.encoder.loaded
    split = dm.splits["train"]
    s = dm.sets["train"]
    assert len(s) == len(set(zip(split["run_id"], split["frame_id"])))
    assert sorted(s.row.tolist()) == list(range(len(split)))
    for d in range(len(s)):
        rows = s.row[s.cand_ptr[d] : s.cand_ptr[d + 1]]
        assert [split["order"][int(i)] for i in rows] == sorted(split["order"][int(i)] for i in rows)
        assert len({split["frame_id"][int(i)] for i in rows}) == 1
        assert s.ret_ptr[d + 1] - s.ret_ptr[d] == split["n_retained"][int(rows[0])]
    batch = next(iter(dm.train_dataloader()))
    b, k = batch["mask"].shape
    assert batch["cand"].shape == (b, k, dm.dim) and batch["retained"].shape[0] == b
    assert torch.all(batch["label"][~batch["mask"]] == -1)
    pad = ~batch["mask"]
    assert torch.all(batch["cand"][pad] == 0)  # padding candidates are zero rows
    assert torch.allclose(batch["cand"][batch["mask"]].norm(dim=-1), torch.ones(int(batch["mask"].sum())), atol=1e-4)


def test_empty_text_is_a_zero_vector(dataset):
    path, cache = dataset
    dm = DecisionDataModule(str(path), encoder="packaged", cache=str(cache), show_progress=False)
    dm.setup()
    s = dm.sets["train"]
    roots = np.flatnonzero(s.goal == 0)  # root frames have no parent goal
    assert len(roots) > 0
    batch = s.batch(roots[:3], dm.table)
    assert torch.all(batch["goal"] == 0)
    stats = dm.train_stats()
    assert (
        stats["n_pos"] > 0
        and stats["n_neg"] > 0
        and stats["pos_weight"] == pytest.approx(stats["n_neg"] / stats["n_pos"])
    )


def test_dataset_encoder_mismatch_is_an_error(dataset, tmp_path):
    path, cache = dataset
    import shutil

    other = tmp_path / "bge"
    shutil.copytree(path, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["encoder"] = "BAAI/bge-small-en-v1.5"
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MismatchError, match="bge-small"):
        DecisionDataModule(str(other), encoder="packaged", cache=str(cache)).setup()


def test_explicit_unavailable_encoder_names_offline_option(dataset):
    path, cache = dataset
    with pytest.raises(EncoderUnavailable, match="--encoder packaged"):
        DecisionDataModule(str(path), encoder="no-such-org/no-such-encoder", cache=str(cache)).setup()


def test_missing_manifest_and_columns(dataset, tmp_path):
    path, cache = dataset
    with pytest.raises(InputError, match="manifest.json"):
        DecisionDataModule(str(tmp_path / "nothing"), encoder="packaged", cache=str(cache)).setup()
    import datasets

    dsd = datasets.load_from_disk(str(path)).remove_columns(["parent_goal"])
    broken = tmp_path / "broken"
    dsd.save_to_disk(str(broken))
    (broken / "manifest.json").write_text((path / "manifest.json").read_text())
    with pytest.raises(InputError, match="parent_goal"):
        DecisionDataModule(str(broken), encoder="packaged", cache=str(cache)).setup()
