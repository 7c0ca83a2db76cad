"""Batched block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh; arXiv 2403.10444).

Token verification judges drafts one by one and stops at the first rejection.  Block verification judges the
block jointly and is optimal among exact verifiers (never fewer accepted tokens in expectation; identical at
K = 1 and at temperature 0).  For row b with drafts x_1..x_n (n = num_draft[b]), p_i / q_i the processed target
/ draft distributions at drafted position i:

    w_0 = 1,   w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1),
    Z_{i+1} = sum_v max(w_i p_{i+1}(v) - q_{i+1}(v), 0),   h_i = Z_{i+1} / (Z_{i+1} + 1 - w_i)  (i < n; 1 if 0/0),
    h_n = w_n,   eta_i ~ Bernoulli(h_i),   tau = max{i : eta_i = 1} (0 if none).

The row emits x_1..x_tau, then Y ~ max(w_tau p_{tau+1} - q_{tau+1}, 0) / Z_{tau+1} when tau < n, else a bonus
token from p_{n+1}.  The exact reference is :func:`fastspec.exact.block_verification_distribution`.

Kernel conventions are those of :mod:`fastspec.verify`: ``u * x <= y`` comparisons with u in (0, 1] (never a
division by q, never an accepted p = 0 token), counter-based uniforms ``uniform(row_seed, i, PURPOSE_BLOCK, 0)``
for eta_i, ``(row_seed, tau, PURPOSE_RESIDUAL, 0)`` for the residual and ``(row_seed, n, PURPOSE_BONUS, 0)`` for
the bonus token; a residual that underflows to 0 in floating point (p ~= q) is sampled from p_{tau+1} and
counted in ``residual_underflows``.  ``draft_logits=None`` means one-hot drafts (q_i = delta at x_i).

Cost: every drafted position is visited (token verification stops at the first rejection), plus one pass per
position over the target and draft rows for Z (its block sums are kept, so the residual token needs only a
scan of one vocabulary block).  Call through ``verify_logits(..., method="block")`` /
``verify_probs(..., method="block")``.
"""
from __future__ import annotations

import math

import numpy as np

from ._fastexp import weight
from ._jit import kernel, parallel_kernel, prange
from ._process import logits_status, row_params, vmax
from ._rng import PURPOSE_BLOCK, PURPOSE_BONUS, PURPOSE_DRAFT, PURPOSE_RESIDUAL, uniform

__all__ = ["METHODS", "check_method"]

METHODS = ("token", "block")
BLOCK = 1024  # vocabulary block of the two-level inverse-CDF sampler (as in fastspec.verify)


def check_method(method) -> str:
    if method not in METHODS:
        raise ValueError(f"method {method!r} is unknown; choose 'token' (token-by-token rejection sampling) or "
                         "'block' (block verification)")
    return method


# --------------------------------------------------------------------------- logits: residual max(a*e_p - b*e_q, 0)
# a = w / z_p, b = 1 / z_q scale the unnormalized weights e_p, e_q; onehot >= 0: q is a point mass at `onehot`
# (then the residual is a*e_p off that token and max(a*e_p - 1, 0) = 0 on it).

@kernel
def _el(x, y, v, onehot, mp, itp, thrp, a, mq, itq, thrq, b):
    xv = np.float64(x[v])
    pv = weight(xv, mp, itp) * a
    pv = pv if xv >= thrp else 0.0
    if onehot >= 0:
        return pv if v != onehot else 0.0
    yv = np.float64(y[v])
    qv = weight(yv, mq, itq) * b
    qv = qv if yv >= thrq else 0.0
    d = pv - qv
    return d if d > 0.0 else 0.0


