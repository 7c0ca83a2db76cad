"""Sampling-parameter processing of one logits row (the rules are in :mod:`fastspec.params`).

The kept set is always ``{v : x_v >= thr}`` for one logit threshold ``thr`` (``-inf`` when nothing is
filtered), and

    p(v) = exp((x_v - m) * inv_t) / z   if x_v >= thr else 0,       inv_t = 1 / temperature,
    z    = sum over kept v of exp((x_v - m) * inv_t)                (>= 1: the argmax has weight 1).

No full sort of the vocabulary: top-k is a three-way quickselect and top-p a weighted quickselect (threshold
search), both on a caller-owned float64 scratch row.  Min-p is a logit cutoff ``m + T ln(min_p)``.
"""
from __future__ import annotations

import math

import numpy as np

from .._numba.fastexp import weight
from .._numba.intrinsics import to_f64
from .._numba.jit import kernel, parallel_kernel, prange
from .._numba.lanes import lane_sum
from .rows import ROW_OK, argmax_of, row_max, status
from .codes import NO_EXCLUDED
from .sample import block_count, row_weights, sample

_SMALL = 16  # partitions this small are finished by insertion sort


@kernel
def _insertion_sort_desc(a, lo, hi):
    for i in range(lo + 1, hi):
        v = a[i]
        j = i - 1
        while j >= lo and a[j] < v:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = v


