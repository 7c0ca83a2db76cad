"""Block verification kernels (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh; arXiv 2403.10444).

For a row with drafts x_1..x_n and processed target / draft distributions p_i, q_i at drafted position i:

    w_0 = 1,   w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1),
    Z_{i+1} = sum_v max(w_i p_{i+1}(v) - q_{i+1}(v), 0),   h_i = Z_{i+1} / (Z_{i+1} + 1 - w_i)  (i < n; 1 if 0/0),
    h_n = w_n,   eta_i ~ Bernoulli(h_i) (``position_uniform(seed, i, Stream.BLOCK)``),   tau = max{i : eta_i = 1}.

The row emits x_1..x_tau, then a token from ``max(w_tau p_{tau+1} - q_{tau+1}, 0)`` when tau < n, else a bonus
token from ``p_{n+1}``.  Positions are numbered from 0 in the code (position i holds draft x_{i+1}).  The
residual of every position is kept as block sums (``rsum``) with the row's processing parameters (``prm``), so
the residual token of the chosen tau needs the weights of one vocabulary block only.  The exact reference is
:func:`fastspec.exact.block_distribution` (``method="block"``); the public entry is ``verify_logits(method="block")``.
"""
from __future__ import annotations

import numpy as np

from .._numba.jit import kernel, parallel_kernel, prange
from .._numba.rng import Stream, position_uniform
from ..config import BLOCK
from .codes import (ACCEPTED, BAD_DRAFT, BAD_VALUES, DRAFT_ROWS, NO_EXCLUDED, PAD, ROW_OK, TARGET_ROWS,
                    UNDERFLOWS)
from .rows import argmax_of, row_max, status
from .sample import (block_count, block_sums, block_weights, pick_block, row_weights, sample,
                     sample_weights, scan_block)
from .process import row_params, visit_row
from .token import row_seed, validate_rest

# columns of prm [K+1, N_PRM]: the processing of position i's target and draft rows, and the residual's scales
P_MAX, P_INV_T, P_THR, Q_MAX, Q_INV_T, Q_THR, RES_A, RES_B = range(8)
N_PRM = 8


@kernel
def _step(rsum_i, w, px, qx, i, tau, seed):
    """One drafted position of the block recursion: the eta coin of the previous position (h_{i-1} from
    Z_i = sum of rsum_i) and w_{i+1} = min(w_i p(x)/q(x), 1) without dividing by q.  Returns (tau, w)."""
    if i > 0:
        z = 0.0
        for j in range(rsum_i.shape[0]):
            z += rsum_i[j]
        den = z + 1.0 - w
        if not den > 0.0 or position_uniform(seed, i, Stream.BLOCK) * den <= z:
            tau = i
    return tau, (1.0 if w * px >= qx else w * px / qx)


@kernel
def _decide(toks, nd, last, w, tau, seed, out, stats):
    """The last coin (h_n = w_n, when every position was reached) and the accepted drafts; returns tau."""
    if last == nd and w > 0.0 and position_uniform(seed, nd, Stream.BLOCK) <= w:
        tau = nd
    for i in range(tau):
        out[i] = toks[i]
    stats[ACCEPTED] = tau
    return tau


@kernel
def _residual_token(xt, xd, has_draft, toks, tau, prm, rsum, tp, tq, u):
    """The residual token of position tau from its stored block sums: one block's weights recomputed."""
    j, rem = pick_block(rsum[tau], u)
    if j < 0:
        return PAD
    lo = j * BLOCK
    hi = min(xt.shape[1], lo + BLOCK)
    block_weights(xt[tau], prm[tau, P_MAX], prm[tau, P_INV_T], prm[tau, P_THR], lo, hi, tp)
    if has_draft:
        block_weights(xd[tau], prm[tau, Q_MAX], prm[tau, Q_INV_T], prm[tau, Q_THR], lo, hi, tq)
        excl = NO_EXCLUDED
    else:
        excl = toks[tau] - lo
    v = scan_block(tp[:hi - lo], tq[:hi - lo] if has_draft else tp[:hi - lo], prm[tau, RES_A], prm[tau, RES_B],
                   excl, rem)
    return lo + v if v >= 0 else PAD


