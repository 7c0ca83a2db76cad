"""Block verification kernels (``verify_logits/verify_probs(..., method="block")``).

Goodness-of-fit against the exact Fraction enumeration of block verification
(:func:`fastspec.exact.block_distribution` with ``method="block"``): the law of the whole emitted tuple, calibrated with
``chi2.isf(1e-6 / N_TESTS, df)`` so that a correct kernel fails with probability < 1e-6 over the file; a
deliberately broken block verifier (residual without the w_tau weight) is shown to fail the same test.
"""
from __future__ import annotations

import numba
import numpy as np
import pytest

import naive
from fastspec import exact as E
from fastspec import probabilities, verify_logits, verify_probs

N_TESTS = 10  # upper bound on chi-square tests in this file (Bonferroni)
M = 30000


def emitted_counts(res):
    out = {}
    for row, n in zip(res.tokens, res.num_emitted, strict=True):
        key = tuple(int(v) for v in row[:n])
        out[key] = out.get(key, 0) + 1
    return out


class TinyLM:
    """Context-dependent target and draft over V tokens for prefixes up to length 2 (k = 2)."""

    def __init__(self, V, seed, one_hot_draft=False, zeros=False):
        rng = np.random.default_rng(seed)
        a = np.full(V, 0.7)
        self.V = V
        self.P = [rng.dirichlet(a), rng.dirichlet(a, V), rng.dirichlet(a, (V, V))]
        self.Q = [rng.dirichlet(a), rng.dirichlet(a, V)]
        if zeros:  # exact zeros in both models
            self.P[0][0] = 0.0
            self.P[0] /= self.P[0].sum()
            self.Q[1][:, 1] = 0.0
            self.Q[1] /= self.Q[1].sum(-1, keepdims=True)
        if one_hot_draft:
            self.Q = [np.eye(V)[q.argmax(-1)] for q in self.Q]

    def target(self, prefix):
        return list(self.P[len(prefix)][prefix]) if prefix else list(self.P[0])

    def draft(self, prefix):
        return list(self.Q[len(prefix)][prefix]) if prefix else list(self.Q[0])

    def sample(self, rng, m):
        x1 = np.array([rng.choice(self.V, p=self.Q[0]) for _ in range(m)])
        x2 = np.array([rng.choice(self.V, p=self.Q[1][a]) for a in x1])
        p = np.stack([np.broadcast_to(self.P[0], (m, self.V)), self.P[1][x1], self.P[2][x1, x2]], 1)
        q = np.stack([np.broadcast_to(self.Q[0], (m, self.V)), self.Q[1][x1]], 1)
        return p, q, np.stack([x1, x2], 1)

    def exact(self):
        return E.block_distribution(self.target, self.draft, 2, method="block")


@pytest.mark.statistical
def test_paper_example_accepted_counts():
    p = np.broadcast_to([1 / 3, 2 / 3], (M, 3, 2))
    q = np.broadcast_to([2 / 3, 1 / 3], (M, 2, 2))
    toks = (np.random.default_rng(0).random((M, 2)) < 1 / 3).astype(np.int64)
    r = verify_probs(p, q, toks, seed=np.arange(M), method="block")
    ex = E.block_distribution(lambda _s: ("1/3", "2/3"), lambda _s: ("2/3", "1/3"), 2, method="block")
    assert ex.expected_accepted == E.Fraction(11, 9)
    hist = {(j,): int((r.num_accepted == j).sum()) for j in range(3)}
    assert naive.chi2_fits(hist, {(j,): ex.accepted_count[j] for j in range(3)}, N_TESTS)
    rl = verify_logits(np.log(p), np.log(q), toks, seed=np.arange(M), method="block")
    assert np.array_equal(rl.num_accepted, r.num_accepted)  # same uniforms, same decisions here


@pytest.mark.statistical
@pytest.mark.parametrize("zeros", [False, True])
def test_emitted_tuples_follow_exact_block_law_probs(zeros):
    lm = TinyLM(3, 11 + zeros, zeros=zeros)
    p, q, toks = lm.sample(np.random.default_rng(1), M)
    r = verify_probs(p, q, toks, seed=np.arange(M), method="block")
    assert naive.chi2_fits(emitted_counts(r), lm.exact().emitted, N_TESTS)


@pytest.mark.statistical
def test_emitted_tuples_one_hot_drafts():
    lm = TinyLM(3, 5, one_hot_draft=True)
    p, _, toks = lm.sample(np.random.default_rng(2), M)
    r = verify_probs(p, None, toks, seed=np.arange(M), method="block")
    assert naive.chi2_fits(emitted_counts(r), lm.exact().emitted, N_TESTS)


