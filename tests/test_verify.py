"""verify_logits / verify_probs: peer cases, exact-path agreement, naive agreement, edges, determinism, bad input."""
from __future__ import annotations

from fractions import Fraction

import numba
import numpy as np
import pytest

import naive
from fastspec import exact, probabilities, row_seeds, sample_tokens, verify_logits, verify_probs
from fastspec._numba.rng import Stream, position_uniform
from kernel_probes import verification_distributions, verification_distributions_logits


def onehot_logits(argmaxes, V=8):
    x = np.zeros((len(argmaxes), V))
    x[np.arange(len(argmaxes)), argmaxes] = 5.0
    return x


# --------------------------------------------------------------------------- peer cases
def test_greedy_peer_cases():
    x = onehot_logits([1, 5, 3, 4])[None]
    assert verify_logits(x, None, [[1, 2, 3]], temperature=0).tokens.tolist() == [[1, 5, -1, -1]]
    x = onehot_logits([1, 2, 3, 4])[None]
    r = verify_logits(x, None, [[1, 2, 3]], temperature=0)
    assert r.tokens.tolist() == [[1, 2, 3, 4]] and r.num_accepted.tolist() == [3] and r.num_emitted.tolist() == [4]
    # with draft logits too: greedy ignores q
    d = onehot_logits([1, 2, 3])[None]
    assert verify_logits(x, d, [[1, 2, 3]], temperature=0).tokens.tolist() == [[1, 2, 3, 4]]


def test_ragged_greedy_peer_case():
    x = np.stack([onehot_logits([1, 2, 5]), onehot_logits([3, 4, 0])])
    r = verify_logits(x, None, [[1, 2], [3, -1]], num_draft=[2, 1], temperature=0)
    assert r.tokens.tolist() == [[1, 2, 5], [3, 4, -1]]
    assert r.num_accepted.tolist() == [2, 1] and r.num_emitted.tolist() == [3, 2]


def test_flashinfer_peer_case_every_seed():
    q = np.array([[[.1, .2, .3, .4], [.2, .3, .4, .1]]])
    p = np.array([[[0, .1, .6, .3], [1, 0, 0, 0], [.7, .1, .1, .1]]])
    for s in range(200):
        assert verify_probs(p, q, [[2, 1]], seed=s).tokens.tolist() == [[2, 0, -1]]
    lp = np.log(np.where(p > 0, p, 0) + 0.0, where=p > 0, out=np.full_like(p, -np.inf))
    lq = np.log(q)
    for s in range(50):
        assert verify_logits(lp, lq, [[2, 1]], seed=s).tokens.tolist() == [[2, 0, -1]]


# --------------------------------------------------------------------------- exact path
def dyadic_dist(rng, V, zeros=0):
    w = rng.integers(1, 64, V)
    w[rng.choice(V, zeros, replace=False)] = 0
    f = [Fraction(int(a), int(w.sum())) for a in w]
    return f, np.array([float(a) for a in f])


@pytest.mark.parametrize("V", [2, 5, 9])
def test_agrees_with_exact_path(V):
    rng = np.random.default_rng(V)
    for trial in range(30):
        pf, p = dyadic_dist(rng, V, zeros=trial % 2)
        qf, q = dyadic_dist(rng, V, zeros=(trial // 2) % 2)
        step = exact.verify_step(p, q, normalize=True)
        for x in np.flatnonzero(q > 0):
            acc, rec, under = verification_distributions(p, q, int(x))
            assert abs(acc * q[x] - float(step.accepted[x])) <= 1e-12
            if step.recovered is None or acc >= 1:
                continue
            assert not under
            np.testing.assert_allclose(rec, [float(r) for r in step.recovered], rtol=0, atol=1e-12)
        # one-hot draft on x: q = e_x
        x = int(rng.integers(V))
        e = np.zeros(V)
        e[x] = 1
        step = exact.verify_step(p, e, normalize=True)
        acc, rec, _ = verification_distributions(p, None, x)
        assert abs(acc - float(step.acceptance)) <= 1e-12
        if step.recovered is not None:
            np.testing.assert_allclose(rec, [float(r) for r in step.recovered], atol=1e-12)


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.7, top_k=4), dict(top_p=0.8, min_p=0.05)])
def test_logits_path_agrees_with_exact_path(kw):
    rng = np.random.default_rng(7)
    V = 12
    for _ in range(10):
        x, y = rng.standard_normal(V) * 2, rng.standard_normal(V) * 2
        p, q = probabilities(x, **kw), probabilities(y, **kw)
        np.testing.assert_allclose(p, naive.probabilities_row(x, **kw), atol=1e-12)
        tok = int(np.flatnonzero(q > 0)[0])
        step = exact.verify_step(p, q, normalize=True)
        px, qx, rec = verification_distributions_logits(x, y, tok, **kw)
        assert abs(px - p[tok]) <= 1e-12 and abs(qx - q[tok]) <= 1e-12
        if step.recovered is not None:
            np.testing.assert_allclose(rec, [float(r) for r in step.recovered], atol=1e-12)
        px, qx, rec = verification_distributions_logits(x, None, tok, **kw)
        step = exact.verify_step(p, np.eye(V)[tok], normalize=True)
        if step.recovered is not None:
            np.testing.assert_allclose(rec, [float(r) for r in step.recovered], atol=1e-12)


