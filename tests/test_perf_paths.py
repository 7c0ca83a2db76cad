"""Fast paths added for speed: fused validation, rows in parallel vs serial vs one by one, the vectorized max,
the FMA exp, fixed-order sums and float16 read as it is.  Each must give exactly what the general path gives."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from fastspec import row_seeds, verify_logits
from fastspec._kernels.rows import ROW_NAN, ROW_NO_FINITE, ROW_OK, ROW_POSINF, argmax_of, row_max, status
from fastspec._numba.fastexp import fexp
from fastspec._numba.intrinsics import fma
from fastspec._numba.lanes import exp_lane_sum, lane_residual_sum, lane_sum
from fastspec.acceptance import acceptance_rates

@numba.njit
def _fexp_loop(y, out):
    for i in range(y.shape[0]):
        out[i] = fexp(y[i])
    return out


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


@pytest.mark.parametrize("draft", [True, False])
def test_rows_identical_batched_serial_and_one_by_one(draft):
    B, K, V = 6, 3, 70003
    xt, xd, toks = _batch(B, K, V, seed=1)
    d = xd if draft else None
    temp = np.array([1.0, 0.7, 0.0, 1.3, 1.0, 0.9])
    min_p = np.array([0.0, 0.05, 0.0, 0.0, 0.2, 0.0])
    top_k = np.array([0, 0, 0, 50, 0, 0])  # row 3 needs the top-k selection
    top_p = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.9])  # row 5 the top-p selection
    seeds = row_seeds(7, B)
    kw = dict(temperature=temp, min_p=min_p, top_k=top_k, top_p=top_p, seed=seeds)
    a = verify_logits(xt, d, toks, **kw)
    serial = _with_threads(1, lambda: verify_logits(xt, d, toks, **kw))
    assert (serial.tokens == a.tokens).all()
    for b in range(B):
        one = verify_logits(xt[b:b + 1], None if d is None else d[b:b + 1], toks[b:b + 1], temperature=temp[b:b + 1],
                            min_p=min_p[b:b + 1], top_k=top_k[b:b + 1], top_p=top_p[b:b + 1], seed=seeds[b:b + 1])
        assert (one.tokens == a.tokens[b:b + 1]).all()
        assert (one.residual_underflows == a.residual_underflows[b:b + 1]).all()


def test_disabled_filters_take_the_same_path():
    # top_k >= V and top_p = 1 filter nothing: the same tokens as no filters at all
    B, K, V = 40, 4, 5000
    xt, xd, toks = _batch(B, K, V, seed=2)
    for draft in (True, False):
        for t in (1.0, 0.6):
            a = verify_logits(xt, xd if draft else None, toks, temperature=t, seed=11)
            b = verify_logits(xt, xd if draft else None, toks, temperature=t, top_k=V, top_p=1.0, seed=11)
            assert (a.tokens == b.tokens).all()


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


def test_row_max_status_and_argmax():
    for dt in (np.float32, np.float64, np.float16):
        def k(a):
            a = np.asarray(a, dtype=dt)
            return a.view(np.uint16) if dt == np.float16 else a
        x = k([-np.inf, 1.5, -2.0, 1.5, -0.0])
        assert row_max(x) == 1.5 and status(row_max(x)) == ROW_OK and argmax_of(x, 1.5) == 1
        assert status(row_max(k([1.0, np.nan, np.inf]))) == ROW_NAN
        assert status(row_max(k([1.0, np.inf, -np.inf]))) == ROW_POSINF
        assert status(row_max(k(np.full(37, -np.inf)))) == ROW_NO_FINITE
        y = np.zeros(1000, dtype=dt)
        y[999] = np.nan  # NaN in the vectorized body's last lane and in a remainder position
        assert status(row_max(k(y))) == ROW_NAN and status(row_max(k(y[:997]))) == ROW_OK
        y[:997] = -1.0
        y[996] = 3.0
        assert argmax_of(k(y[:997]), row_max(k(y[:997]))) == 996


def test_fexp_scalar_and_vectorized_bitwise_equal():
    rng = np.random.default_rng(6)
    y = np.concatenate([-rng.random(3000) * 720, -rng.random(1000) * 1e-3, [0.0, -0.0, -708.0, -np.inf]])
    vec = _fexp_loop(y, np.empty_like(y))
    scal = np.array([fexp(v) for v in y])
    assert (vec.view(np.int64) == scal.view(np.int64)).all()


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1023, 1024, 5001])
def test_lane_sum_is_its_documented_order(n):
    w = np.random.default_rng(n).random(n) * 10.0 ** np.random.default_rng(n + 1).integers(-8, 8, n)
    stop = n - n % 16
    lanes = [0.0] * 16
    for j in range(0, stop, 16):
        for lane in range(16):
            lanes[lane] += w[j + lane]
    while len(lanes) > 1:
        lanes = [lanes[i] + lanes[i + 1] for i in range(0, len(lanes), 2)]
    t = lanes[0]
    for j in range(stop, n):
        t += w[j]
    assert lane_sum(w, 0, n) == t  # bit for bit: the order is fixed, not left to the compiler
    assert abs(lane_sum(w, 0, n) - np.sum(w)) <= 1e-12 * max(1.0, np.abs(w).sum())


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1024, 5001])
def test_exp_lane_sum_has_the_bits_of_scalar_fexp_and_lane_sum(dtype, n):
    """The fused lane-wise exponential stores exactly scalar fexp's weights (cutoff applied) and returns
    lane_sum of them, bit for bit; masked (-inf) logits, ties with the max and a strided row included."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 6).astype(dtype)
    x[rng.random(n) < 0.05] = -np.inf
    x[0] = 4.0
    m, inv_t = float(np.max(x)), 1.0 / 0.7
    for thr in (-np.inf, float(np.quantile(x[np.isfinite(x)], 0.3))):
        expect = np.array([fexp((float(v) - m) * inv_t) if float(v) >= thr else 0.0 for v in x])
        for view in (x, np.repeat(x, 2)[::2]):  # contiguous and strided
            k = view.view(np.uint16) if dtype == np.float16 else view
            w = np.full(n, np.nan)
            t = exp_lane_sum(k, m, inv_t, thr, w)
            assert (w.view(np.int64) == expect.view(np.int64)).all()
            assert t == lane_sum(expect, 0, n)