# --------------------------------------------------------------------------------------------- work buffers
def buffer_size(K1: int, V: int, nb: int) -> int:
    """float64 elements of one thread's work buffer for rows of K1 = K + 1 positions (see :func:`split_buffer`)."""
    return max(K1 - 1, 1) * nb + K1 * N_PRM + 2 * V + 2 * nb + 2 * BLOCK


@kernel
def split_buffer(buf, K1, V, nb):
    """(rsum, prm, wp, wq, zpb, zqb, tp, tq) views of one flat work buffer.

    rsum [max(K1 - 1, 1), nb]: every position's residual block sums; prm [K1, N_PRM]: its processing parameters;
    wp, wq [V]: the current target / draft weights (wq doubles as the top-k/top-p selection scratch); zpb, zqb
    [nb]: their block sums; tp, tq [BLOCK]: one block's recomputed weights (tp also block_sums' scratch)."""
    n = max(K1 - 1, 1) * nb
    rsum = buf[0:n].reshape((max(K1 - 1, 1), nb))
    prm = buf[n:n + K1 * N_PRM].reshape((K1, N_PRM))
    n += K1 * N_PRM
    wp = buf[n:n + V]
    wq = buf[n + V:n + 2 * V]
    n += 2 * V
    zpb = buf[n:n + nb]
    zqb = buf[n + nb:n + 2 * nb]
    n += 2 * nb
    tp = buf[n:n + BLOCK]
    tq = buf[n + BLOCK:n + 2 * BLOCK]
    return rsum, prm, wp, wq, zpb, zqb, tp, tq


# --------------------------------------------------------------------------------------------- logits
@kernel
def verify_row_block(xt, xd, has_draft, check_all, toks, nd, sp, seed, out, stats, buf):
    """Block-verify one row from logits (arrays as in :func:`fastspec._kernels.token.verify_row_logits`);
    sp = (temperature, top_k, top_p, min_p) of the row; buf: a work buffer of :func:`buffer_size` elements."""
    V = xt.shape[1]
    rsum, prm, wp, wq, zpb, zqb, tp, tq = split_buffer(buf, xt.shape[0], V, block_count(V))
    if sp[0] == 0.0:  # greedy: block verification equals token verification
        for i in range(nd + 1):
            m = row_max(xt[i])
            if status(m) != ROW_OK:
                stats[BAD_VALUES] = TARGET_ROWS
                return
            amax = argmax_of(xt[i], m)
            out[i] = amax
            if i == nd or toks[i] != amax:
                stats[ACCEPTED] = i
                if check_all:
                    validate_rest(xt, xd, has_draft, toks, nd, (i + 1, 0, 0), np.empty(0), sp, wq, stats)
                return
        return
    w = 1.0
    tau = 0
    last = nd  # positions 0..last-1 have stored residuals
    for i in range(nd):
        tok = toks[i]
        ok, mp, itp, thrp, zp = visit_row(xt[i], sp, wq, wp, zpb)
        if not ok:
            stats[BAD_VALUES] = TARGET_ROWS
            return
        if has_draft:
            ok, mq, itq, thrq, zq = visit_row(xd[i], sp, wq, wq, zqb)
            if not ok:
                stats[BAD_VALUES] = DRAFT_ROWS
                return
            excl = NO_EXCLUDED
        else:
            mq, itq, thrq, zq = 0.0, 0.0, 0.0, 1.0
            excl = tok
        a = w / zp
        b = 1.0 / zq if has_draft else 0.0
        prm[i, P_MAX], prm[i, P_INV_T], prm[i, P_THR] = mp, itp, thrp
        prm[i, Q_MAX], prm[i, Q_INV_T], prm[i, Q_THR] = mq, itq, thrq
        prm[i, RES_A], prm[i, RES_B] = a, b
        block_sums(wp, wq if has_draft else wp, a, b, excl, rsum[i], tp, 0, rsum.shape[1])
        qx = wq[tok] / zq if has_draft else 1.0
        if not qx > 0.0:
            stats[BAD_DRAFT] = i + 1
            return
        tau, w = _step(rsum[i], w, wp[tok] / zp, qx, i, tau, seed)
        if not w > 0.0:  # every later h is 0: tau is decided
            last = i + 1
            break
    tau = _decide(toks, nd, last, w, tau, seed, out, stats)
    t_read = last
    if tau == nd:  # bonus token from p_{nd}
        ok, _, _, _, _ = visit_row(xt[nd], sp, wq, wp, zpb)
        if not ok:
            stats[BAD_VALUES] = TARGET_ROWS
            return
        out[nd] = sample(wp, wp, 1.0, 0.0, NO_EXCLUDED, zpb, position_uniform(seed, nd, Stream.BONUS))
        t_read = nd + 1
    else:
        u = position_uniform(seed, tau, Stream.RESIDUAL)
        v = _residual_token(xt, xd, has_draft, toks, tau, prm, rsum, tp, tq, u)
        if v < 0:  # the residual underflowed to 0: sample p_tau
            stats[UNDERFLOWS] += 1
            row_weights(xt[tau], prm[tau, P_MAX], prm[tau, P_INV_T], prm[tau, P_THR], wp, zpb)
            v = sample(wp, wp, 1.0, 0.0, NO_EXCLUDED, zpb, u)
        out[tau] = v
    if check_all:
        validate_rest(xt, xd, has_draft, toks, nd, (t_read, last if has_draft else 0, 0), np.empty(0), sp, wq, stats)


