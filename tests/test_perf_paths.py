"""Fast paths added for speed: fused validation, vocabulary-parallel rows, α scratch/recompute branches,
the vectorized max, and the FMA exp.  Each must give exactly what the general path gives."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from fastspec import row_seeds, verify_logits
from fastspec._fastexp import fexp, fexp_array
from fastspec._process import logits_status, row_max, vmax
from fastspec.acceptance import _alpha_plain, acceptance_rates
import fastspec.verify as verify_mod
from fastspec.verify import PAR_MIN_V, _verify_logits_kernel


def _batch(B, K, V, seed=0):
    rng = np.random.default_rng(seed)
    xt = (rng.standard_normal((B, K + 1, V)) * 2).astype(np.float32)
    xd = (xt[:, :K] + rng.standard_normal((B, K, V))).astype(np.float32)
    toks = xd.argmax(-1)
    return xt, xd, toks


def _with_threads(n, fn):
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        return fn()
    finally:
        numba.set_num_threads(old)


@pytest.mark.parametrize("vocab_parallel", [True, False])
@pytest.mark.parametrize("draft", [True, False])
def test_vocab_parallel_rows_identical_to_batched_and_serial(draft, vocab_parallel, monkeypatch):
    monkeypatch.setattr(verify_mod, "VOCAB_PARALLEL", vocab_parallel)
    B, K, V = 6, 3, PAR_MIN_V + 3000  # large enough for the vocabulary-parallel path at B = 1
    xt, xd, toks = _batch(B, K, V, seed=1)
    d = xd if draft else None
    temp = np.array([1.0, 0.7, 0.0, 1.3, 1.0, 0.9])
    min_p = np.array([0.0, 0.05, 0.0, 0.0, 0.2, 0.0])
    top_k = np.array([0, 0, 0, 50, 0, 0])  # row 3 takes the general (row_params) path
    seeds = row_seeds(7, B)
    kw = dict(temperature=temp, min_p=min_p, top_k=top_k, seed=seeds)
    a = verify_logits(xt, d, toks, **kw)
    serial = _with_threads(1, lambda: verify_logits(xt, d, toks, **kw))
    assert (serial.tokens == a.tokens).all()
    for b in range(B):
        for n in (1, 2):  # B = 1: rows in turn, vocabulary-parallel passes when 2 threads
            one = _with_threads(n, lambda: verify_logits(
                xt[b:b + 1], None if d is None else d[b:b + 1], toks[b:b + 1], temperature=temp[b:b + 1],
                min_p=min_p[b:b + 1], top_k=top_k[b:b + 1], seed=seeds[b:b + 1]))
            assert (one.tokens == a.tokens[b:b + 1]).all()
            assert (one.residual_underflows == a.residual_underflows[b:b + 1]).all()


def test_fused_path_matches_general_kernel():
    # The fused path sums normalizers per block; the general kernel (row_params) in one pass.  Only a
    # uniform within ~1e-16 of a CDF boundary could tell them apart.
    B, K, V = 40, 4, 5000
    xt, xd, toks = _batch(B, K, V, seed=2)
    for draft in (True, False):
        for t in (1.0, 0.6):
            new = verify_logits(xt, xd if draft else None, toks, temperature=t, seed=11)
            out = np.full((B, K + 1), -1, dtype=np.int64)
            st = np.zeros((B, 3), dtype=np.int64)
            d = xd if draft else np.zeros((B, 0, V), np.float32)
            _verify_logits_kernel(xt, d, draft, toks, np.full(B, K), np.full(B, t), np.zeros(B, np.int64),
                                  np.ones(B), np.zeros(B), row_seeds(11, B), out, st)
            assert (new.tokens == out).all()
            assert (new.num_accepted == st[:, 0]).all()


@pytest.mark.parametrize("where", ["target_last", "draft_last", "target_beyond_num_draft"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_bad_values_in_positions_never_visited_are_reported(where, bad):
    B, K, V = 3, 4, 300
    xt, xd, toks = _batch(B, K, V, seed=3)
    xt[:, 0] = -50.0
    xt[:, 0, 0] = 0.0  # p concentrated on token 0 at position 0 ...
    toks[:, 0] = 1      # ... so the draft is rejected there and later positions are not visited
    nd = None
    if where == "target_last":
        xt[1, K, 7] = bad
        pat = r"target_logits\[1, 4, 7\]"
    elif where == "draft_last":
        xd[2, K - 1, 5] = bad
        pat = r"draft_logits\[2, 3, 5\]"
    else:
        nd = [1, 1, 1]
        xt[0, 3, 2] = bad
        pat = r"target_logits\[0, 3, 2\]"
    with pytest.raises(ValueError, match=pat):
        verify_logits(xt, xd, toks, num_draft=nd, seed=1)
    # greedy rows never look at the draft values, but they are still validated
    if where == "draft_last":
        with pytest.raises(ValueError, match=pat):
            verify_logits(xt, xd, toks, temperature=0.0)


def test_all_masked_row_reported_in_unvisited_position():
    xt, xd, toks = _batch(2, 2, 50, seed=4)
    xt[0, 2] = -np.inf
    with pytest.raises(ValueError, match=r"target_logits\[0, 2\] has no finite logit"):
        verify_logits(xt, xd, toks, num_draft=[0, 2])


def test_target_error_reported_before_draft_error():
    xt, xd, toks = _batch(2, 2, 50, seed=5)
    xd[0, 0, 3] = np.nan  # visited first by the kernel
    xt[1, 2, 4] = np.nan  # found later, but validate_logits checks the target first
    with pytest.raises(ValueError, match=r"target_logits\[1, 2, 4\]"):
        verify_logits(xt, xd, toks)


def test_vmax_status_and_row_max():
    for dt in (np.float32, np.float64):
        x = np.array([-np.inf, 1.5, -2.0, 1.5, -0.0], dtype=dt)
        assert vmax(x) == 1.5 and logits_status(vmax(x)) == 0
        assert tuple(row_max(x)) == (1.5, 1)
        assert logits_status(vmax(np.array([1.0, np.nan, np.inf], dtype=dt))) == 1
        assert logits_status(vmax(np.array([1.0, np.inf, -np.inf], dtype=dt))) == 2
        assert logits_status(vmax(np.full(37, -np.inf, dtype=dt))) == 3
        y = np.zeros(1000, dtype=dt)
        y[999] = np.nan  # NaN in the vectorized body's last lane and in a remainder position
        assert logits_status(vmax(y)) == 1 and logits_status(vmax(y[:997])) == 0
        y[:997] = -1.0
        y[996] = 3.0
        assert row_max(y[:997])[1] == 996


def test_fexp_scalar_and_vectorized_bitwise_equal():
    rng = np.random.default_rng(6)
    y = np.concatenate([-rng.random(3000) * 720, -rng.random(1000) * 1e-3, [0.0, -0.0, -708.0, -np.inf]])
    vec = fexp_array(y, np.empty_like(y))
    scal = np.array([fexp(v) for v in y])
    assert (vec.view(np.int64) == scal.view(np.int64)).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_alpha_scratch_and_recompute_branches_agree(dtype):
    rng = np.random.default_rng(7)
    R, V = 5, 3001
    P = (rng.standard_normal((R, V)) * 4).astype(dtype)
    Q = (P.astype(np.float64) + rng.standard_normal((R, V)) * 2).astype(dtype)
    P[1, :100] = -np.inf
    t = np.array([1.0, 0.7, 2.0, 0.0, 1.0])
    P2, Q2 = (P.view(np.uint16), Q.view(np.uint16)) if dtype == np.float16 else (P, Q)
    res = []
    for use_scratch in (True, False):
        out = np.empty(R)
        st = np.zeros(R, dtype=np.int8)
        _alpha_plain(P2, Q2, t, np.ones(R, dtype=np.bool_), use_scratch, numba.get_num_threads(), out, st)
        assert not st.any()
        res.append(out)
    np.testing.assert_allclose(res[0], res[1], rtol=0, atol=1e-15)
    np.testing.assert_allclose(acceptance_rates(P, Q, temperature=t), res[0], rtol=0, atol=0)
    x = P.astype(np.float64) / np.where(t > 0, t, 1)[:, None]
    y = Q.astype(np.float64) / np.where(t > 0, t, 1)[:, None]
    p = np.exp(x - x.max(-1, keepdims=True))
    q = np.exp(y - y.max(-1, keepdims=True))
    ref = np.minimum(p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)).sum(-1)
    ref[3] = float(P[3].argmax() == Q[3].argmax())
    np.testing.assert_allclose(res[0], ref, rtol=0, atol=1e-12)


def test_alpha_threads_identical():
    rng = np.random.default_rng(8)
    P = rng.standard_normal((7, 2000)).astype(np.float32)
    Q = rng.standard_normal((7, 2000)).astype(np.float32)
    a = acceptance_rates(P, Q)
    b = _with_threads(1, lambda: acceptance_rates(P, Q))
    assert (a == b).all()
    c = np.array([acceptance_rates(P[i], Q[i]) for i in range(7)])
    assert (a == c).all()
