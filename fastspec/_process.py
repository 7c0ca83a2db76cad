"""Sampling-parameter processing shared by the whole library.

The distribution an engine samples from is obtained from a logits row ``x`` in
this order (the order vLLM and Hugging Face apply them):

1. **temperature** ``T``: weights ``exp((x_v - m) / T)`` with ``m = max(x)``.
   ``T == 0`` is greedy: one-hot on the argmax, lowest index on ties (the
   filters below are then irrelevant).
2. **top-k**: keep logits ``>= `` the k-th largest logit; every token tied at
   the cutoff is kept.  ``top_k == 0`` or ``top_k >= V`` disables it.
3. **top-p** on the top-k-filtered, renormalized distribution: keep the
   smallest set of highest-probability tokens whose mass is ``>= top_p``; the
   cutoff is the probability of the last token needed, and every token tied with
   it (same float64 weight) is kept.  ``top_p == 1`` disables it.
4. **min-p**: keep tokens with ``p(v) >= min_p * p_max``, evaluated in logit
   space as ``x_v >= m + T * ln(min_p)``.  ``min_p == 0`` disables it.

The kept set is always ``{v : x_v >= thr}`` for one logit threshold ``thr``
(``-inf`` when nothing is filtered), and

    p(v) = exp((x_v - m) / T) / z   if x_v >= thr else 0,
    z    = sum over kept v of exp((x_v - m) / T)   (>= 1, the argmax has weight 1).

No full sort of the vocabulary: top-k is a three-way quickselect and top-p a
weighted quickselect (threshold search), both on a caller-owned scratch row.
Exponentials use :func:`fastspec._fastexp.fexp` (vectorizable, relative error
<= 1e-15), so all kernels of the library agree bitwise on every weight.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ._fastexp import fexp, fmaximum, weight  # noqa: F401
from ._jit import kernel, parallel_kernel, prange

__all__ = ["row_params", "prob_at", "probabilities", "validate_sampling_params", "validate_logits"]

_SMALL = 16


# --------------------------------------------------------------------------- kernels
@kernel
def row_max(x):
    """(m, amax): the max logit as float64 and its lowest index.

    The max is an IEEE ``maximum`` reduction in the row's own dtype (vectorized; exact), then one
    early-exit scan for the first index equal to it.  Rows are validated (no NaN) by the callers.
    """
    m = vmax(x)
    amax = 0
    for i in range(x.shape[0]):
        if np.float64(x[i]) == m:
            amax = i
            break
    return m, np.int64(amax)


@kernel
def vmax(x):
    """max of a non-empty row as float64 via ``fmaximum`` (vectorized): NaN if the row has a NaN,
    +inf if it has +inf (and no NaN), -inf if every entry is -inf."""
    m = x[0]
    for i in range(x.shape[0]):  # from 0 (not 1): a loop from 0 vectorizes
        m = fmaximum(m, x[i])
    return np.float64(m)


@kernel
def logits_status(m):
    """Validity of a row from its :func:`vmax`: 0 ok, 1 NaN, 2 +inf, 3 no finite value."""
    if m != m:
        return 1
    if m == np.inf:
        return 2
    if m == -np.inf:
        return 3
    return 0


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
        lt = lo
        i = lo
        gt = hi
        while i < gt:
            v = a[i]
            if v > pivot:
                a[i] = a[lt]
                a[lt] = v
                lt += 1
                i += 1
            elif v < pivot:
                gt -= 1
                a[i] = a[gt]
                a[gt] = v
            else:
                i += 1
        if target < lt:
            hi = lt
        elif target < gt:
            return pivot
        else:
            lo = gt


@kernel
def top_p_cutoff(a, n, target):
    """Largest value c among a[0:n] (non-negative weights) with sum(a[a >= c]) >= target.

    Returns (c, mass kept).  Reorders a.  If rounding makes the total fall short
    of ``target``, the smallest value is returned (everything kept).
    """
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
def row_normalizer(x, m, inv_t, thr):
    """z = sum over x_v >= thr of exp((x_v - m) * inv_t) (vectorized)."""
    z = 0.0
    for i in range(x.shape[0]):
        w = weight(x[i], m, inv_t)
        z += w if np.float64(x[i]) >= thr else 0.0
    return z


@kernel
def row_params(x, temperature, top_k, top_p, min_p, scratch):
    """Processed-distribution parameters of one logits row.

    x: 1-D logits row (float32/64, may contain -inf, at least one finite).
    scratch: caller-owned float64 work array with len >= len(x) (overwritten
    only when top-k or top-p is active).
    Returns (m, inv_t, thr, z, amax) as (float64, float64, float64, float64, int64):
      amax = index of the max logit (lowest index on ties), m = x[amax] as float64.
      temperature > 0: p(v) = exp((x_v - m) * inv_t) / z if x_v >= thr else 0.0
        (``prob_at``), inv_t = 1/temperature, thr = the cutoff implied by
        top_k/top_p/min_p (-inf when none), z = sum of kept weights (>= 1).
      temperature == 0 (greedy): inv_t = 0.0, thr = m, z = 1.0; p is one-hot at amax.
    """
    m, amax = row_max(x)
    if temperature == 0.0:
        return m, 0.0, m, 1.0, amax
    n = x.shape[0]
    inv_t = 1.0 / temperature
    thr = -np.inf
    if top_k > 0 and top_k < n:
        for i in range(n):
            scratch[i] = np.float64(x[i])
        thr = kth_largest(scratch, n, top_k)
    if top_p < 1.0:
        cnt = 0
        z = 0.0
        for i in range(n):
            xv = np.float64(x[i])
            if xv >= thr:
                w = weight(xv, m, inv_t)
                scratch[cnt] = w
                cnt += 1
                z += w
        wstar, _ = top_p_cutoff(scratch, cnt, top_p * z)
        tp = np.inf
        for i in range(n):
            xv = np.float64(x[i])
            if xv >= thr and xv < tp and weight(xv, m, inv_t) >= wstar:
                tp = xv
        if tp > thr:
            thr = tp
    if min_p > 0.0:
        tm = m + temperature * math.log(min_p)
        if tm > thr:
            thr = tm
    z = row_normalizer(x, m, inv_t, thr)
    return m, inv_t, thr, z, amax


@kernel
def prob_at(x_v, m, inv_t, thr, z):
    """p(v) for one logit value given the row parameters (greedy is the caller's job)."""
    xv = np.float64(x_v)
    if xv >= thr:
        return weight(xv, m, inv_t) / z
    return 0.0


@parallel_kernel
def _probabilities_kernel(x, temperature, top_k, top_p, min_p, out):
    rows, n = x.shape
    for r in prange(rows):
        scratch = np.empty(n)
        m, inv_t, thr, z, amax = row_params(x[r], temperature[r], top_k[r], top_p[r], min_p[r], scratch)
        if temperature[r] == 0.0:
            for i in range(n):
                out[r, i] = 0.0
            out[r, amax] = 1.0
        else:
            inv_z = 1.0 / z
            for i in range(n):
                xv = np.float64(x[r, i])
                w = weight(xv, m, inv_t)
                out[r, i] = w * inv_z if xv >= thr else 0.0


# --------------------------------------------------------------------------- validation
def _as_param(name, value, rows, dtype, kind):
    arr = np.asarray(value)
    if arr.dtype == bool or arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.integer) or (kind == "float" and np.issubdtype(arr.dtype, np.floating))
    ):
        need = "an integer" if kind == "int" else "a real number"
        raise TypeError(f"{name} must be {need} or an array of them with one entry per row ({rows}), "
                        f"got dtype {arr.dtype}")
    if arr.ndim == 0:
        arr = np.full(rows, arr.item(), dtype=dtype)
    elif arr.shape != (rows,):
        raise ValueError(f"{name} must be a scalar or have shape [{rows}] (one per row), got shape {list(arr.shape)}")
    return np.ascontiguousarray(arr, dtype=dtype)


