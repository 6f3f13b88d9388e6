"""Heuristic teachers: hand-computed values, edge cases, registry, gate/select/set_gain."""

from __future__ import annotations

import math

import numpy as np
import pytest

from branchgate.errors import BranchgateError, MismatchError
from branchgate.models import teachers as T
from branchgate.models.teachers import Items, State, gate, select, set_gain

D = 5
E = np.eye(D)
R2 = 1 / math.sqrt(2)


def items(*vecs, texts=None, tokens=None) -> Items:
    arr = np.array(vecs, dtype=np.float32).reshape(len(vecs), D) if vecs else np.zeros((0, D), np.float32)
    texts = texts or [f"t{i}" for i in range(len(vecs))]
    return Items(texts, arr, None if tokens is None else np.asarray(tokens, float))


def state(context=(), query=E[0], **extra) -> State:
    return State(query=items(query, texts=["q"]), context=items(*context), extra=extra)


MIX = (E[0] + E[1]) * R2  # 45° between e0 and e1


def test_registry_names_and_errors():
    assert T.NAMES == ("mmr", "grn", "cd", "dpp", "sc", "lexical", "hybrid")
    for name in T.NAMES:
        model = T.get(name)
        assert model.name == name and isinstance(model, T.ValueModel)
        assert T.get(name, threshold=0.123).threshold == 0.123
    with pytest.raises(BranchgateError, match="valid names: mmr, grn, cd, dpp, sc, lexical, hybrid"):
        T.get("nope")
    with pytest.raises(BranchgateError, match="no parameter"):
        T.get("mmr", lambda_=0.5)
    with pytest.raises(BranchgateError, match="lam"):
        T.get("mmr", lam=2.0)
    assert T.params(T.get("dpp")) == {"threshold": 0.30, "ridge": 1e-6}
    assert T.params(T.get("grn")) == {"threshold": 0.85, "ridge": 1e-6}


def test_paper_defaults():
    assert (T.get("mmr").lam, T.get("mmr").threshold) == (0.35, 0.35)
    assert T.get("grn").threshold == 0.85 and T.get("cd").threshold == 0.03
    assert T.get("dpp").threshold == 0.30 and T.get("sc").threshold == 0.05
    assert (T.get("lexical").lam, T.get("lexical").threshold) == (0.6, 0.2)
    h = T.get("hybrid")
    assert (h.alpha, h.beta, h.gamma) == (0.40, 0.30, 0.30)


def test_mmr_exact_values():
    m = T.get("mmr")
    # sim(x,q)=1/√2, max sim to C = 1/√2 → (0.35 − 0.65)/√2
    assert m.score(items(MIX), state([E[1]]))[0] == pytest.approx(-0.3 * R2, abs=1e-6)
    # max over C picks the most similar retained item
    assert m.score(items(E[0]), state([E[2], E[0]]))[0] == pytest.approx(0.35 - 0.65, abs=1e-6)
    # empty C: λ·sim
    assert m.score(items(E[0], MIX), state())[:] == pytest.approx([0.35, 0.35 * R2], abs=1e-6)
    # an empty retained text (zero row) is absent, not a similarity of 0: the max is over −e0 alone
    assert m.score(items(E[0]), state([-E[0], np.zeros(D)]))[0] == pytest.approx(0.35 + 0.65, abs=1e-6)
    assert m.score(items(E[0]), state([np.zeros(D)]))[0] == pytest.approx(0.35, abs=1e-6)  # only empty: as empty C


def test_grn_values():
    g = T.get("grn")
    s = state([E[0], E[1]])
    got = g.score(items(E[0], E[2], (E[0] + E[2]) * R2, MIX, np.zeros(D)), s)
    assert got == pytest.approx([0.0, 1.0, 0.5, 0.0, 0.0], abs=1e-6)  # duplicate, orthogonal, half, in span, zero
    assert g.score(items(E[3]), state())[0] == pytest.approx(1.0)  # empty C: novelty 1
    # duplicates and zero rows in C add no direction
    assert g.score(items(E[1], E[0]), state([E[0], E[0], np.zeros(D)]))[:] == pytest.approx([1.0, 0.0], abs=1e-6)


