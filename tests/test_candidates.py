"""Multi-candidate and token-tree verification kernels (``fastspec.candidates``).

The law of the whole emitted tuple of a depth-2 tree with two candidates per node is compared with the exact
Fraction enumeration (:func:`fastspec.exact.block_distribution` with ``method="candidates"``) by a chi-square test
calibrated with
``chi2.isf(1e-6 / N_TESTS, df)``; a deliberately broken multi-candidate verifier (residual not updated between
candidates) is shown to fail the same test.
"""
from __future__ import annotations

import numba
import numpy as np
import pytest

import naive
from fastspec import exact as E
from fastspec.candidates import (candidate_acceptance, parent_from_siblings, verify_tree_logits,
                                 verify_tree_probs)

N_TESTS = 8
M = 30000
PARENT = np.array([-1, 0, 0, 1, 1, 2, 2])  # root, two children, two grandchildren each
FIRST_CHILD = np.array([1, 3, 5, -1, -1, -1, -1])
NEXT_SIBLING = np.array([-1, 2, -1, 4, -1, 6, -1])


def emitted_counts(res):
    out = {}
    for row, n in zip(res.tokens, res.num_emitted, strict=True):
        key = tuple(int(v) for v in row[:n])
        out[key] = out.get(key, 0) + 1
    return out


def draw(q, u):
    c = np.cumsum(q, -1)
    idx = (c < (u * c[:, -1])[:, None]).sum(-1)
    return np.minimum(idx, q.shape[1] - 1)


class TinyTreeLM:
    def __init__(self, V, seed):
        rng = np.random.default_rng(seed)
        a = np.full(V, 0.8)
        self.V = V
        self.P = [rng.dirichlet(a), rng.dirichlet(a, V), rng.dirichlet(a, (V, V))]
        self.Q = [rng.dirichlet(a), rng.dirichlet(a, V)]

    def target(self, s):
        return list(self.P[len(s)][s]) if s else list(self.P[0])

    def draft(self, s):
        return list(self.Q[len(s)][s]) if s else list(self.Q[0])

    def children(self, q, rng, sampling):
        m = q.shape[0]
        if sampling == "deterministic":
            order = np.argsort(-q, axis=1, kind="stable")
            return order[:, 0], order[:, 1]
        a = draw(q, rng.random(m))
        if sampling == "iid":
            return a, draw(q, rng.random(m))
        q2 = q.copy()
        q2[np.arange(m), a] = 0.0
        return a, draw(q2, rng.random(m))

    def trees(self, rng, m, sampling):
        V = self.V
        toks = np.zeros((m, 7), np.int64)
        q0 = np.broadcast_to(self.Q[0], (m, V))
        toks[:, 1], toks[:, 2] = self.children(q0, rng, sampling)
        for node, kids in ((1, (3, 4)), (2, (5, 6))):
            toks[:, kids[0]], toks[:, kids[1]] = self.children(self.Q[1][toks[:, node]], rng, sampling)
        pt = np.empty((m, 7, V))
        pd = np.full((m, 7, V), 1.0 / V)
        pt[:, 0] = self.P[0]
        pd[:, 0] = self.Q[0]
        for n in (1, 2):
            pt[:, n] = self.P[1][toks[:, n]]
            pd[:, n] = self.Q[1][toks[:, n]]
        for n in (3, 4, 5, 6):
            pt[:, n] = self.P[2][toks[:, PARENT[n]], toks[:, n]]
        return pt, pd, toks

    def exact(self, sampling):
        return E.block_distribution(self.target, self.draft, 2, method="candidates", widths=(2, 2),
                                    candidate_sampling=sampling)


@pytest.mark.statistical
@pytest.mark.parametrize("sampling", ["iid", "without_replacement", "deterministic"])
def test_tree_emissions_follow_exact_law(sampling):
    lm = TinyTreeLM(3, {"iid": 1, "without_replacement": 2, "deterministic": 3}[sampling])
    pt, pd, toks = lm.trees(np.random.default_rng(4), M, sampling)
    r = verify_tree_probs(pt, None if sampling == "deterministic" else pd, toks, parent=np.tile(PARENT, (M, 1)),
                          candidate_sampling=sampling, seed=np.arange(M))
    ex = lm.exact(sampling)
    assert ex.exact
    assert naive.chi2_fits(emitted_counts(r), ex.emitted, N_TESTS)
    # the path names the accepted nodes
    for b in range(50):
        for d in range(r.num_accepted[b]):
            assert toks[b, r.path[b, d]] == r.tokens[b, d]


