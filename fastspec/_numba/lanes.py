"""Sums in a fixed order that still vectorize.

Kernels are compiled without ``reassoc`` (see :mod:`fastspec._numba.jit`), so LLVM may not reorder a sum: a
plain ``s += w[v]`` loop is exact in its order but runs one add at a time (and Numba leaves LLVM's SLP vectorizer
off, so sixteen hand-written scalar accumulators stay scalar too).  :func:`lane_sum` writes the order out and
spells the vector in LLVM IR itself: element ``lo + 16 j + l`` is added to lane ``l`` of a ``<16 x double>``
accumulator (two AVX-512 or four AVX2 registers; lane-wise adds, no reassociation), the lanes are combined by a
fixed pairwise tree, then the tail (``(hi - lo) % 16`` elements) is added left to right.  The result is a pure
function of the input values: the same on every CPU, vector width, thread count and call site, and the same
whether the kernel was compiled in this process or loaded from the cache.  :func:`lane_min_sum` is the same
order over ``min(a p[v], b q[v])`` (the acceptance rate of two stored weight rows).  :func:`exp_lane_sum`
computes processed weights ``exp((x_v - m) * inv_t)`` (0 below the cutoff), stores them and sums them in the
same order in one pass: the exponential is :func:`fastspec._numba.fastexp.fexp` spelled lane-wise in IR (the same
operations in the same order, so every weight has the bits of the scalar ``fexp``), and the accumulator's adds
hide behind it instead of running as a second, latency-bound pass over the stored weights.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import fastexp as _fx
from .intrinsics import fma
from .intrinsics import to_f64 as _to_f64
from .jit import kernel

LANES = 16


def _lane_loop(builder, lo, stop, load_term):
    """IR: acc = sum over i in [lo, stop) step LANES of load_term(i) (a <LANES x double>); returns the lanes
    combined by the fixed pairwise tree."""
    i64 = ir.IntType(64)
    vt = ir.VectorType(ir.DoubleType(), LANES)
    entry = builder.block
    loop = builder.append_basic_block("lanes.loop")
    body = builder.append_basic_block("lanes.body")
    done = builder.append_basic_block("lanes.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    i = builder.phi(i64)
    acc = builder.phi(vt)
    i.add_incoming(lo, entry)
    acc.add_incoming(ir.Constant(vt, [0.0] * LANES), entry)
    builder.cbranch(builder.icmp_signed("<", i, stop), body, done)
    builder.position_at_end(body)
    acc_next = builder.fadd(acc, load_term(i))
    i_next = builder.add(i, ir.Constant(i64, LANES))
    i.add_incoming(i_next, builder.block)
    acc.add_incoming(acc_next, builder.block)
    builder.branch(loop)
    builder.position_at_end(done)
    lanes = [builder.extract_element(acc, ir.Constant(ir.IntType(32), lane)) for lane in range(LANES)]
    while len(lanes) > 1:
        lanes = [builder.fadd(lanes[k], lanes[k + 1]) for k in range(0, len(lanes), 2)]
    return lanes[0]


def _vector_at(builder, data, i):
    vt = ir.VectorType(ir.DoubleType(), LANES)
    return builder.load(builder.bitcast(builder.gep(data, [i]), vt.as_pointer()), align=8)


def _is_f64_vector(a):
    return isinstance(a, types.Array) and a.ndim == 1 and a.dtype == types.float64 and a.layout == "C"


@intrinsic
def _sum_lanes(typingctx, w, stop):
    """Lanes of w[0:stop] (stop a multiple of LANES) combined by the pairwise tree."""
    if not _is_f64_vector(w):
        return None
    sig = types.float64(w, types.intp)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        zero = ir.Constant(ir.IntType(64), 0)
        return _lane_loop(builder, zero, args[1], lambda i: _vector_at(builder, data, i))

    return sig, codegen


def _vector_fma(builder, vt):
    """llvm.fma on <LANES x double>, declared once per module."""
    name = f"llvm.fma.v{LANES}f64"  # llvmlite's declare_intrinsic names scalar types only
    return builder.module.globals.get(name) or ir.Function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), name)


def _pair_sum_intrinsic(name, term, doc):
    """An intrinsic ``(p, q, a, b, stop) -> float64``: the lanes of ``term(builder, p_i, q_i, a, b)`` (each a
    <LANES x double>) over [0, stop), combined by the pairwise tree."""
    def typer(typingctx, p, q, a, b, stop):
        if not (_is_f64_vector(p) and _is_f64_vector(q)):
            return None
        sig = types.float64(p, q, types.float64, types.float64, types.intp)

        def codegen(context, builder, signature, args):
            pd = context.make_array(signature.args[0])(context, builder, args[0]).data
            qd = context.make_array(signature.args[1])(context, builder, args[1]).data
            vt = ir.VectorType(ir.DoubleType(), LANES)
            va, vb = _splat(builder, args[2], vt), _splat(builder, args[3], vt)
            return _lane_loop(builder, ir.Constant(ir.IntType(64), 0), args[4],
                              lambda i: term(builder, _vector_at(builder, pd, i), _vector_at(builder, qd, i), va, vb))

        return sig, codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


def _min_term(builder, p, q, va, vb):
    x = builder.fmul(p, va)
    y = builder.fmul(q, vb)
    return builder.select(builder.fcmp_ordered("<", y, x), y, x)  # min(x, y), x on ties


def _residual_term(builder, p, q, va, vb):
    vt = p.type
    d = builder.call(_vector_fma(builder, vt), [p, va, builder.fneg(builder.fmul(q, vb))])
    zero = ir.Constant(vt, [0.0] * LANES)
    return builder.select(builder.fcmp_ordered(">", d, zero), d, zero)


_min_sum_lanes = _pair_sum_intrinsic("_min_sum_lanes", _min_term, "Lanes of min(a p, b q) over [0, stop).")
_residual_sum_lanes = _pair_sum_intrinsic(
    "_residual_sum_lanes", _residual_term, "Lanes of max(fma(p, a, -(q b)), 0) over [0, stop) (the residual weights of "
    ":func:`fastspec._kernels.sample.block_sums`, summed without storing them).")


def _splat(builder, value, vt):
    undef = ir.Constant(vt, ir.Undefined)
    mask = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
    return builder.shuffle_vector(builder.insert_element(undef, value, ir.Constant(ir.IntType(32), 0)), undef, mask)


def _fexp_lanes(builder, y):
    """:func:`fastspec._numba.fastexp.fexp` on a <LANES x double>, operation for operation (Numba lowers
    ``a if c else b`` to a select): no clamp, lanes below EXP_MIN_ARG are replaced by 0 at the end."""
    vt = y.type
    it = ir.VectorType(ir.IntType(64), LANES)

    def c(v):
        return ir.Constant(vt, [float(v)] * LANES)

    fma = _vector_fma(builder, vt)
    t = builder.call(fma, [y, c(_fx.LOG2E), c(_fx._SHIFT)])
    nf = builder.fsub(t, c(_fx._SHIFT))
    neg = builder.fneg(nf)
    r = builder.call(fma, [neg, c(_fx.LN2_HI), y])
    r = builder.call(fma, [neg, c(_fx.LN2_LO), r])
    p = builder.call(fma, [r, c(1.0 / 479001600), c(1.0 / 39916800)])
    for k in (1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5,
              1.0, 1.0):
        p = builder.call(fma, [r, p, c(k)])
    bits = builder.bitcast(t, it)
    bits = builder.add(builder.sub(bits, ir.Constant(it, [_fx._SHIFT_BITS] * LANES)), ir.Constant(it, [1023] * LANES))
    scale = builder.bitcast(builder.shl(bits, ir.Constant(it, [52] * LANES)), vt)
    return builder.select(builder.fcmp_ordered(">=", y, c(_fx.EXP_MIN_ARG)), builder.fmul(p, scale), c(0.0))


_LOGIT_TYPES = (types.uint16, types.float32, types.float64)


@intrinsic
def _exp_lanes(typingctx, x, m, inv_t, thr, w, stop):
    """w[0:stop] = processed weights of the logits x[0:stop] (unit stride; float16 as uint16 bits), and their
    lanes combined by the pairwise tree (stop a multiple of LANES)."""
    if not (isinstance(x, types.Array) and x.ndim == 1 and x.dtype in _LOGIT_TYPES and _is_f64_vector(w)):
        return None
    sig = types.float64(x, types.float64, types.float64, types.float64, w, types.intp)

    def codegen(context, builder, signature, args):
        xd = context.make_array(signature.args[0])(context, builder, args[0]).data
        wd = context.make_array(signature.args[4])(context, builder, args[4]).data
        vt = ir.VectorType(ir.DoubleType(), LANES)
        vm, vinv, vthr = (_splat(builder, a, vt) for a in args[1:4])
        dt = signature.args[0].dtype
        src = ir.VectorType(ir.IntType(16) if dt == types.uint16 else context.get_value_type(dt), LANES)

        def term(i):
            xv = builder.load(builder.bitcast(builder.gep(xd, [i]), src.as_pointer()), align=1)
            if dt == types.uint16:
                xv = builder.fpext(builder.bitcast(xv, ir.VectorType(ir.HalfType(), LANES)), vt)
            elif dt == types.float32:
                xv = builder.fpext(xv, vt)
            e = _fexp_lanes(builder, builder.fmul(builder.fsub(xv, vm), vinv))
            e = builder.select(builder.fcmp_ordered(">=", xv, vthr), e, ir.Constant(vt, [0.0] * LANES))
            builder.store(e, builder.bitcast(builder.gep(wd, [i]), vt.as_pointer()), align=8)
            return e

        return _lane_loop(builder, ir.Constant(ir.IntType(64), 0), args[5], term)

    return sig, codegen


@kernel
def exp_lane_sum(x, m, inv_t, thr, w):
    """Store ``w[v] = exp((x_v - m) * inv_t)`` if ``x_v >= thr`` else 0 (fexp's bits) for every v of the logits
    x (float16 bits, float32 or float64; w float64 of the same length) and return the sum of w in
    :func:`lane_sum`'s order."""
    n = x.shape[0]
    contiguous = x.strides[0] == x.itemsize  # a strided row never comes from fastspec's wrappers
    stop = n - n % LANES if contiguous else 0
    for v in range(stop, n):  # the tail (every value of a strided row) one by one
        w[v] = _fx.weight(x[v], m, inv_t) if _to_f64(x[v]) >= thr else 0.0
    if not contiguous:
        return lane_sum(w, 0, n)
    t = _exp_lanes(x, m, inv_t, thr, w, stop)
    for v in range(stop, n):
        t += w[v]
    return t


@kernel
def lane_sum(w, lo, hi):
    """Sum of ``w[lo:hi]`` (float64) in the fixed order described in the module docstring."""
    ws = w[lo:hi]
    n = ws.shape[0]
    stop = n - n % LANES
    t = _sum_lanes(ws, stop)
    for j in range(stop, n):
        t += ws[j]
    return t


@kernel
def _pair_sum(p, q, a, b, lo, hi, residual):
    """Sum over ``v`` in ``[lo, hi)`` of ``max(fma(p[v], a, -(q[v] * b)), 0)`` (``residual``) or ``min(a p[v],
    b q[v])``, in the order of :func:`lane_sum`."""
    ps = p[lo:hi]
    qs = q[lo:hi]
    n = ps.shape[0]
    stop = n - n % LANES
    t = _residual_sum_lanes(ps, qs, a, b, stop) if residual else _min_sum_lanes(ps, qs, a, b, stop)
    for j in range(stop, n):
        if residual:
            d = fma(ps[j], a, -(qs[j] * b))
            t += d if d > 0.0 else 0.0
        else:
            x = ps[j] * a
            y = qs[j] * b
            t += y if y < x else x
    return t


@kernel
def lane_min_sum(p, q, a, b, lo, hi):
    """Sum of ``min(a p[v], b q[v])`` over ``v`` in ``[lo, hi)`` in the order of :func:`lane_sum`."""
    return _pair_sum(p, q, a, b, lo, hi, False)


@kernel
def lane_residual_sum(p, q, a, b, lo, hi):
    """Sum of ``max(fma(p[v], a, -(q[v] * b)), 0)`` over ``v`` in ``[lo, hi)`` in the order of :func:`lane_sum`:
    the bits of storing those terms and calling :func:`lane_sum` on them (test), without the store."""
    return _pair_sum(p, q, a, b, lo, hi, True)