@parallel_kernel
def block_logits_rows(xt, xd, has_draft, check_all, toks, nd, params, seeds, derive, out, stats, buffers):
    """Rows in parallel: thread chunk c takes rows c, c + n, ... (n = len(buffers)) with work buffer
    buffers[c] (as :func:`fastspec._kernels.token.verify_logits_rows`); params: the per-row sampling arrays."""
    B = xt.shape[0]
    n = buffers.shape[0]
    for c in prange(n):
        for b in range(c, B, n):
            verify_row_block(xt[b], xd[b], has_draft, check_all, toks[b], nd[b], row_params(params, b),
                             row_seed(seeds, derive, b), out[b], stats[b], buffers[c])


@kernel
def block_logits_serial(xt, xd, has_draft, check_all, toks, nd, params, seeds, derive, out, stats, buffers):
    """The same, rows one after the other with buffers[0] (no parallel region)."""
    for b in range(xt.shape[0]):
        verify_row_block(xt[b], xd[b], has_draft, check_all, toks[b], nd[b], row_params(params, b),
                         row_seed(seeds, derive, b), out[b], stats[b], buffers[0])


# --------------------------------------------------------------------------------------------- probabilities
@kernel
def verify_row_block_probs(pt, pd, has_draft, toks, nd, seed, out, stats, rsum, ws, bsum, tmp):
    """Block-verify one row from validated probabilities (pt [K+1, V], pd [K, V] or [0, V])."""
    w = 1.0
    tau = 0
    last = nd
    nb = bsum.shape[0]
    for i in range(nd):
        p = pt[i]
        tok = toks[i]
        q = pd[i] if has_draft else p
        excl = NO_EXCLUDED if has_draft else tok
        b = 1.0 if has_draft else 0.0
        ws[i] = w
        block_sums(p, q, w, b, excl, rsum[i], tmp, 0, nb)
        tau, w = _step(rsum[i], w, p[tok], q[tok] if has_draft else 1.0, i, tau, seed)
        if not w > 0.0:
            last = i + 1
            break
    tau = _decide(toks, nd, last, w, tau, seed, out, stats)
    if tau == nd:
        p = pt[nd]
        out[nd] = sample_weights(p, p, 1.0, 0.0, NO_EXCLUDED, bsum, tmp, position_uniform(seed, nd, Stream.BONUS))
        return
    p = pt[tau]
    q = pd[tau] if has_draft else p
    u = position_uniform(seed, tau, Stream.RESIDUAL)
    v = sample(p, q, ws[tau], 1.0 if has_draft else 0.0, NO_EXCLUDED if has_draft else toks[tau], rsum[tau], u)
    if v < 0:
        stats[UNDERFLOWS] += 1
        v = sample_weights(p, p, 1.0, 0.0, NO_EXCLUDED, bsum, tmp, u)
    out[tau] = v


@parallel_kernel
def block_probs_rows(pt, pd, has_draft, toks, nd, seeds, derive, out, stats):
    B, K1, V = pt.shape
    nb = block_count(V)
    for b in prange(B):
        rsum = np.empty((max(K1 - 1, 1), nb))
        ws = np.empty(K1)
        bsum = np.empty(nb)
        tmp = np.empty(BLOCK)
        verify_row_block_probs(pt[b], pd[b], has_draft, toks[b], nd[b], row_seed(seeds, derive, b), out[b],
                               stats[b], rsum, ws, bsum, tmp)