def broken_tree_first_token(pt, pd, toks, rng):
    """Multi-candidate verification that judges every candidate against p (residual never updated)."""
    out = np.empty(pt.shape[0], np.int64)
    for b in range(pt.shape[0]):
        p, q = pt[b, 0], pd[b, 0]
        for c in (1, 2):
            x = toks[b, c]
            if rng.random() * q[x] <= p[x]:
                out[b] = x
                break
        else:
            r = np.maximum(p - q, 0)
            out[b] = rng.choice(len(p), p=r / r.sum())
    return out


@pytest.mark.statistical
def test_broken_multi_candidate_verifier_fails():
    lm = TinyTreeLM(3, 1)
    pt, pd, toks = lm.trees(np.random.default_rng(4), M, "iid")
    bad = broken_tree_first_token(pt, pd, toks, np.random.default_rng(0))
    expected = {(i,): lm.P[0][i] for i in range(3)}
    r = verify_tree_probs(pt, pd, toks, parent=np.tile(PARENT, (M, 1)), seed=np.arange(M))
    assert naive.chi2_fits({(i,): int((r.tokens[:, 0] == i).sum()) for i in range(3)}, expected, N_TESTS)
    assert not naive.chi2_fits({(i,): int((bad == i).sum()) for i in range(3)}, expected, N_TESTS)


def test_numeric_cases_single_position():
    P, Q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    assert candidate_acceptance(P[None], Q[None], 1)[0] == pytest.approx(0.7, abs=1e-15)
    assert candidate_acceptance(P[None], Q[None], 2)[0] == pytest.approx(19 / 25, abs=1e-15)
    assert candidate_acceptance(P[None], Q[None], 2, candidate_sampling="deterministic")[0] == pytest.approx(0.5)
    rng = np.random.default_rng(9)
    m = 40000
    for sampling, expect in (("iid", 19 / 25), ("without_replacement", 41 / 50)):
        a, b = TinyTreeLM(3, 0).children(np.broadcast_to(Q, (m, 3)), rng, sampling)
        toks = np.stack([np.zeros(m, np.int64), a, b], 1)
        r = verify_tree_probs(np.broadcast_to(P, (m, 3, 3)), np.broadcast_to(Q, (m, 3, 3)), toks,
                              parent=np.tile([-1, 0, 0], (m, 1)), candidate_sampling=sampling, seed=np.arange(m))
        assert abs(r.num_accepted.mean() - expect) <= 5.5 * np.sqrt(expect * (1 - expect) / m)
    with pytest.raises(ValueError, match="without replacement"):
        candidate_acceptance(P[None], Q[None], 2, candidate_sampling="without_replacement")


@pytest.mark.parametrize("seed", range(3))
def test_candidate_acceptance_iid_matches_exact(seed):
    rng = np.random.default_rng(seed)
    for V, w in ((4, 3), (7, 2)):
        p, q = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5)
        ex = E.candidate_step(list(p), list(q), w)
        assert candidate_acceptance(p[None], q[None], w)[0] == pytest.approx(float(ex.acceptance), abs=1e-12)


def test_sibling_lists_equal_parent_arrays_and_chain_is_token_verification():
    lm = TinyTreeLM(3, 5)
    pt, pd, toks = lm.trees(np.random.default_rng(1), 500, "iid")
    a = verify_tree_probs(pt, pd, toks, parent=np.tile(PARENT, (500, 1)), seed=3)
    b = verify_tree_probs(pt, pd, toks, first_child=np.tile(FIRST_CHILD, (500, 1)),
                          next_sibling=np.tile(NEXT_SIBLING, (500, 1)), seed=3)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.path, b.path)
    assert np.array_equal(parent_from_siblings(FIRST_CHILD, NEXT_SIBLING), PARENT)
    # a chain is token verification in distribution: compare against the exact token-level block
    chain = E.block_distribution(lm.target, lm.draft, 2, method="candidates", widths=(1, 1))
    tok = E.block_distribution(lm.target, lm.draft, 2)
    assert chain.emitted == tok.emitted


def test_logits_wrapper_deterministic_threads_and_batches():
    rng = np.random.default_rng(2)
    B, V = 10, 50
    xt = rng.standard_normal((B, 7, V))
    xd = xt + 0.5 * rng.standard_normal((B, 7, V))
    toks = rng.integers(0, V, (B, 7))
    for n in range(1, 7):
        toks[:, n] = np.argsort(-xd[:, PARENT[n]], axis=1)[:, (n - 1) % 2]  # distinct siblings, q > 0
    kw = dict(parent=np.tile(PARENT, (B, 1)), candidate_sampling="without_replacement", temperature=0.9,
              seed=np.arange(B))
    full = verify_tree_logits(xt, xd, toks, **kw)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = verify_tree_logits(xt, xd, toks, **kw)
    finally:
        numba.set_num_threads(old)
    assert np.array_equal(full.tokens, one.tokens)
    kw1 = dict(kw, parent=PARENT[None], seed=np.arange(B)[4:5])
    assert np.array_equal(verify_tree_logits(xt[4:5], xd[4:5], toks[4:5], **kw1).tokens[0], full.tokens[4])
    assert ((full.tokens >= 0) | (np.arange(3)[None] >= full.num_emitted[:, None])).all()
    assert (full.tokens < V).all()


