"""A vectorizable, accurate ``exp`` for non-positive arguments (float64).

Numba on this platform has no SVML, so ``math.exp`` inside a loop is a scalar
libm call.  :func:`fexp` is written in plain arithmetic that LLVM vectorizes
(AVX2/AVX-512) when it is called from a loop:

* range reduction ``y = n*ln2 + r`` with ``n = round(y*log2(e))`` obtained by
  the shifter trick (``t = fma(y, log2(e), 1.5*2**52)``; the low mantissa bits
  of ``t`` hold ``n``, so no float->int64 conversion is needed -- AVX2 has none)
  and a Cody-Waite split of ``ln2`` (``LN2_HI`` has 11 trailing zero bits, so
  ``n*LN2_HI`` is exact for ``|n| <= 2048``), giving ``|r| <= ln2/2 + tiny``;
* ``e**r`` by its degree-12 Taylor polynomial in Horner form with explicit
  fused multiply-adds (``llvm.fma``: one rounding per step, so bitwise the same
  on every machine and whether vectorized or not): truncation error
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

:func:`fmaximum` is IEEE ``maximum`` (``llvm.maximum``: NaN-propagating, -0 < +0).
Unlike ``max``/``if v > m`` it vectorizes as a reduction without ``nnan`` fast-math,
and its result doubles as a validity check of a logits row: NaN if the row has a
NaN, +inf if it has +inf, -inf if every entry is -inf.
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


@intrinsic
def _f64_as_i64(typingctx, v):
    """Reinterpret the bits of a float64 as an int64 (no conversion)."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a*b + c with one rounding (llvm.fma; a hardware FMA on x86-64 with FMA3, correctly rounded anywhere)."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def fmaximum(typingctx, a, b):
    """IEEE maximum of two floats of the same type (NaN-propagating; vectorizable reduction)."""
    if not (isinstance(a, types.Float) and a == b):
        return None
    sig = a(a, b)

    def codegen(context, builder, signature, args):
        t = context.get_value_type(signature.return_type)
        fn = builder.module.declare_intrinsic("llvm.maximum", [t], ir.FunctionType(t, [t, t]))
        return builder.call(fn, args)

    return sig, codegen


_SHIFT = 6755399441055744.0  # 1.5 * 2**52: adding it rounds to an integer kept in the low mantissa bits
_SHIFT_BITS = 0x4338000000000000


@kernel(fastmath=_EXACT)
def fexp(y):
    """exp(y) for y <= 0 (float64), relative error <= 1e-15; 0.0 for y < -708."""
    yc = min(max(y, EXP_MIN_ARG), 0.0)
    t = _fma(yc, LOG2E, _SHIFT)
    nf = t - _SHIFT  # exact: round(yc * log2(e)) as a float
    r = _fma(-nf, LN2_HI, yc)
    r = _fma(-nf, LN2_LO, r)
    p = _fma(r, 1.0 / 479001600, 1.0 / 39916800)
    p = _fma(r, p, 1.0 / 3628800)
    p = _fma(r, p, 1.0 / 362880)
    p = _fma(r, p, 1.0 / 40320)
    p = _fma(r, p, 1.0 / 5040)
    p = _fma(r, p, 1.0 / 720)
    p = _fma(r, p, 1.0 / 120)
    p = _fma(r, p, 1.0 / 24)
    p = _fma(r, p, 1.0 / 6)
    p = _fma(r, p, 0.5)
    p = _fma(r, p, 1.0)
    p = _fma(r, p, 1.0)
    scale = _i64_as_f64((_f64_as_i64(t) - _SHIFT_BITS + 1023) << 52)
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