def _first_bad(mask):
    return int(np.flatnonzero(mask)[0])


_T_MIN = 1e-300  # a positive temperature below this makes 1/T overflow to inf (NaN weights): refused


def validate_sampling_params(rows, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """Validate sampling parameters, scalar or one per row; return 1-D arrays of length ``rows``.

    Returns ``(temperature float64, top_k int64, top_p float64, min_p float64)``.
    Raises TypeError/ValueError naming the argument, the offending row and the fix.
    """
    if (type(temperature) in (float, int) and type(top_k) is int and type(top_p) in (float, int)
            and type(min_p) in (float, int) and math.isfinite(temperature) and (temperature == 0 or temperature >= _T_MIN)
            and 0 <= top_k < 2 ** 63
            and 0 < top_p <= 1 and 0 <= min_p < 1):  # common case: valid Python scalars (skips ~40 us of NumPy)
        return (np.full(rows, float(temperature)), np.full(rows, top_k, dtype=np.int64),
                np.full(rows, float(top_p)), np.full(rows, float(min_p)))
    t = _as_param("temperature", temperature, rows, np.float64, "float")
    k = _as_param("top_k", top_k, rows, np.int64, "int")
    p = _as_param("top_p", top_p, rows, np.float64, "float")
    mp = _as_param("min_p", min_p, rows, np.float64, "float")
    bad = ~(np.isfinite(t) & (t >= 0))
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"temperature[{i}] = {t[i]!r} is invalid: use a finite value >= 0 (0 means greedy)")
    bad = (t > 0) & (t < _T_MIN)
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"temperature[{i}] = {t[i]!r} is too small: 1/temperature overflows float64; use 0 for "
                         f"greedy or a value >= {_T_MIN:g}")
    bad = k < 0
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"top_k[{i}] = {k[i]} is invalid: use 0 (disabled) or a positive count")
    bad = ~((p > 0) & (p <= 1))
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"top_p[{i}] = {p[i]!r} is invalid: use a value in (0, 1] (1 disables top-p)")
    bad = ~((mp >= 0) & (mp < 1))
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"min_p[{i}] = {mp[i]!r} is invalid: use a value in [0, 1) (0 disables min-p)")
    return t, k, p, mp


