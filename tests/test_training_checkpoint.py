"""Checkpoint round-trip: save_controller / load_controller keep weights, standardisation and meta."""

from __future__ import annotations

import pytest
import torch

from branchgate.errors import InputError, MismatchError
from branchgate.models.encoder import EncoderSpec
from branchgate.models.value_model import SCALAR_NAMES, ValueNet
from branchgate.training.checkpoint import META_KEYS, load_controller, make_meta, save_controller


def _meta(**kw):
    return make_meta(EncoderSpec("sentence-transformers/all-MiniLM-L6-v2", "/nowhere"), tau=0.42, data_sha256="abc",
                     dim=16, max_length=128, **kw)


def test_round_trip_preserves_outputs_and_meta(tmp_path):
    torch.manual_seed(1)
    net = ValueNet(16, hidden=8, dropout=0.0)
    net.set_standardisation(torch.arange(len(SCALAR_NAMES), dtype=torch.float32), torch.full((len(SCALAR_NAMES),), 2.0), 0.7, 3.0)
    path = save_controller(tmp_path / "c.ckpt", net.eval(), _meta())
    loaded, meta = load_controller(path)
    assert not loaded.training
    assert set(META_KEYS) <= set(meta)
    assert meta["tau"] == pytest.approx(0.42) and meta["dim"] == 16 and meta["encoder"].endswith("all-MiniLM-L6-v2")
    assert meta["standardisation"]["utility_std"] == pytest.approx(3.0)
    x = (torch.nn.functional.normalize(torch.randn(16), dim=0), torch.zeros(16), torch.zeros(16),
         torch.zeros(1, 16), torch.nn.functional.normalize(torch.randn(3, 16), dim=-1), torch.tensor([[0.0, i, 3, 0] for i in range(3)]))
    with torch.no_grad():
        for a, b in zip(net(*x), loaded(*x)):
            assert torch.equal(a, b)


def test_not_a_checkpoint_and_missing_file(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_controller(tmp_path / "missing.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(InputError, match="not a branchgate controller"):
        load_controller(tmp_path / "other.ckpt")


def test_feature_schema_mismatch_is_an_error(tmp_path):
    path = save_controller(tmp_path / "c.ckpt", ValueNet(16, hidden=8), _meta())
    ckpt = torch.load(path, weights_only=True)
    ckpt["branchgate"]["meta"]["feature_names"] = ["depth"]
    torch.save(ckpt, path)
    with pytest.raises(MismatchError, match="features"):
        load_controller(path)