@kernel
def _median3(a, lo, hi):
    x = a[lo]
    y = a[(lo + hi) // 2]
    z = a[hi - 1]
    if x > y:
        x, y = y, x
    if y > z:
        y = z
    return x if x > y else y


@kernel
def _partition3(a, lo, hi, pivot):
    """Three-way partition of a[lo:hi] around pivot: greater values first, then equal, then smaller.
    Returns (lt, gt, g, e): a[lo:lt] > pivot, a[lt:gt] == pivot, and the sums g of the greater and e of the
    equal values (in the order they were met)."""
    lt = lo
    i = lo
    gt = hi
    g = 0.0
    e = 0.0
    while i < gt:
        v = a[i]
        if v > pivot:
            g += v
            a[i] = a[lt]
            a[lt] = v
            lt += 1
            i += 1
        elif v < pivot:
            gt -= 1
            a[i] = a[gt]
            a[gt] = v
        else:
            e += v
            i += 1
    return lt, gt, g, e


@kernel
def kth_largest(a, n, k):
    """The k-th largest (1-based) of a[0:n]; reorders a (three-way quickselect)."""
    target = k - 1
    lo = 0
    hi = n
    while True:
        if hi - lo <= _SMALL:
            _insertion_sort_desc(a, lo, hi)
            return a[target]
        pivot = _median3(a, lo, hi)
        lt, gt, _, _ = _partition3(a, lo, hi, pivot)
        if target < lt:
            hi = lt
        elif target < gt:
            return pivot
        else:
            lo = gt


@kernel
def top_p_cutoff(a, n, target):
    """Largest value c among a[0:n] (non-negative weights) with sum(a[a >= c]) >= target.

    Returns (c, mass kept).  Reorders a.  If rounding makes the total fall short of ``target``, the smallest
    value is returned (everything kept)."""
    lo = 0
    hi = n
    above = 0.0
    last = np.inf
    while lo < hi:
        if hi - lo <= _SMALL:
            _insertion_sort_desc(a, lo, hi)
            j = lo
            while j < hi:
                c = a[j]
                while j < hi and a[j] == c:
                    above += a[j]
                    j += 1
                if above >= target:
                    return c, above
                last = c
            return last, above
        pivot = _median3(a, lo, hi)
        lt, gt, g, e = _partition3(a, lo, hi, pivot)
        if above + g >= target:
            hi = lt
        elif above + g + e >= target:
            return pivot, above + g + e
        else:
            above += g + e
            last = pivot
            lo = gt
    return last, above


@kernel
def row_params(params, r):
    """Row r's sampling tuple (temperature, top_k, top_p, min_p) from the per-row arrays ``params``
    (``fastspec.params.RowParams``): the one sampling argument every row kernel takes."""
    temperature, top_k, top_p, min_p = params
    return (temperature[r], top_k[r], top_p[r], min_p[r])


@kernel
def needs_selection(n, sp):
    """True when the top-k or top-p of sp filters a row of n tokens (they need the scratch row and a selection)."""
    _, top_k, top_p, _ = sp
    return (top_k > 0 and top_k < n) or top_p < 1.0


@kernel
def cutoff(x, m, sp, scratch):
    """(inv_t, thr) of a valid row with max ``m`` and sampling ``sp = (temperature, top_k, top_p, min_p)``,
    ``temperature > 0``: the kept set is ``x_v >= thr``.

    ``scratch``: float64 [len(x)] work row (read only when top-k or top-p is active)."""
    temperature, top_k, top_p, min_p = sp
    n = x.shape[0]
    inv_t = 1.0 / temperature
    thr = -np.inf
    if top_k > 0 and top_k < n:
        for i in range(n):
            scratch[i] = to_f64(x[i])
        thr = kth_largest(scratch, n, top_k)
    if top_p < 1.0:
        cnt = 0
        z = 0.0
        for i in range(n):
            xv = to_f64(x[i])
            if xv >= thr:
                w = weight(xv, m, inv_t)
                scratch[cnt] = w
                cnt += 1
                z += w
        wstar, _ = top_p_cutoff(scratch, cnt, top_p * z)
        tp = np.inf
        for i in range(n):
            xv = to_f64(x[i])
            if xv >= thr and xv < tp and weight(xv, m, inv_t) >= wstar:
                tp = xv
        if tp > thr:
            thr = tp
    if min_p > 0.0:
        tm = m + temperature * math.log(min_p)
        if tm > thr:
            thr = tm
    return inv_t, thr


@kernel
def row_cutoff(x, m, sp, scratch):
    """(inv_t, thr) of a valid row with max m (temperature > 0); the selection runs only for top-k/top-p."""
    temperature, _, _, min_p = sp
    if needs_selection(x.shape[0], sp):
        return cutoff(x, m, sp, scratch)
    thr = -np.inf
    if min_p > 0.0:
        thr = m + temperature * math.log(min_p)
    return 1.0 / temperature, thr


@kernel
def processed_weights(x, m, sp, scratch, w, bsum):
    """(inv_t, thr, z) of a valid row with max m (temperature > 0), with its processed weights stored in w and
    their block sums in bsum (:func:`fastspec._kernels.sample.row_weights`)."""
    inv_t, thr = row_cutoff(x, m, sp, scratch)
    return inv_t, thr, row_weights(x, m, inv_t, thr, w, bsum)


@kernel
def visit_row(x, sp, scratch, w, bsum):
    """(ok, m, inv_t, thr, z) of one logits row read once: its max (and validity), then, when temperature > 0,
    its processed weights stored in w with block sums in bsum."""
    m = row_max(x)
    if status(m) != ROW_OK:
        return False, m, 0.0, 0.0, 0.0
    if sp[0] == 0.0:
        return True, m, 0.0, m, 1.0
    inv_t, thr, z = processed_weights(x, m, sp, scratch, w, bsum)
    return True, m, inv_t, thr, z


@kernel
def row_probabilities(x, sp, scratch, out):
    """out[:] = the processed distribution of a valid row (float64); greedy is one-hot on the argmax."""
    n = x.shape[0]
    m = row_max(x)
    if sp[0] == 0.0:
        for i in range(n):
            out[i] = 0.0
        out[argmax_of(x, m)] = 1.0
        return
    inv_t, thr = row_cutoff(x, m, sp, scratch)
    for i in range(n):
        xv = to_f64(x[i])
        e = weight(xv, m, inv_t)
        out[i] = e if xv >= thr else 0.0
    inv_z = 1.0 / lane_sum(out, 0, n)
    for i in range(n):
        out[i] *= inv_z


@parallel_kernel
def probabilities_rows(x, params, out):
    """Processed distributions of valid rows x [R, V] with per-row parameters (``fastspec.params.RowParams``)."""
    rows, n = x.shape
    for r in prange(rows):
        sp = row_params(params, r)
        scratch = np.empty(n if needs_selection(n, sp) else 1)
        row_probabilities(x[r], sp, scratch, out[r])


@kernel
def sample_row(x, sp, u, w, bsum, scratch):
    """One token from the processed distribution of a valid logits row with the uniform u (greedy: the argmax);
    w [V], bsum [blocks], scratch [V]: work arrays."""
    m = row_max(x)
    if sp[0] == 0.0:
        return argmax_of(x, m)
    processed_weights(x, m, sp, scratch, w, bsum)
    return sample(w, w, 1.0, 0.0, NO_EXCLUDED, bsum, u)


@kernel
def row_work(V, nb, sp):
    """(w [V], bsum [nb], scratch) work arrays of one row's weights: scratch holds V values only when the top-k or
    top-p of sp needs a selection."""
    return np.empty(V), np.empty(nb), np.empty(V if needs_selection(V, sp) else 1)


@parallel_kernel
def sample_rows(x, params, u, out):
    """out[r] = a token from the processed distribution of row r of x [R, V], with uniform u[r]."""
    R, V = x.shape
    nb = block_count(V)
    for r in prange(R):
        sp = row_params(params, r)
        w, bsum, scratch = row_work(V, nb, sp)
        out[r] = sample_row(x[r], sp, u[r], w, bsum, scratch)


@parallel_kernel
def probabilities_at(x, params, ids, out):
    """out[r, j] = the processed probability of token ids[r, j] in row r of x [R, V] (0 where ids[r, j] < 0);
    greedy rows: 1 for the argmax, else 0.  One max pass and one weight pass per row, no probability row kept."""
    R, V = x.shape
    nb = block_count(V)
    for r in prange(R):
        sp = row_params(params, r)
        w, bsum, scratch = row_work(V, nb, sp)
        m = row_max(x[r])
        if sp[0] == 0.0:
            amax = argmax_of(x[r], m)
            for j in range(ids.shape[1]):
                out[r, j] = 1.0 if ids[r, j] == amax else 0.0
            continue
        _, _, z = processed_weights(x[r], m, sp, scratch, w, bsum)
        for j in range(ids.shape[1]):
            out[r, j] = w[ids[r, j]] / z if ids[r, j] >= 0 else 0.0
