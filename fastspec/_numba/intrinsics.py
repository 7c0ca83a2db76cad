"""LLVM intrinsics the kernels need and Numba does not expose.

* :func:`fma` -- ``a*b + c`` with one rounding (``llvm.fma``: a hardware FMA on x86-64 with FMA3 and on ARMv8,
  correctly rounded everywhere), so a result does not depend on whether the compiler fused it.
* :func:`fmaximum` -- IEEE ``maximum`` (``llvm.maximum``: NaN-propagating, -0 < +0).  Exactly associative, so
  its reductions vectorize without ``reassoc``; the result of a row reduction doubles as the row's validity
  check (NaN if the row has a NaN, +inf if it has +inf, -inf if every entry is -inf).
* :func:`to_f64` / :func:`narrow` -- exact widening of a logit: float16 rows travel as their ``uint16`` bit
  patterns (Numba has no float16 arrays) and are widened by LLVM's half conversion (F16C, vectorized);
  float32/float64 values are widened or passed through.  :func:`narrow` widens float16 only to float32 (max
  passes run in the narrowest exact type: more lanes per vector).
* :func:`i64_as_f64` / :func:`f64_as_i64` -- bit reinterpretation (no conversion); :func:`half_index` -- a
  float16's bits as a table index.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def i64_as_f64(typingctx, v):
    """Reinterpret the bits of an int64 as a float64."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@intrinsic
def f64_as_i64(typingctx, v):
    """Reinterpret the bits of a float64 as an int64."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a*b + c with a single rounding."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def fmaximum(typingctx, a, b):
    """IEEE maximum of two floats of the same type (NaN-propagating)."""
    if not (isinstance(a, types.Float) and a == b):
        return None
    sig = a(a, b)

    def codegen(context, builder, signature, args):
        t = context.get_value_type(signature.return_type)
        fn = builder.module.declare_intrinsic("llvm.maximum", [t], ir.FunctionType(t, [t, t]))
        return builder.call(fn, args)

    return sig, codegen


def _widen(typingctx, x, target, ir_target):
    if x == types.uint16:
        sig = target(x)

        def codegen(context, builder, signature, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir_target())

        return sig, codegen
    if isinstance(x, types.Float) and x.bitwidth <= target.bitwidth:
        sig = target(x)

        def codegen(context, builder, signature, args):
            if x.bitwidth == target.bitwidth:
                return args[0]
            return builder.fpext(args[0], ir_target())

        return sig, codegen
    return None


@intrinsic
def to_f64(typingctx, x):
    """A logit as float64: float16 bits (uint16), float32 or float64 in, exact."""
    return _widen(typingctx, x, types.float64, ir.DoubleType)


@intrinsic
def narrow(typingctx, x):
    """float16 bits (uint16) -> float32 exactly; float32 and float64 unchanged."""
    if x == types.float64:
        sig = types.float64(x)
        return sig, lambda context, builder, signature, args: args[0]
    return _widen(typingctx, x, types.float32, ir.FloatType)


@intrinsic
def half_index(typingctx, x):
    """The bit pattern of a float16 value (uint16) as a table index (int64); 0 for any other type (a row of
    another dtype never reaches the table lookup, but its code must compile)."""
    sig = types.int64(x)
    if x == types.uint16:
        def codegen(context, builder, signature, args):
            return builder.zext(args[0], ir.IntType(64))
    else:
        def codegen(context, builder, signature, args):
            return ir.Constant(ir.IntType(64), 0)
    return sig, codegen
