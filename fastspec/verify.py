"""Batched speculative-decoding verification (token-level rejection sampling).

For each row b and drafted position i < num_draft[b] with drafted token x:

* accept while ``u_i * q_i(x) <= p_i(x)`` with ``u_i`` uniform in (0, 1] (never
  a division; ``u_i > 0`` so a token with ``p_i(x) = 0`` is never accepted);
* at the first rejection emit a *recovered token* sampled from
  ``max(p_i - q_i, 0) / sum``; if that sum underflows to 0 (p ~= q) sample from
  ``p_i`` instead and count it in ``residual_underflows``;
* if every draft is accepted emit a *bonus token* sampled from ``p_{n}``
  (target position ``n = num_draft[b]``).

``draft_logits=None`` / ``draft_probs=None`` means a deterministic proposer
(n-gram, prompt lookup, argmax draft): q is one-hot on the drafted token, the
acceptance probability is p(x) and the recovered distribution is p with x
removed, renormalized.  Greedy rows (temperature 0) accept while the draft equals
the target argmax; the first mismatch emits the target argmax.

Randomness: ``fastspec._rng.uniform(row_seed, position, purpose, 0)``, a pure
function of the row's own seed.  The same per-row seed gives the same tokens
whatever the batch composition, row order or thread count, and whether rows are
verified together or one by one: "same text under a fixed seed".  That is a
different claim from "same distribution" (which holds for every seed, and is
what the goodness-of-fit tests check).

Sampling a categorical uses one uniform: inverse CDF over the unnormalized
weights against ``u * total``; the fall-off-the-end case returns the last index
with positive weight, so a result is never >= V nor a zero-weight token.

Performance (``verify_logits``, rows without top-k/top-p): no probability array is
materialized and no separate validation pass is made.  Per visited position: one
vectorized IEEE-maximum pass per row (it is also the NaN/+inf/all -inf check, and it
is fused into the previous position's exp pass), one pass computing the target and
draft weights (``fastspec._fastexp.fexp``) into per-thread float64 buffers with
per-block sums, point look-ups for p(x) and q(x), and on rejection the residual's
block sums from the buffers (no exp) plus a scan of one block.  Positions after the
first rejection are only validated (one max pass), never normalized.  Rows run in
parallel (``prange``); when there are fewer rows than threads, each row's exp pass is
split across threads by vocabulary block (sums are per block, combined in block
order, so results do not depend on the thread count or the batch).  Rows with top-k
or top-p use the general ``row_params`` path.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numba
import numpy as np

from ._fastexp import _fma, fmaximum, weight
from ._jit import kernel, parallel_kernel, prange
from ._process import (as_float_rows, check_logits_array, logits_status, row_max, row_params,  # noqa: F401
                       validate_logits, validate_sampling_params, vmax)
from ._rng import PURPOSE_ACCEPT, PURPOSE_BONUS, PURPOSE_RESIDUAL, row_seeds, uniform

__all__ = ["VerifyResult", "verify_logits", "verify_probs"]

BLOCK = 1024  # vocabulary block of the two-level inverse-CDF sampler


@dataclass(frozen=True)
class VerifyResult:
    """Result of one batched verify step.

    tokens: int64 [B, K+1] -- accepted drafts, then the recovered or bonus token, then -1.
    num_accepted: int64 [B] -- accepted drafted tokens per row.
    num_emitted: int64 [B] -- tokens emitted per row (num_accepted + 1).
    residual_underflows: int64 [B] -- 1 where the residual max(p - q, 0) summed to 0 in
        floating point (p ~= q) and the recovered token was sampled from p instead.
    """

    tokens: np.ndarray
    num_accepted: np.ndarray
    num_emitted: np.ndarray
    residual_underflows: np.ndarray
    num_draft: np.ndarray | None = None  # int64 [B]: drafts each row had (num_draft argument, default K)

    @property
    def bonus(self) -> np.ndarray:
        """bool [B]: True where every draft was accepted and the last token is a bonus token."""
        nd = self.num_draft if self.num_draft is not None else np.full(len(self.num_accepted), self.tokens.shape[1] - 1)
        return self.num_accepted == nd


# --------------------------------------------------------------------------- element weights
# mode 0: weights of p (logit row x), optionally excluding token `excl` (one-hot residual)
# mode 1: residual max(p - q, 0) of two logit rows


@kernel
def _el_logits(x, y, v, mode, excl, mp, itp, thrp, izp, mq, itq, thrq, izq):
    xv = np.float64(x[v])
    if mode == 0:
        w = weight(xv, mp, itp)
        return w if (xv >= thrp and v != excl) else 0.0
    pv = weight(xv, mp, itp) * izp
    pv = pv if xv >= thrp else 0.0
    yv = np.float64(y[v])
    qv = weight(yv, mq, itq) * izq
    qv = qv if yv >= thrq else 0.0
    d = pv - qv
    return d if d > 0.0 else 0.0


@kernel
def _blk_logits(x, y, lo, hi, mode, excl, mp, itp, thrp, izp, mq, itq, thrq, izq):
    s = 0.0
    if mode == 0:
        for v in range(lo, hi):
            xv = np.float64(x[v])
            w = weight(xv, mp, itp)
            s += w if (xv >= thrp and v != excl) else 0.0
    else:
        for v in range(lo, hi):
            xv = np.float64(x[v])
            pv = weight(xv, mp, itp) * izp
            pv = pv if xv >= thrp else 0.0
            yv = np.float64(y[v])
            qv = weight(yv, mq, itq) * izq
            qv = qv if yv >= thrq else 0.0
            d = pv - qv
            s += d if d > 0.0 else 0.0
    return s


@kernel
def _el_probs(p, q, v, mode, excl):
    if mode == 0:
        return p[v] if v != excl else 0.0
    d = p[v] - q[v]
    return d if d > 0.0 else 0.0


@kernel
def _blk_probs(p, q, lo, hi, mode, excl):
    s = 0.0
    if mode == 0:
        for v in range(lo, hi):
            s += p[v] if v != excl else 0.0
    else:
        for v in range(lo, hi):
            d = p[v] - q[v]
            s += d if d > 0.0 else 0.0
    return s


# --------------------------------------------------------------------------- two-level sampler
@kernel
def _block_sums_logits(x, y, mode, excl, mp, itp, thrp, izp, mq, itq, thrq, izq, bsum, par):
    n = x.shape[0]
    nb = bsum.shape[0]
    if par:
        for j in prange(nb):
            bsum[j] = _blk_logits(x, y, j * BLOCK, min(n, (j + 1) * BLOCK), mode, excl,
                                  mp, itp, thrp, izp, mq, itq, thrq, izq)
    else:
        for j in range(nb):
            bsum[j] = _blk_logits(x, y, j * BLOCK, min(n, (j + 1) * BLOCK), mode, excl,
                                  mp, itp, thrp, izp, mq, itq, thrq, izq)


@kernel
def _pick_block(bsum, u):
    """(block, remaining target, total) for inverse-CDF sampling; block -1 if total == 0."""
    total = 0.0
    for j in range(bsum.shape[0]):
        total += bsum[j]
    if not total > 0.0:
        return -1, 0.0, total
    target = u * total
    cum = 0.0
    last = -1
    for j in range(bsum.shape[0]):
        b = bsum[j]
        if b > 0.0:
            last = j
            if cum + b >= target:
                return j, target - cum, total
        cum += b
    return last, np.inf, total


@kernel
def _sample_logits(x, y, mode, excl, mp, itp, thrp, izp, mq, itq, thrq, izq, u, bsum):
    """Inverse-CDF sample; returns -1 when every weight is 0."""
    _block_sums_logits(x, y, mode, excl, mp, itp, thrp, izp, mq, itq, thrq, izq, bsum, False)
    j, rem, total = _pick_block(bsum, u)
    if j < 0:
        return -1
    n = x.shape[0]
    c = 0.0
    last = -1
    for v in range(j * BLOCK, min(n, (j + 1) * BLOCK)):
        w = _el_logits(x, y, v, mode, excl, mp, itp, thrp, izp, mq, itq, thrq, izq)
        if w > 0.0:
            last = v
            c += w
            if c >= rem:
                return v
    return last


@kernel
def _sample_probs(p, q, mode, excl, u, bsum):
    n = p.shape[0]
    for j in range(bsum.shape[0]):
        bsum[j] = _blk_probs(p, q, j * BLOCK, min(n, (j + 1) * BLOCK), mode, excl)
    j, rem, total = _pick_block(bsum, u)
    if j < 0:
        return -1
    c = 0.0
    last = -1
    for v in range(j * BLOCK, min(n, (j + 1) * BLOCK)):
        w = _el_probs(p, q, v, mode, excl)
        if w > 0.0:
            last = v
            c += w
            if c >= rem:
                return v
    return last


# --------------------------------------------------------------------------- row kernels
@kernel
def _verify_row_logits(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seed,
                       out, stats, scratch, bsum):
    """Verify one row from logits; writes out[:], returns nothing.

    stats: [num_accepted, residual_underflows, error_position+1 (0 = ok)].
    """
    greedy = temp == 0.0
    for i in range(nd):
        x = xt[i]
        tok = toks[i]
        mp, itp, thrp, zp, amaxp = row_params(x, temp, top_k, top_p, min_p, scratch)
        if greedy:
            if tok == amaxp:
                out[i] = tok
                continue
            out[i] = amaxp
            stats[0] = i
            return
        px = weight(x[tok], mp, itp) / zp if np.float64(x[tok]) >= thrp else 0.0
        if has_draft:
            y = xd[i]
            mq, itq, thrq, zq, amaxq = row_params(y, temp, top_k, top_p, min_p, scratch)
            qx = weight(y[tok], mq, itq) / zq if np.float64(y[tok]) >= thrq else 0.0
            if not qx > 0.0:
                stats[2] = i + 1
                return
        else:
            y = x
            mq, itq, thrq, zq = 0.0, 0.0, 0.0, 1.0
            qx = 1.0
        u = uniform(seed, i, PURPOSE_ACCEPT, 0)
        if u * qx <= px:
            out[i] = tok
            continue
        stats[0] = i
        ur = uniform(seed, i, PURPOSE_RESIDUAL, 0)
        if has_draft:
            v = _sample_logits(x, y, 1, -1, mp, itp, thrp, 1.0 / zp, mq, itq, thrq, 1.0 / zq, ur, bsum)
        else:
            v = _sample_logits(x, x, 0, tok, mp, itp, thrp, 1.0, 0.0, 0.0, 0.0, 1.0, ur, bsum)
        if v < 0:
            stats[1] += 1
            v = _sample_logits(x, x, 0, -1, mp, itp, thrp, 1.0, 0.0, 0.0, 0.0, 1.0, ur, bsum)
        out[i] = v
        return
    stats[0] = nd
    x = xt[nd]
    mp, itp, thrp, zp, amaxp = row_params(x, temp, top_k, top_p, min_p, scratch)
    if greedy:
        out[nd] = amaxp
        return
    ub = uniform(seed, nd, PURPOSE_BONUS, 0)
    out[nd] = _sample_logits(x, x, 0, -1, mp, itp, thrp, 1.0, 0.0, 0.0, 0.0, 1.0, ub, bsum)


@kernel
def _verify_logits_one(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats, b):
    V = xt.shape[2]
    nb = (V + BLOCK - 1) // BLOCK
    need = (top_k[b] > 0 and top_k[b] < V) or top_p[b] < 1.0
    scratch = np.empty(V if need else 1)
    bsum = np.empty(nb)
    _verify_row_logits(xt[b], xd[b], has_draft, toks[b], nd[b], temp[b], top_k[b], top_p[b], min_p[b],
                       seeds[b], out[b], stats[b], scratch, bsum)


@parallel_kernel
def _verify_logits_kernel(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats):
    for b in prange(xt.shape[0]):
        _verify_logits_one(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats, b)


# --------------------------------------------------------------------------- fused fast path
# Rows without top-k/top-p (temperature, greedy and min-p only).  Per visited position: one IEEE-maximum
# pass per row (vectorized; it also validates the row: NaN/+inf/all -inf), one pass computing the weights
# exp((x - m) / T) of the target and draft rows into per-thread float64 buffers with per-BLOCK sums, and
# on rejection the residual's block sums from the buffers (no exp) plus a scan of one block.  Positions
# after the first rejection are only validated (one maximum pass), never normalized.  All sums are per
# BLOCK and then combined in block order, so the result is the same whether a row's blocks are computed
# by one thread or split across threads (the vocabulary-parallel path for B < threads).
PAR_MIN_V = 65536  # below this V a row's passes are not split across threads (thread wake-up dominates)
# Split the exp passes of single rows across threads (B < threads)?  Off by default: on the shared 2-core
# benchmark machine (load 4-8) it measured ~10% slower at B = 1 (the second thread is rarely free, and a
# static split waits for it); results are identical either way (tests/test_perf_paths.py runs both).
VOCAB_PARALLEL = False


@kernel
def _wblocks(x, y, two, mp, itp, thrp, mq, itq, thrq, wp, wq, zpb, zqb, j0, j1, xn, yn, nxt, mxb, myb):
    """For blocks j0..j1-1: wp[v] = kept weight of x[v], zpb[j] = its block sum (same for y if ``two``).

    Also the block maxima of the rows visited (or validated) next -- ``xn`` into mxb if nxt & 1, ``yn``
    into myb if nxt & 2 -- so their first read from memory overlaps this compute-bound pass."""
    n = x.shape[0]
    for j in range(j0, j1):
        lo = j * BLOCK
        hi = min(n, lo + BLOCK)
        xs = x[lo:hi]  # slices: loops from 0 let LLVM drop the negative-index checks and vectorize
        ws = wp[lo:hi]
        s = 0.0
        for v in range(xs.shape[0]):
            xv = np.float64(xs[v])
            a = weight(xv, mp, itp)
            a = a if xv >= thrp else 0.0
            ws[v] = a
            s += a
        zpb[j] = s
        if two:
            ys = y[lo:hi]
            wqs = wq[lo:hi]
            s = 0.0
            for v in range(ys.shape[0]):
                yv = np.float64(ys[v])
                b = weight(yv, mq, itq)
                b = b if yv >= thrq else 0.0
                wqs[v] = b
                s += b
            zqb[j] = s
        if nxt & 1:
            mxb[j] = vmax(xn[lo:hi])
        if nxt & 2:
            myb[j] = vmax(yn[lo:hi])


@parallel_kernel
def _wblocks_par(x, y, two, mp, itp, thrp, mq, itq, thrq, wp, wq, zpb, zqb, xn, yn, nxt, mxb, myb):
    for j in prange(zpb.shape[0]):
        _wblocks(x, y, two, mp, itp, thrp, mq, itq, thrq, wp, wq, zpb, zqb, j, j + 1, xn, yn, nxt, mxb, myb)


@kernel
def _weights_and_next(x, y, two, mp, itp, thrp, mq, itq, thrq, wp, wq, zpb, zqb, xn, yn, nxt, mxb, myb, par):
    if par:
        _wblocks_par(x, y, two, mp, itp, thrp, mq, itq, thrq, wp, wq, zpb, zqb, xn, yn, nxt, mxb, myb)
    else:
        _wblocks(x, y, two, mp, itp, thrp, mq, itq, thrq, wp, wq, zpb, zqb, 0, zpb.shape[0], xn, yn, nxt, mxb, myb)


@kernel
def _max_of_blocks(mb):
    m = mb[0]
    for j in range(mb.shape[0]):
        m = fmaximum(m, mb[j])
    return m


@kernel
def _resid(a, b, izp, izq):
    """max(a/zp - b/zq, 0) with explicit rounding steps (bitwise the same in every loop shape)."""
    d = _fma(a, izp, -(b * izq))
    return d if d > 0.0 else 0.0


@kernel
def _sample_w(wp, wq, mode, excl, izp, izq, zpb, bsum, u):
    """Inverse-CDF sample from stored weights: mode 0 -> wp without ``excl``; mode 1 -> max(p - q, 0).
    zpb holds wp's block sums.  Returns -1 when every weight is 0."""
    n = wp.shape[0]
    nb = zpb.shape[0]
    if mode == 0:
        for j in range(nb):
            bsum[j] = zpb[j]
        if excl >= 0:
            j = excl // BLOCK
            ws = wp[j * BLOCK:min(n, (j + 1) * BLOCK)]
            e = excl - j * BLOCK
            s = 0.0
            for v in range(ws.shape[0]):
                s += ws[v] if v != e else 0.0
            bsum[j] = s
    else:
        for j in range(nb):
            ws = wp[j * BLOCK:min(n, (j + 1) * BLOCK)]
            wqs = wq[j * BLOCK:min(n, (j + 1) * BLOCK)]
            s = 0.0
            for v in range(ws.shape[0]):
                s += _resid(ws[v], wqs[v], izp, izq)
            bsum[j] = s
    j, rem, total = _pick_block(bsum, u)
    if j < 0:
        return -1
    c = 0.0
    last = -1
    for v in range(j * BLOCK, min(n, (j + 1) * BLOCK)):
        if mode == 0:
            w = wp[v] if v != excl else 0.0
        else:
            w = _resid(wp[v], wq[v], izp, izq)
        if w > 0.0:
            last = v
            c += w
            if c >= rem:
                return v
    return last