# --------------------------------------------------------------------------- naive agreement (same uniforms)
def naive_batch(p, q, toks, nd, seeds):
    B, K1, V = p.shape
    out = np.full((B, K1), -1)
    for b in range(B):
        n = nd[b]
        ua = [position_uniform(seeds[b], i, Stream.ACCEPT) for i in range(n)]
        em = naive.verify_with_uniforms(p[b], None if q is None else q[b], toks[b, :n], ua, 0.0)
        pos = len(em) - 1
        bonus = pos == n and len(em) == n + 1 and all(
            ua[i] * (1 if q is None else q[b, i, toks[b, i]]) <= p[b, i, toks[b, i]] for i in range(n))
        us = position_uniform(seeds[b], pos, Stream.BONUS if bonus else Stream.RESIDUAL)
        em = naive.verify_with_uniforms(p[b], None if q is None else q[b], toks[b, :n], ua, us)
        out[b, :len(em)] = em
    return out


@pytest.mark.parametrize("V", [3, 100, 8193])
@pytest.mark.parametrize("onehot", [False, True])
def test_probs_kernel_matches_naive(V, onehot):
    rng = np.random.default_rng(V + onehot)
    B, K = 16, 3
    p = rng.dirichlet(np.full(V, 0.3), (B, K + 1))
    q = rng.dirichlet(np.full(V, 0.3), (B, K))
    toks = np.array([[rng.choice(V, p=q[b, i]) for i in range(K)] for b in range(B)])
    nd = rng.integers(0, K + 1, B)
    seeds = row_seeds(11, B)
    r = verify_probs(p, None if onehot else q, toks, num_draft=nd, seed=11)
    np.testing.assert_array_equal(r.tokens, naive_batch(p, None if onehot else q, toks, nd, seeds))
    assert (r.tokens < V).all()


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.8, top_k=50, top_p=0.9), dict(min_p=0.05)])
def test_logits_kernel_matches_naive(kw):
    rng = np.random.default_rng(5)
    B, K, V = 12, 4, 8193
    xt = (rng.standard_normal((B, K + 1, V)) * 3).astype(np.float32)
    xd = xt[:, :K] + rng.standard_normal((B, K, V)).astype(np.float32)
    p = naive.probabilities(xt, **kw)
    q = naive.probabilities(xd, **kw)
    toks = np.array([[rng.choice(V, p=q[b, i]) for i in range(K)] for b in range(B)])
    r = verify_logits(xt, xd, toks, seed=3, **kw)
    np.testing.assert_array_equal(r.tokens, naive_batch(p, q, toks, np.full(B, K), row_seeds(3, B)))
    r = verify_logits(xt, None, toks, seed=3, **kw)
    np.testing.assert_array_equal(r.tokens, naive_batch(p, None, toks, np.full(B, K), row_seeds(3, B)))


# --------------------------------------------------------------------------- edge cases
def test_p_equals_q_never_rejects():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(7), (20, 4))
    toks = rng.integers(0, 7, (20, 3))
    r = verify_probs(p, p[:, :3], toks, seed=1)
    assert (r.num_accepted == 3).all() and (r.residual_underflows == 0).all()
    x = np.log(p)
    r = verify_logits(x, np.ascontiguousarray(x[:, :3]), toks, seed=1)  # contiguous: no extra compiled layout
    assert (r.num_accepted == 3).all() and np.isfinite(r.tokens).all()


