"""float16 rows without an exponential per token: a table over the 65,536 possible values.

A float16 logit has one of 65,536 bit patterns, so for one inverse temperature ``it`` the weights of every row
can come from one table ``T[h] = exp(val(h) it - c)``, filled once (65,536 exponentials, about the cost of half
a row of 128k tokens), and a scale per row: ``exp((x - m) it) = T[bits(x)] * exp(c - m it)``.

The offset c is a function of the row alone -- the multiple of :data:`STEP` just above ``m it`` -- so a row's
weights (and everything computed from them) are bit-identical whichever rows a thread processed before it, in
whatever chunks and on however many threads.  Every exponent the table serves is then <= 0 and the row's own
max sits at most STEP below c.  A thread keeps :data:`SLOTS` tables (a target row and its draft row usually need
one or two offsets; rows of one dump have similar maxima) and refills the least recently filled slot when a row
needs another offset.  Accuracy: the table entry and the scale each carry fastspec's exp error (<= 1e-15
relative), their product <= 2.2e-15; entries below ``exp(-708)`` relative to c are 0, i.e. weights below
``exp(STEP - 708)`` of a row's max (about 1e-196) are dropped -- far below anything a float64 sum of a row can
represent.
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
STEP = 256.0  # a row's table offset: the multiple of STEP above m * it
SLOTS = 2  # tables kept per thread
STATE = 3 * SLOTS + 1  # per slot (c, inv_t, filled), then the slot to refill next


@kernel
def fill(table, inv_t, c):
    """table[h] = exp(val(h) * inv_t - c) for every float16 bit pattern h (0 where the exponent is positive or
    not a number: such values never occur in a row this table serves)."""
    for h in range(HALF_VALUES):
        y = to_f64(np.uint16(h)) * inv_t - c
        table[h] = fexp(y) if y <= 0.0 else 0.0


@kernel
def offset(m, inv_t):
    """The table offset c of a row with max m: the multiple of STEP just above m * inv_t."""
    return (math.floor(m * inv_t / STEP) + 1.0) * STEP


@kernel
def serves(tables, state, m, inv_t):
    """(table, c) serving a row with max m at inverse temperature inv_t: a slot of ``tables`` [SLOTS, 65536]
    already filled for this (c, inv_t), else the next slot, refilled (``state``: :data:`STATE` floats)."""
    c = offset(m, inv_t)
    for s in range(SLOTS):
        if state[3 * s + 2] == 1.0 and state[3 * s] == c and state[3 * s + 1] == inv_t:
            return tables[s], c
    s = int(state[3 * SLOTS])
    state[3 * SLOTS] = float((s + 1) % SLOTS)
    fill(tables[s], inv_t, c)
    state[3 * s] = c
    state[3 * s + 1] = inv_t
    state[3 * s + 2] = 1.0
    return tables[s], c


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