@kernel
def _first_index_of(x, m):
    for i in range(x.shape[0]):
        if np.float64(x[i]) == m:
            return i
    return 0


@kernel
def _check_rest(xt, xd, t0, d0, stats):
    """Validate target positions t0.. and draft positions d0.. of one row (stats[3]: 1 target, 2 draft)."""
    for i in range(t0, xt.shape[0]):
        if logits_status(vmax(xt[i])) != 0:
            stats[3] = 1
            return
    for i in range(d0, xd.shape[0]):
        if logits_status(vmax(xd[i])) != 0:
            stats[3] = 2
            return


@kernel
def _verify_row_fast(xt, xd, has_draft, toks, nd, temp, min_p, seed, out, stats, wp, wq, zpb, zqb, bsum,
                     mxb, myb, par, mt, md, pre):
    """Verify one row (no top-k/top-p) from logits; validates the row's values as it goes.

    stats: [num_accepted, residual_underflows, error_position+1 (q = 0), bad values (1 target, 2 draft)].
    Every target/draft position of the row is validated exactly once: by the max pass of a visited
    position (fused into the previous position's weight pass when there is one), else by _check_rest.
    With ``pre`` the maxima mt [K+1], md [K] were computed (and validated) beforehand.
    """
    greedy = temp == 0.0
    it = 0.0 if greedy else 1.0 / temp
    lmp = math.log(min_p) if min_p > 0.0 else 0.0
    K1 = xt.shape[0]
    Kd = xd.shape[0]
    t_ok = 0  # target rows [0, t_ok) validated
    d_ok = 0
    have_t = False  # max of target row t_ok already computed (pm_t)
    have_d = False
    pm_t = 0.0
    pm_d = 0.0
    for i in range(nd + 1):
        x = xt[i]
        mp = mt[i] if pre else (pm_t if have_t else vmax(x))
        have_t = False
        if logits_status(mp) != 0:
            stats[3] = 1
            return
        t_ok = i + 1
        if greedy:
            amax = _first_index_of(x, mp)
            if i < nd and toks[i] == amax:
                out[i] = amax
                continue
            out[i] = amax
            stats[0] = i
            break
        thrp = mp + temp * lmp if min_p > 0.0 else -np.inf
        two = has_draft and i < nd
        if two:
            y = xd[i]
            mq = md[i] if pre else (pm_d if have_d else vmax(y))
            have_d = False
            if logits_status(mq) != 0:
                stats[3] = 2
                return
            d_ok = i + 1
            thrq = mq + temp * lmp if min_p > 0.0 else -np.inf
        else:
            y = x
            mq = 0.0
            thrq = 0.0
        # rows validated next: target t_ok (= i + 1) and draft d_ok (i + 1, or nd after the bonus position)
        nxt = 0 if pre else (1 if t_ok < K1 else 0) + (2 if d_ok < Kd else 0)
        xn = xt[t_ok] if nxt & 1 else x
        yn = xd[d_ok] if nxt & 2 else x
        _weights_and_next(x, y, two, mp, it, thrp, mq, it, thrq, wp, wq, zpb, zqb, xn, yn, nxt, mxb, myb, par)
        if nxt & 1:
            pm_t = _max_of_blocks(mxb)
            have_t = True
        if nxt & 2:
            pm_d = _max_of_blocks(myb)
            have_d = True
        zp = 0.0
        for j in range(zpb.shape[0]):
            zp += zpb[j]
        if i == nd:  # every draft accepted: bonus token from p_nd
            stats[0] = nd
            ub = uniform(seed, nd, PURPOSE_BONUS, 0)
            out[nd] = _sample_w(wp, wq, 0, -1, 1.0, 1.0, zpb, bsum, ub)
            break
        tok = toks[i]
        px = wp[tok] / zp
        if has_draft:
            zq = 0.0
            for j in range(zqb.shape[0]):
                zq += zqb[j]
            qx = wq[tok] / zq
            if not qx > 0.0:
                stats[2] = i + 1
                break
        else:
            zq = 1.0
            qx = 1.0
        u = uniform(seed, i, PURPOSE_ACCEPT, 0)
        if u * qx <= px:
            out[i] = tok
            continue
        stats[0] = i
        ur = uniform(seed, i, PURPOSE_RESIDUAL, 0)
        if has_draft:
            v = _sample_w(wp, wq, 1, -1, 1.0 / zp, 1.0 / zq, zpb, bsum, ur)
        else:
            v = _sample_w(wp, wq, 0, tok, 1.0, 1.0, zpb, bsum, ur)
        if v < 0:
            stats[1] += 1
            v = _sample_w(wp, wq, 0, -1, 1.0, 1.0, zpb, bsum, ur)
        out[i] = v
        break
    if pre:
        return
    if have_t:  # the next target row's max was computed but the row was not visited
        if logits_status(pm_t) != 0:
            stats[3] = 1
            return
        t_ok += 1
    if have_d:
        if logits_status(pm_d) != 0:
            stats[3] = 2
            return
        d_ok += 1
    _check_rest(xt, xd, t_ok, d_ok, stats)


