"""The teacher-derived in-graph features of ``value_model.scalar_features`` equal the numpy teachers.

Each teacher rule exists once in meaning: the torch graph (float32 inputs, the Gram/inverse parts in
float64) must give the number the teacher in ``models/teachers`` gives (float64) to ``TOL`` on random
decisions built to hit the hard cases — retained texts with negative relevance to the root query (their
DPP weight is 0), exactly duplicated and nearly duplicated retained rows (a singular or near-singular
Gram matrix), candidates that copy or lie in the span of retained rows, and zero rows as padding
anywhere in the retained set and among the candidates. The same features through onnxruntime as well.

Pairing (feature ↔ teacher): ``mmr`` ↔ ``MMR(lam=0.35)`` with the root query as ``q``; ``centroid_drift``
↔ ``CentroidDrift``; ``coverage_gain`` ↔ ``SubmodularCoverage.gains(x, state) / |P|`` with
``P`` = the frame's candidates (``extra={"pool": x}``, as the dataset builds it; the teacher's ``score``
divides by the token cost, which the graph does not know); ``residual_novelty`` ↔ ``GRN``;
``dpp_gain`` ↔ ``DPP``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from branchgate.models import teachers as T
from branchgate.models.teachers import Items, State
from branchgate.models.value_model import SCALAR_NAMES, scalar_features

TOL = 1e-5
PAIRS = ("mmr", "centroid_drift", "coverage_gain", "residual_novelty", "dpp_gain")
N_DECISIONS = 300


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def random_decision(seed: int, dim: int | None = None) -> dict:
    """One decision of unit float32 rows (no padding): root, frame, goal [D], retained [R, D], cand [K, D]."""
    rng = np.random.default_rng(seed)
    d = int(dim or rng.integers(16, 65))
    k, r = int(rng.integers(1, 9)), int(rng.integers(0, 7))
    root = _unit(rng.normal(size=d))

    def around_root(n, sign=None):  # relevance to the root spread over about [-0.9, 0.9]
        s = rng.choice([-1.0, 1.0], size=n) if sign is None else np.full(n, sign)
        a = s * rng.uniform(0.0, 3.0, size=n)
        return _unit(a[:, None] * root + rng.normal(size=(n, d)) / np.sqrt(d))

    ret = around_root(r)
    if r:
        ret[0] = around_root(1, sign=-1.0)[0]  # a retained text with negative relevance (DPP weight 0)
    if r >= 2:
        kind = rng.integers(0, 3)
        src = int(rng.integers(0, r - 1))
        if kind == 0:
            ret[-1] = ret[src]  # exact duplicate: singular Gram matrix
        elif kind == 1:  # near duplicate, cos = 1 − O(eps²)
            eps = 10.0 ** -rng.uniform(1.0, 4.0)
            ret[-1] = _unit(ret[src] + eps * rng.normal(size=d) / np.sqrt(d))
    cand = around_root(k)
    for i in range(k):
        if not r or rng.random() < 0.4:
            continue
        kind = rng.integers(0, 3)
        if kind == 0:
            cand[i] = ret[rng.integers(0, r)]  # a copy of a retained text: GRN = 0
        elif kind == 1:  # in span(C)
            cand[i] = _unit(rng.normal(size=r) @ ret)
        else:  # a near copy
            cand[i] = _unit(ret[rng.integers(0, r)] + 1e-2 * rng.normal(size=d) / np.sqrt(d))
    frame, goal = _unit(rng.normal(size=(2, d)))
    out = {"root": root, "frame": frame, "goal": goal, "retained": ret.reshape(r, d), "cand": cand}
    return {key: np.asarray(v, np.float32) for key, v in out.items()}


def decisions(n: int = N_DECISIONS, dim: int | None = None, offset: int = 0) -> list[dict]:
    return [random_decision(offset + s, dim) for s in range(n)]


def teacher_features(d: dict) -> dict[str, np.ndarray]:
    """The five teachers on one decision, as the dataset calls them (pool = the frame's candidates)."""
    k, r = len(d["cand"]), len(d["retained"])
    x = Items([f"c{i}" for i in range(k)], d["cand"])
    state = State(Items(["q"], d["root"][None]), Items([f"r{i}" for i in range(r)], d["retained"]), extra={"pool": x})
    return {
        "mmr": T.MMR(lam=0.35).score(x, state),
        "centroid_drift": T.CentroidDrift().score(x, state),
        "coverage_gain": T.SubmodularCoverage().gains(x, state) / k,
        "residual_novelty": T.GRN().score(x, state),
        "dpp_gain": T.DPP().score(x, state),
    }


def _insert_zeros(rows: np.ndarray, n_zero: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` with ``n_zero`` zero rows at random positions, and where the real rows went."""
    n = len(rows) + n_zero
    real = np.sort(rng.choice(n, size=len(rows), replace=False))
    out = np.zeros((n, rows.shape[1]), np.float32)
    out[real] = rows
    return out, real


def padded_inputs(d: dict, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """scalar_features inputs for one decision (B = 1) with zero rows inserted into retained (at least one
    row in all) and among the candidates; and the positions of the real candidates."""
    rng = np.random.default_rng(10_000 + seed)
    ret, _ = _insert_zeros(d["retained"], int(rng.integers(0 if len(d["retained"]) else 1, 3)), rng)
    cand, real = _insert_zeros(d["cand"], int(rng.integers(0, 3)), rng)
    k, r = len(d["cand"]), len(d["retained"])
    feats = np.zeros((len(cand), 4), np.float32)
    feats[real] = np.array([[1.0, i, k, r] for i in range(k)], np.float32)
    return [d["root"][None], d["frame"][None], d["goal"][None], ret[None], cand[None], feats[None]], real


def graph_features(inputs: list[np.ndarray], real: np.ndarray) -> dict[str, np.ndarray]:
    with torch.no_grad():
        s = scalar_features(*[torch.from_numpy(a) for a in inputs])[0].numpy()
    return {name: s[real, SCALAR_NAMES.index(name)].astype(np.float64) for name in PAIRS}


def max_deltas(pairs) -> dict[str, float]:
    """max |graph − teacher| per feature over (graph, teacher) dicts."""
    pairs = list(pairs)
    return {name: max(float(np.max(np.abs(g[name] - t[name]))) for g, t in pairs) for name in PAIRS}


@pytest.fixture(scope="module")
def cases():
    out = []
    for seed, d in enumerate(decisions()):
        inputs, real = padded_inputs(d, seed)
        out.append((d, inputs, real, teacher_features(d)))
    return out


def test_the_random_decisions_hit_the_hard_cases(cases):
    def rel(d):
        return d["retained"].astype(np.float64) @ d["root"]

    assert sum(bool(np.any(rel(d) < 0)) for d, *_ in cases) > N_DECISIONS // 2
    gram_min = [
        np.linalg.eigvalsh(d["retained"].astype(np.float64) @ d["retained"].T.astype(np.float64))[0]
        for d, *_ in cases
        if len(d["retained"]) >= 2
    ]
    assert sum(g < 1e-12 for g in gram_min) >= 20  # exact duplicates
    assert sum(1e-12 <= g < 1e-4 for g in gram_min) >= 20  # near duplicates, around the ridge
    grn = np.concatenate([t["residual_novelty"] for *_, t in cases])
    assert np.sum(grn < 1e-3) >= 50 and np.sum(grn > 0.5) >= 200
    assert sum(inputs[3].shape[1] > len(d["retained"]) for d, inputs, _, _ in cases) > N_DECISIONS // 2
    assert sum(inputs[4].shape[1] > len(d["cand"]) for d, inputs, _, _ in cases) > N_DECISIONS // 2


def test_in_graph_features_equal_the_teachers(cases):
    worst = max_deltas((graph_features(inputs, real), t) for _, inputs, real, t in cases)
    assert all(v <= TOL for v in worst.values()), worst


def test_empty_retained_texts_count_as_absent_for_the_teachers_too(cases):
    """The graph cannot tell an empty retained text (zero row) from padding, so the teachers ignore it too:
    the teachers given the padded retained set (zero rows as empty texts) give the same numbers."""
    pairs = [
        (graph_features(inputs, real), teacher_features({**d, "retained": inputs[3][0]}))
        for d, inputs, real, _ in cases
    ]
    worst = max_deltas(pairs)
    assert all(v <= TOL for v in worst.values()), worst


def test_padded_batch_equals_the_teachers():
    """Several decisions of one width in one padded batch (different K and R) give the teachers' numbers."""
    batch = decisions(24, dim=32, offset=5000)
    k_max = max(len(d["cand"]) for d in batch) + 1
    r_max = max(len(d["retained"]) for d in batch) + 1
    arrays = [np.zeros((len(batch), 32), np.float32) for _ in range(3)]
    ret = np.zeros((len(batch), r_max, 32), np.float32)
    cand = np.zeros((len(batch), k_max, 32), np.float32)
    feats = np.zeros((len(batch), k_max, 4), np.float32)
    for b, d in enumerate(batch):
        for a, key in zip(arrays, ("root", "frame", "goal")):
            a[b] = d[key]
        ret[b, r_max - len(d["retained"]) :] = d["retained"]  # padding first here
        cand[b, : len(d["cand"])] = d["cand"]
    with torch.no_grad():
        s = scalar_features(*[torch.from_numpy(a) for a in (*arrays, ret, cand, feats)]).numpy()
    for b, d in enumerate(batch):
        t = teacher_features(d)
        for name in PAIRS:
            got = s[b, : len(d["cand"]), SCALAR_NAMES.index(name)]
            np.testing.assert_allclose(got, t[name], atol=TOL, err_msg=f"{name}, decision {b}")


class _Scalars(torch.nn.Module):
    def forward(self, root, frame, goal, retained, cand, features):
        return scalar_features(root, frame, goal, retained, cand, features)


def test_onnx_features_equal_the_teachers(cases, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from branchgate.export.controller import register_onnx_ops
    from branchgate.export.onnx_metadata import OPSET

    register_onnx_ops()  # torch.linalg.inv → onnxruntime's Inverse (here on float64)
    names = ["root", "frame", "goal", "retained", "cand", "features"]
    path = tmp_path / "scalars.onnx"
    _, inputs, _, _ = cases[0]
    axes = {
        "root": {0: "B", 1: "D"},
        "frame": {0: "B", 1: "D"},
        "goal": {0: "B", 1: "D"},
        "retained": {0: "B", 1: "R", 2: "D"},
        "cand": {0: "B", 1: "K", 2: "D"},
        "features": {0: "B", 1: "K"},
        "scalars": {0: "B", 1: "K"},
    }
    torch.onnx.export(
        _Scalars(),
        tuple(torch.from_numpy(a) for a in inputs),
        str(path),
        dynamo=False,
        input_names=names,
        output_names=["scalars"],
        opset_version=OPSET,
        dynamic_axes=axes,
    )
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    pairs = []
    for _, inputs, real, t in cases[:120]:
        s = sess.run(None, dict(zip(names, inputs)))[0][0]
        pairs.append(({name: s[real, SCALAR_NAMES.index(name)].astype(np.float64) for name in PAIRS}, t))
    worst = max_deltas(pairs)
    assert all(v <= TOL for v in worst.values()), worst
