"""The one categorical sampler: two-level inverse CDF over stored weights.

Every token fastspec samples -- recovered tokens (token, block and tree verification), bonus tokens, drafted
tokens in the simulator and the Hugging Face loop -- comes from :func:`sample`.  The weights are "pluggable"
through one formula over two stored float64 rows ``P`` and ``Q`` (weights of the processed target and draft,
or probabilities):

    w(v) = max(fma(P[v], a, -(Q[v] * b)), 0)      and w(excl) = 0

* plain ``P`` (bonus token, drafting, a tree's residual): ``a = 1, b = 0`` (then ``w = P`` exactly);
* the residual ``max(p - q, 0)`` from unnormalized weights: ``a = 1/z_p, b = 1/z_q`` (token verification);
  block verification's ``max(w_i p - q, 0)``: ``a = w_i / z_p``;
* a one-hot draft on token x (n-gram, prompt lookup): ``P`` without ``x``: ``a = 1, b = 0, excl = x``.

Sampling is inverse CDF in token order with one uniform ``u`` in (0, 1]: the block sums ``bsum`` (:data:`BLOCK`
tokens each, summed in a fixed order, :mod:`fastspec._numba.lanes`) pick the block where the running total
first reaches ``u * total``; a scan of that one block picks the token.  When rounding makes the scan fall off
the end, the last index with positive weight is returned, so a result is never ``>= V`` nor a zero-weight
token; ``-1`` means every weight is 0 (the caller decides: e.g. a residual that underflowed).
"""
from __future__ import annotations

import numpy as np

from .._numba.intrinsics import fma, fmaximum, narrow, to_f64
from .._numba.fastexp import fexp
from .._numba.jit import kernel
from .._numba.lanes import exp_lane_sum, lane_residual_sum, lane_sum
from ..config import BLOCK

from .codes import NONE, PAD


@kernel
def block_count(V):
    """Number of sampler blocks for a vocabulary of V tokens."""
    return (V + BLOCK - 1) // BLOCK


@kernel
def residual_weight(P, Q, a, b, excl, v):
    """w(v) of the module docstring (``excl`` < 0: none)."""
    d = fma(P[v], a, -(Q[v] * b))
    return d if (d > 0.0 and v != excl) else 0.0


@kernel
def block_sums(P, Q, a, b, excl, bsum, tmp, j0, j1):
    """bsum[j] = sum of w over block j, for blocks j0..j1-1 (tmp: float64 scratch of BLOCK)."""
    n = P.shape[0]
    for j in range(j0, j1):
        lo = j * BLOCK
        hi = min(n, lo + BLOCK)
        if not lo <= excl < hi:  # the same sum, the terms never stored
            bsum[j] = lane_residual_sum(P, Q, a, b, lo, hi)
            continue
        ps = P[lo:hi]
        qs = Q[lo:hi]
        for v in range(hi - lo):
            d = fma(ps[v], a, -(qs[v] * b))
            tmp[v] = d if d > 0.0 else 0.0
        if lo <= excl < hi:
            tmp[excl - lo] = 0.0
        bsum[j] = lane_sum(tmp, 0, hi - lo)


@kernel
def pick_block(bsum, u):
    """(block, remaining target) of inverse-CDF sampling over block sums; block -1 when the total is 0."""
    total = 0.0
    for j in range(bsum.shape[0]):
        total += bsum[j]
    if not total > 0.0:
        return NONE, 0.0
    target = u * total
    cum = 0.0
    last = NONE
    for j in range(bsum.shape[0]):
        s = bsum[j]
        if s > 0.0:
            last = j
            if cum + s >= target:
                return j, target - cum
        cum += s
    return last, np.inf


@kernel
def scan_block(P, Q, a, b, excl, rem):
    """Inverse CDF inside one block (P, Q: the block's slices; excl relative to the block): the first index
    where the running sum of w reaches ``rem``, else the last index with positive weight, else -1."""
    c = 0.0
    last = NONE
    for v in range(P.shape[0]):
        w = residual_weight(P, Q, a, b, excl, v)
        if w > 0.0:
            last = v
            c += w
            if c >= rem:
                return v
    return last