def test_grn_near_singular_context_is_stable():
    c2 = E[0] + 1e-9 * E[1]
    out = T.get("grn").score(items(E[0], E[1], E[2]), state([E[0], c2]))
    assert np.all(np.isfinite(out)) and np.all((out >= 0) & (out <= 1))
    assert out == pytest.approx([0.0, 1.0, 1.0], abs=1e-6)  # the 1e-9 direction is noise, not a new basis vector


def test_grn_is_the_ridge_projection_residual():
    """GRN = ‖x‖² − kᵀ(G + ρI)⁻¹k, G = CCᵀ, k = Cx, ρ = 1e-6: the exact projection for distinct rows, and
    for two rows at angle t the direction between them counts with weight σ²/(σ²+ρ), σ² = 1 − cos t."""
    rng = np.random.default_rng(7)
    c, x = (
        T.common.unit(T.common.unit(rng.normal(size=(n, D))).astype(np.float32)) for n in (3, 4)
    )  # as Items hold it
    g = T.get("grn").score(items(*x), state(list(c)))
    q, _ = np.linalg.qr(c.T)
    exact = 1.0 - ((x @ q) ** 2).sum(axis=1)
    assert g == pytest.approx(exact, abs=1e-5)  # well-conditioned C: the exact projection
    k = c @ x.T
    ridge = 1.0 - np.einsum("ij,ij->j", k, np.linalg.inv(c @ c.T + 1e-6 * np.eye(3)) @ k)
    assert g == pytest.approx(ridge, abs=1e-12)
    for t, novelty in ((1e-1, 0.0), (1e-5, 1.0)):  # near duplicates: a real direction, then noise
        c2 = np.cos(t) * E[0] + np.sin(t) * E[1]
        sigma2 = 1.0 - np.cos(t)  # the small eigenvalue of G; E[1] lies in its eigenvector up to O(t)
        got = T.get("grn").score(items(E[1]), state([E[0], c2]))[0]
        assert got == pytest.approx(novelty, abs=2e-3)
        assert (got < 0.5) == (sigma2 > 1e-6)
    # zero rows of C (empty texts) change nothing
    padded = T.get("grn").score(items(*x), state([np.zeros(D), *c, np.zeros(D)]))
    assert np.max(np.abs(padded - g)) < 1e-12
    assert T.get("grn").score(items(*x), state([np.zeros(D)])) == pytest.approx(np.ones(4))  # only empty: 1


def test_centroid_drift_values():
    cd = T.get("cd")
    s = state([E[0], E[1]])
    assert cd.score(items(MIX), s)[0] == pytest.approx(0.0, abs=1e-7)  # x on the centroid direction
    assert cd.score(items(np.zeros(D)), s)[0] == pytest.approx(0.0, abs=1e-7)
    assert cd.score(items(E[1]), state([E[0]]))[0] == pytest.approx(1 - R2, abs=1e-6)  # μ: e0 → (e0+e1)/2
    assert cd.score(items(E[2]), state())[0] == 1.0  # empty C
    assert cd.score(items(E[2]), state([E[0], -E[0]]))[0] == 1.0  # zero centroid counts as empty
    far = cd.score(items(E[2], -E[0]), state([E[0], E[1]]))
    assert far[0] > 0.03 and far[1] > far[0]


def test_dpp_values():
    d = T.get("dpp")
    # L_C = [1], L_xx = 1/2, l = 1/2 → gain = 1/2 − 1/4 (= det ratio of [[1, .5], [.5, .5]])
    assert d.score(items(MIX), state([E[0]]))[0] == pytest.approx(0.25, abs=1e-6)
    # collinear with a retained item → ~0; empty C → L_xx = w²
    assert d.score(items(E[0], 0.5 * E[0]), state([E[0]]))[:] == pytest.approx([0.0, 0.0], abs=1e-5)
    assert d.score(items(MIX, E[2], np.zeros(D)), state())[:] == pytest.approx([0.5, 0.0, 0.0], abs=1e-7)
    # a duplicated context stays finite and still says "redundant"
    assert d.score(items(MIX), state([MIX, MIX, MIX]))[0] == pytest.approx(0.0, abs=1e-5)