def test_alpha_float16_read_as_it_is():
    rng = np.random.default_rng(7)
    R, V = 5, 3001
    P = (rng.standard_normal((R, V)) * 4).astype(np.float16)
    Q = (P.astype(np.float64) + rng.standard_normal((R, V)) * 2).astype(np.float16)
    P[1, :100] = -np.inf
    t = np.array([1.0, 0.7, 2.0, 0.0, 1.0])
    a16 = acceptance_rates(P, Q, temperature=t)
    a32 = acceptance_rates(P.astype(np.float32), Q.astype(np.float32), temperature=t)
    # float16 rows take their weights from a table over the 65,536 float16 values, not an exp per token
    np.testing.assert_allclose(a16, a32, rtol=0, atol=1e-14)
    x = P.astype(np.float64) / np.where(t > 0, t, 1)[:, None]
    y = Q.astype(np.float64) / np.where(t > 0, t, 1)[:, None]
    p = np.exp(x - x.max(-1, keepdims=True))
    q = np.exp(y - y.max(-1, keepdims=True))
    ref = np.minimum(p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)).sum(-1)
    ref[3] = float(P[3].argmax() == Q[3].argmax())
    np.testing.assert_allclose(a16, ref, rtol=0, atol=1e-12)


def test_alpha_threads_identical():
    rng = np.random.default_rng(8)
    P = rng.standard_normal((7, 2000)).astype(np.float32)
    Q = rng.standard_normal((7, 2000)).astype(np.float32)
    a = acceptance_rates(P, Q)
    b = _with_threads(1, lambda: acceptance_rates(P, Q))
    assert (a == b).all()
    c = np.array([acceptance_rates(P[i], Q[i]) for i in range(7)])
    assert (a == c).all()


def test_float16_table_refills_for_far_apart_rows():
    # rows whose maxima lie thousands of logits apart (and per-row temperatures) make each thread refill its
    # table: the result must not depend on which rows shared a table
    rng = np.random.default_rng(9)
    R, V = 6, 2000
    P = rng.standard_normal((R, V)) * 3 + np.array([0, 3000, -3000, 0, 20000, 5])[:, None]
    Q = P + rng.standard_normal((R, V))
    t = np.array([1.0, 1.0, 0.5, 2.0, 1.0, 0.01])
    a16 = acceptance_rates(P.astype(np.float16), Q.astype(np.float16), temperature=t)
    ref = np.array([acceptance_rates(P[i].astype(np.float16).astype(np.float64),
                                     Q[i].astype(np.float16).astype(np.float64), temperature=t[i]) for i in range(R)])
    np.testing.assert_allclose(a16, ref, rtol=0, atol=1e-13)
    one = np.array([acceptance_rates(P[i:i + 1].astype(np.float16), Q[i:i + 1].astype(np.float16),
                                     temperature=t[i:i + 1])[0] for i in range(R)])
    assert (a16 == one).all()  # bit-identical: a row's table offset depends on the row alone


