"""Acceptance: the α kernel vs references, invariances, sparse bounds, whole dumps (the DP: test_analysis.py)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fastspec import exact
from fastspec.acceptance import acceptance_bounds, acceptance_rates, dump_acceptance
from fastspec.io import save_dump


def _softmax64(x, t=1.0):
    x = np.asarray(x, dtype=np.float64) / t
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _ref_alpha(P, Q, t=1.0):
    return np.minimum(_softmax64(P, t), _softmax64(Q, t)).sum(-1)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("V", [1, 7, 100, 8193])
def test_alpha_matches_numpy_reference(dtype, V):
    rng = np.random.default_rng(V)
    P = (rng.standard_normal((3, 4, V)) * 3).astype(dtype)
    Q = (P.astype(np.float64) + rng.standard_normal((3, 4, V))).astype(dtype)
    P[0, 0, : V // 2] = -np.inf  # masked tokens
    for t in (1.0, 0.6, 2.5):
        got = acceptance_rates(P, Q, temperature=t)
        assert got.shape == (3, 4) and got.dtype == np.float64
        np.testing.assert_allclose(got, _ref_alpha(P, Q, t), rtol=0, atol=1e-12)


def test_alpha_large_vocab_recompute_path():
    rng = np.random.default_rng(1)
    V = 70001  # above the scratch limit: the recompute branch
    P = rng.standard_normal((3, V)).astype(np.float32)
    Q = rng.standard_normal((3, V)).astype(np.float32)
    np.testing.assert_allclose(acceptance_rates(P, Q), _ref_alpha(P, Q), atol=1e-12, rtol=0)


def test_alpha_equals_fraction_path_on_small_cases():
    rng = np.random.default_rng(2)
    for _ in range(20):
        V = int(rng.integers(1, 8))
        x, y = rng.standard_normal(V), rng.standard_normal(V)
        p, q = _softmax64(x), _softmax64(y)
        res = exact.verify_step([Fraction(float(v)) for v in p], [Fraction(float(v)) for v in q], normalize=True)
        assert abs(float(res.acceptance) - acceptance_rates(x, y)) <= 1e-14
    # exact on dyadic probabilities: logits log(p) give p exactly up to exp rounding
    p = np.array([0.5, 0.25, 0.25])
    q = np.array([0.25, 0.25, 0.5])
    a = acceptance_rates(np.log(p), np.log(q))
    exact_alpha = exact.verify_step(["1/2", "1/4", "1/4"], ["1/4", "1/4", "1/2"]).acceptance
    assert float(exact_alpha) == pytest.approx(a, abs=1e-15)
    assert a == pytest.approx(0.75, abs=1e-15)


def test_filtered_matches_probabilities():
    from fastspec import probabilities

    rng = np.random.default_rng(3)
    P = rng.standard_normal((5, 40)) * 2
    Q = rng.standard_normal((5, 40)) * 2
    for kw in (dict(top_k=5), dict(top_p=0.7), dict(min_p=0.2, temperature=0.5), dict(top_k=3, top_p=0.9)):
        ref = np.minimum(probabilities(P, **kw), probabilities(Q, **kw)).sum(-1)
        np.testing.assert_allclose(acceptance_rates(P, Q, **kw), ref, atol=1e-12, rtol=0)
        ref16 = np.minimum(probabilities(P.astype(np.float16).astype(np.float32), **kw),
                           probabilities(Q.astype(np.float16).astype(np.float32), **kw)).sum(-1)
        np.testing.assert_allclose(acceptance_rates(P.astype(np.float16), Q.astype(np.float16), **kw), ref16,
                                   atol=1e-12, rtol=0)


def test_greedy():
    P = np.array([[1.0, 3.0, 3.0], [0.0, 1.0, 2.0]])
    Q = np.array([[5.0, 5.0, 0.0], [0.0, 0.0, 9.0]])
    # argmax with lowest index on ties: P row0 -> 1, Q row0 -> 0
    np.testing.assert_array_equal(acceptance_rates(P, Q, temperature=0), [0.0, 1.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=1, max_size=12), st.integers(0, 2**32 - 1))
def test_invariances(xs, seed):
    x = np.array(xs)
    y = x + np.random.default_rng(seed).standard_normal(x.size)
    a, b = acceptance_rates(x, y), acceptance_rates(y, x)
    assert a == pytest.approx(b, abs=1e-14)  # symmetric
    assert 0.0 <= a <= 1.0
    assert acceptance_rates(x, x) == pytest.approx(1.0, abs=1e-14)  # p == q
    assert acceptance_rates(x, x + 3.0) == pytest.approx(1.0, abs=1e-14)  # shift-invariant logits


def test_alpha_one_only_if_equal_and_zero_for_disjoint():
    x = np.array([0.0, 1.0, -np.inf, -np.inf])
    y = np.array([-np.inf, -np.inf, 2.0, 0.0])
    assert acceptance_rates(x, y) == 0.0
    assert acceptance_rates(x, np.array([0.0, 1.1, -np.inf, -np.inf])) < 1.0


@pytest.mark.parametrize("bad,msg", [(np.nan, "NaN"), (np.inf, r"\+inf")])
def test_alpha_rejects_bad_logits(bad, msg):
    x = np.zeros((2, 3, 5))
    y = np.zeros((2, 3, 5))
    y[1, 2, 4] = bad
    with pytest.raises(ValueError, match=rf"draft_logits row \[1, 2\] contains {msg}"):
        acceptance_rates(x, y)
    x[0, 1, :] = -np.inf
    with pytest.raises(ValueError, match=r"target_logits row \[0, 1\] has no finite"):
        acceptance_rates(x, np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match="same shape"):
        acceptance_rates(np.zeros((2, 5)), np.zeros((2, 6)))
    with pytest.raises(TypeError):
        acceptance_rates(np.zeros(3, dtype=complex), np.zeros(3))
    with pytest.raises(ValueError, match="temperature"):
        acceptance_rates(np.zeros(3), np.zeros(3), temperature=-1)


def _topk(lp, k):
    ids = np.argsort(-lp, axis=-1, kind="stable")[..., :k]
    return ids, np.take_along_axis(lp, ids, -1)


@pytest.mark.parametrize("V", [2, 5, 12])
def test_sparse_bounds_contain_dense(V):
    rng = np.random.default_rng(V)
    P = rng.standard_normal((300, V)) * rng.uniform(0.1, 4, (300, 1))
    Q = P * rng.uniform(0, 1.5, (300, 1)) + rng.standard_normal((300, V))
    P[:50, 0] = -np.inf
    with np.errstate(divide="ignore"):
        lp = np.log(_softmax64(P))
    lq = np.log(_softmax64(Q))
    dense = acceptance_rates(P, Q)
    prev_width = None
    for k in range(1, V + 1):
        for kq in {k, max(1, k - 1), V}:
            lo, hi = acceptance_bounds(*_topk(lp, k), *_topk(lq, kq), vocab_size=V)
            assert (lo <= dense + 1e-12).all() and (dense <= hi + 1e-12).all(), (k, kq)
            assert (lo >= 0).all() and (hi <= 1).all()
        width = float((hi - lo).mean())
        if k == V:
            np.testing.assert_allclose(lo, dense, atol=1e-12)
            np.testing.assert_allclose(hi, dense, atol=1e-12)
        prev_width = width
    assert prev_width is not None
    g_lo, g_hi = acceptance_bounds(*_topk(lp, 1), *_topk(lq, 1), greedy=True)
    np.testing.assert_array_equal(g_lo, acceptance_rates(P, Q, temperature=0))
    np.testing.assert_array_equal(g_hi, g_lo)


def test_sparse_bounds_validation():
    ids = np.array([[0, 1]])
    with pytest.raises(ValueError, match="draft_topk_ids"):
        acceptance_bounds(ids, np.log([[0.5, 0.3]]), np.array([[0, 0]]), np.log([[0.5, 0.3]]))
    with pytest.raises(ValueError, match="target_topk_logprobs"):
        acceptance_bounds(ids, np.array([[0.1, -1.0]]), ids, np.log([[0.5, 0.3]]))
    with pytest.raises(ValueError, match="outside"):
        acceptance_bounds(ids, np.log([[0.5, 0.3]]), np.array([[0, 9]]), np.log([[0.5, 0.3]]), vocab_size=5)


def test_dump_acceptance_dense_and_sparse(tmp_path):
    rng = np.random.default_rng(7)
    P = rng.standard_normal((3, 6, 20)).astype(np.float32)
    Q = (P + rng.standard_normal((3, 6, 20))).astype(np.float32)
    lengths = np.array([6, 2, 4])
    P0 = P.copy()
    P[1, 3:] = np.nan  # padding is never read as data
    path = save_dump(tmp_path / "d.npz", P, {"a": Q, "b": P}, lengths=lengths)
    res = dump_acceptance(path, temperature=0.7, max_bytes=200)  # tiny chunks
    valid = np.arange(6)[None] < lengths[:, None]
    ref = _ref_alpha(np.where(valid[..., None], P, 0), Q, 0.7)
    np.testing.assert_allclose(res["a"].alpha[valid], ref[valid], atol=1e-12)
    assert (res["a"].alpha[~valid] == 0).all()
    np.testing.assert_allclose(res["b"].alpha[valid], 1.0, atol=1e-12)

    lp = np.log(_softmax64(Q))
    lq = np.log(_softmax64(P0))
    sp = save_dump(tmp_path / "s", _topk(lp, 4), _topk(lq, 3), vocab_size=20)
    r = dump_acceptance(sp)["draft"]
    dense = _ref_alpha(Q, P0)
    assert (r.lower <= dense + 1e-12).all() and (dense <= r.upper + 1e-12).all()
    with pytest.raises(ValueError, match="full vocabulary"):
        dump_acceptance(sp, top_p=0.9)
    with pytest.raises(ValueError, match="full vocabulary"):
        dump_acceptance(sp, temperature=0.5)
    g = dump_acceptance(sp, temperature=0)["draft"]
    np.testing.assert_array_equal(g.lower, acceptance_rates(Q, P0, temperature=0))
