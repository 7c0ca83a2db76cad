"""Calibrated goodness-of-fit: emitted tokens follow the target distribution.

Each test uses fixed seeds and a chi-square threshold ``chi2.isf(1e-6 / N_TESTS, df)``
so that a correct kernel fails with probability < 1e-6 over the whole file; deliberately
broken verifiers (residual not normalized, resampling from p) are shown to fail the same test.
"""
from __future__ import annotations

import numpy as np
import pytest

import naive
from fastspec import probabilities, verify_logits, verify_probs

pytestmark = pytest.mark.statistical

N_TESTS = 16  # upper bound on chi-square tests run in this file (Bonferroni)


def fits(counts, probs):
    """:func:`naive.chi2_fits` with this file's Bonferroni count."""
    return naive.chi2_fits(counts, probs, N_TESTS)


def first_token_counts(tokens, V):
    return np.bincount(tokens[:, 0], minlength=V)


# --------------------------------------------------------------------------- broken variants (NumPy)
def broken_verify(p, q, toks, rng, variant):
    """First emitted token of a deliberately broken verifier (one row at a time)."""
    out = np.empty(p.shape[0], dtype=np.int64)
    V = p.shape[-1]
    for b in range(p.shape[0]):
        x = toks[b, 0]
        if rng.random() * q[b, 0, x] <= p[b, 0, x]:
            out[b] = x
            continue
        r = np.maximum(p[b, 0] - q[b, 0], 0)
        if variant == "resample_p":
            r = p[b, 0]
            out[b] = naive.sample_inverse_cdf(r, rng.random())
        else:  # residual not normalized: inverse CDF against u, not u * sum; fall off -> last id
            c = np.cumsum(r)
            hit = np.flatnonzero(c >= rng.random())
            out[b] = hit[0] if hit.size else V - 1
    return out[:, None]


def make_pq(rng, V, N, K=2):
    p1 = rng.dirichlet(np.ones(V), K + 1)
    q1 = rng.dirichlet(np.ones(V), K)
    p = np.broadcast_to(p1, (N, K + 1, V))
    q = np.broadcast_to(q1, (N, K, V))
    toks = np.stack([rng.choice(V, N, p=q1[i]) for i in range(K)], 1)
    return p, q, toks


N = 20000


def test_first_token_follows_p_and_broken_variants_fail():
    rng = np.random.default_rng(123)
    V = 6
    p, q, toks = make_pq(rng, V, N)
    r = verify_probs(p, q, toks, seed=np.arange(N))
    assert fits(first_token_counts(r.tokens, V), p[0, 0])
    for variant in ("resample_p", "unnormalized"):
        bad = broken_verify(p, q, toks, np.random.default_rng(1), variant)
        assert not fits(first_token_counts(bad, V), p[0, 0]), variant


def test_first_token_one_hot_drafts_and_ragged():
    rng = np.random.default_rng(7)
    V = 5
    p, _, _ = make_pq(rng, V, N)
    toks = rng.integers(0, V, (N, 2))  # deterministic proposer: any token
    nd = rng.integers(0, 3, N)
    r = verify_probs(p, None, toks, num_draft=nd, seed=11)
    assert fits(first_token_counts(r.tokens, V), p[0, 0])


@pytest.mark.parametrize("kw", [dict(temperature=0.8, top_k=4), dict(top_p=0.7), dict(temperature=1.3, min_p=0.1)])
def test_first_token_follows_processed_target_logits(kw):
    rng = np.random.default_rng(len(kw))
    V, K = 9, 2
    xt1 = rng.standard_normal((K + 1, V)) * 1.5
    xd1 = xt1[:K] + rng.standard_normal((K, V))
    q1 = probabilities(xd1, **kw)
    toks = np.stack([rng.choice(V, N, p=q1[i]) for i in range(K)], 1)
    # contiguous copies (N x 27 floats): the broadcast (stride-0) layout is covered by the greedy test below, and
    # each layout is one more compiled kernel
    xt = np.ascontiguousarray(np.broadcast_to(xt1, (N, K + 1, V)))
    xd = np.ascontiguousarray(np.broadcast_to(xd1, (N, K, V)))
    r = verify_logits(xt, xd, toks, seed=5, **kw)
    p1 = naive.probabilities_row(xt1[0], **kw)
    assert fits(first_token_counts(r.tokens, V), p1)


def test_greedy_rows_are_exact_and_mixed_batches_fit():
    rng = np.random.default_rng(3)
    V, K = 7, 2
    xt1 = rng.standard_normal((K + 1, V))
    xt = np.broadcast_to(xt1, (N, K + 1, V))
    toks = rng.integers(0, V, (N, K))
    temp = np.where(np.arange(N) % 2 == 0, 0.0, 1.0)
    r = verify_logits(xt, None, toks, temperature=temp, seed=9)
    g = r.tokens[::2, 0]
    assert (g == xt1[0].argmax()).all()
    assert fits(first_token_counts(r.tokens[1::2], V), naive.probabilities_row(xt1[0]))


# --------------------------------------------------------------------------- joint of the first two emitted tokens
def test_joint_of_first_two_tokens_follows_sequential_target():
    """A tiny context-dependent language model: p(.|prefix), q(.|prefix) for prefixes up to length 2.
    The first two emitted tokens (from one verify step, or two when the first step emits one)
    must follow p(a | ()) * p(b | a)."""
    rng = np.random.default_rng(2024)
    V, M = 4, 40000
    P0, P1, P2 = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V), V), rng.dirichlet(np.ones(V), (V, V))
    Q0, Q1 = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V), V)
    x1 = rng.choice(V, M, p=Q0)
    x2 = np.array([rng.choice(V, p=Q1[a]) for a in x1])
    p = np.stack([np.broadcast_to(P0, (M, V)), P1[x1], P2[x1, x2]], 1)
    q = np.stack([np.broadcast_to(Q0, (M, V)), Q1[x1]], 1)
    r = verify_probs(p, q, np.stack([x1, x2], 1), seed=np.arange(M))
    first = r.tokens[:, 0]
    second = r.tokens[:, 1].copy()
    need = r.num_emitted == 1
    a = first[need]
    y = np.array([rng.choice(V, p=Q1[t]) for t in a])
    p2 = np.stack([P1[a], P2[a, y]], 1)
    r2 = verify_probs(p2, Q1[a][:, None], y[:, None], seed=np.arange(M, M + a.size))
    second[need] = r2.tokens[:, 0]
    joint = np.zeros((V, V))
    np.add.at(joint, (first, second), 1)
    expected = P0[:, None] * P1
    assert fits(joint, expected)
    # the same test rejects a verifier that resamples from p on rejection (first token biased)
    bad_first = broken_verify(p, q, np.stack([x1, x2], 1), np.random.default_rng(5), "resample_p")[:, 0]
    bad = np.zeros((V, V))
    np.add.at(bad, (bad_first, second), 1)
    assert not fits(bad, expected)