@kernel
def _verify_row_any(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seed, out, stats,
                    wp, wq, zpb, zqb, bsum, mxb, myb, par, mt, md, pre):
    V = xt.shape[1]
    if has_draft and temp > 0.0:  # flag drafted tokens with draft logit -inf; the caller words the error
        for i in range(nd):
            if xd[i, toks[i]] == -np.inf:
                stats[4] = 1
    if (top_k > 0 and top_k < V) or top_p < 1.0:  # general path (row_params); validate first
        if not pre:
            _check_rest(xt, xd, 0, 0, stats)
        if stats[3] == 0:
            _verify_row_logits(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seed,
                               out, stats, wp, bsum)
    else:
        _verify_row_fast(xt, xd, has_draft, toks, nd, temp, min_p, seed, out, stats, wp, wq, zpb, zqb, bsum,
                         mxb, myb, par, mt, md, pre)


@parallel_kernel
def _verify_fused_kernel(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats, nth,
                         W, Z, MT, MD):
    """Rows in parallel: thread chunk c takes rows c, c + nth, ... with buffers W[c] ([2, V]) and Z[c]
    ([5, blocks])."""
    B = xt.shape[0]
    for c in prange(nth):
        w = W[c]
        z = Z[c]
        for b in range(c, B, nth):
            _verify_row_any(xt[b], xd[b], has_draft, toks[b], nd[b], temp[b], top_k[b], top_p[b], min_p[b],
                            seeds[b], out[b], stats[b], w[0], w[1], z[0], z[1], z[2], z[3], z[4], False,
                            MT[0], MD[0], False)