@kernel
def _blk(x, y, lo, hi, onehot, mp, itp, thrp, a, mq, itq, thrq, b):
    s = 0.0
    if onehot >= 0:
        for v in range(lo, hi):
            xv = np.float64(x[v])
            pv = weight(xv, mp, itp) * a
            s += pv if (xv >= thrp and v != onehot) else 0.0
    else:
        for v in range(lo, hi):
            xv = np.float64(x[v])
            pv = weight(xv, mp, itp) * a
            pv = pv if xv >= thrp else 0.0
            yv = np.float64(y[v])
            qv = weight(yv, mq, itq) * b
            qv = qv if yv >= thrq else 0.0
            d = pv - qv
            s += d if d > 0.0 else 0.0
    return s


@kernel
def _residual_sums(x, y, onehot, mp, itp, thrp, a, mq, itq, thrq, b, bsum):
    n = x.shape[0]
    total = 0.0
    for j in range(bsum.shape[0]):
        s = _blk(x, y, j * BLOCK, min(n, (j + 1) * BLOCK), onehot, mp, itp, thrp, a, mq, itq, thrq, b)
        bsum[j] = s
        total += s
    return total


@kernel
def _pick(bsum, u):
    """(block, remaining target) of inverse-CDF sampling over block sums; block -1 when the total is 0."""
    total = 0.0
    for j in range(bsum.shape[0]):
        total += bsum[j]
    if not total > 0.0:
        return -1, 0.0
    target = u * total
    cum = 0.0
    last = -1
    for j in range(bsum.shape[0]):
        s = bsum[j]
        if s > 0.0:
            last = j
            if cum + s >= target:
                return j, target - cum
        cum += s
    return last, np.inf


@kernel
def _sample_stored(x, y, onehot, mp, itp, thrp, a, mq, itq, thrq, b, bsum, u):
    """Sample from the residual whose block sums are in bsum; -1 when it is all zero."""
    j, rem = _pick(bsum, u)
    if j < 0:
        return -1
    n = x.shape[0]
    c = 0.0
    last = -1
    for v in range(j * BLOCK, min(n, (j + 1) * BLOCK)):
        e = _el(x, y, v, onehot, mp, itp, thrp, a, mq, itq, thrq, b)
        if e > 0.0:
            last = v
            c += e
            if c >= rem:
                return v
    return last


@kernel
def _sample_target(x, mp, itp, thrp, u, bsum):
    """Sample from the processed target row (bonus token, or the residual-underflow fallback)."""
    _residual_sums(x, x, x.shape[0], mp, itp, thrp, 1.0, 0.0, 0.0, 0.0, 0.0, bsum)
    return _sample_stored(x, x, x.shape[0], mp, itp, thrp, 1.0, 0.0, 0.0, 0.0, 0.0, bsum, u)


@kernel
def _row_weights(x, m, temp, top_k, top_p, min_p, scratch, e):
    """Row parameters (inv_t, thr, z) of :func:`fastspec._process.row_params` for a validated row with max m,
    and e[v] = the kept unnormalized weight of every token (0 where filtered), in one exponential pass."""
    n = x.shape[0]
    if (top_k == 0 or top_k >= n) and top_p >= 1.0:  # temperature (and min-p) only: fused
        inv_t = 1.0 / temp
        thr = -np.inf
        if min_p > 0.0:
            thr = m + temp * math.log(min_p)
    else:
        _, inv_t, thr, _, _ = row_params(x, temp, top_k, top_p, min_p, scratch)
    z = 0.0
    for v in range(n):
        xv = np.float64(x[v])
        wv = weight(xv, m, inv_t)
        wv = wv if xv >= thr else 0.0
        e[v] = wv
        z += wv
    return inv_t, thr, z


