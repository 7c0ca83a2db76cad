"""A vectorizable, accurate ``exp`` for non-positive arguments (float64).

Numba on this platform has no SVML, so ``math.exp`` inside a loop is a scalar
libm call.  :func:`fexp` is written in plain arithmetic that LLVM vectorizes
(AVX2/AVX-512) when it is called from a loop:

* range reduction ``y = n*ln2 + r`` with ``n = floor(y*log2(e) + 1/2)`` and a
  Cody-Waite split of ``ln2`` (``LN2_HI`` has 11 trailing zero bits, so
  ``n*LN2_HI`` is exact for ``|n| <= 2048``), giving ``|r| <= ln2/2 + tiny``;
* ``e**r`` by its degree-12 Taylor polynomial: truncation error
  ``|r|**13/13! * e**|r| < 2.6e-16`` relative;
* ``2**n`` built from the exponent bits (exact for ``n >= -1022``).

Error bound: ``|fexp(y)/exp(y) - 1| <= 1e-15`` for ``-708 <= y <= 0`` (tested
against ``np.exp`` in ``tests/test_process.py``; measured max about 3.3e-16).
For ``y < -708`` (including ``-inf``) the result is exactly 0.0: the true value
is below 3.4e-308, so the absolute error is below that.  Callers only pass
``(x - max) * inv_t <= 0``.

The functions are compiled without ``reassoc``/``contract`` (which would undo
the Cody-Waite split); LLVM keeps per-instruction flags when it inlines them into
fastspec's ``reassoc`` kernels, so results are bitwise identical whether a call
site is vectorized or scalar.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._jit import kernel

LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
EXP_MIN_ARG = -708.0
FEXP_REL_ERROR_BOUND = 1e-15

_EXACT = {"nsz"}  # no reassoc, no contract: bitwise-reproducible arithmetic


@intrinsic
def _i64_as_f64(typingctx, v):
    """Reinterpret the bits of an int64 as a float64 (no conversion)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@kernel(fastmath=_EXACT)
def fexp(y):
    """exp(y) for y <= 0 (float64), relative error <= 1e-15; 0.0 for y < -708."""
    yc = min(max(y, EXP_MIN_ARG), 0.0)
    nf = np.floor(yc * LOG2E + 0.5)
    r = (yc - nf * LN2_HI) - nf * LN2_LO
    p = 1.0 + r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (
        1.0 / 120 + r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (
            1.0 / 362880 + r * (1.0 / 3628800 + r * (1.0 / 39916800 + r * (1.0 / 479001600))))))))))))
    scale = _i64_as_f64((np.int64(nf) + 1023) << 52)
    return p * scale if y >= EXP_MIN_ARG else 0.0


@kernel(fastmath=_EXACT)
def weight(x_v, m, inv_t):
    """Unnormalized processed weight exp((x_v - m) * inv_t) of one logit (float64)."""
    return fexp((np.float64(x_v) - m) * inv_t)


@kernel
def fexp_array(y, out):
    """out[i] = fexp(y[i]) (used by tests)."""
    for i in range(y.shape[0]):
        out[i] = fexp(y[i])
    return out