@kernel
def _verify_fused_rows(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats, par, W, Z,
                       MT, MD, pre):
    """Rows one after the other (no parallel region for the rows; ``par`` splits each row's
    weight pass over the vocabulary blocks across threads).  Buffers W[0], Z[0] as above.  With ``pre``
    MT [B, K+1] and MD [B, K] hold every row's max (from :func:`_all_maxima`)."""
    w = W[0]
    z = Z[0]
    for b in range(xt.shape[0]):
        if pre:
            for i in range(MT.shape[1]):
                if logits_status(MT[b, i]) != 0:
                    stats[b, 3] = 1
                    break
            if stats[b, 3] == 0:
                for i in range(MD.shape[1]):
                    if logits_status(MD[b, i]) != 0:
                        stats[b, 3] = 2
                        break
            if stats[b, 3] != 0:
                continue
        _verify_row_any(xt[b], xd[b], has_draft, toks[b], nd[b], temp[b], top_k[b], top_p[b], min_p[b],
                        seeds[b], out[b], stats[b], w[0], w[1], z[0], z[1], z[2], z[3], z[4], par,
                        MT[b], MD[b], pre)


@parallel_kernel
def _all_maxima(xt, xd, MT, MD):
    """MT[b, i] = max of xt[b, i], MD[b, i] = max of xd[b, i] (NaN/+inf/-inf flag bad rows), in parallel."""
    B, K1 = MT.shape
    Kd = MD.shape[1]
    for k in prange(B * (K1 + Kd)):
        b = k // (K1 + Kd)
        i = k - b * (K1 + Kd)
        if i < K1:
            MT[b, i] = vmax(xt[b, i])
        else:
            MD[b, i - K1] = vmax(xd[b, i - K1])