def test_float16_table_bitwise_independent_of_neighbours():
    # rows with similar maxima share a table; whichever rows came first (order, chunk, thread), each row's alpha
    # is the same to the bit -- also for maxima straddling a table offset boundary
    rng = np.random.default_rng(11)
    R, V = 12, 3000
    shift = np.array([0, 1, 2, 250, 255, 256, 257, 300, -3, 511, 512, 40])
    P = (rng.standard_normal((R, V)) * 2 + shift[:, None]).astype(np.float16)
    Q = (P.astype(np.float64) + rng.standard_normal((R, V)) * 0.5).astype(np.float16)
    a = acceptance_rates(P, Q)
    order = rng.permutation(R)
    b = acceptance_rates(P[order], Q[order])
    assert (a[order] == b).all()
    c = acceptance_rates(P[::-1].copy(), Q[::-1].copy())
    assert (a[::-1] == c).all()
    one = np.array([acceptance_rates(P[i:i + 1], Q[i:i + 1])[0] for i in range(R)])
    assert (a == one).all()


def test_float16_logits_are_never_widened_into_a_copy():
    """Every logits entry point reads float16 as it is: the memory a call allocates (NumPy and Numba arrays,
    traced after a warm-up call) stays below half the size of the float16 input, where a float32 copy would take
    twice that (issue 14)."""
    import tracemalloc

    from fastspec import sample_tokens

    rng = np.random.default_rng(11)
    B, K, V = 64, 4, 20000  # inputs of 10-13 MB; work arrays per thread about 1.4 MB (two float16 tables)
    t = (rng.standard_normal((B, K + 1, V)) * 3).astype(np.float16)
    d = (rng.standard_normal((B, K, V)) * 3).astype(np.float16)
    toks = rng.integers(0, V, (B, K))
    calls = {
        "verify_logits": (lambda: verify_logits(t, d, toks, seed=1), t.nbytes),
        "verify_logits one-hot": (lambda: verify_logits(t, None, toks, seed=1), t.nbytes),
        "verify_logits block": (lambda: verify_logits(t, d, toks, seed=1, method="block"), t.nbytes),
        "sample_tokens": (lambda: sample_tokens(t.reshape(-1, V), np.full(B * (K + 1), 0.5)), t.nbytes),
        "acceptance_rates": (lambda: acceptance_rates(d, d), d.nbytes),
    }
    threads = numba.get_num_threads()
    numba.set_num_threads(min(2, threads))  # per-thread work arrays: at most two sets
    try:
        for name, (call, size) in calls.items():
            call()
            tracemalloc.start()
            try:
                call()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < size / 2, f"{name}: allocated {peak} bytes for a float16 input of {size} bytes"
    finally:
        numba.set_num_threads(threads)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1023, 1024, 5001])
def test_lane_residual_sum_has_the_bits_of_stored_terms_and_lane_sum(n):
    """The fused residual block sum (no store) equals storing max(fma(p, a, -(q b)), 0) and calling lane_sum."""
    rng = np.random.default_rng(n)
    p = rng.random(n) * 10.0 ** rng.integers(-12, 1, n)
    q = rng.random(n) * 10.0 ** rng.integers(-12, 1, n)
    q[::7] = p[::7]  # exact ties: d = 0
    for a, b in ((1.0, 1.0), (1 / 3.7, 1 / 1.3), (2.5, 0.0)):
        d = np.array([_fma(x, a, -(y * b)) for x, y in zip(p, q, strict=True)])
        want = lane_sum(np.where(d > 0.0, d, 0.0), 0, n)
        got = lane_residual_sum(p, q, a, b, 0, n)
        assert np.float64(got).view(np.int64) == np.float64(want).view(np.int64)
        if n > 40:
            assert lane_residual_sum(p, q, a, b, 5, n - 3) == lane_sum(np.where(d > 0.0, d, 0.0), 5, n - 3)


@numba.njit
def _fma(x, a, c):
    return fma(x, a, c)