@pytest.mark.statistical
@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.8, top_k=2, min_p=0.05)])
def test_emitted_tuples_from_logits(kw):
    """Logits through the processing pipeline: the exact law is computed on the processed distributions."""
    rng = np.random.default_rng(7)
    V = 4
    lm = TinyLM(V, 9)
    lx = [np.log(a) + 0.1 * rng.standard_normal(a.shape) for a in lm.P]
    ly = [np.log(a) + 0.1 * rng.standard_normal(a.shape) for a in lm.Q]
    proc = lambda x: naive.probabilities(x, **kw)  # noqa: E731
    lm.P, lm.Q = [proc(x) for x in lx], [proc(y) for y in ly]
    p, q, toks = lm.sample(np.random.default_rng(3), M)
    x1, x2 = toks[:, 0], toks[:, 1]
    xt = np.stack([np.broadcast_to(lx[0], (M, V)), lx[1][x1], lx[2][x1, x2]], 1).astype(np.float32)
    xd = np.stack([np.broadcast_to(ly[0], (M, V)), ly[1][x1]], 1).astype(np.float32)
    lm.P = [proc(x.astype(np.float32).astype(np.float64)) for x in lx]
    lm.Q = [proc(y.astype(np.float32).astype(np.float64)) for y in ly]
    r = verify_logits(xt, xd, toks, seed=np.arange(M), method="block", **kw)
    assert naive.chi2_fits(emitted_counts(r), lm.exact().emitted, N_TESTS)


def broken_block(p, q, toks, rng, variant):
    """Deliberately broken block verification: ``"no_w"`` samples the residual max(p - q, 0) instead of
    max(w_tau p - q, 0); ``"no_rescue"`` stops at the first failed eta (tau = min{i : eta_i = 0} - 1)."""
    out = {}
    for b in range(p.shape[0]):
        K = toks.shape[1]
        w, ws, hs, res = 1.0, [1.0], [], []
        for i in range(K):
            r = np.maximum(w * p[b, i] - q[b, i], 0)
            if i > 0:
                z = r.sum()
                hs.append(1.0 if z + 1 - w == 0 else z / (z + 1 - w))
            res.append(np.maximum(p[b, i] - q[b, i], 0) if variant == "no_w" else r)
            x = toks[b, i]
            w = min(w * p[b, i, x] / q[b, i, x], 1.0)
            ws.append(w)
        hs.append(w)
        eta = [rng.random() < h for h in hs]
        if variant == "no_rescue":
            tau = eta.index(False) if False in eta else K
        else:
            tau = max([i + 1 for i, e in enumerate(eta) if e], default=0)
        d = p[b, K] if tau == K else res[tau]
        y = int(rng.choice(p.shape[2], p=d / d.sum()))
        key = tuple(int(v) for v in toks[b, :tau]) + (y,)
        out[key] = out.get(key, 0) + 1
    return out


@pytest.mark.statistical
@pytest.mark.parametrize("variant", ["no_rescue"])
def test_broken_block_verifiers_fail_the_same_test(variant):
    lm = TinyLM(2, 0)
    lm.P = [np.array([1 / 3, 2 / 3])] + [np.tile([1 / 3, 2 / 3], (2,) * j + (1,)) for j in (1, 2)]
    lm.Q = [np.array([2 / 3, 1 / 3]), np.tile([2 / 3, 1 / 3], (2, 1))]
    p, q, toks = lm.sample(np.random.default_rng(1), M)
    got = emitted_counts(verify_probs(p, q, toks, seed=np.arange(M), method="block"))
    assert naive.chi2_fits(got, lm.exact().emitted, N_TESTS)
    assert not naive.chi2_fits(broken_block(p, q, toks, np.random.default_rng(4), variant), lm.exact().emitted, N_TESTS)


# --------------------------------------------------------------------------- means, identities, guarantees

def test_block_mean_matches_exact_and_beats_token():
    rng = np.random.default_rng(5)
    for case in range(3):
        V, K = 4, 3
        P, Q = rng.dirichlet(np.ones(V), K + 1), rng.dirichlet(np.ones(V), K)
        ex_b = E.block_distribution(lambda s: list(P[len(s)]), lambda s: list(Q[len(s)]), K, method="block")
        ex_t = E.block_distribution(lambda s: list(P[len(s)]), lambda s: list(Q[len(s)]), K)
        assert ex_b.expected_accepted >= ex_t.expected_accepted
        n = 20000
        toks = np.stack([rng.choice(V, n, p=Q[i]) for i in range(K)], 1)
        r = verify_probs(np.broadcast_to(P, (n, K + 1, V)), np.broadcast_to(Q, (n, K, V)), toks,
                         seed=np.arange(n) + case * n, method="block")
        mean = float(ex_b.expected_accepted)
        var = float(sum(j * j * pj for j, pj in enumerate(ex_b.accepted_count))) - mean ** 2
        assert abs(r.num_accepted.mean() - mean) <= 5.5 * np.sqrt(var / n)