_buffers = threading.local()


def _work_buffers(n, V):
    """Per-(Python-)thread work buffers for n kernel threads: W [n, 2, V], Z [n, 5, blocks] (float64).

    Kept between calls: fresh multi-MiB allocations are page-faulted in on every call once other
    code has made the allocator return memory to the OS (measured: +0.15 ms per call at V = 32000).
    Thread-local, so concurrent calls from several Python threads (nogil kernels) never share them.
    """
    nb = (V + BLOCK - 1) // BLOCK
    flat = getattr(_buffers, "flat", None)
    need = n * (2 * V + 5 * nb)
    if flat is None or flat.shape[0] < need:
        flat = _buffers.flat = np.empty(need)
    W = flat[:n * 2 * V].reshape(n, 2, V)
    Z = flat[n * 2 * V:need].reshape(n, 5, nb)
    return W, Z


def _run_token_logits(xt, xd, has_draft, toks, nd, t, k, p, mp, seeds, out, stats):
    """Dispatch: rows in parallel when B >= threads, else rows in turn with vocabulary-parallel passes."""
    B, _, V = xt.shape
    if not B:
        return
    nth = numba.get_num_threads()
    if B >= nth or nth == 1:
        n = min(nth, B)
        W, Z = _work_buffers(n, V)
        none = np.empty((1, 0))
        if n == 1:  # one thread: no parallel region at all
            _verify_fused_rows(xt, xd, has_draft, toks, nd, t, k, p, mp, seeds, out, stats, False, W, Z,
                               none, none, False)
        else:
            _verify_fused_kernel(xt, xd, has_draft, toks, nd, t, k, p, mp, seeds, out, stats, n, W, Z, none, none)
    else:
        # Fewer rows than threads: the rows in turn.  When V is large enough to pay for thread wake-ups,
        # one parallel pass first takes every row's max (validation, and the first read of the data with
        # all threads' memory bandwidth) and each row's exp passes are split by vocabulary block.
        W, Z = _work_buffers(1, V)
        par = VOCAB_PARALLEL and V >= PAR_MIN_V
        if par:
            MT = np.empty((B, xt.shape[1]))
            MD = np.empty((B, xd.shape[1]))
            _all_maxima(xt, xd, MT, MD)
        else:
            MT = MD = np.empty((1, 0))
        _verify_fused_rows(xt, xd, has_draft, toks, nd, t, k, p, mp, seeds, out, stats, par, W, Z, MT, MD, par)


