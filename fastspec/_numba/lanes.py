"""Sums in a fixed order that still vectorize.

Kernels are compiled without ``reassoc`` (see :mod:`fastspec._numba.jit`), so LLVM may not reorder a sum: a
plain ``s += w[v]`` loop is exact in its order but runs one add at a time.  :func:`lane_sum` writes the order
out: element ``lo + 16 j + l`` goes to lane ``l`` (16 independent running sums, which the SLP vectorizer packs
into two AVX-512 or four AVX2 registers), the lanes are combined by a fixed pairwise tree, then the tail
(``(hi - lo) % 16`` elements) is added left to right.  The result is a pure function of the input values, the
same on every CPU, vector width, thread count and call site, and the same whether the kernel was compiled in
this process or loaded from the cache.  Reductions over other expressions store the terms first (one
vectorized pass into a block-sized buffer) and then call :func:`lane_sum`.
"""
from __future__ import annotations

from .jit import kernel

LANES = 16


@kernel
def lane_sum(w, lo, hi):
    """Sum of ``w[lo:hi]`` (float64) in the fixed order described in the module docstring."""
    n = hi - lo
    stop = lo + n - n % LANES
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    s8 = s9 = s10 = s11 = s12 = s13 = s14 = s15 = 0.0
    for j in range(lo, stop, LANES):
        s0 += w[j]
        s1 += w[j + 1]
        s2 += w[j + 2]
        s3 += w[j + 3]
        s4 += w[j + 4]
        s5 += w[j + 5]
        s6 += w[j + 6]
        s7 += w[j + 7]
        s8 += w[j + 8]
        s9 += w[j + 9]
        s10 += w[j + 10]
        s11 += w[j + 11]
        s12 += w[j + 12]
        s13 += w[j + 13]
        s14 += w[j + 14]
        s15 += w[j + 15]
    t = (((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))) + (((s8 + s9) + (s10 + s11)) + ((s12 + s13) + (s14 + s15)))
    for j in range(stop, hi):
        t += w[j]
    return t