@kernel
def sample(P, Q, a, b, excl, bsum, u):
    """A token from w (module docstring) given its block sums ``bsum``; -1 when every weight is 0."""
    j, rem = pick_block(bsum, u)
    if j < 0:
        return PAD
    lo = j * BLOCK
    hi = min(P.shape[0], lo + BLOCK)
    v = scan_block(P[lo:hi], Q[lo:hi], a, b, excl - lo, rem)
    return lo + v if v >= 0 else PAD


@kernel
def sample_weights(P, Q, a, b, excl, bsum, tmp, u):
    """:func:`sample` after computing every block sum into ``bsum`` (tmp: scratch of BLOCK): the one way a kernel
    samples weights whose block sums it does not already have."""
    block_sums(P, Q, a, b, excl, bsum, tmp, 0, bsum.shape[0])
    return sample(P, Q, a, b, excl, bsum, u)


@kernel
def block_weights(x, m, inv_t, thr, lo, hi, w):
    """w[0:hi-lo] = the processed weights of x[lo:hi]: ``exp((x_v - m) * inv_t)`` if ``x_v >= thr`` else 0."""
    xs = x[lo:hi]  # slices: loops from 0 let LLVM drop the negative-index checks and vectorize
    for v in range(hi - lo):
        xv = to_f64(xs[v])
        e = fexp((xv - m) * inv_t)
        w[v] = e if xv >= thr else 0.0


@kernel
def scan_max(row, lo, hi, acc):
    """IEEE maximum of ``acc`` and ``row[lo:hi]`` (taken in the row's narrow type; float64 result)."""
    ns = row[lo:hi]
    bm = narrow(ns[0])
    for v in range(hi - lo):
        bm = fmaximum(bm, narrow(ns[v]))
    return fmaximum(acc, np.float64(bm))


@kernel
def _block_of_weights(x, m, inv_t, thr, w, bsum, j):
    """(sum, lo, hi) of block j of a row: its processed weights stored in w[lo:hi], their sum in bsum[j]."""
    lo = j * BLOCK
    hi = min(x.shape[0], lo + BLOCK)
    s = exp_lane_sum(x[lo:hi], m, inv_t, thr, w[lo:hi])
    bsum[j] = s
    return s, lo, hi


@kernel
def row_weights(x, m, inv_t, thr, w, bsum):
    """The processed weights of one logits row, stored: ``w[v] = exp((x_v - m) * inv_t)`` if ``x_v >= thr``
    else 0 (float64), ``bsum[j]`` = their block sums.  Returns their total."""
    total = 0.0
    for j in range(bsum.shape[0]):
        total += _block_of_weights(x, m, inv_t, thr, w, bsum, j)[0]
    return total


@kernel
def row_weights_ahead(x, m, inv_t, thr, w, bsum, ahead, mx, ahead2, mx2):
    """:func:`row_weights` taking the max of every row of ``ahead`` [R, V] (into ``mx[r]``) and of ``ahead2``
    [R2, V] (into ``mx2``; another array, possibly of another dtype) instead: rows that must be read anyway (to
    be validated, or used later) are read while this pass computes."""
    for r in range(ahead.shape[0]):
        mx[r] = np.float64(narrow(ahead[r, 0]))
    for r in range(ahead2.shape[0]):
        mx2[r] = np.float64(narrow(ahead2[r, 0]))
    total = 0.0
    for j in range(bsum.shape[0]):
        s, lo, hi = _block_of_weights(x, m, inv_t, thr, w, bsum, j)
        total += s
        for r in range(ahead.shape[0]):
            mx[r] = scan_max(ahead[r], lo, hi, mx[r])
        for r in range(ahead2.shape[0]):
            mx2[r] = scan_max(ahead2[r], lo, hi, mx2[r])
    return total
