"""The packed BERT tower that export puts in the graph: the same embeddings as the padded tower, and the
Gate runs it once per decision (no length bucketing needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from export_support import exported, spy_runs

from branchgate.export.controller import graph_tower
from branchgate.export.packed_tower import PackedBertTower, supports
from branchgate.inference.gate import Gate
from branchgate.inference.model_file import read_metadata
from branchgate.models.text_tower import TextTower

TEXTS = [
    "varroa",
    "neonicotinoid pesticides and honeybee colony losses in field studies across Europe",
    "水土流失的原因",
    "ñandú 🦤 <b>&amp;</b>",
    "x " * 400,
]  # the last one is cut at max_length


def _batch(encoder, texts):
    feats = encoder.features(texts)
    return feats["input_ids"].long(), feats["attention_mask"].long()


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_packed_tower_equals_the_padded_tower(encoder, pooling):
    transformer = encoder.st[0].auto_model
    padded, packed = TextTower(transformer, pooling).eval(), PackedBertTower(transformer, pooling).eval()
    ids, mask = _batch(encoder, TEXTS)
    assert ids.shape[1] == encoder.max_length and int(mask.sum()) < mask.numel() / 2  # mostly padding
    with torch.inference_mode():
        for i, m in ((ids, mask), (ids[:1], mask[:1]), (ids[1:3], mask[1:3])):
            want, got = padded(i, m), packed(i, m)
            assert got.shape == want.shape
            assert float((want - got).abs().max()) <= 1e-5
            assert torch.allclose(got.norm(dim=-1), torch.ones(len(i)), atol=1e-5)


def test_export_uses_the_packed_tower_only_for_bert(encoder):
    tower = encoder.torch_module()
    assert supports(tower.transformer) and isinstance(graph_tower(tower), PackedBertTower)
    other = TextTower(torch.nn.Linear(4, 4), "mean")  # not a BERT: exported as it is
    assert not supports(other.transformer) and graph_tower(other) is other


def test_gate_runs_a_packed_graph_once_per_decision(encoder):
    path = exported(encoder)["files"]["fp32"]
    assert read_metadata(path)["text_tower"] == "packed"
    gate = Gate.load(path, threads=1)
    assert gate.bucketing is False
    runs = spy_runs(gate)
    long_frame = "Previous research goal: " + " ".join(f"aspect{i} of colony collapse" for i in range(40))
    state = {"root_query": "Why are bees dying?", "frame_query": long_frame}
    cands = [{"query": "varroa", "goal": ""}, {"query": "pesticides", "goal": "field studies"}]
    sel = gate.select(state, cands)
    assert len(runs) == 1 and runs[0][0] == 4  # root, frame and both candidates in one run
    want = Gate.load(path, threads=1, bucketing=True).select(state, cands)
    np.testing.assert_allclose(sel.p_keep, want.p_keep, atol=1e-5)