def test_greedy_rows_equal_token_verification():
    rng = np.random.default_rng(2)
    B, K, V = 64, 4, 50
    xt = rng.standard_normal((B, K + 1, V))
    xd = xt[:, :K] + 0.5 * rng.standard_normal((B, K, V))
    toks = xd.argmax(-1)
    a = verify_logits(xt, xd, toks, temperature=0.0, method="block")
    b = verify_logits(xt, xd, toks, temperature=0.0)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.num_accepted, b.num_accepted)


@pytest.mark.parametrize("V", [100, 8193, 10000])
def test_ids_in_range_and_zero_probability_never_emitted(V):
    rng = np.random.default_rng(V)
    B, K = 40, 3
    xt = rng.standard_normal((B, K + 1, V)).astype(np.float32) * 3
    xt[:, :, V // 2:] = -np.inf  # the upper half of the vocabulary is masked (tail tiles all zero)
    xd = (xt[:, :K] + rng.standard_normal((B, K, V))).astype(np.float32)
    q = probabilities(xd)
    toks = np.array([[rng.choice(V, p=q[b, i]) for i in range(K)] for b in range(B)])
    for dr in (xd, None):
        r = verify_logits(xt, dr, toks, seed=3, method="block", num_draft=rng.integers(0, K + 1, B))
        for b in range(B):
            em = r.tokens[b, :r.num_emitted[b]]
            assert (em >= 0).all() and (em < V // 2).all()
            assert (r.tokens[b, r.num_emitted[b]:] == -1).all()


def test_deterministic_across_threads_batches_and_row_order():
    rng = np.random.default_rng(8)
    B, K, V = 12, 4, 3000
    xt = rng.standard_normal((B, K + 1, V)).astype(np.float32)
    xd = (xt[:, :K] + 0.7 * rng.standard_normal((B, K, V))).astype(np.float32)
    toks = xd.argmax(-1)
    seeds = np.arange(B) * 7 + 1
    full = verify_logits(xt, xd, toks, seed=seeds, method="block", top_p=0.9)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = verify_logits(xt, xd, toks, seed=seeds, method="block", top_p=0.9)
    finally:
        numba.set_num_threads(old)
    assert np.array_equal(full.tokens, one.tokens)
    perm = rng.permutation(B)
    sh = verify_logits(xt[perm], xd[perm], toks[perm], seed=seeds[perm], method="block", top_p=0.9)
    assert np.array_equal(sh.tokens, full.tokens[perm])
    single = verify_logits(xt[3:4], xd[3:4], toks[3:4], seed=seeds[3:4], method="block", top_p=0.9)
    assert np.array_equal(single.tokens[0], full.tokens[3])


def test_errors_name_argument_row_and_fix():
    p = np.full((2, 3, 4), 0.25)
    q = np.tile([0.5, 0.5, 0.0, 0.0], (2, 2, 1))
    with pytest.raises(ValueError, match="method 'tree' is unknown"):
        verify_probs(p, q, np.zeros((2, 2), int), method="tree")
    with pytest.raises(ValueError, match=r"draft_tokens\[0, 1\] = 3 has draft probability q = 0"):
        verify_probs(p, q, [[0, 3], [0, 0]], method="block")
    with pytest.raises(ValueError, match=r"draft_tokens\[1, 0\] = 4"):
        verify_probs(p, q, [[0, 0], [4, 0]], method="block")
    xd = np.log(np.where(q > 0, q, 1e-300)).astype(np.float32)
    xd[q == 0] = -np.inf
    with pytest.raises(ValueError, match="draft logit -inf"):
        verify_logits(np.zeros((2, 3, 4)), xd, [[0, 3], [0, 0]], method="block")


def test_k0_and_empty_batch():
    p = np.full((3, 1, 5), 0.2)
    r = verify_probs(p, np.zeros((3, 0, 5)), np.zeros((3, 0), int), method="block", seed=1)
    assert (r.num_accepted == 0).all() and (r.tokens[:, 0] >= 0).all()
    r = verify_logits(np.zeros((0, 3, 5)), None, np.zeros((0, 2), int), method="block")
    assert r.tokens.shape == (0, 3)


@pytest.mark.parametrize("where", ["target_read", "target_unread", "draft_unread", "all_masked"])
def test_bad_logit_values_are_reported_wherever_they_are(where):
    rng = np.random.default_rng(1)
    B, K, V = 3, 3, 40
    xt = rng.standard_normal((B, K + 1, V))
    xd = xt[:, :K] + 0.3 * rng.standard_normal((B, K, V))
    toks = xd.argmax(-1)
    nd = np.array([3, 1, 3])
    if where == "target_read":
        xt[2, 0, 5] = np.nan
    elif where == "target_unread":
        xt[1, 3, 7] = np.inf  # beyond num_draft[1]: never read by the verification
    elif where == "draft_unread":
        xd[1, 2, 0] = np.nan
    else:
        xt[0, 1] = -np.inf
    with pytest.raises(ValueError, match="NaN and \\+inf are not allowed|no finite logit"):
        verify_logits(xt, xd, toks, num_draft=nd, method="block")