@kernel
def _verify_row_probs(pt, pd, has_draft, toks, nd, seed, out, stats, bsum):
    for i in range(nd):
        p = pt[i]
        tok = toks[i]
        px = p[tok]
        if has_draft:
            q = pd[i]
            qx = q[tok]
        else:
            q = p
            qx = 1.0
        u = uniform(seed, i, PURPOSE_ACCEPT, 0)
        if u * qx <= px:
            out[i] = tok
            continue
        stats[0] = i
        ur = uniform(seed, i, PURPOSE_RESIDUAL, 0)
        if has_draft:
            v = _sample_probs(p, q, 1, -1, ur, bsum)
        else:
            v = _sample_probs(p, p, 0, tok, ur, bsum)
        if v < 0:
            stats[1] += 1
            v = _sample_probs(p, p, 0, -1, ur, bsum)
        out[i] = v
        return
    stats[0] = nd
    ub = uniform(seed, nd, PURPOSE_BONUS, 0)
    out[nd] = _sample_probs(pt[nd], pt[nd], 0, -1, ub, bsum)


@parallel_kernel
def _verify_probs_kernel(pt, pd, has_draft, toks, nd, seeds, out, stats):
    B = pt.shape[0]
    V = pt.shape[2]
    nb = (V + BLOCK - 1) // BLOCK
    for b in prange(B):
        bsum = np.empty(nb)
        _verify_row_probs(pt[b], pd[b], has_draft, toks[b], nd[b], seeds[b], out[b], stats[b], bsum)


# --------------------------------------------------------------------------- validation helpers
def _validate_tokens(draft_tokens, B, K, V, num_draft):
    if (num_draft is None and type(draft_tokens) is np.ndarray and draft_tokens.dtype == np.int64
            and draft_tokens.shape == (B, K) and draft_tokens.flags.c_contiguous
            and (K == 0 or B == 0 or (draft_tokens.min() >= 0 and draft_tokens.max() < V))):
        return draft_tokens, np.full(B, K, dtype=np.int64)  # common case, same result as below
    toks = np.asarray(draft_tokens)
    if toks.dtype == bool or not np.issubdtype(toks.dtype, np.integer):
        if toks.size == 0 and toks.dtype == np.float64:
            toks = toks.astype(np.int64)
        else:
            raise TypeError(f"draft_tokens must be an integer array of shape [{B}, {K}], got dtype {toks.dtype}")
    if toks.shape != (B, K):
        raise ValueError(f"draft_tokens must have shape [B, K] = [{B}, {K}] to match the logits, "
                         f"got shape {list(toks.shape)}")
    toks = np.ascontiguousarray(toks, dtype=np.int64)
    if num_draft is None:
        nd = np.full(B, K, dtype=np.int64)
    else:
        nd = np.asarray(num_draft)
        if nd.dtype == bool or not np.issubdtype(nd.dtype, np.integer):
            raise TypeError(f"num_draft must be an integer array of shape [{B}], got dtype {nd.dtype}")
        if nd.ndim == 0:
            nd = np.full(B, int(nd), dtype=np.int64)
        if nd.shape != (B,):
            raise ValueError(f"num_draft must have shape [{B}] (one count per row), got shape {list(nd.shape)}")
        nd = np.ascontiguousarray(nd, dtype=np.int64)
        bad = (nd < 0) | (nd > K)
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise ValueError(f"num_draft[{b}] = {nd[b]} is outside [0, {K}]: use the number of drafted tokens in row {b}")
    inside = np.arange(K)[None, :] < nd[:, None]
    bad = inside & ((toks < 0) | (toks >= V))
    if bad.any():
        b, i = (int(t) for t in np.argwhere(bad)[0])
        what = "-1 padding" if toks[b, i] == -1 else f"token id {toks[b, i]}"
        raise ValueError(f"draft_tokens[{b}, {i}] = {toks[b, i]} ({what}) is invalid: ids must lie in [0, {V}) "
                         f"within num_draft[{b}] = {nd[b]}; pass num_draft for ragged rows")
    toks = np.where(inside, toks, 0)  # padding beyond num_draft is never read; make it a safe id
    return toks, nd


def _check_draft_shape(name, d, B, K, V):
    if d.shape != (B, K, V):
        raise ValueError(f"{name} must have shape [B, K, V] = [{B}, {K}, {V}] (K = target positions - 1), "
                         f"got shape {list(d.shape)}")


def _rows3(a):
    """Contiguous last axis (the kernels read rows)."""
    if a.strides[-1] != a.itemsize or not all(s % a.itemsize == 0 for s in a.strides):
        a = np.ascontiguousarray(a)
    return a


def _finish(out, stats, nd, what):
    err = stats[:, 2]
    if err.any():
        b = int(np.flatnonzero(err)[0])
        i = int(err[b]) - 1
        raise ValueError(f"draft_tokens[{b}, {i}] has draft probability q = 0 under the processed {what}: "
                         "a drafted token must have been sampled from the draft distribution "
                         "(pass draft_logits=None for deterministic proposers)")
    acc = stats[:, 0].copy()
    return VerifyResult(tokens=out, num_accepted=acc, num_emitted=acc + 1, residual_underflows=stats[:, 1].copy(),
                        num_draft=np.asarray(nd, dtype=np.int64).copy())