@kernel
def _stored_sums(ep, eq, onehot, a, b, bsum):
    """Block sums of max(a*ep - b*eq, 0) (or a*ep off the point mass `onehot`); returns the total."""
    n = ep.shape[0]
    total = 0.0
    for j in range(bsum.shape[0]):
        lo = j * BLOCK
        hi = min(n, (j + 1) * BLOCK)
        ps = ep[lo:hi]  # slices: loops from 0 vectorize
        s = 0.0
        if onehot >= 0:
            for v in range(ps.shape[0]):
                s += ps[v]
            s *= a
            if onehot >= lo and onehot < hi:
                s = max(s - ep[onehot] * a, 0.0)
        else:
            qs = eq[lo:hi]
            for v in range(ps.shape[0]):
                s += max(ps[v] * a - qs[v] * b, 0.0)
        bsum[j] = s
        total += s
    return total


@kernel
def _first_index_of(x, m):
    for i in range(x.shape[0]):
        if np.float64(x[i]) == m:
            return i
    return 0


@kernel
def _block_row_logits(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seed, out, stats, scratch,
                      rsum, prm, ep, eq, bsum):
    """Block-verify one row from logits, validating each row it reads (NaN/+inf/all -inf: stats[3] = 1 for the
    target, 2 for the draft).  rsum [K, nb]: residual block sums per tau; prm [K+1, 8]: row parameters per
    position; ep, eq [V]: weights of the current position.  stats: [tau, residual_underflows,
    error_position+1, bad_values].  Returns how many leading target and draft rows were read (validated)."""
    if temp == 0.0:  # greedy: block verification equals token verification
        for i in range(nd + 1):
            m = vmax(xt[i])
            if logits_status(m) != 0:
                stats[3] = 1
                return i + 1, 0
            amax = _first_index_of(xt[i], m)
            if i == nd or toks[i] != amax:
                out[i] = amax
                stats[0] = i
                return i + 1, 0
            out[i] = toks[i]
        return nd + 1, 0
    w = 1.0
    tau = 0
    last = nd  # positions 0..last-1 have stored residuals
    for i in range(nd):
        x = xt[i]
        tok = toks[i]
        mp = vmax(x)
        if logits_status(mp) != 0:
            stats[3] = 1
            return i + 1, i
        itp, thrp, zp = _row_weights(x, mp, temp, top_k, top_p, min_p, scratch, ep)
        if has_draft:
            y = xd[i]
            mq = vmax(y)
            if logits_status(mq) != 0:
                stats[3] = 2
                return i + 1, i + 1
            itq, thrq, zq = _row_weights(y, mq, temp, top_k, top_p, min_p, scratch, eq)
            onehot = -1
        else:
            y = x
            mq, itq, thrq, zq = 0.0, 0.0, 0.0, 1.0
            onehot = tok
        a = w / zp
        b = 1.0 / zq
        prm[i, 0], prm[i, 1], prm[i, 2], prm[i, 3] = mp, itp, thrp, a
        prm[i, 4], prm[i, 5], prm[i, 6], prm[i, 7] = mq, itq, thrq, b
        z = _stored_sums(ep, eq, onehot, a, b, rsum[i])
        if i > 0:  # h_i for the previous position, from Z_{i+1} computed at this one
            den = z + 1.0 - w
            if not den > 0.0 or uniform(seed, i, PURPOSE_BLOCK, 0) * den <= z:
                tau = i
        px = ep[tok] / zp
        if has_draft:
            qx = eq[tok] / zq
            if not qx > 0.0:
                stats[2] = i + 1
                return i + 1, i + 1
        else:
            qx = 1.0
        # w_{i+1} = min(w_i p(x)/q(x), 1) without dividing by q
        w = 1.0 if w * px >= qx else w * px / qx
        if not w > 0.0:  # every later h is 0: tau is decided
            last = i + 1
            break
    vt = last
    if last == nd and w > 0.0 and uniform(seed, nd, PURPOSE_BLOCK, 0) <= w:
        tau = nd
    for i in range(tau):
        out[i] = toks[i]
    stats[0] = tau
    if tau == nd:
        x = xt[nd]
        mp = vmax(x)
        if logits_status(mp) != 0:
            stats[3] = 1
            return nd + 1, last
        itp, thrp, zp = _row_weights(x, mp, temp, top_k, top_p, min_p, scratch, ep)
        _stored_sums(ep, ep, x.shape[0], 1.0, 0.0, bsum)
        out[nd] = _sample_stored(x, x, x.shape[0], mp, itp, thrp, 1.0, 0.0, 0.0, 0.0, 0.0, bsum,
                                 uniform(seed, nd, PURPOSE_BONUS, 0))
        return nd + 1, last
    x = xt[tau]
    y = xd[tau] if has_draft else x
    onehot = -1 if has_draft else toks[tau]
    u = uniform(seed, tau, PURPOSE_RESIDUAL, 0)
    v = _sample_stored(x, y, onehot, prm[tau, 0], prm[tau, 1], prm[tau, 2], prm[tau, 3], prm[tau, 4],
                       prm[tau, 5], prm[tau, 6], prm[tau, 7], rsum[tau], u)
    if v < 0:
        stats[1] += 1
        v = _sample_target(x, prm[tau, 0], prm[tau, 1], prm[tau, 2], u, bsum)
    out[tau] = v
    return vt, last


