"""Row primitives shared by every kernel: the max pass (which is also the validity check), the argmax scan and
the validator for rows a kernel did not otherwise read.

Logit rows are 1-D float32/float64 arrays or float16 rows viewed as ``uint16`` (see
:mod:`fastspec._numba.intrinsics`).  A row is valid when it has no NaN, no +inf and at least one finite value
(-inf marks a masked token).
"""
from __future__ import annotations

import numpy as np

from .._numba.intrinsics import fmaximum, narrow, to_f64
from .._numba.jit import kernel
from .codes import NONE, ROW_NAN, ROW_NO_FINITE, ROW_OK, ROW_POSINF  # the status codes status() returns


@kernel
def row_max(x):
    """max of a non-empty row as float64: one vectorized IEEE-maximum pass in the row's narrow type.
    NaN if the row has a NaN, +inf if it has +inf (and no NaN), -inf if every entry is -inf."""
    m = narrow(x[0])
    for i in range(x.shape[0]):  # from 0 (not 1): a loop from 0 vectorizes
        m = fmaximum(m, narrow(x[i]))
    return np.float64(m)


@kernel
def status(m):
    """Validity of a row from its :func:`row_max`: ROW_OK, ROW_NAN, ROW_POSINF or ROW_NO_FINITE."""
    if m != m:
        return ROW_NAN
    if m == np.inf:
        return ROW_POSINF
    if m == -np.inf:
        return ROW_NO_FINITE
    return ROW_OK


@kernel
def argmax_of(x, m):
    """Lowest index i with x[i] == m (m: the row's max): the greedy token, lowest index on ties."""
    for i in range(x.shape[0]):
        if to_f64(x[i]) == m:
            return i
    return 0


@kernel
def first_bad_row(rows, start):
    """Index of the first row of ``rows`` [n, V] from ``start`` on that is not valid, or -1."""
    for i in range(start, rows.shape[0]):
        if status(row_max(rows[i])) != ROW_OK:
            return i
    return NONE