def test_tree_errors_name_argument_row_and_fix():
    p = np.full((2, 3, 4), 0.25)
    q = np.tile([0.5, 0.5, 0.0, 0.0], (2, 3, 1))
    par = np.tile([-1, 0, 0], (2, 1))
    with pytest.raises(ValueError, match=r"tree_tokens\[1, 2\] = 3 has draft probability 0"):
        verify_tree_probs(p, q, [[0, 0, 1], [0, 0, 3]], parent=par)
    with pytest.raises(ValueError, match="repeats a sibling"):
        verify_tree_probs(p, q, [[0, 1, 1], [0, 0, 1]], parent=par, candidate_sampling="without_replacement")
    with pytest.raises(ValueError, match=r"parent\[0, 2\] = 2"):
        verify_tree_probs(p, q, [[0, 0, 1], [0, 0, 1]], parent=[[-1, 0, 2], [-1, 0, 0]])
    with pytest.raises(ValueError, match="reached twice"):
        verify_tree_probs(p, q, [[0, 0, 1]] * 2, first_child=[[1, -1, -1]] * 2, next_sibling=[[-1, 1, -1]] * 2)
    with pytest.raises(ValueError, match="not reachable"):
        verify_tree_probs(p, q, [[0, 0, 1]] * 2, first_child=[[1, -1, -1]] * 2, next_sibling=[[-1, -1, -1]] * 2)
    with pytest.raises(ValueError, match="either as parent"):
        verify_tree_probs(p, q, [[0, 0, 1]] * 2)
    with pytest.raises(ValueError, match="draft_probs is needed"):
        verify_tree_probs(p, None, [[0, 0, 1]] * 2, parent=par)
    with pytest.raises(ValueError, match="sampling 'beam'"):
        verify_tree_probs(p, q, [[0, 0, 1]] * 2, parent=par, candidate_sampling="beam")
    r = verify_tree_probs(p, None, [[0, 2, 3], [0, 1, 0]], parent=par, candidate_sampling="deterministic",
                          num_nodes=[3, 1])
    assert r.num_accepted[1] == 0 and r.tokens[1, 0] >= 0


def test_candidate_acceptance_validates_its_input():
    p = np.full((1, 8), 1 / 8)
    q = np.full((1, 2), 1 / 2)
    with pytest.raises(ValueError, match=r"same shape"):  # used to read past q and return 0.375
        candidate_acceptance(p, q, 2)
    with pytest.raises(ValueError, match=r"finite"):  # used to return NaN
        candidate_acceptance(np.array([[np.nan, 1.0]]), np.array([[0.5, 0.5]]), 1)
    with pytest.raises(ValueError, match=r"sums to"):  # used to return -1.88
        candidate_acceptance(np.array([[3.0, 1.0]]), np.array([[0.5, 0.5]]), 2)
    with pytest.raises(ValueError, match=r"2 dimensions"):  # used to raise a Numba TypingError
        candidate_acceptance(np.array([0.5, 0.5]), np.array([0.5, 0.5]), 1)
    with pytest.raises(TypeError, match=r"w must be an integer"):  # 2.5 used to be truncated to 2
        candidate_acceptance(np.array([[0.5, 0.5]]), np.array([[0.5, 0.5]]), 2.5)
    with pytest.raises(ValueError, match=r"w = 0"):
        candidate_acceptance(np.array([[0.5, 0.5]]), np.array([[0.5, 0.5]]), 0)
    with pytest.raises(ValueError, match=r"without replacement"):
        candidate_acceptance(np.array([[0.5, 0.5]]), np.array([[0.5, 0.5]]), 2,
                             candidate_sampling="without_replacement")
    ok = candidate_acceptance(np.array([[0.5, 0.3, 0.2]]), np.array([[0.2, 0.3, 0.5]]), 2)
    assert ok[0] == pytest.approx(19 / 25, abs=1e-15)


def test_parent_from_siblings_refuses_a_cycle_instead_of_looping():
    fc = np.array([[1, -1, -1]])
    ns = np.array([[-1, 2, 1]])  # 1 -> 2 -> 1 -> ...: used to loop forever
    with pytest.raises(ValueError, match=r"reached twice"):
        parent_from_siblings(fc, ns)
    with pytest.raises(ValueError, match=r"\[-1, 3\)"):
        parent_from_siblings(np.array([[1, 5, -1]]), np.array([[-1, -1, -1]]))
    assert parent_from_siblings(np.array([[1, -1, -1]]), np.array([[-1, 2, -1]])).tolist() == [[-1, 0, 0]]
