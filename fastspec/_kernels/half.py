"""float16 rows without an exponential per token: a table over the 65,536 possible values.

A float16 logit has one of 65,536 bit patterns, so for one inverse temperature ``it`` the weights of every row
can come from one table ``T[h] = exp(val(h) it - c)``, filled once (65,536 exponentials, about the cost of half
a row of 128k tokens), and a scale per row: ``exp((x - m) it) = T[bits(x)] * exp(c - m it)``.  The offset c is
chosen so that every exponent the table serves is <= 0 (``c >= m it``) and no row's own max falls more than
:data:`SPAN` below it (else its small weights would underflow); a row outside that window refills the table
around its own max (rows of one dump have similar maxima, so this is rare).  Accuracy: the table entry and the
scale each carry fastspec's exp error (<= 1e-15 relative), their product <= 2.2e-15; entries below
``exp(-708)`` relative to c are 0, i.e. weights below ``exp(-708 + SPAN)`` of a row's max (about 1e-47) are
dropped -- far below anything a float64 sum of a row can represent.
"""
from __future__ import annotations

import math

import numpy as np

from .._numba.fastexp import fexp
from .._numba.intrinsics import half_index, to_f64
from .._numba.jit import kernel
from .._numba.lanes import lane_sum
from ..config import BLOCK

HALF_VALUES = 65536
SPAN = 600.0  # a table serves rows whose max * it lies in [c - SPAN, c]
HEADROOM = 50.0  # a refilled table's c = m * it + HEADROOM


@kernel
def fill(table, inv_t, c):
    """table[h] = exp(val(h) * inv_t - c) for every float16 bit pattern h (0 where the exponent is positive or
    not a number: such values never occur in a row this table serves)."""
    for h in range(HALF_VALUES):
        y = to_f64(np.uint16(h)) * inv_t - c
        table[h] = fexp(y) if y <= 0.0 else 0.0


@kernel
def serves(state, m, inv_t):
    """Make the table (state: [c, inv_t, filled]) serve a row with max m; returns c."""
    mt = m * inv_t
    if state[2] == 0.0 or state[1] != inv_t or mt > state[0] or mt < state[0] - SPAN:
        state[0] = mt + HEADROOM
        state[1] = inv_t
        state[2] = 1.0
        return state[0], True
    return state[0], False


@kernel
def table_weights(x, m, inv_t, thr, w, bsum, table, c):
    """:func:`fastspec._kernels.sample.row_weights` for a float16 row (uint16 bits) from the table."""
    s = math.exp(c - m * inv_t)
    n = x.shape[0]
    total = 0.0
    for j in range(bsum.shape[0]):
        lo = j * BLOCK
        hi = min(n, lo + BLOCK)
        xs = x[lo:hi]
        ws = w[lo:hi]
        for v in range(hi - lo):
            e = table[half_index(xs[v])] * s
            ws[v] = e if to_f64(xs[v]) >= thr else 0.0
        b = lane_sum(ws, 0, hi - lo)
        bsum[j] = b
        total += b
    return total
