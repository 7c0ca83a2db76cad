"""Exact acceptance analysis: per-position α, sparse α bounds, trajectory DP, closed forms.

Definitions
-----------
For a position with target distribution p and draft distribution q (both after the same temperature /
top-k / top-p / min-p processing), the probability that token-level speculative sampling accepts the draft
token is ``α = Σ_v min(p(v), q(v)) = 1 - TV(p, q)``.  Temperature 0 is greedy: α = 1 if the two argmaxes
(lowest index on ties) agree, else 0.

Trajectory DP and the end-of-sequence convention
------------------------------------------------
A sequence has L valid positions 0..L-1 with acceptance rates α_0..α_{L-1} (α_t: the draft's proposal for
token t is accepted).  A verify step starting at position t (token t is the next one to produce) drafts
``d = min(k, L - 1 - t)`` tokens, i.e. **it never speculates past the recorded end**: drafts cover
positions t..t+d-1 and the bonus token, if all are accepted, is token t+d <= L-1.  Draft i is accepted
with probability α_{t+i} given drafts < i were, so exactly j < d are accepted with probability
(Π_{i<j} α_{t+i})(1 - α_{t+j}) (the rejected position t+j then gets the recovered token) and all d with
Π_{i<d} α_{t+i}; the step emits accepted + 1 tokens and the next step starts at t + accepted + 1.
A step that would start at t = L-1 (d = 0) is a plain target step: it emits the last token and is **not**
counted as a verify step (nothing was drafted), matching engines, which count only steps with drafts.
Consequently α_{L-1} is never used.  Each position is drafted at most once, so the process is the same as
drawing one independent Bernoulli(α_t) coin per position in advance (the property the tests use).

Reported figures, summed over sequences and then divided (ratios of totals, as vLLM's metrics):

* mean acceptance length = (accepted + verify steps) / verify steps = 1 + accepted / steps
  (tokens per verify step, the bonus / recovered token included);
* draft acceptance rate = accepted / drafted;
* per-position acceptance[j] = (steps whose draft j was accepted) / steps (vLLM's unconditional definition;
  steps that drafted fewer than j+1 tokens count in the denominator).

Closed forms (Leviathan et al. 2023) assume one α for every position and no end of sequence:
``(1 - α^{k+1}) / (1 - α)`` tokens per step (bonus included) and speed-up ``that / (k c + 1)`` for a
draft/target cost ratio c.  Replaying recorded α_t differs from plugging their mean into the formula:
E[Π α] != Π E[α] (Jensen; α varies across contexts and is correlated along a trajectory), and blocks start
right after a rejection, i.e. disproportionately after hard positions, so the positions a step actually
drafts are not a uniform sample of the α_t.

Sparse top-k dumps
------------------
When only the top-k (ids, log-probabilities) of each distribution are known, α is not determined.  With
S_p, S_q the listed sets, A = S_p ∩ S_q, B = S_p \\ S_q, C = S_q \\ S_p, r_p = 1 - Σ_{S_p} p and
r_q = 1 - Σ_{S_q} q the unlisted masses, and p_min = min_{S_p} p, q_min = min_{S_q} q (every unlisted
token has at most the smallest listed probability, because the lists are the top k):

* lower = Σ_A min(p, q)  (the unlisted mass may be spread over tokens the other model gives 0);
* upper = Σ_A min(p, q) + min(min(b, r_q) + r_p, min(c, r_p) + r_q, b + c + min(r_p, r_q),
  1 - Σ_A min(p,q) - ½ [Σ_A |p - q| + Σ_B (p - q_min)^+ + Σ_C (q - p_min)^+])
  with b = Σ_B min(p, q_min) and c = Σ_C min(q, p_min) (each term bounds the unknown part of the sum).

Both are exact when k covers the whole support.  Sampling flags that need the full vocabulary are refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from ._fastexp import fmaximum, weight
from ._jit import kernel, parallel_kernel, prange
from ._process import logits_status, row_max, row_params, validate_sampling_params

__all__ = [
    "acceptance_rates", "acceptance_bounds", "expected_tokens_per_step", "SpecStats",
    "expected_tokens_closed_form", "expected_speedup", "optimal_k", "dump_acceptance", "DraftAcceptance",
    "alpha_summary",
]

_SCRATCH_MAX_V = 1 << 20  # up to this V the kernel keeps the rows' weights (16 B/token and thread; measured
# faster than recomputing the exps at V = 49152 and 128256)


# --------------------------------------------------------------------------------------------------
# float16 support: Numba has no float16 arrays, so float16 rows travel as uint16 bit patterns and are
# widened exactly by LLVM's half -> double conversion (F16C, vectorized).
# --------------------------------------------------------------------------------------------------
@intrinsic
def _half_bits_to_f64(typingctx, x):
    sig = types.float64(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.DoubleType())

    return sig, codegen


def _f64(v):  # pragma: no cover - replaced inside kernels by the overload below
    return float(v)


@overload(_f64, jit_options={"cache": True})
def _f64_ov(v):
    if v == types.uint16:
        return lambda v: _half_bits_to_f64(v)
    return lambda v: np.float64(v)


def _f32w(v):  # pragma: no cover - replaced inside kernels by the overload below
    return v


@overload(_f32w, jit_options={"cache": True})
def _f32w_ov(v):
    """float16 bits -> float32 (exact); float32/float64 unchanged: the max pass runs in the narrow type."""
    if v == types.uint16:
        return lambda v: _half_bits_to_f32(v)
    return lambda v: v


@intrinsic
def _half_bits_to_f32(typingctx, x):
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@kernel
def _row_status(x):
    """(status, m): status 0 ok, 1 NaN, 2 +inf, 3 no finite value; m = max as float64.

    One vectorized IEEE-maximum reduction (NaN-propagating, so it is also the validity check)."""
    m = _f32w(x[0])
    for i in range(x.shape[0]):
        m = fmaximum(m, _f32w(x[i]))
    m64 = np.float64(m)
    return logits_status(m64), m64


@kernel
def _argmax_of(x, m):
    """Lowest index with x[i] == m."""
    for i in range(x.shape[0]):
        if _f64(x[i]) == m:
            return i
    return 0


@kernel
def _row_check(x):
    """(status, m, amax): status 0 ok, 1 NaN, 2 +inf, 3 no finite value; m = max, amax = lowest argmax."""
    st, m = _row_status(x)
    if st != 0:
        return st, m, 0
    return 0, m, _argmax_of(x, m)


# --------------------------------------------------------------------------------------------------
# Dense kernels
# --------------------------------------------------------------------------------------------------
@kernel
def _weights_row(x, m, it, w):
    """w[v] = exp((x[v] - m) * it) (float64); returns their sum."""
    z = 0.0
    for v in range(x.shape[0]):
        a = weight(_f64(x[v]), m, it)
        w[v] = a
        z += a
    return z


@kernel
def _min_sum(ep, eq, izp, izq):
    s = 0.0
    for v in range(ep.shape[0]):
        s += min(ep[v] * izp, eq[v] * izq)
    return s


@parallel_kernel
def _alpha_plain(P, Q, temp, valid, use_scratch, nthreads, out, status):
    """α per row, temperature only (no filters).  Per row pair: one vectorized max pass per row (it also
    validates the row), then with ``use_scratch`` two exps per token pair -- the weights go to per-thread
    float64 buffers while the normalizers are summed -- and a Σ min pass over the buffers (no exp);
    without it the min pass recomputes the exps (four per pair)."""
    R, V = P.shape
    nth = min(nthreads, max(R, 1))
    for c in prange(nth):
        ep = np.empty(V if use_scratch else 1)
        eq = np.empty(V if use_scratch else 1)
        for r in range(c * R // nth, (c + 1) * R // nth):
            out[r] = 0.0
            status[r] = 0
            if not valid[r]:
                continue
            x = P[r]
            y = Q[r]
            sp, mp = _row_status(x)
            if sp != 0:
                status[r] = sp
                continue
            sq, mq = _row_status(y)
            if sq != 0:
                status[r] = 3 + sq
                continue
            t = temp[r]
            if t == 0.0:
                out[r] = 1.0 if _argmax_of(x, mp) == _argmax_of(y, mq) else 0.0
                continue
            it = 1.0 / t
            if use_scratch:
                zp = _weights_row(x, mp, it, ep)
                zq = _weights_row(y, mq, it, eq)
                s = _min_sum(ep, eq, 1.0 / zp, 1.0 / zq)
            else:
                zp = 0.0
                zq = 0.0
                for v in range(V):
                    zp += weight(_f64(x[v]), mp, it)
                    zq += weight(_f64(y[v]), mq, it)
                izp = 1.0 / zp
                izq = 1.0 / zq
                s = 0.0
                for v in range(V):
                    s += min(weight(_f64(x[v]), mp, it) * izp, weight(_f64(y[v]), mq, it) * izq)
            out[r] = min(s, 1.0)


@parallel_kernel
def _alpha_filtered(P, Q, temp, top_k, top_p, min_p, valid, nthreads, out, status):
    """α per row with top-k / top-p / min-p via :func:`fastspec._process.row_params` (float32/64 rows)."""
    R, V = P.shape
    nth = min(nthreads, max(R, 1))
    for c in prange(nth):
        scratch = np.empty(V)
        for r in range(c * R // nth, (c + 1) * R // nth):
            out[r] = 0.0
            status[r] = 0
            if not valid[r]:
                continue
            x = P[r]
            y = Q[r]
            sp, _ = _row_status(x)
            if sp != 0:
                status[r] = sp
                continue
            sq, _ = _row_status(y)
            if sq != 0:
                status[r] = 3 + sq
                continue
            mp, itp, thp, zp, ap = row_params(x, temp[r], top_k[r], top_p[r], min_p[r], scratch)
            mq, itq, thq, zq, aq = row_params(y, temp[r], top_k[r], top_p[r], min_p[r], scratch)
            if temp[r] == 0.0:
                out[r] = 1.0 if ap == aq else 0.0
                continue
            izp = 1.0 / zp
            izq = 1.0 / zq
            s = 0.0
            for v in range(V):
                a = np.float64(x[v])
                b = np.float64(y[v])
                wa = weight(a, mp, itp) * izp if a >= thp else 0.0
                wb = weight(b, mq, itq) * izq if b >= thq else 0.0
                s += min(wa, wb)
            out[r] = min(s, 1.0)


_STATUS = {1: "is NaN", 2: "is +inf", 3: "has no finite logit (all -inf)"}


def _raise_status(status, lead_shape, names, where=None):
    bad = np.flatnonzero(status)
    if not bad.size:
        return
    i = int(bad[0])
    s = int(status[i])
    name = names[0] if s <= 3 else names[1]
    idx = where(i) if where is not None else [int(j) for j in np.unravel_index(i, lead_shape)] if lead_shape else []
    what = {1: "contains NaN", 2: "contains +inf", 3: "has no finite logit (all -inf)"}[s if s <= 3 else s - 3]
    raise ValueError(f"{name} row {idx} {what}; logits must be finite or -inf (masked), with at least one "
                     "finite value per row")


def _as_rows(name, a):
    if not isinstance(a, np.ndarray):
        a = np.asarray(a)
    if a.dtype.kind in "iu" and a.dtype != bool:
        a = a.astype(np.float64)
    if a.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"{name} must be a float16/float32/float64 array, got dtype {a.dtype}")
    if a.ndim < 1 or a.shape[-1] < 1:
        raise ValueError(f"{name} must have shape [..., V] with V >= 1, got {list(a.shape)}")
    x2 = a.reshape(-1, a.shape[-1])
    if x2.strides[-1] != x2.itemsize:
        x2 = np.ascontiguousarray(x2)
    return x2


def _filters_active(k, p, mp):
    return bool((k > 0).any() or (p < 1.0).any() or (mp > 0.0).any())


def _alpha_rows(P, Q, t, k, p, mp, valid, block_rows=4096):
    """α for 2-D rows (validated params per row); status per row."""
    R, V = P.shape
    out = np.empty(R)
    status = np.zeros(R, dtype=np.int8)
    if R == 0:
        return out, status
    if not _filters_active(k, p, mp):
        if P.dtype == np.float16:
            P = P.view(np.uint16)
        if Q.dtype == np.float16:
            Q = Q.view(np.uint16)
        _alpha_plain(P, Q, t, valid, V <= _SCRATCH_MAX_V, numba.get_num_threads(), out, status)
        return out, status
    for r0 in range(0, R, block_rows):  # float16 rows are widened to float32 a block at a time
        r1 = min(R, r0 + block_rows)
        a = P[r0:r1] if P.dtype != np.float16 else P[r0:r1].astype(np.float32)
        b = Q[r0:r1] if Q.dtype != np.float16 else Q[r0:r1].astype(np.float32)
        _alpha_filtered(a, b, t[r0:r1], k[r0:r1], p[r0:r1], mp[r0:r1], valid[r0:r1],
                        numba.get_num_threads(), out[r0:r1], status[r0:r1])
    return out, status


def _params(rows, lead, temperature, top_k, top_p, min_p):
    vals = []
    for v in (temperature, top_k, top_p, min_p):
        a = np.asarray(v)
        if a.ndim > 0 and a.shape == tuple(lead):
            a = a.reshape(rows)
        vals.append(a)
    return validate_sampling_params(rows, *vals)


def acceptance_rates(target_logits, draft_logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """α_t = Σ_v min(p_t(v), q_t(v)) for every leading index of ``[..., V]`` logits (float64 result).

    Target and draft raw logits (float16/32/64, ``-inf`` = masked) go through the same processing
    (temperature, then top-k, top-p, min-p, as :func:`fastspec.probabilities`); temperature 0 is greedy
    (α = 1 iff the argmaxes agree).  Parameters are scalars or arrays of the leading shape.  One fused,
    row-parallel Numba pass; float64 accumulation; no probability arrays are materialized.
    """
    P = _as_rows("target_logits", target_logits)
    Q = _as_rows("draft_logits", draft_logits)
    ts, ds = np.shape(target_logits), np.shape(draft_logits)
    if ts != ds:
        raise ValueError(f"target_logits {list(ts)} and draft_logits {list(ds)} must have the same shape")
    lead = ts[:-1]
    rows = P.shape[0]
    t, k, p, mp = _params(rows, lead, temperature, top_k, top_p, min_p)
    out, status = _alpha_rows(P, Q, t, k, p, mp, np.ones(rows, dtype=np.bool_))
    _raise_status(status, lead, ("target_logits", "draft_logits"))
    return out.reshape(lead)


# --------------------------------------------------------------------------------------------------
# Sparse bounds
# --------------------------------------------------------------------------------------------------
@parallel_kernel
def _bounds_kernel(ti, tl, di, dl, valid, greedy, lo, hi):
    R = ti.shape[0]
    kp = ti.shape[1]
    kq = di.shape[1]
    for r in prange(R):
        lo[r] = 0.0
        hi[r] = 0.0
        if not valid[r]:
            continue
        op = np.argsort(ti[r])
        oq = np.argsort(di[r])
        if greedy:
            bp = 0
            for j in range(kp):
                if tl[r, j] > tl[r, bp] or (tl[r, j] == tl[r, bp] and ti[r, j] < ti[r, bp]):
                    bp = j
            bq = 0
            for j in range(kq):
                if dl[r, j] > dl[r, bq] or (dl[r, j] == dl[r, bq] and di[r, j] < di[r, bq]):
                    bq = j
            a = 1.0 if ti[r, bp] == di[r, bq] else 0.0
            lo[r] = a
            hi[r] = a
            continue
        sp = 0.0
        pmin = 1.0
        for j in range(kp):
            v = math.exp(np.float64(tl[r, j]))
            sp += v
            pmin = min(pmin, v)
        sq = 0.0
        qmin = 1.0
        for j in range(kq):
            v = math.exp(np.float64(dl[r, j]))
            sq += v
            qmin = min(qmin, v)
        rp = max(0.0, 1.0 - sp)
        rq = max(0.0, 1.0 - sq)
        A = 0.0
        Ad = 0.0
        b = 0.0
        bx = 0.0
        c = 0.0
        cx = 0.0
        i = 0
        j = 0
        while i < kp or j < kq:
            if j >= kq or (i < kp and ti[r, op[i]] < di[r, oq[j]]):
                pv = math.exp(np.float64(tl[r, op[i]]))
                b += min(pv, qmin)
                bx += max(pv - qmin, 0.0)
                i += 1
            elif i >= kp or di[r, oq[j]] < ti[r, op[i]]:
                qv = math.exp(np.float64(dl[r, oq[j]]))
                c += min(qv, pmin)
                cx += max(qv - pmin, 0.0)
                j += 1
            else:
                pv = math.exp(np.float64(tl[r, op[i]]))
                qv = math.exp(np.float64(dl[r, oq[j]]))
                A += min(pv, qv)
                Ad += abs(pv - qv)
                i += 1
                j += 1
        u = min(min(b, rq) + rp, min(c, rp) + rq)
        u = min(u, b + c + min(rp, rq))
        u = min(u, 1.0 - A - 0.5 * (Ad + bx + cx))
        L = min(A, 1.0)
        U = min(max(A + max(u, 0.0), L), 1.0)
        lo[r] = L
        hi[r] = U


def acceptance_bounds(target_ids, target_logprobs, draft_ids, draft_logprobs, *, greedy=False, vocab_size=None):
    """Interval [lower, upper] that provably contains α from sparse top-k data, per leading index.

    ``*_ids`` int [..., k] and ``*_logprobs`` float [..., k] (log-probabilities under the full processed
    distribution; the lists must be the top k, so every unlisted token has at most the smallest listed
    probability).  The target and draft may list different k.  ``greedy=True`` compares the top-1 ids
    (exact: lower == upper).  Returns ``(lower, upper)`` float64 arrays of the leading shape.
    """
    arrs = {}
    for name, a, kind in (("target_ids", target_ids, "i"), ("target_logprobs", target_logprobs, "f"),
                          ("draft_ids", draft_ids, "i"), ("draft_logprobs", draft_logprobs, "f")):
        a = np.asarray(a)
        if kind == "i" and (a.dtype.kind not in "iu"):
            raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
        if kind == "f" and a.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError(f"{name} must be a float16/float32/float64 array, got dtype {a.dtype}")
        if a.ndim < 1 or a.shape[-1] < 1:
            raise ValueError(f"{name} must have shape [..., k] with k >= 1, got {list(a.shape)}")
        arrs[name] = a
    if arrs["target_ids"].shape != arrs["target_logprobs"].shape:
        raise ValueError("target_ids and target_logprobs must have the same shape")
    if arrs["draft_ids"].shape != arrs["draft_logprobs"].shape:
        raise ValueError("draft_ids and draft_logprobs must have the same shape")
    lead = arrs["target_ids"].shape[:-1]
    if arrs["draft_ids"].shape[:-1] != lead:
        raise ValueError(f"target {list(arrs['target_ids'].shape)} and draft {list(arrs['draft_ids'].shape)} "
                         "must agree on the leading dimensions")
    from .io import Dump, _MemorySource  # same checks as the loader

    srcs = {"target_topk_ids": arrs["target_ids"], "target_topk_logprobs": arrs["target_logprobs"],
            "draft_topk_ids": arrs["draft_ids"], "draft_topk_logprobs": arrs["draft_logprobs"]}
    rows = int(np.prod(lead)) if lead else 1
    flat = {k: v.reshape(1, rows, v.shape[-1]) for k, v in srcs.items()}
    if vocab_size is not None:
        flat["vocab_size"] = np.asarray(vocab_size)
    Dump("<arrays>", {k: _MemorySource(k, v) for k, v in flat.items()}).validate()
    lo, hi = _bounds_rows(*(flat[k][0] for k in srcs), np.ones(rows, dtype=np.bool_), greedy)
    return lo.reshape(lead), hi.reshape(lead)


def _bounds_rows(ti, tl, di, dl, valid, greedy):
    R = ti.shape[0]
    lo = np.empty(R)
    hi = np.empty(R)
    _bounds_kernel(np.ascontiguousarray(ti, dtype=np.int64), np.ascontiguousarray(tl, dtype=np.float64),
                   np.ascontiguousarray(di, dtype=np.int64), np.ascontiguousarray(dl, dtype=np.float64),
                   valid, bool(greedy), lo, hi)
    return lo, hi


# --------------------------------------------------------------------------------------------------
# Trajectory DP
# --------------------------------------------------------------------------------------------------
@parallel_kernel
def _dp_kernel(alpha, lengths, k, steps, drafted, accepted, per_pos):
    N = alpha.shape[0]
    for n in prange(N):
        L = lengths[n]
        start = np.zeros(L + 1)
        start[0] = 1.0
        st = 0.0
        dr = 0.0
        ac = 0.0
        for j in range(k):
            per_pos[n, j] = 0.0
        for t in range(L):
            P = start[t]
            if P == 0.0:
                continue
            d = min(k, L - 1 - t)
            if d == 0:
                start[t + 1] += P  # plain target step for the last token: not a verify step
                continue
            st += P
            dr += P * d
            c = 1.0
            for j in range(d):
                a = alpha[n, t + j]
                start[t + j + 1] += P * c * (1.0 - a)
                c *= a
                ac += P * c
                per_pos[n, j] += P * c
            start[t + d + 1] += P * c
        steps[n] = st
        drafted[n] = dr
        accepted[n] = ac


@dataclass
class SpecStats:
    """Expected counts of the speculative process replayed along recorded trajectories (see module doc)."""

    k: int
    steps: float  # expected verify steps (summed over sequences)
    drafted: float
    accepted: float
    tokens: int  # valid positions (tokens produced), summed over sequences
    mean_acceptance_length: float  # 1 + accepted / steps (tokens per verify step, bonus included)
    draft_acceptance_rate: float  # accepted / drafted
    per_position_acceptance: np.ndarray  # [k]: accepted at draft index j / steps
    per_sequence_acceptance_length: np.ndarray = field(repr=False)  # [N]

    def as_dict(self) -> dict:
        return {"k": self.k, "steps": self.steps, "drafted": self.drafted, "accepted": self.accepted,
                "tokens": self.tokens, "mean_acceptance_length": self.mean_acceptance_length,
                "draft_acceptance_rate": self.draft_acceptance_rate,
                "per_position_acceptance": self.per_position_acceptance.tolist()}


def expected_tokens_per_step(alpha, k, *, lengths=None) -> SpecStats:
    """Exact expected speculative-decoding figures for draft length ``k`` by DP along each trajectory.

    ``alpha``: [N, T] (or [T]) per-position acceptance rates in [0, 1]; ``lengths``: valid positions per
    sequence (default T; positions beyond are ignored).  End of sequence: a step at t drafts
    ``min(k, L - 1 - t)`` tokens; the last token, when reached by itself, is a plain target step that is
    not counted (module docstring).  O(N·T·k).
    """
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] < 1:
        raise ValueError(f"alpha must have shape [N, T] or [T], got {list(np.shape(alpha))}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (draft length), got {k!r}")
    N, T = a.shape
    if lengths is None:
        ln = np.full(N, T, dtype=np.int64)
    else:
        ln = np.asarray(lengths)
        if ln.dtype.kind not in "iu" or ln.shape != (N,):
            raise ValueError(f"lengths must be integers of shape [{N}], got {ln.dtype} {list(ln.shape)}")
        ln = ln.astype(np.int64)
        bad = np.flatnonzero((ln < 1) | (ln > T))
        if bad.size:
            raise ValueError(f"lengths[{bad[0]}] = {ln[bad[0]]} must be in [1, {T}]")
    valid = np.arange(T)[None, :] < ln[:, None]
    bad = np.argwhere(valid & ~((a >= 0.0) & (a <= 1.0)))
    if bad.size:
        n, t = bad[0]
        raise ValueError(f"alpha[{n}, {t}] = {a[n, t]!r} must be a probability in [0, 1]")
    a = np.ascontiguousarray(a)
    k = int(k)
    steps = np.empty(N)
    drafted = np.empty(N)
    accepted = np.empty(N)
    per_pos = np.empty((N, k))
    _dp_kernel(a, ln, k, steps, drafted, accepted, per_pos)
    S, D, A = float(steps.sum()), float(drafted.sum()), float(accepted.sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        per_seq = np.where(steps > 0, 1.0 + accepted / np.where(steps > 0, steps, 1.0), 1.0)
    return SpecStats(
        k=k, steps=S, drafted=D, accepted=A, tokens=int(ln.sum()),
        mean_acceptance_length=1.0 + A / S if S > 0 else 1.0,
        draft_acceptance_rate=A / D if D > 0 else 0.0,
        per_position_acceptance=per_pos.sum(axis=0) / S if S > 0 else np.zeros(k),
        per_sequence_acceptance_length=per_seq,
    )


# --------------------------------------------------------------------------------------------------
# Closed forms (Leviathan et al. 2023, bonus token included)
# --------------------------------------------------------------------------------------------------
def _check_alpha_k(alpha, k):
    a = float(alpha)
    if not (0.0 <= a <= 1.0):
        raise ValueError(f"alpha = {alpha!r} must be in [0, 1]")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    return a, int(k)


def expected_tokens_closed_form(alpha, k) -> float:
    """(1 - α^{k+1}) / (1 - α): expected tokens per verify step with i.i.d. α (k + 1 when α = 1)."""
    a, k = _check_alpha_k(alpha, k)
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_speedup(alpha, k, c) -> float:
    """(1 - α^{k+1}) / ((1 - α)(k c + 1)): walltime speed-up for draft/target cost ratio ``c`` >= 0."""
    a, k = _check_alpha_k(alpha, k)
    c = float(c)
    if not (c >= 0.0 and math.isfinite(c)):
        raise ValueError(f"c = {c!r} (draft/target cost ratio) must be finite and >= 0")
    return expected_tokens_closed_form(a, k) / (k * c + 1.0)


def optimal_k(alpha, c, k_max=64) -> int:
    """The k in [0, k_max] maximizing :func:`expected_speedup` (0 means: do not speculate; smallest on ties)."""
    if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or k_max < 0:
        raise ValueError(f"k_max must be an integer >= 0, got {k_max!r}")
    best, best_s = 0, 1.0
    for k in range(1, int(k_max) + 1):
        s = expected_speedup(alpha, k, c)
        if s > best_s * (1.0 + 1e-12):
            best, best_s = k, s
    return best


# --------------------------------------------------------------------------------------------------
# Whole dumps, bounded memory
# --------------------------------------------------------------------------------------------------
@dataclass
class DraftAcceptance:
    """Per-position α of one draft over a dump: ``alpha`` [N, T] (dense; 0 at padding), or the sparse
    interval ``lower``/``upper`` (``alpha`` is then None); ``valid`` [N, T] marks real positions."""

    name: str
    valid: np.ndarray
    alpha: np.ndarray | None = None
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None

    @property
    def exact(self) -> bool:
        return self.alpha is not None


def alpha_summary(alpha, valid) -> dict:
    """mean (over valid positions), std over positions, std/min/max of per-sequence means."""
    a = np.asarray(alpha, dtype=np.float64)
    v = np.asarray(valid, dtype=bool)
    vals = a[v]
    cnt = v.sum(axis=1)
    seq = np.where(cnt > 0, np.where(v, a, 0.0).sum(axis=1) / np.maximum(cnt, 1), 0.0)[cnt > 0]
    return {"mean": float(vals.mean()), "std_positions": float(vals.std()),
            "std_sequences": float(seq.std()), "min_sequence": float(seq.min()), "max_sequence": float(seq.max()),
            "min": float(vals.min()), "max": float(vals.max())}


def _resolve_params(dump, temperature, top_k, top_p, min_p):
    md = dump.metadata
    t = md.get("temperature", 1.0) if temperature is None else temperature
    k = md.get("top_k", 0) if top_k is None else top_k
    p = md.get("top_p", 1.0) if top_p is None else top_p
    m = md.get("min_p", 0.0) if min_p is None else min_p
    t, k, p, m = (x[0] for x in validate_sampling_params(1, t, k, p, m))
    if dump.kind == "sparse":
        rec_t = md.get("temperature", 1.0)
        flags = []
        if t != 0.0 and t != rec_t:
            flags.append(f"temperature {t:g} (the log-probabilities were recorded at {rec_t:g})")
        if top_k is not None and top_k != md.get("top_k", 0):
            flags.append(f"top_k {top_k}")
        if top_p is not None and top_p != md.get("top_p", 1.0):
            flags.append(f"top_p {top_p:g}")
        if min_p is not None and min_p != md.get("min_p", 0.0):
            flags.append(f"min_p {min_p:g}")
        if flags:
            raise ValueError(f"{dump.path}: sparse top-k dump: cannot apply {', '.join(flags)}; that needs the "
                             "full vocabulary. Sparse log-probabilities are analysed as recorded (or greedy with "
                             "temperature 0); save dense logits for other settings")
    return float(t), int(k), float(p), float(m)


def dump_acceptance(dump, *, temperature=None, top_k=None, top_p=None, min_p=None, drafts=None,
                    max_bytes=None) -> dict[str, DraftAcceptance]:
    """α at every valid position of a dump, per draft, reading ``max_bytes`` per array at a time.

    ``dump``: a :class:`fastspec.io.Dump` or a path.  Processing flags default to the dump's recorded
    metadata (then temperature 1, no filters).  Dense dumps give exact α; sparse dumps give the
    [lower, upper] interval and refuse flags that need the full vocabulary.  Extra memory: one chunk per
    array plus O(N·T) float64 outputs per draft.
    """
    from .io import DEFAULT_CHUNK_BYTES, load_dump

    own = not hasattr(dump, "iter_chunks")
    d = load_dump(dump) if own else dump
    try:
        t, k, p, m = _resolve_params(d, temperature, top_k, top_p, min_p)
        names = d.drafts if drafts is None else tuple(drafts)
        N, T = d.N, d.T
        valid2 = np.arange(T)[None, :] < d.lengths[:, None]
        res = {}
        for n in names:
            if d.kind == "dense":
                res[n] = DraftAcceptance(n, valid2, alpha=np.zeros((N, T)))
            else:
                res[n] = DraftAcceptance(n, valid2, lower=np.zeros((N, T)), upper=np.zeros((N, T)))
        dense = d.kind == "dense"
        for ch in d.iter_chunks(drafts=names, max_bytes=max_bytes or DEFAULT_CHUNK_BYTES, validate=not dense):
            R = ch.stop - ch.start
            valid = np.ascontiguousarray(ch.valid)
            if dense:
                ta = np.full(R, t)
                ka = np.full(R, k, dtype=np.int64)
                pa = np.full(R, p)
                ma = np.full(R, m)
            for n in names:
                if dense:
                    out, status = _alpha_rows(ch.target, ch.drafts[n], ta, ka, pa, ma, valid)
                    if status.any():
                        i = int(np.flatnonzero(status)[0])
                        s = int(status[i])
                        arr = d.array_name("target", "logits") if s <= 3 else d.array_name(n, "logits")
                        what = {1: "contains NaN", 2: "contains +inf", 3: "has no finite logit (all -inf)"}
                        raise ValueError(f"{d.path}: array {arr!r}: row {d.where(ch.start + i)} "
                                         f"{what[s if s <= 3 else s - 3]}; logits must be finite or -inf")
                    res[n].alpha.reshape(-1)[ch.start:ch.stop] = out
                else:
                    lo, hi = _bounds_rows(ch.target[0], ch.target[1], ch.drafts[n][0], ch.drafts[n][1], valid,
                                          t == 0.0)
                    res[n].lower.reshape(-1)[ch.start:ch.stop] = lo
                    res[n].upper.reshape(-1)[ch.start:ch.stop] = hi
        return res
    finally:
        if own:
            d.close()