def test_p_zero_where_q_positive_rejects_and_q_zero_where_p_positive():
    p = np.array([[[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]]])
    q = np.array([[[0.5, 0.5, 0.0]]])
    for s in range(50):
        r = verify_probs(p, q, [[0]], seed=s)
        assert r.num_accepted[0] == 0 and r.tokens[0, 0] == 2  # residual is all on token 2


def _find_seed(threshold):
    @numba.njit
    def go(th):
        for s in range(50_000_000):
            if position_uniform(s, 0, Stream.ACCEPT) > th:
                return s
        return -1
    return go(threshold)


def test_residual_underflow_falls_back_to_p():
    s = _find_seed(1 - 4e-7)
    p = np.array([[[1 - 5e-7, 0.0], [0.5, 0.5]]])
    q = np.array([[[1.0, 0.0]]])
    r = verify_probs(p, q, [[0]], seed=[s])
    assert r.num_accepted[0] == 0 and r.residual_underflows[0] == 1 and r.tokens[0, 0] == 0
    acc, rec, under = verification_distributions(p[0, 0], q[0, 0], 0)
    assert under and rec.tolist() == [1.0, 0.0]


def test_all_minus_inf_but_one_v1_k0_float16_boundary():
    V = 151936
    x = np.full((2, 2, V), -np.inf, dtype=np.float32)
    x[:, :, V - 1] = 0.0
    d = np.zeros((2, 1, V), dtype=np.float32)
    r = verify_logits(x, d, [[V - 1], [0]], seed=2)
    assert r.tokens[0].tolist() == [V - 1, V - 1]
    assert r.tokens[1].tolist() == [V - 1, -1]  # token 0 has p = 0: rejected, recovered V-1
    assert verify_logits(np.zeros((3, 3, 1)), np.zeros((3, 2, 1)), np.zeros((3, 2), int)).tokens.tolist() == \
        [[0, 0, 0]] * 3
    r = verify_logits(np.random.default_rng(0).standard_normal((4, 1, 100)), np.zeros((4, 0, 100)),
                      np.zeros((4, 0), int))
    assert (r.num_emitted == 1).all() and ((r.tokens >= 0) & (r.tokens < 100)).all()
    h = np.random.default_rng(1).standard_normal((3, 4, 50)).astype(np.float16)
    r16 = verify_logits(h, np.ascontiguousarray(h[:, :3]), [[1, 2, 3]] * 3, seed=4)
    r32 = verify_logits(h.astype(np.float32), h[:, :3].astype(np.float32), [[1, 2, 3]] * 3, seed=4)
    np.testing.assert_array_equal(r16.tokens, r32.tokens)


def test_num_draft_zero_rows_and_mixed_greedy():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 30))
    toks = x[:, :2].argmax(-1)
    r = verify_logits(x, x[:, :2], toks, num_draft=[0, 2, 0, 1], temperature=[0.0, 0.0, 1.0, 1.0], seed=5)
    assert r.tokens[0].tolist() == [x[0, 0].argmax(), -1, -1]
    assert r.tokens[1].tolist() == [toks[1, 0], toks[1, 1], x[1, 2].argmax()]
    assert r.num_emitted.tolist()[0] == 1 and r.tokens[2, 1] == -1


