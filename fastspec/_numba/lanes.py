"""Sums in a fixed order that still vectorize.

Kernels are compiled without ``reassoc`` (see :mod:`fastspec._numba.jit`), so LLVM may not reorder a sum: a
plain ``s += w[v]`` loop is exact in its order but runs one add at a time (and Numba leaves LLVM's SLP vectorizer
off, so sixteen hand-written scalar accumulators stay scalar too).  :func:`lane_sum` writes the order out and
spells the vector in LLVM IR itself: element ``lo + 16 j + l`` is added to lane ``l`` of a ``<16 x double>``
accumulator (two AVX-512 or four AVX2 registers; lane-wise adds, no reassociation), the lanes are combined by a
fixed pairwise tree, then the tail (``(hi - lo) % 16`` elements) is added left to right.  The result is a pure
function of the input values: the same on every CPU, vector width, thread count and call site, and the same
whether the kernel was compiled in this process or loaded from the cache.  :func:`lane_min_sum` is the same
order over ``min(a p[v], b q[v])`` (the acceptance rate of two stored weight rows).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

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
    i.add_incoming(i_next, body)
    acc.add_incoming(acc_next, body)
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


@intrinsic
def _min_sum_lanes(typingctx, p, q, a, b, stop):
    """Lanes of min(a p, b q) over [0, stop) combined by the pairwise tree."""
    if not (_is_f64_vector(p) and _is_f64_vector(q)):
        return None
    sig = types.float64(p, q, types.float64, types.float64, types.intp)

    def codegen(context, builder, signature, args):
        pd = context.make_array(signature.args[0])(context, builder, args[0]).data
        qd = context.make_array(signature.args[1])(context, builder, args[1]).data
        vt = ir.VectorType(ir.DoubleType(), LANES)
        undef = ir.Constant(vt, ir.Undefined)
        mask = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        va = builder.shuffle_vector(builder.insert_element(undef, args[2], ir.Constant(ir.IntType(32), 0)),
                                    undef, mask)
        vb = builder.shuffle_vector(builder.insert_element(undef, args[3], ir.Constant(ir.IntType(32), 0)),
                                    undef, mask)

        def term(i):
            x = builder.fmul(_vector_at(builder, pd, i), va)
            y = builder.fmul(_vector_at(builder, qd, i), vb)
            return builder.select(builder.fcmp_ordered("<", y, x), y, x)  # min(x, y), x on ties

        return _lane_loop(builder, ir.Constant(ir.IntType(64), 0), args[4], term)

    return sig, codegen


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
def lane_min_sum(p, q, a, b, lo, hi):
    """Sum of ``min(a p[v], b q[v])`` over ``v`` in ``[lo, hi)`` in the order of :func:`lane_sum`."""
    ps = p[lo:hi]
    qs = q[lo:hi]
    n = ps.shape[0]
    stop = n - n % LANES
    t = _min_sum_lanes(ps, qs, a, b, stop)
    for j in range(stop, n):
        x = ps[j] * a
        y = qs[j] * b
        t += y if y < x else x
    return t
