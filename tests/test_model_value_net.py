"""ValueNet: the ONE-decision forward contract, padding/batching equivalence, invariances, ONNX export."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from branchgate.models.value_model import FEATURE_NAMES, SCALAR_NAMES, ValueNet, scalar_features

D = 24


def unit(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)


def decision(k=5, r=3, seed=0):
    feats = torch.tensor([[1.0, i, k, r] for i in range(k)])
    return (
        unit(D, seed=seed),
        unit(D, seed=seed + 1),
        unit(D, seed=seed + 2),
        unit(r, D, seed=seed + 3),
        unit(k, D, seed=seed + 4),
        feats,
    )


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    n = ValueNet(D, hidden=16, dropout=0.0)
    n.set_standardisation(torch.randn(len(SCALAR_NAMES)) * 0.1, torch.rand(len(SCALAR_NAMES)) + 0.5, 1.5, 2.0)
    return n.eval()


def test_forward_shapes_and_utility_units(net):
    logit, util = net(*decision(k=5, r=3))
    assert logit.shape == (5,) and util.shape == (5,)
    assert torch.isfinite(logit).all() and torch.isfinite(util).all()
    _, z = net.raw_heads(*[x.unsqueeze(0) for x in decision(k=5, r=3)])
    assert torch.allclose(util, z[0] * 2.0 + 1.5, atol=1e-6)  # utility comes back in dataset units


def test_zero_retained_row_means_nothing_retained(net):
    root, frame, goal, _, cand, feats = decision(k=4)
    feats[:, 3] = 0
    out1 = net(root, frame, goal, torch.zeros(1, D), cand, feats)
    out2 = net(root, frame, goal, torch.zeros(3, D), cand, feats)
    assert torch.allclose(out1[0], out2[0], atol=1e-6)
    s = scalar_features(root[None], frame[None], goal[None], torch.zeros(1, 1, D), cand[None], feats[None])[0]
    assert torch.all(s[:, SCALAR_NAMES.index("retained_max")] == 0)
    assert torch.allclose(s[:, SCALAR_NAMES.index("centroid_drift")], torch.ones(4))  # empty C: maximal drift


def test_retained_order_invariance_and_candidate_equivariance(net):
    root, frame, goal, ret, cand, feats = decision(k=5, r=4)
    base = net(root, frame, goal, ret, cand, feats)[0]
    assert torch.allclose(base, net(root, frame, goal, ret.flip(0), cand, feats)[0], atol=1e-5)
    perm = torch.tensor([3, 0, 4, 1, 2])
    permuted = net(root, frame, goal, ret, cand[perm], feats[perm])[0]
    assert torch.allclose(base[perm], permuted, atol=1e-5)


def test_padded_batch_equals_single_decisions(net):
    a, b = decision(k=2, r=1, seed=10), decision(k=5, r=4, seed=20)
    k, r = 5, 4
    pad = lambda x, n: torch.cat([x, torch.zeros(n - x.shape[0], *x.shape[1:])])  # noqa: E731
    batch = [torch.stack([a[i], b[i]]) for i in range(3)]
    batch.append(torch.stack([pad(a[3], r), b[3]]))
    batch.append(torch.stack([pad(a[4], k), b[4]]))
    batch.append(torch.stack([pad(a[5], k), b[5]]))
    logit, util = net.score_batch(*batch)
    for j, d in enumerate((a, b)):
        lo, ut = net(*d)
        n = d[4].shape[0]
        assert torch.allclose(logit[j, :n], lo, atol=1e-5)
        assert torch.allclose(util[j, :n], ut, atol=1e-5)


def test_rank_feature_counts_higher_siblings():
    root = torch.nn.functional.normalize(torch.tensor([1.0, 0, 0]), dim=0)
    cand = torch.nn.functional.normalize(torch.tensor([[1.0, 0.1, 0], [0.2, 1, 0], [1, 1, 0]]), dim=-1)
    feats = torch.tensor([[0.0, i, 3, 0] for i in range(3)])
    s = scalar_features(
        root[None], torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, 1, 3), cand[None], feats[None]
    )[0]
    rank = s[:, SCALAR_NAMES.index("rank_sim_root")]
    assert rank.tolist() == [0.0, 1.0, 0.5]  # best, worst, middle
    assert s.shape[-1] == len(SCALAR_NAMES) and SCALAR_NAMES[: len(FEATURE_NAMES)] == FEATURE_NAMES


def test_onnx_export_matches_torch_for_varying_k_and_r(net, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from branchgate.export.controller import register_onnx_ops

    register_onnx_ops()  # torch.linalg.inv (residual novelty) → onnxruntime's Inverse
    names = ["root", "frame", "goal", "retained", "cand", "features"]
    path = tmp_path / "vn.onnx"
    torch.onnx.export(
        net,
        decision(k=4, r=2),
        str(path),
        dynamo=False,
        input_names=names,
        output_names=["logit", "utility"],
        opset_version=17,
        dynamic_axes={
            "retained": {0: "R"},
            "cand": {0: "K"},
            "features": {0: "K"},
            "logit": {0: "K"},
            "utility": {0: "K"},
        },
    )
    sess = ort.InferenceSession(str(path))
    for k, r in [(1, 1), (7, 5), (3, 9)]:
        x = decision(k=k, r=r, seed=k * 10 + r)
        with torch.no_grad():
            ref = net(*x)
        got = sess.run(None, {n: v.numpy() for n, v in zip(names, x)})
        np.testing.assert_allclose(got[0], ref[0].numpy(), atol=1e-4)
        np.testing.assert_allclose(got[1], ref[1].numpy(), atol=1e-4)


def test_wrong_feature_count_is_rejected():
    with pytest.raises(ValueError, match="structured features"):
        ValueNet(D, n_features=3)


def test_residual_novelty_is_the_ridge_projection_in_float64_and_is_stable():
    """GRN = ‖x‖² − kᵀ(CCᵀ + ρI)⁻¹k with ρ = 1e-6 (the GRN teacher's definition, models/teachers/novelty.py):
    the exact projection for distinct retained rows; duplicates and padding rows add nothing."""
    from branchgate.models.teachers.common import RIDGE
    from branchgate.models.value_model import residual_novelty

    assert RIDGE == 1e-6
    distinct = unit(1, 6, D, seed=5)
    ret = torch.cat([distinct, distinct[:, :2], torch.zeros(1, 1, D)], dim=1)  # exact duplicates + a padding row
    cand = torch.cat([unit(1, 3, D, seed=6), ret[:, :1]], dim=1)  # last candidate is a retained text
    grn = residual_novelty(ret, cand)[0]
    c, x = ret[0].double(), cand[0].double()
    k = c @ x.T
    ridge = 1.0 - (k * torch.linalg.solve(c @ c.T + RIDGE * torch.eye(len(c), dtype=torch.float64), k)).sum(0)
    assert torch.allclose(grn.double(), ridge, atol=1e-6)
    basis, _ = torch.linalg.qr(distinct[0].double().T)
    exact = 1.0 - ((x @ basis) ** 2).sum(-1)  # ‖x − P_C x‖², P_C the orthogonal projection
    assert torch.allclose(grn.double(), exact, atol=1e-5)
    assert grn[-1] < 1e-5 and grn[:3].min() > 0.3

    def noisy(t):  # 1e-6 noise on the real rows, padding stays zero
        return torch.nn.functional.normalize(
            t + 1e-6 * torch.randn(t.shape) * (t.norm(dim=-1, keepdim=True) > 0), dim=-1
        )

    assert (residual_novelty(noisy(ret), noisy(cand))[0] - grn).abs().max() < 1e-4  # torch/ONNX parity margin
    assert torch.allclose(residual_novelty(torch.zeros(1, 1, D), cand)[0], torch.ones(4))  # empty C → 1


@pytest.mark.parametrize("towers", ["interaction", "none"])
def test_towers_option_limits_what_the_text_can_do(towers):
    """The option is recorded in the config; ``none`` builds no towers, so the texts reach the network only
    through the scalar features."""
    torch.manual_seed(0)
    n = ValueNet(D, hidden=16, dropout=0.0, towers=towers).eval()
    assert n.config()["towers"] == towers
    assert hasattr(n, "cand_tower") == (towers != "none")
    logit, util = n(*decision(k=5, r=3))
    assert logit.shape == (5,) and torch.isfinite(util).all()
    if towers == "none":  # the text reaches the net only through the scalar features
        root, frame, goal, ret, cand, feats = [x.unsqueeze(0) for x in decision(k=5, r=3)]
        s = n.scalars(root, frame, goal, ret, cand, feats)
        other = unit(1, 3, D, seed=9)  # different retained texts, same scalars passed in
        assert torch.equal(
            n.raw_heads(root, frame, goal, ret, cand, feats, scalars=s)[0],
            n.raw_heads(root, frame, goal, other, cand, feats, scalars=s)[0],
        )


def test_unknown_towers_is_refused():
    with pytest.raises(ValueError, match="towers must be one of"):
        ValueNet(D, towers="candidate")


def test_order_option_makes_scores_independent_of_the_listing_order():
    """Listing the same candidates in another order (positions stay 0..K-1): with ``order=False`` each candidate
    keeps its score; with the position as an input (the default) the scores move."""
    root, frame, goal, ret, cand, feats = decision(k=5, r=3)
    perm = torch.tensor([4, 2, 0, 3, 1])
    for order in (False, True):
        torch.manual_seed(0)
        n = ValueNet(D, hidden=16, dropout=0.0, order=order)
        n.set_standardisation(torch.zeros(len(SCALAR_NAMES)), torch.full((len(SCALAR_NAMES),), 0.5))
        n.eval()
        assert n.config()["order"] is order
        base = n(root, frame, goal, ret, cand, feats)[0]
        relisted = n(root, frame, goal, ret, cand[perm], feats)[0]  # same positions, candidates moved
        assert torch.allclose(base[perm], relisted, atol=1e-5) is (not order)
