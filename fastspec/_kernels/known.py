"""Sparse alpha bounds when more than the top-k is known: :func:`known_bounds_rows`.

Each side lists its top-k entries followed by extra known entries (ids outside its top-k with exact logprobs;
unused slots are id -1 with logprob -inf, which add nothing anywhere).  The difference with
:func:`fastspec._kernels.alpha.bounds_rows` is where the bound on an unlisted probability comes from: the caller
passes ``tcap`` / ``dcap``, the smallest *top-k* probability of each row, not the smallest listed one (an extra id
may be far below the top-k, and an unknown id is bounded only by the top-k).  The derivation is in
:mod:`fastspec.acceptance`.
"""
from __future__ import annotations

import math

from .._numba.jit import parallel_kernel, prange


@parallel_kernel
def known_bounds_rows(ti, tl, op, tcap, di, dl, oq, dcap, valid, lo, hi):
    """[lower, upper] of alpha per row from known (ids int64, logprobs float64) lists with the caps ``tcap`` /
    ``dcap`` on every unlisted probability; op / oq: the order that sorts each row's ids (merge walk)."""
    R = ti.shape[0]
    kp = ti.shape[1]
    kq = di.shape[1]
    for r in prange(R):
        lo[r] = 0.0
        hi[r] = 0.0
        if not valid[r]:
            continue
        pmin = tcap[r]
        qmin = dcap[r]
        sp = 0.0
        for j in range(kp):
            sp += math.exp(tl[r, j])
        sq = 0.0
        for j in range(kq):
            sq += math.exp(dl[r, j])
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
        lo[r] = L
        hi[r] = min(max(A + max(u, 0.0), L), 1.0)