def test_dpp_retained_rows_without_relevance_drop_out():
    d = T.get("dpp")
    off = (-0.2 * E[0] + E[1]) / np.linalg.norm(-0.2 * E[0] + E[1])  # sim(off, q) < 0 → w = 0
    assert d.score(items(MIX), state([off]))[0] == pytest.approx(0.5, abs=1e-9)  # as with C empty: w_x² = 1/2
    assert d.score(items(MIX), state([off, E[1]]))[0] == pytest.approx(0.5, abs=1e-9)  # e1 also has w = 0
    # w_x² · GRN(x) is not the gain: GRN sees the zero-weight row
    assert 0.5 * T.get("grn").score(items(MIX), state([off]))[0] < 0.5 - 0.1
    # the kernel with the weights: L_xx − l_xᵀ(L_C + ρI)⁻¹l_x, here for C = {e0 (w = 1), off (w = 0)}
    got = d.score(items(MIX), state([E[0], off]))[0]
    assert got == pytest.approx(0.5 - 0.25 / (1 + 1e-6), abs=1e-9)  # = 1/2 − (1/2)²/(1 + ρ)
    assert d.score(items(MIX), state([np.zeros(D), E[0], np.zeros(D)]))[0] == pytest.approx(got, abs=1e-12)


def test_dpp_matches_determinant_ratio_when_well_conditioned():
    rng = np.random.default_rng(3)
    q = np.abs(rng.normal(size=D))
    vecs = np.abs(rng.normal(size=(4, D)))
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    w = vecs @ (q / np.linalg.norm(q))
    L = np.outer(w, w) * (vecs @ vecs.T)
    expected = np.linalg.det(L) / np.linalg.det(L[:3, :3])
    got = T.get("dpp").score(items(vecs[3]), state(list(vecs[:3]), query=q))[0]
    assert got == pytest.approx(expected, rel=1e-3)


def test_sc_per_token_on_three_point_pool():
    sc = T.get("sc")
    pool = items(E[0], E[1], MIX)  # p1 = e0, p2 = e1, p3 = (e0+e1)/√2; q = e0
    # C = {e0} covers p1: 1, p2: 0, p3: 1/√2. x = p3 (w = 1/√2) covers 1/2, 1/2, 1/√2 → gain 0 + 1/2 + 0
    s = state([E[0]], pool=pool)
    assert sc.score(items(MIX, tokens=[2]), s)[0] == pytest.approx(0.25, abs=1e-6)
    assert sc.score(items(E[1], tokens=[2]), s)[0] == pytest.approx(0.0, abs=1e-7)  # w(e1) = 0
    # empty C: F({x}) / cost = (1/2 + 1/2 + 1/√2) / 2
    assert sc.score(items(MIX, tokens=[2]), state(pool=pool))[0] == pytest.approx((1 + R2) / 2, abs=1e-6)
    # pool given as a raw array gives the same
    s_arr = state([E[0]], pool=pool.emb)
    assert sc.score(items(MIX, tokens=[2]), s_arr)[0] == pytest.approx(0.25, abs=1e-6)
    # exact set gain: E = {p3, e1} adds 1/2 (p2 via p3), cost 2 + 3
    assert set_gain(sc, items(MIX, E[1], tokens=[2, 3]), s) == pytest.approx(0.5 / 5, abs=1e-6)
    assert set_gain(sc, items(), s) == 0.0


def test_sc_default_pool_is_x_union_c():
    sc = T.get("sc")
    x = items(MIX, tokens=[1])
    explicit = state([E[0]], pool=items(MIX, E[0]))
    assert sc.score(x, state([E[0]]))[0] == pytest.approx(sc.score(x, explicit)[0])