@kernel
def _validate_rest(xt, xd, has_draft, vt, vd, stats):
    """Check the rows the verification did not read (later positions, padding): stats[3] = 1 / 2 when bad."""
    for i in range(vt, xt.shape[0]):
        if logits_status(vmax(xt[i])) != 0:
            stats[3] = 1
            return
    if has_draft:
        for i in range(vd, xd.shape[0]):
            if logits_status(vmax(xd[i])) != 0:
                stats[3] = 2
                return


@kernel
def _block_logits_one(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats, b):
    K1 = xt.shape[1]
    V = xt.shape[2]
    nb = (V + BLOCK - 1) // BLOCK
    need = (top_k[b] > 0 and top_k[b] < V) or top_p[b] < 1.0
    scratch = np.empty(V if need else 1)
    rsum = np.empty((max(K1 - 1, 1), nb))
    prm = np.empty((K1, 8))
    ep = np.empty(V)
    eq = np.empty(V if has_draft else 1)
    bsum = np.empty(nb)
    vt, vd = _block_row_logits(xt[b], xd[b], has_draft, toks[b], nd[b], temp[b], top_k[b], top_p[b], min_p[b],
                               seeds[b], out[b], stats[b], scratch, rsum, prm, ep, eq, bsum)
    if stats[b, 3] == 0:
        _validate_rest(xt[b], xd[b], has_draft, vt, vd, stats[b])


@parallel_kernel
def _block_logits_kernel(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats):
    for b in prange(xt.shape[0]):
        _block_logits_one(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats, b)


def run_block_logits(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats):
    """Block-verify (called by :func:`fastspec.verify_logits` after the shape, token and parameter checks);
    fills out and stats [B, 4].  The logits' values are validated while they are read: stats[b, 3] != 0 marks
    a row with NaN/+inf/no finite value (the caller then words the error with ``validate_logits``)."""
    B = xt.shape[0]
    if xd.shape[1] == 0:  # one-hot drafts or K = 0: give the kernel a row it never reads
        xd = np.zeros((B, 1, xt.shape[2]), dtype=xt.dtype)
    if B == 1:
        _block_logits_one(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats, 0)
    elif B:
        _block_logits_kernel(xt, xd, has_draft, toks, nd, temp, top_k, top_p, min_p, seeds, out, stats)


# --------------------------------------------------------------------------- probabilities

@kernel
def _pel(p, q, v, onehot, w):
    pv = w * p[v]
    if onehot >= 0:
        return pv if v != onehot else 0.0
    d = pv - q[v]
    return d if d > 0.0 else 0.0


@kernel
def _psums(p, q, onehot, w, bsum):
    n = p.shape[0]
    total = 0.0
    for j in range(bsum.shape[0]):
        s = 0.0
        for v in range(j * BLOCK, min(n, (j + 1) * BLOCK)):
            s += _pel(p, q, v, onehot, w)
        bsum[j] = s
        total += s
    return total