def _check_draft_inf(xd, toks, nd, t, has_draft):
    K = toks.shape[1]
    if has_draft and K > 0:
        dx = np.take_along_axis(xd, toks[:, :, None], axis=2)[:, :, 0]
        bad = (np.arange(K)[None, :] < nd[:, None]) & (dx == -np.inf) & (t[:, None] > 0)
        if bad.any():
            b, i = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(f"draft_tokens[{b}, {i}] = {toks[b, i]} has draft logit -inf (q = 0): a drafted "
                             "token must have been sampled from the draft distribution")


# --------------------------------------------------------------------------- public API
def _check_method(method):
    from .block import check_method

    return check_method(method)


def verify_logits(target_logits, draft_logits, draft_tokens, *, num_draft=None, temperature=1.0, top_k=0,
                  top_p=1.0, min_p=0.0, seed=0, method="token") -> VerifyResult:
    """Verify a batch of drafted tokens from raw logits.

    target_logits: [B, K+1, V] float16/32/64 (any layout, read-only/memory-mapped fine);
    draft_logits: [B, K, V] or None (deterministic proposer: q one-hot on the draft);
    draft_tokens: int [B, K]; num_draft: int [B] for ragged rows (row b uses its first
    num_draft[b] drafts and target position num_draft[b] for its bonus token).
    temperature/top_k/top_p/min_p: scalars or one per row, applied to both the target and
    the draft logits (see ``fastspec.probabilities``); seed: scalar or int64 [B].
    method: "token" (token-by-token rejection sampling) or "block" (block verification,
    :mod:`fastspec.block`: same inputs, outputs, determinism and errors; accepts at least as many
    drafts in expectation).
    """
    method = _check_method(method)  # "token" or "block" (block verification, fastspec.block)
    # The token kernel validates the logits' values (NaN/+inf/all -inf rows) while it reads them; the
    # full validate_logits then runs only to word the error (same messages).
    check = check_logits_array if method in ("token", "block") else validate_logits
    xt = check("target_logits", target_logits, ndim=3)
    B, K1, V = xt.shape
    if K1 < 1:
        raise ValueError(f"target_logits must have K+1 >= 1 positions, got shape {list(xt.shape)}")
    K = K1 - 1
    has_draft = draft_logits is not None
    if has_draft:
        xd = check("draft_logits", draft_logits, ndim=3)
        _check_draft_shape("draft_logits", xd, B, K, V)
        if xd.dtype != xt.dtype:
            common = np.promote_types(xt.dtype, xd.dtype)
            xt, xd = xt.astype(common), xd.astype(common)
    else:
        xd = np.zeros((B, 0, V), dtype=xt.dtype)
    toks, nd = _validate_tokens(draft_tokens, B, K, V, num_draft)
    t, k, p, mp = validate_sampling_params(B, temperature, top_k, top_p, min_p)
    seeds = row_seeds(seed, B)
    if method != "token":
        _check_draft_inf(xd, toks, nd, t, has_draft)
    xt, xd = _rows3(xt), _rows3(xd)
    out = np.full((B, K + 1), -1, dtype=np.int64)
    stats = np.zeros((B, 3), dtype=np.int64)
    if method == "token":
        stats = np.zeros((B, 5), dtype=np.int64)
        _run_token_logits(xt, xd, has_draft, toks, nd, t, k, p, mp, seeds, out, stats)
        if stats[:, 3].any():  # a bad value somewhere: word the error as validate_logits does (target first)
            validate_logits("target_logits", target_logits, ndim=3)
            if has_draft:
                validate_logits("draft_logits", draft_logits, ndim=3)
            raise ValueError("logits must be finite or -inf (masked), with a finite value in every row")
        if stats[:, 4].any():
            _check_draft_inf(xd, toks, nd, t, has_draft)
        return _finish(out, stats, nd, "draft logits")
    if method == "block":  # validates the values while reading them, like the token kernel
        from .block import run_block_logits

        stats = np.zeros((B, 4), dtype=np.int64)
        run_block_logits(xt, xd, has_draft, toks, nd, t, k, p, mp, seeds, out, stats)
        if stats[:, 3].any():
            validate_logits("target_logits", target_logits, ndim=3)
            if has_draft:
                validate_logits("draft_logits", draft_logits, ndim=3)
            raise ValueError("logits must be finite or -inf (masked), with a finite value in every row")
        return _finish(out, stats, nd, "draft logits")
    raise AssertionError(f"unreachable: method {method!r} passed _check_method")  # pragma: no cover


def _validate_probs(name, a, ndim):
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer) or a.dtype == bool:
        raise TypeError(f"{name} must be a float array of probabilities, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {list(a.shape)}")
    a = np.asarray(a, dtype=np.float64)
    if a.shape[-1] < 1:
        raise ValueError(f"{name} must have a non-empty vocabulary axis, got shape {list(a.shape)}")
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}{list(idx)} = {a[idx]!r}: probabilities must be finite and non-negative")
    s = a.sum(axis=-1)
    bad = np.abs(s - 1.0) > 1e-6
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}{list(idx)} sums to {s[idx]!r}, not 1 within 1e-6: pass normalized "
                         "probabilities (or use verify_logits with raw logits)")
    return a