def test_lexical_similarity_and_score():
    lex = T.get("lexical")
    q = "solar panel efficiency"
    s = State(query=Items([q], np.zeros((1, D))), context=Items(["wind turbine noise levels"], np.zeros((1, D))))
    out = lex.score(Items([q, "wind turbine noise levels", "", "unrelated words here"], np.zeros((4, D))), s)
    assert out[0] == pytest.approx(0.6, abs=1e-9)  # identical to the query, nothing shared with C
    assert out[1] == pytest.approx(-0.4, abs=1e-9)  # identical to C, nothing shared with the query
    assert out[2] == 0.0 and out[3] == 0.0
    assert T.lexical.jaccard([{1, 2}], [{1, 3}])[0, 0] == pytest.approx(1 / 3)
    sim = T.lexical.lex_sim(["a b c"], ["a b d", "a b c", "x"])
    assert sim[0, 1] == pytest.approx(1.0) and 0 < sim[0, 0] < 1 and sim[0, 2] == 0.0
    # bigram part alone: {ab, bc} vs {ab, bd}
    assert T.lexical.lex_sim(["a b c"], ["a b d"], w_tfidf=0.0)[0, 0] == pytest.approx(1 / 3)
    assert T.lexical.lex_sim(["Word"], ["word"])[0, 0] == pytest.approx(1.0)  # one-word texts


def test_hybrid_combination_and_sign():
    h = T.get("hybrid")
    pool = items(E[0], E[1], MIX)
    s = state([E[1]], pool=pool)
    x = items(MIX, E[0], tokens=[2, 2])
    sc = T.get("sc").score(x, s)
    grn = np.array([0.5, 1.0])
    rel = np.array([R2, 1.0])
    assert h.score(x, s) == pytest.approx(0.4 * rel + 0.3 * grn + 0.3 * sc, abs=1e-6)
    # novelty is rewarded: same relevance, the one outside span(C) scores higher
    s2 = state([(E[0] + E[2]) * R2])
    novel, dup = h.score(items((E[0] + E[3]) * R2, (E[0] + E[2]) * R2), s2)
    assert novel > dup
    literal = T.get("hybrid", beta=-0.30).score(items((E[0] + E[3]) * R2, (E[0] + E[2]) * R2), s2)
    assert literal[0] < literal[1]  # the paper's printed sign prefers the duplicate


@pytest.mark.parametrize("name", ["mmr", "grn", "cd", "dpp", "sc", "lexical", "hybrid"])
def test_edge_cases_every_teacher(name):
    m = T.get(name)
    empty_c = state()
    one = m.score(items(E[1]), empty_c)
    assert one.shape == (1,) and np.all(np.isfinite(one))
    zero = m.score(items(np.zeros(D), E[2]), state([E[0], E[0] + 1e-9 * E[1], np.zeros(D)]))
    assert zero.shape == (2,) and np.all(np.isfinite(zero))
    assert m.score(items(), state([E[0]])).shape == (0,)
    # empty context given as a width-less batch
    bare = State(query=items(E[0], texts=["q"]), context=Items([], np.zeros(0)))
    assert np.all(np.isfinite(m.score(items(E[1], E[2]), bare)))
    assert sorted(select(m, items(E[1], E[2]), bare, use_threshold=False)) == [0, 1]
    kept = gate(m, items(E[1]), empty_c)
    assert list(kept) == [0]  # single candidate: kept by threshold or fallback
    assert select(m, items(E[1]), state([E[0]])) == [0]


@pytest.mark.parametrize("name", ["mmr", "grn", "cd", "dpp", "sc", "hybrid"])
def test_dimension_mismatch_is_reported(name):
    s = State(query=items(E[0], texts=["q"]), context=Items(["c"], np.ones((1, 3))))
    with pytest.raises(MismatchError, match="dimension"):
        T.get(name).score(items(E[1]), s)


def test_gate_threshold_and_fallback():
    x = items(E[0], MIX, E[2])
    s = state()
    mmr = T.get("mmr")  # empty C: 0.35, 0.247, 0
    assert list(gate(mmr, x, s)) == [0]
    assert list(gate(T.get("mmr", threshold=0.2), x, s)) == [0, 1]
    strict = T.get("mmr", threshold=5.0)
    assert list(gate(strict, x, s)) == [0]  # nothing passes → best one
    assert list(gate(strict, x, s, fallback_top1=False)) == []
    assert list(gate(strict, items(), s)) == []


