"""Skippable tower/head parts of the exported graph, and the Gate's text groups built on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from export_support import exported, max_abs, relabelled

from branchgate.errors import BranchgateError, MismatchError
from branchgate.export.parts import PARTS, skippable_parts
from branchgate.export.samples import sample_decisions
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import as_decision
from branchgate.inference.model_file import read_metadata
from branchgate.inference.schedule import balanced_groups, group_threads


@pytest.fixture(scope="module")
def fp32_model(encoder) -> str:
    return exported(encoder)["files"]["fp32"]


def _session(path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def test_each_part_runs_alone_and_matches_the_whole_run(fp32_model):
    assert read_metadata(fp32_model)["parts"] == PARTS
    gate = Gate.load(fp32_model, threads=1)
    state, cands = as_decision(*sample_decisions()[0])
    texts = [state.root_query, state.frame_query, state.parent_goal, *state.retained, *cands]
    new = [t for t in dict.fromkeys(texts) if t]
    feed = gate._tokens(new)
    rows = [None if not t else ("new", new.index(t)) for t in texts]
    feed.update(gate._head_feed(state, len(cands), rows, len(new), []))
    sess = _session(fp32_model)
    p_whole, u_whole, emb_whole = sess.run(None, feed)

    tower_only = dict(feed, cand_idx=np.zeros(0, np.int64), features=np.zeros((0, 4), np.float32))
    p_none, u_none, emb = sess.run(None, tower_only)
    assert p_none.shape == (0,) and u_none.shape == (0,)
    assert max_abs(emb.ravel(), emb_whole.ravel()) <= 1e-6

    head_only = dict(feed, input_ids=np.zeros((0, 1), np.int64), attention_mask=np.zeros((0, 1), np.int64))
    head_only.update(gate._head_feed(state, len(cands), rows, 0, list(emb)))
    p, u, no_emb = sess.run(None, head_only)
    assert no_emb.shape == (0, gate.dim)
    assert max_abs(p, p_whole) <= 1e-6 and max_abs(u, u_whole) <= 1e-5


def test_text_groups_change_nothing_in_fp32(fp32_model):
    one = Gate.load(fp32_model, threads=2, text_groups=1)
    two = Gate.load(fp32_model, threads=2)
    assert one.text_groups == 1 and two.text_groups == 2  # the default on two threads
    for state, cands in sample_decisions():
        a = one.select(state, cands)
        two.clear_cache()
        b = two.select(state, cands)
        assert a.kept == b.kept and max_abs(a.p_keep, b.p_keep) <= 1e-5 and max_abs(a.utility, b.utility) <= 1e-4
        c = two.select(state, cands)  # everything cached now: the head alone
        assert max_abs(c.p_keep, b.p_keep) <= 1e-6
    texts = ["varroa mites", "", "neonicotinoid pesticides and colony losses", "varroa mites", "winter"]
    np.testing.assert_allclose(one.embed(texts), Gate.load(fp32_model, threads=2).embed(texts), atol=1e-6)


def test_text_groups_keep_every_thread_busy(fp32_model):
    # Both groups' runs share the session's intra-op pool: its workers plus the group threads make `threads`.
    for threads, workers in ((2, 0), (3, 1), (4, 2), (8, 6)):
        gate = Gate.load(fp32_model, threads=threads)
        assert gate.text_groups == 2
        assert gate.session.get_session_options().intra_op_num_threads - 1 == workers, threads
    assert group_threads(2, 2) == 1 and group_threads(4, 3) == 2 and group_threads(1, 2) == 1
    assert Gate.load(fp32_model, threads=4, text_groups=1).session.get_session_options().intra_op_num_threads == 4


def test_text_groups_need_a_model_with_parts(fp32_model, tmp_path):
    meta = {k: v for k, v in read_metadata(fp32_model).items() if k != "parts"}
    old = relabelled(fp32_model, tmp_path, meta)
    assert Gate.load(old, threads=2).text_groups == 1  # an older export: one run per decision
    with pytest.raises(MismatchError, match="parts"):
        Gate.load(old, threads=2, text_groups=2)
    with pytest.raises(Exception, match="text_groups"):
        Gate.load(fp32_model, text_groups=0)


def test_graphs_whose_parts_share_work_are_left_whole():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 2]) for n in ("text_emb", "p_keep", "utility")]
    nodes = [
        helper.make_node("Relu", ["x"], ["shared"]),
        helper.make_node("Neg", ["shared"], ["text_emb"]),
        helper.make_node("Abs", ["shared"], ["p_keep"]),
        helper.make_node("Sigmoid", ["shared"], ["utility"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match="share"):
        skippable_parts(model, 2, tower_input="x", head_input="x")
    with pytest.raises(ValueError, match="no output"):
        skippable_parts(helper.make_model(helper.make_graph(nodes[:2], "g", [x], outs[:1])), 2)


def test_balanced_groups_split_by_total_length():
    groups = balanced_groups(np.array([30, 5, 20, 12, 8]), 2)
    assert sorted(np.concatenate(groups).tolist()) == [0, 1, 2, 3, 4]
    loads = [int(np.array([30, 5, 20, 12, 8])[g].sum()) for g in groups]
    assert abs(loads[0] - loads[1]) <= 5 and all(len(g) for g in groups)
    assert [g.tolist() for g in balanced_groups(np.array([3, 3]), 2)] == [[0], [1]]


def test_metadata_is_read_without_loading_and_bad_files_are_named(fp32_model, tmp_path):
    assert read_metadata(fp32_model) == dict(_session(fp32_model).get_modelmeta().custom_metadata_map)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(Path(fp32_model).read_bytes()[:1000])
    with pytest.raises(BranchgateError, match="cut.onnx: not a loadable ONNX model"):
        read_metadata(cut)
    cut.write_bytes(Path(fp32_model).read_bytes()[:-3])  # cut inside the last metadata entry
    with pytest.raises(BranchgateError, match="cut.onnx: not a loadable ONNX model"):
        read_metadata(cut)
