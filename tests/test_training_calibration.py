"""τ calibration and metrics on hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from branchgate.training.metrics import calibrate_tau, ece, gate_metrics, top1_accuracy


def test_f1_tau_on_hand_made_case():
    # sorted scores .9(1) .8(1) .7(0) .6(1) .3(0) .2(0): F1 is best keeping the top 4 (tp 3, fp 1) → 6/7
    scores = np.array([0.3, 0.9, 0.6, 0.2, 0.8, 0.7])
    labels = np.array([0, 1, 1, 0, 1, 0])
    tau = calibrate_tau(scores, labels, "f1")
    assert tau == pytest.approx(0.45)  # midway between the lowest kept (.6) and the next (.3)
    assert ((scores >= tau) == np.array([0, 1, 1, 0, 1, 1], bool)).all()


def test_f1_ignores_excluded_rows_and_ties():
    scores = np.array([0.9, 0.5, 0.5, 0.1, 0.95])
    labels = np.array([1, 1, 0, 0, -1])
    tau = calibrate_tau(scores, labels, "f1")
    # kept {0.9}: F1 2/3; kept {0.9, 0.5, 0.5} (a tie is kept or dropped whole): F1 0.8; the -1 row is ignored
    assert tau == pytest.approx(0.3)


def test_keep_rate_and_fixed():
    scores = np.linspace(0, 1, 11)
    tau = calibrate_tau(scores, np.zeros(11, int), "keep_rate", keep_rate=0.3)
    assert (scores >= tau).sum() == 3
    assert calibrate_tau(scores, None, "fixed", tau=0.5) == 0.5
    with pytest.raises(ValueError):
        calibrate_tau(scores, None, "keep_rate")


def test_top1_ece_and_gate_metrics():
    groups = np.array([0, 0, 0, 1, 1, 2])
    utility = np.array([0.0, 2.0, 1.0, 1.0, 1.0, 3.0])
    scores = np.array([0.1, 0.9, 0.5, 0.2, 0.8, 0.5])
    assert top1_accuracy(scores, utility, groups) == 1.0  # frame 2 has one candidate: not counted
    assert top1_accuracy(-scores, utility, groups) == 0.5  # frame 0 wrong, frame 1 a tie (still best)
    assert ece(np.array([0.9, 0.9]), np.array([1, 1])) == pytest.approx(0.1)
    labels = np.array([0, 1, 0, 1, 1, -1])
    m = gate_metrics(scores, scores, labels, utility, groups, tau=0.5)
    assert m["keep_rate"] == pytest.approx(4 / 6)
    assert m["recall"] == pytest.approx(2 / 3) and m["precision"] == pytest.approx(2 / 3)
    assert m["auroc"] == pytest.approx(5 / 6) and m["n_labelled"] == 5  # 5 of the 6 (positive, negative) pairs ordered
    # at tau 0.95 nothing passes: the gate still keeps the top-1 of each of the 3 decision points
    assert gate_metrics(scores, scores, labels, utility, groups, tau=0.95)["keep_rate_fallback"] == pytest.approx(3 / 6)


def test_listwise_loss_prefers_positive_on_top():
    import math

    import torch

    from branchgate.training.module import listwise_loss

    label = torch.tensor([[1, 0, 0, -1], [0, 0, -1, -1], [1, 1, 0, 0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False], [True, True, True, True]])
    good = torch.tensor([[5.0, 0.0, 0.0, 9.0], [0.0, 0.0, 0.0, 0.0], [5.0, 5.0, 0.0, 0.0]])
    bad = torch.tensor([[0.0, 5.0, 0.0, 9.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 5.0, 5.0]])
    # decision 2 has no positive and is ignored; padded/excluded rows never enter the softmax
    assert listwise_loss(good, label, mask) < listwise_loss(bad, label, mask)
    flat = torch.zeros(3, 4)
    expected = (math.log(3) + math.log(4)) / 2  # uniform scores: −log(1/3), and −(½·log ¼ + ½·log ¼)
    assert abs(float(listwise_loss(flat, label, mask)) - expected) < 1e-6
    assert listwise_loss(flat, torch.tensor([[0, 0, -1, -1]] * 3), mask) is None


def test_auroc_is_sklearns_with_ties_and_rejects_nan():
    from sklearn.metrics import roc_auc_score

    from branchgate.training.metrics import safe_auroc

    rng = np.random.default_rng(3)
    for i in range(50):
        n = int(rng.integers(2, 200))
        y = rng.integers(0, 2, n)
        s = rng.integers(0, 4, n) / 3.0 if i % 2 else rng.normal(size=n)  # odd cases: heavy ties
        if len(set(y)) < 2:
            assert safe_auroc(y, s) is None
            continue
        assert abs(safe_auroc(y, s) - roc_auc_score(y, s)) < 1e-12
    with pytest.raises(ValueError, match="NaN"):
        safe_auroc([0, 1, 1], [0.1, np.nan, 0.3])


def test_depth_weights_weigh_each_depth_s_classes_equally():
    """``depth_weights`` (recorded in the controller's ``train_stats``; the loss option that used them,
    ``model.balance: depth``, was removed: docs/research/balance-capacity.md)."""
    from branchgate.data.datamodule import depth_weights

    depth = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2])
    label = np.array([1, 1, 1, 0, 1, 0, 0, 0, -1, 0, 0])
    w = depth_weights(depth, label)
    # depth 0: 3 pos, 1 neg of 4 → neg 4/2, pos 4/6; depth 1: 1 pos, 3 neg (the -1 row is unlabelled);
    # depth 2: one class
    assert w == [pytest.approx([2.0, 2 / 3]), pytest.approx([2 / 3, 2.0]), [1.0, 1.0]]
    lab = label >= 0
    for k in (0, 1):  # within a depth both classes weigh the same in total
        yk = label[lab & (depth == k)]
        assert (yk == 1).sum() * w[k][1] == pytest.approx((yk == 0).sum() * w[k][0])