class LowerIsBetter:
    """Negated MMR: the same choices must come out with higher_is_better=False."""

    name, higher_is_better = "neg_mmr", False

    def __init__(self, threshold):
        self.threshold, self.inner = threshold, T.get("mmr")

    def score(self, x, state):
        return -self.inner.score(x, state)


def test_lower_is_better_models_work_in_gate_and_select():
    x = items(E[0], MIX, E[2], MIX)
    s = state()
    assert list(gate(LowerIsBetter(-0.2), x, s)) == list(gate(T.get("mmr", threshold=0.2), x, s))
    assert select(LowerIsBetter(10.0), x, s, use_threshold=False) == select(T.get("mmr"), x, s, use_threshold=False)


def test_select_respects_budgets_and_redundancy():
    x = items(E[0], E[0], MIX, E[2], tokens=[5, 5, 3, 4])
    s = state()
    grn = T.get("grn", threshold=0.1)
    first = select(grn, x, s, use_threshold=True)
    assert first[0] == 0 and 1 not in first  # the duplicate has 0 novelty once e0 is in C
    assert len(select(grn, x, s, max_items=2)) == 2
    chosen = select(grn, x, s, max_tokens=9)
    assert chosen == [0, 3]  # MIX (3 tokens) would bust 9 and is skipped; the duplicate fails the threshold
    # an item that does not fit is skipped, a later one that fits is still taken
    big_first = items(E[0], E[1], E[2], tokens=[2, 100, 3])
    assert select(T.get("cd", threshold=0.0), big_first, s, max_tokens=6) == [0, 2]
    # at least one item even if it alone busts the budget
    assert select(grn, items(E[0], tokens=[50]), s, max_tokens=1) == [0]
    assert select(grn, items(), s) == []


def test_set_gain_is_sequential_for_non_sc():
    mmr = T.get("mmr")
    s = state([E[1]])
    e = items(E[0], E[0], E[2])
    expected = (
        mmr.score(items(E[0]), s)[0]
        + mmr.score(items(E[0]), state([E[1], E[0]]))[0]
        + mmr.score(items(E[2]), state([E[1], E[0], E[0]]))[0]
    )
    assert set_gain(mmr, e, s) == pytest.approx(expected)
    assert set_gain(T.get("grn"), items(E[0], E[0], E[2]), state()) == pytest.approx(2.0)  # 1 + 0 + 1
    assert set_gain(T.get("dpp"), items(), s) == 0.0


def test_with_real_encoder(embed):
    q = "How do heat pumps work in cold climates?"
    texts = [
        "How do heat pumps work in cold climates?",
        "heat pump efficiency at low outdoor temperatures",
        "history of the Roman empire",
        "heat pump efficiency at low outdoor temperatures",
    ]
    vecs = embed(texts + [q])
    x = Items(texts, vecs[:4])
    s = State(query=Items([q], vecs[4:]), context=Items(texts[1:2], vecs[1:2]))
    scores = {name: T.get(name).score(x, s) for name in T.NAMES}
    for name, v in scores.items():
        assert v.shape == (4,) and np.all(np.isfinite(v)), name
    assert scores["grn"][1] < 1e-3 and scores["grn"][3] < 1e-3  # duplicates of C
    assert scores["grn"][2] > scores["grn"][0]  # off-topic is geometrically newer than the paraphrase
    assert scores["dpp"][1] < 1e-3 and scores["dpp"][0] > scores["dpp"][2]  # relevance weighs in
    cos = vecs[:4].astype(np.float64) @ vecs[4].astype(np.float64)
    assert scores["mmr"][1] == pytest.approx(0.35 * cos[1] - 0.65, abs=1e-4)  # a copy of C: max sim = 1
    assert scores["mmr"][0] == pytest.approx(0.35 - 0.65 * float(vecs[0] @ vecs[1]), abs=1e-4)
    assert scores["lexical"][1] == scores["lexical"][3] < -0.35  # copies of C (one shared word with Q)
    assert scores["lexical"][0] == max(scores["lexical"])
    picked = select(T.get("mmr"), x, State(s.query, Items.empty(vecs.shape[1])), max_items=3, use_threshold=False)
    assert picked[0] == 0 and not {1, 3} <= set(picked)  # never both copies