def verify_probs(target_probs, draft_probs, draft_tokens, *, num_draft=None, seed=0,
                 method="token") -> VerifyResult:
    """Verify drafted tokens from already-processed probabilities.

    target_probs: [B, K+1, V], draft_probs: [B, K, V] or None (one-hot drafts); both
    validated: non-negative, finite, each row sums to 1 within 1e-6.  method: "token" or "block"
    (block verification, :mod:`fastspec.block`).
    """
    method = _check_method(method)  # "token" or "block" (block verification, fastspec.block)
    pt = _validate_probs("target_probs", target_probs, 3)
    B, K1, V = pt.shape
    if K1 < 1:
        raise ValueError(f"target_probs must have K+1 >= 1 positions, got shape {list(pt.shape)}")
    K = K1 - 1
    has_draft = draft_probs is not None
    if has_draft:
        pd = _validate_probs("draft_probs", draft_probs, 3)
        _check_draft_shape("draft_probs", pd, B, K, V)
    else:
        pd = np.zeros((B, 0, V))
    toks, nd = _validate_tokens(draft_tokens, B, K, V, num_draft)
    seeds = row_seeds(seed, B)
    if has_draft and K > 0:
        qx = np.take_along_axis(pd, toks[:, :, None], axis=2)[:, :, 0]
        bad = (np.arange(K)[None, :] < nd[:, None]) & (qx == 0)
        if bad.any():
            b, i = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(f"draft_tokens[{b}, {i}] = {toks[b, i]} has draft probability q = 0: a drafted "
                             "token must have been sampled from the draft distribution")
    pt, pd = np.ascontiguousarray(pt), np.ascontiguousarray(pd)
    out = np.full((B, K + 1), -1, dtype=np.int64)
    stats = np.zeros((B, 3), dtype=np.int64)
    if method == "block":
        from .block import run_block_probs

        run_block_probs(pt, pd, has_draft, toks, nd, seeds, out, stats)
    elif B:
        _verify_probs_kernel(pt, pd, has_draft, toks, nd, seeds, out, stats)
    return _finish(out, stats, nd, "draft probabilities")


# --------------------------------------------------------------------------- internals for tests
@kernel
def _residual_weights_probs(p, q, mode, excl, out):
    n = p.shape[0]
    total = 0.0
    for j in range((n + BLOCK - 1) // BLOCK):
        total += _blk_probs(p, q, j * BLOCK, min(n, (j + 1) * BLOCK), mode, excl)
    for v in range(n):
        out[v] = _el_probs(p, q, v, mode, excl)
    return total


@kernel
def _residual_weights_logits(x, y, mode, excl, temp, top_k, top_p, min_p, out):
    scratch = np.empty(x.shape[0])
    mp, itp, thrp, zp, _ = row_params(x, temp, top_k, top_p, min_p, scratch)
    if mode == 1:
        mq, itq, thrq, zq, _ = row_params(y, temp, top_k, top_p, min_p, scratch)
    else:
        mq, itq, thrq, zq = 0.0, 0.0, 0.0, 1.0
    n = x.shape[0]
    izp = 1.0 if mode == 0 else 1.0 / zp
    izq = 1.0 / zq
    total = 0.0
    for j in range((n + BLOCK - 1) // BLOCK):
        total += _blk_logits(x, y, j * BLOCK, min(n, (j + 1) * BLOCK), mode, excl, mp, itp, thrp, izp, mq, itq,
                             thrq, izq)
    for v in range(n):
        out[v] = _el_logits(x, y, v, mode, excl, mp, itp, thrp, izp, mq, itq, thrq, izq)
    return total


def verification_distributions(p, q, token):
    """Internal (tests): for one position with target probs p [V], draft probs q [V] (or None
    for a one-hot draft on ``token``), the kernel's acceptance probability of ``token`` and the
    distribution the recovered token is sampled from on rejection (None if never rejected).

    Returns (acceptance_probability, recovered [V] float64 or None, residual_underflow bool).
    """
    p = np.ascontiguousarray(p, dtype=np.float64)
    qx = 1.0 if q is None else float(q[token])
    acc = min(1.0, float(p[token]) / qx)
    w = np.empty_like(p)
    if q is None:
        total = _residual_weights_probs(p, p, 0, token, w)
    else:
        total = _residual_weights_probs(p, np.ascontiguousarray(q, dtype=np.float64), 1, -1, w)
    if acc >= 1.0:
        return acc, None, False
    if total == 0.0:
        return acc, p / p.sum(), True
    return acc, w / total, False


def verification_distributions_logits(target_row, draft_row, token, *, temperature=1.0, top_k=0, top_p=1.0,
                                      min_p=0.0):
    """Internal (tests): the processed p(x), q(x) and the recovered distribution the logits
    kernel samples from on rejection at one position (q one-hot when draft_row is None)."""
    x = np.ascontiguousarray(validate_logits("target_row", target_row, ndim=1))
    scratch = np.empty(x.shape[0])
    mp, itp, thrp, zp, _ = row_params(x, float(temperature), int(top_k), float(top_p), float(min_p), scratch)
    px = weight(x[token], mp, itp) / zp if float(x[token]) >= thrp else 0.0
    w = np.empty(x.shape[0])
    if draft_row is None:
        qx = 1.0
        total = _residual_weights_logits(x, x, 0, token, float(temperature), int(top_k), float(top_p),
                                         float(min_p), w)
    else:
        y = np.ascontiguousarray(validate_logits("draft_row", draft_row, ndim=1)).astype(x.dtype)
        mq, itq, thrq, zq, _ = row_params(y, float(temperature), int(top_k), float(top_p), float(min_p), scratch)
        qx = weight(y[token], mq, itq) / zq if float(y[token]) >= thrq else 0.0
        total = _residual_weights_logits(x, y, 1, -1, float(temperature), int(top_k), float(top_p),
                                         float(min_p), w)
    rec = None if total == 0.0 else w / total
    return px, qx, rec
