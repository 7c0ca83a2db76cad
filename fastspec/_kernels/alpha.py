"""Acceptance-rate kernels: dense ``alpha = sum_v min(p, q)`` per row pair, and the sparse top-k bounds.

Dense rows (float16 as uint16 bits, float32, float64) are processed with the same primitives as
verification: the max pass (also the validity check), the cutoff of top-k/top-p/min-p, the stored weights
with fixed-order block sums, then a fixed-order sum of ``min(ep/zp, eq/zq)`` over the stored weights (no
exponential, :func:`fastspec._numba.lanes.lane_min_sum`).  float16 rows take their weights from a table over
the 65,536 float16 values instead of an exponential per token (:mod:`fastspec._kernels.half`).  The formulas of
the sparse bounds are derived in :mod:`fastspec.acceptance`.
"""
from __future__ import annotations

import math

import numpy as np

from .._numba.jit import parallel_kernel, kernel, prange
from .._numba.lanes import lane_min_sum
from .codes import DRAFT_STATUS, ROW_OK
from .rows import argmax_of, row_max, status
from . import half
from .process import processed_weights, row_cutoff, row_params
from .sample import block_count


@kernel
def _weights(x, m, sp, scratch, w, bsum, use_table, tables, state):
    """z of a valid row (temperature > 0) with its processed weights stored in w: from the float16 table when
    ``use_table`` (:mod:`fastspec._kernels.half`), else with fastspec's exp."""
    if not use_table:
        return processed_weights(x, m, sp, scratch, w, bsum)[2]
    inv_t, thr = row_cutoff(x, m, sp, scratch)
    table, c = half.serves(tables, state, m, inv_t)
    return half.table_weights(x, m, inv_t, thr, w, bsum, table, c)


@kernel
def alpha_row(x, y, sp, ep, eq, bsum, use_table, tables, state):
    """(alpha, status) of one row pair under sampling sp = (temperature, top_k, top_p, min_p); status ROW_OK,
    the target row's :func:`status` (NaN/+inf/no finite value) or :data:`DRAFT_STATUS` + the draft row's.
    ``use_table``: float16 rows (uint16 bits) take their weights from the per-thread tables (tables, state)."""
    mp = row_max(x)
    st = status(mp)
    if st != ROW_OK:
        return 0.0, st
    mq = row_max(y)
    sq = status(mq)
    if sq != ROW_OK:
        return 0.0, DRAFT_STATUS + sq
    if sp[0] == 0.0:
        return (1.0 if argmax_of(x, mp) == argmax_of(y, mq) else 0.0), ROW_OK
    zp = _weights(x, mp, sp, eq, ep, bsum, use_table, tables, state)  # eq: scratch first
    zq = _weights(y, mq, sp, eq, eq, bsum, use_table, tables, state)
    return min(lane_min_sum(ep, eq, 1.0 / zp, 1.0 / zq, 0, ep.shape[0]), 1.0), ROW_OK


@parallel_kernel
def alpha_rows(P, Q, params, valid, nthreads, use_table, out, status_out):
    """alpha per row of P, Q [R, V] (rows where ``valid`` is False get 0): thread c takes a contiguous range
    of rows with its own work arrays (and, with ``use_table`` -- float16 rows -- its own weight tables)."""
    R, V = P.shape
    nth = min(nthreads, max(R, 1))
    nb = block_count(V)
    for c in prange(nth):
        ep = np.empty(V)
        eq = np.empty(V)
        bsum = np.empty(nb)
        tables = np.empty((half.SLOTS, half.HALF_VALUES) if use_table else (1, 1))
        state = np.zeros(half.STATE)
        for r in range(c * R // nth, (c + 1) * R // nth):
            out[r] = 0.0
            status_out[r] = 0
            if valid[r]:
                out[r], status_out[r] = alpha_row(P[r], Q[r], row_params(params, r), ep, eq, bsum, use_table, tables,
                                                  state)


@kernel
def _top1(ids, lps, r):
    """Index of the largest log-probability of row r, lowest id on ties."""
    best = 0
    for j in range(ids.shape[1]):
        if lps[r, j] > lps[r, best] or (lps[r, j] == lps[r, best] and ids[r, j] < ids[r, best]):
            best = j
    return best


@kernel
def _mass_and_min(lps, r):
    """(sum, min) of the listed probabilities exp(lps[r, j])."""
    total = 0.0
    low = 1.0
    for j in range(lps.shape[1]):
        v = math.exp(lps[r, j])
        total += v
        low = min(low, v)
    return total, low


@kernel
def merged_bounds(ti, tl, op, di, dl, oq, r, sp, pmin, sq, qmin):
    """[lower, upper] of alpha for row ``r`` from the listed (id, logprob) entries of both sides, merged in id order
    (op / oq sort each row's ids); ``sp`` / ``sq``: each side's listed mass, ``pmin`` / ``qmin``: the cap on each
    side's unlisted probabilities.  Shared by :func:`bounds_rows` (caps = smallest listed probability) and
    :func:`fastspec._kernels.known.known_bounds_rows` (caps = smallest top-k probability)."""
    kp = ti.shape[1]
    kq = di.shape[1]
    rp = max(0.0, 1.0 - sp)
    rq = max(0.0, 1.0 - sq)
    A = 0.0
    Ad = 0.0
    b = 0.0
    bx = 0.0
    c = 0.0
    cx = 0.0
    i = 0
    j = 0
    while i < kp or j < kq:
        if j >= kq or (i < kp and ti[r, op[r, i]] < di[r, oq[r, j]]):
            pv = math.exp(tl[r, op[r, i]])
            b += min(pv, qmin)
            bx += max(pv - qmin, 0.0)
            i += 1
        elif i >= kp or di[r, oq[r, j]] < ti[r, op[r, i]]:
            qv = math.exp(dl[r, oq[r, j]])
            c += min(qv, pmin)
            cx += max(qv - pmin, 0.0)
            j += 1
        else:
            pv = math.exp(tl[r, op[r, i]])
            qv = math.exp(dl[r, oq[r, j]])
            A += min(pv, qv)
            Ad += abs(pv - qv)
            i += 1
            j += 1
    u = min(min(b, rq) + rp, min(c, rp) + rq)
    u = min(u, b + c + min(rp, rq))
    u = min(u, 1.0 - A - 0.5 * (Ad + bx + cx))
    L = min(A, 1.0)
    return L, min(max(A + max(u, 0.0), L), 1.0)


@parallel_kernel
def bounds_rows(ti, tl, op, di, dl, oq, valid, greedy, lo, hi):
    """[lower, upper] of alpha per row from sparse top-k lists (ids int64, logprobs float64); op / oq: the order
    that sorts each row's ids (merge walk over the two lists)."""
    R = ti.shape[0]
    for r in prange(R):
        lo[r] = 0.0
        hi[r] = 0.0
        if not valid[r]:
            continue
        if greedy:
            a = 1.0 if ti[r, _top1(ti, tl, r)] == di[r, _top1(di, dl, r)] else 0.0
            lo[r] = a
            hi[r] = a
            continue
        sp, pmin = _mass_and_min(tl, r)
        sq, qmin = _mass_and_min(dl, r)
        lo[r], hi[r] = merged_bounds(ti, tl, op, di, dl, oq, r, sp, pmin, sq, qmin)
