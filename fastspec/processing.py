"""Processed distributions of raw logits, and tokens sampled from them (rules: :mod:`fastspec.params`).

* :func:`probabilities` -- the exact float64 distribution an engine samples from, per row;
* :func:`sample_tokens` -- one token per row from that distribution with caller-given uniforms (the one
  two-level inverse-CDF sampler of the verification kernels, :mod:`fastspec._kernels.sample`);
* :func:`logits_array` / :func:`validate_logits` -- how every entry point takes logits: float16/32/64 of any
  layout (read-only and memory-mapped fine), float16 kept as it is (viewed as its bits, never widened into a
  copy), a contiguous last axis (copied only when the rows are strided).
"""
from __future__ import annotations

import numpy as np

from ._kernels.process import probabilities_rows, sample_rows
from .errors import InvalidInput, InvalidType
from .params import per_row

__all__ = ["probabilities", "sample_tokens", "logits_array", "validate_logits", "kernel_view"]


def logits_array(name: str, logits, ndim: int | None = None) -> np.ndarray:
    """``logits`` as a float16/float32/float64 ndarray with a non-empty last axis (no value checks, no copy of
    a float array); integer input is converted to float64."""
    if not isinstance(logits, np.ndarray):
        logits = np.asarray(logits)
        if np.issubdtype(logits.dtype, np.integer) and logits.dtype != bool:
            logits = logits.astype(np.float64)
    if logits.dtype not in (np.float16, np.float32, np.float64):
        raise InvalidType(f"{name} must be a float16/float32/float64 array, got dtype {logits.dtype}")
    if ndim is not None and logits.ndim != ndim:
        raise InvalidInput(f"{name} must have {ndim} dimensions, got shape {list(logits.shape)}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise InvalidInput(f"{name} must have a non-empty last (vocabulary) axis, got shape {list(logits.shape)}")
    return logits


def read_only(a: np.ndarray) -> np.ndarray:
    """``a``, or a read-only view of it (no copy).  Kernels only read their inputs, and Numba compiles a kernel
    once per array type, read-only or not: handing them read-only arrays only, whether the caller's arrays are
    memory-mapped (read-only) or in memory (writable), compiles each kernel once instead of twice."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def kernel_view(a: np.ndarray) -> np.ndarray:
    """What kernels read: the same data with a contiguous last axis (copied only when the last axis is strided),
    float16 viewed as its uint16 bit patterns (Numba has no float16; the kernels widen them exactly), read-only
    (:func:`read_only`)."""
    if a.ndim and (a.strides[-1] != a.itemsize or not all(s % a.itemsize == 0 for s in a.strides)):
        a = np.ascontiguousarray(a)
    return read_only(a.view(np.uint16) if a.dtype == np.float16 else a)


def raise_bad_values(name: str, logits: np.ndarray) -> None:
    """Raise the error for the first NaN, +inf or all -inf row of ``logits`` (NumPy, any layout)."""
    bad = np.isnan(logits) | (logits == np.inf)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidInput(f"{name}{list(idx)} = {float(logits[idx])!r}: logits must be finite or -inf (masked); "
                           "NaN and +inf are not allowed")
    ok = np.isfinite(logits).any(axis=-1)
    if not ok.all():
        idx = tuple(int(i) for i in np.argwhere(~ok)[0])
        raise InvalidInput(f"{name}{list(idx)} has no finite logit (all -inf): at least one token must be allowed")


def validate_logits(name: str, logits, ndim: int | None = None) -> np.ndarray:
    """:func:`logits_array` plus the value check: no NaN/+inf and a finite value in every row (one parallel
    read pass; the first offender is named)."""
    from ._kernels.rows import first_bad_row

    logits = logits_array(name, logits, ndim)
    if logits.size:
        x2 = kernel_view(logits).reshape(-1, logits.shape[-1])
        if first_bad_row(x2, 0) >= 0:
            raise_bad_values(name, logits)
    return logits


def _params(rows, lead, temperature, top_k, top_p, min_p):
    return per_row(rows, temperature, top_k, top_p, min_p, lead=lead)


def probabilities(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """The exact float64 distribution an engine samples from, per row of ``logits`` [..., V].

    Parameters are scalars or arrays of the leading shape (one per row).  Processing order: temperature,
    top-k, top-p, min-p (:mod:`fastspec.params`); temperature 0 is greedy (one-hot on the argmax, lowest index
    on ties).  Returns float64 of the same shape."""
    logits = validate_logits("logits", logits)
    lead = logits.shape[:-1]
    rows = int(np.prod(lead)) if lead else 1
    params = _params(rows, lead, temperature, top_k, top_p, min_p)
    x2 = kernel_view(logits).reshape(rows, logits.shape[-1])
    out = np.empty((rows, logits.shape[-1]), dtype=np.float64)
    if rows:
        probabilities_rows(x2, params, out)
    return out.reshape(logits.shape)


def sample_tokens(logits, uniforms, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """One token per row of ``logits`` [..., V] from its processed distribution (:func:`probabilities`), by
    inverse CDF in token order with ``uniforms`` [...] in (0, 1] (greedy rows: the argmax).  Never a token of
    probability 0.  Returns int64 of the leading shape."""
    logits = validate_logits("logits", logits)
    lead = logits.shape[:-1]
    rows = int(np.prod(lead)) if lead else 1
    u = np.asarray(uniforms, dtype=np.float64)
    if u.shape != lead:
        raise InvalidInput(f"uniforms must have the leading shape of logits {list(lead)}, got {list(u.shape)}")
    bad = ~((u > 0) & (u <= 1))
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise InvalidInput(f"uniforms{list(i)} = {float(u[i])!r} must lie in (0, 1]")
    params = _params(rows, lead, temperature, top_k, top_p, min_p)
    out = np.empty(rows, np.int64)
    if rows:
        sample_rows(kernel_view(logits).reshape(rows, logits.shape[-1]), params, np.ascontiguousarray(u.reshape(rows)),
                    out)
    return out.reshape(lead)