@parallel_kernel
def _scan_rows(x2, bad):
    """bad[r] = number of NaN/+inf entries of row r, or -1 when the row has no finite value."""
    for r in prange(x2.shape[0]):
        n = x2.shape[1]
        nonfinite = 0
        neginf = 0
        for i in range(n):
            v = x2[r, i]
            nonfinite += np.int64(not (v - v == 0))
            neginf += np.int64(v == -np.inf)
        nbad = nonfinite - neginf
        bad[r] = nbad if nbad > 0 else (-1 if neginf == n else 0)


def _rows_ok(logits):
    """Fast parallel check (one read pass): no NaN/+inf and a finite value in every row."""
    x2 = logits.reshape(-1, logits.shape[-1])
    if x2.strides[-1] != x2.itemsize:
        return False  # let the NumPy path find (or clear) problems; it handles any layout
    bad = np.empty(x2.shape[0], dtype=np.int64)
    _scan_rows(x2, bad)
    return not bad.any()


def validate_logits(name, logits, ndim=None):
    """Check a logits array: real float dtype, no NaN/+inf, every row has a finite value.

    float16 is widened to float32 (exactly); other float dtypes and memory layout
    are kept (read-only and memory-mapped arrays are fine).  Returns the array.
    """
    logits = check_logits_array(name, logits, ndim)
    if logits.size and not _rows_ok(logits):
        bad = np.isnan(logits) | (logits == np.inf)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name}{list(idx)} = {logits[idx]!r}: logits must be finite or -inf (masked); "
                             "NaN and +inf are not allowed")
        ok = np.isfinite(logits).any(axis=-1)
        if not ok.all():
            idx = tuple(int(i) for i in np.argwhere(~ok)[0])
            raise ValueError(f"{name}{list(idx)} has no finite logit (all -inf): at least one token must be allowed")
    return logits


def check_logits_array(name, logits, ndim=None):
    """The cheap part of :func:`validate_logits` (dtype, shape, float16 widening), without the value scan.

    For kernels that detect NaN/+inf/all -inf rows themselves while they read the data (see
    ``fastspec.verify``) and call :func:`validate_logits` for the error message when they find one.
    """
    if not hasattr(logits, "dtype"):
        logits = np.asarray(logits)
        if np.issubdtype(logits.dtype, np.integer):
            logits = logits.astype(np.float64)
    if not isinstance(logits, np.ndarray):
        logits = np.asarray(logits)
    if not np.issubdtype(logits.dtype, np.floating) or logits.dtype == np.longdouble:
        raise TypeError(f"{name} must be a float16/float32/float64 array, got dtype {logits.dtype}")
    if ndim is not None and logits.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {list(logits.shape)}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"{name} must have a non-empty last (vocabulary) axis, got shape {list(logits.shape)}")
    if logits.dtype == np.float16:
        logits = logits.astype(np.float32)
    return logits


def as_float_rows(logits):
    """2-D view [rows, V] with a contiguous last axis (copies only when needed)."""
    V = logits.shape[-1]
    x2 = logits.reshape(-1, V)
    if x2.strides[-1] != x2.itemsize:
        x2 = np.ascontiguousarray(x2)
    return x2


def probabilities(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The exact float64 distribution an engine samples from, per row of ``logits``.

    ``logits`` has shape [..., V]; the parameters are scalars or arrays of the
    leading shape (one per row).  Processing order: temperature, top-k, top-p,
    min-p (see the module docstring); temperature 0 is greedy (one-hot on the
    argmax, lowest index on ties).  Returns float64 of the same shape.
    """
    logits = validate_logits("logits", logits)
    lead = logits.shape[:-1]
    rows = int(np.prod(lead)) if lead else 1
    params = []
    for nm, val in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        a = np.asarray(val)
        if a.ndim > 0 and a.shape == lead:
            a = a.reshape(rows)
        params.append(a)
    t, k, p, mp = validate_sampling_params(rows, *params)
    x2 = as_float_rows(logits)
    out = np.empty((rows, logits.shape[-1]), dtype=np.float64)
    _probabilities_kernel(x2, t, k, p, mp, out)
    return out.reshape(logits.shape)