@pytest.mark.parametrize("V", [100, 8193, 10000, 151936])
def test_ids_below_vocab(V):
    rng = np.random.default_rng(V)
    x = (rng.standard_normal((3, 3, V)) * 4).astype(np.float32)
    cut = V - min(2000, V // 4)
    x[:, :, cut:] = -np.inf
    d = rng.standard_normal((3, 2, V)).astype(np.float32)
    toks = sample_tokens(d, rng.random((3, 2)) + 1e-9, top_p=0.95)  # drafts the processed q can propose
    r = verify_logits(x, d, toks, seed=9, top_p=0.95)
    assert ((r.tokens[:, 0] >= 0) & (r.tokens < V)).all() and (r.tokens[r.tokens >= 0] < cut).all()


# --------------------------------------------------------------------------- determinism
def test_seeded_determinism_threads_and_batching():
    rng = np.random.default_rng(8)
    B, K, V = 12, 4, 3000
    xt = rng.standard_normal((B, K + 1, V)).astype(np.float32)
    xd = rng.standard_normal((B, K, V)).astype(np.float32)
    toks = rng.integers(0, V, (B, K))
    kw = dict(temperature=np.linspace(0, 1.5, B), top_p=1.0, seed=42)
    a = verify_logits(xt, xd, toks, **kw).tokens
    assert (verify_logits(xt, xd, toks, **kw).tokens == a).all()
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert (verify_logits(xt, xd, toks, **kw).tokens == a).all()
    finally:
        numba.set_num_threads(old)
    seeds = row_seeds(42, B)
    for b in range(B):
        one = verify_logits(xt[b:b + 1], xd[b:b + 1], toks[b:b + 1], temperature=kw["temperature"][b:b + 1],
                            top_p=1.0, seed=seeds[b:b + 1]).tokens
        assert (one == a[b:b + 1]).all()
    perm = rng.permutation(B)
    c = verify_logits(xt[perm], xd[perm], toks[perm], temperature=kw["temperature"][perm], top_p=1.0,
                      seed=seeds[perm]).tokens
    assert (c == a[perm]).all()
    ro = xt.copy()
    ro.setflags(write=False)
    assert (verify_logits(np.asfortranarray(ro), xd, toks, **kw).tokens == a).all()


# --------------------------------------------------------------------------- bad inputs
def _ok():
    return np.zeros((2, 3, 5)), np.zeros((2, 2, 5)), np.zeros((2, 2), dtype=int)


@pytest.mark.parametrize("mutate, exc, pat", [
    (lambda t, d, k: (np.where(np.arange(5) == 1, np.nan, t), d, k, {}), ValueError, r"target_logits\[0, 0, 1\]"),
    (lambda t, d, k: (t, np.where(np.arange(5) == 1, np.inf, d), k, {}), ValueError, "draft_logits"),
    (lambda t, d, k: (t[0], d, k, {}), ValueError, "target_logits"),
    (lambda t, d, k: (t, d[:, :1], k, {}), ValueError, "draft_logits"),
    (lambda t, d, k: (t, d, k[:, :1], {}), ValueError, "draft_tokens"),
    (lambda t, d, k: (t, d, k + 0.5, {}), TypeError, "draft_tokens"),
    (lambda t, d, k: (t, d, k + 5, {}), ValueError, r"draft_tokens\[0, 0\]"),
    (lambda t, d, k: (t, d, k - 1, {}), ValueError, "padding"),
    (lambda t, d, k: (t, d, k, dict(temperature=-1)), ValueError, "temperature"),
    (lambda t, d, k: (t, d, k, dict(top_p=0.0)), ValueError, "top_p"),
    (lambda t, d, k: (t, d, k, dict(top_p=1.1)), ValueError, "top_p"),
    (lambda t, d, k: (t, d, k, dict(top_k=-1)), ValueError, "top_k"),
    (lambda t, d, k: (t, d, k, dict(min_p=1.0)), ValueError, "min_p"),
    (lambda t, d, k: (t, d, k, dict(num_draft=[3, 0])), ValueError, "num_draft"),
    (lambda t, d, k: (t, d, k, dict(seed=1.5)), TypeError, "seed"),
    (lambda t, d, k: (t, np.where(np.arange(5) == 0, -np.inf, d), k, {}), ValueError, r"draft_tokens\[0, 0\]"),
])
def test_bad_inputs_logits(mutate, exc, pat):
    t, d, k, kw = mutate(*_ok())
    with pytest.raises(exc, match=pat):
        verify_logits(t, d, k, **kw)


def test_bad_inputs_probs():
    p = np.full((1, 2, 4), 0.25)
    with pytest.raises(ValueError, match="target_probs"):
        verify_probs(p * 1.1, p[:, :1], [[0]])
    with pytest.raises(ValueError, match="draft_probs"):
        verify_probs(p, -p[:, :1], [[0]])
    q = np.array([[[0.0, 0.5, 0.5, 0.0]]])
    with pytest.raises(ValueError, match=r"draft_tokens\[0, 0\].*q = 0"):
        verify_probs(p, q, [[0]])
    with pytest.raises(ValueError, match=r"draft_tokens\[0, 0\]"):
        verify_probs(p, None, [[4]])
    with pytest.raises(ValueError, match=r"num_draft\[0\]"):
        verify_probs(p, None, [[1]], num_draft=[2])
    # -1 padding beyond num_draft is fine
    assert verify_probs(p, None, [[-1]], num_draft=[0], seed=1).num_emitted.tolist() == [1]


def test_filtered_q_zero_is_reported():
    x = np.array([[[3.0, 2.0, 1.0, 0.0]] * 2])
    with pytest.raises(ValueError, match=r"draft_tokens\[0, 0\]"):
        verify_logits(x, x[:, :1], [[3]], top_k=2)