@kernel
def _psample(p, q, onehot, w, bsum, u):
    j, rem = _pick(bsum, u)
    if j < 0:
        return -1
    n = p.shape[0]
    c = 0.0
    last = -1
    for v in range(j * BLOCK, min(n, (j + 1) * BLOCK)):
        e = _pel(p, q, v, onehot, w)
        if e > 0.0:
            last = v
            c += e
            if c >= rem:
                return v
    return last


@kernel
def _block_row_probs(pt, pd, has_draft, toks, nd, seed, out, stats, rsum, ws, bsum):
    w = 1.0
    tau = 0
    last = nd
    for i in range(nd):
        p = pt[i]
        tok = toks[i]
        q = pd[i] if has_draft else p
        onehot = -1 if has_draft else tok
        ws[i] = w
        z = _psums(p, q, onehot, w, rsum[i])
        if i > 0:
            den = z + 1.0 - w
            if not den > 0.0 or uniform(seed, i, PURPOSE_BLOCK, 0) * den <= z:
                tau = i
        px = p[tok]
        qx = q[tok] if has_draft else 1.0
        w = 1.0 if w * px >= qx else w * px / qx
        if not w > 0.0:
            last = i + 1
            break
    if last == nd and w > 0.0 and uniform(seed, nd, PURPOSE_BLOCK, 0) <= w:
        tau = nd
    for i in range(tau):
        out[i] = toks[i]
    stats[0] = tau
    if tau == nd:
        _psums(pt[nd], pt[nd], pt.shape[1], 1.0, bsum)
        out[nd] = _psample(pt[nd], pt[nd], pt.shape[1], 1.0, bsum, uniform(seed, nd, PURPOSE_BONUS, 0))
        return
    p = pt[tau]
    q = pd[tau] if has_draft else p
    onehot = -1 if has_draft else toks[tau]
    u = uniform(seed, tau, PURPOSE_RESIDUAL, 0)
    v = _psample(p, q, onehot, ws[tau], rsum[tau], u)
    if v < 0:
        stats[1] += 1
        _psums(p, p, p.shape[0], 1.0, bsum)
        v = _psample(p, p, p.shape[0], 1.0, bsum, u)
    out[tau] = v


@parallel_kernel
def _block_probs_kernel(pt, pd, has_draft, toks, nd, seeds, out, stats):
    B, K1, V = pt.shape
    nb = (V + BLOCK - 1) // BLOCK
    for b in prange(B):
        rsum = np.empty((max(K1 - 1, 1), nb))
        ws = np.empty(K1)
        bsum = np.empty(nb)
        _block_row_probs(pt[b], pd[b], has_draft, toks[b], nd[b], seeds[b], out[b], stats[b], rsum, ws, bsum)


def run_block_probs(pt, pd, has_draft, toks, nd, seeds, out, stats):
    """Block-verify validated probabilities (called by :func:`fastspec.verify_probs`); fills out and stats."""
    if pd.shape[1] == 0:
        pd = np.zeros((pt.shape[0], 1, pt.shape[2]))
    if pt.shape[0]:
        _block_probs_kernel(pt, pd, has_draft, toks, nd, seeds, out, stats)


@kernel
def step_draft_uniforms(step_seeds, kmax):
    """Uniforms in (0, 1] for drafting kmax tokens in each verify step, keyed by the step's own seed.

    Block verification's decision depends on every drafted token of the block, so a trajectory replay must draft
    fresh tokens in every step (a position re-drafted after a rejection must not reuse the token that helped
    reject it); token verification never looks past the first rejection and can key draws by position."""
    out = np.empty((step_seeds.shape[0], kmax), np.float64)
    for i in range(step_seeds.shape[0]):
        for j in range(kmax):
            out[i, j] = uniform(step_seeds[i], j, PURPOSE_DRAFT, 0)
    return out
