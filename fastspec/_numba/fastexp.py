"""A vectorizable, accurate ``exp`` for non-positive arguments (float64).

Numba here has no SVML, so ``math.exp`` inside a loop is a scalar libm call.  :func:`fexp` is plain arithmetic
that LLVM vectorizes (AVX2/AVX-512) when it is called from a loop:

* range reduction ``y = n*ln2 + r`` with ``n = round(y*log2(e))`` by the shifter trick (``t = fma(y, log2(e),
  1.5*2**52)``: the low mantissa bits of ``t`` hold ``n``, so no float->int64 conversion is needed -- AVX2 has
  none) and a Cody-Waite split of ``ln2`` (``LN2_HI`` has 11 trailing zero bits, so ``n*LN2_HI`` is exact for
  ``|n| <= 2048``), giving ``|r| <= ln2/2 + tiny``;
* ``e**r`` by its degree-12 Taylor polynomial in Horner form with explicit fused multiply-adds (one rounding
  per step: bitwise the same on every machine, vectorized or not): truncation error
  ``|r|**13/13! * e**|r| < 2.6e-16`` relative;
* ``2**n`` built from the exponent bits (exact for ``n >= -1022``).

Error bound: ``|fexp(y)/exp(y) - 1| <= 1e-15`` for ``-708 <= y <= 0`` (tested against ``np.exp``; measured max
about 3.3e-16).  For ``y < -708`` (including ``-inf``) the result is exactly 0.0 (the true value is below
3.4e-308).  Callers only pass ``(x - max) * inv_t <= 0``.
"""
from __future__ import annotations

from .intrinsics import f64_as_i64, fma, i64_as_f64, to_f64
from .jit import kernel

LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
EXP_MIN_ARG = -708.0
FEXP_REL_ERROR_BOUND = 1e-15

_SHIFT = 6755399441055744.0  # 1.5 * 2**52: adding it rounds to an integer kept in the low mantissa bits
_SHIFT_BITS = 0x4338000000000000


@kernel
def fexp(y):
    """exp(y) for y <= 0 (float64), relative error <= 1e-15; 0.0 for y < -708 (whatever the intermediate values
    there: the last select discards them, so no clamp of y is needed)."""
    t = fma(y, LOG2E, _SHIFT)
    nf = t - _SHIFT  # exact: round(y * log2(e)) as a float
    r = fma(-nf, LN2_HI, y)
    r = fma(-nf, LN2_LO, r)
    p = fma(r, 1.0 / 479001600, 1.0 / 39916800)
    p = fma(r, p, 1.0 / 3628800)
    p = fma(r, p, 1.0 / 362880)
    p = fma(r, p, 1.0 / 40320)
    p = fma(r, p, 1.0 / 5040)
    p = fma(r, p, 1.0 / 720)
    p = fma(r, p, 1.0 / 120)
    p = fma(r, p, 1.0 / 24)
    p = fma(r, p, 1.0 / 6)
    p = fma(r, p, 0.5)
    p = fma(r, p, 1.0)
    p = fma(r, p, 1.0)
    scale = i64_as_f64((f64_as_i64(t) - _SHIFT_BITS + 1023) << 52)
    return p * scale if y >= EXP_MIN_ARG else 0.0


@kernel
def weight(x_v, m, inv_t):
    """Unnormalized processed weight ``exp((x_v - m) * inv_t)`` of one logit (float64; float16 bits accepted)."""
    return fexp((to_f64(x_v) - m) * inv_t)
