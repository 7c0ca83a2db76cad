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
from .alpha import merged_bounds


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
        lo[r], hi[r] = merged_bounds(ti, tl, op, di, dl, oq, r, sp, pmin, sq, qmin)
