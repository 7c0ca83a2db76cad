"""Kernels of the output audit (:mod:`fastspec.audit`): per-token PIT sums, the Poisson-binomial tail, the
one-sided Kolmogorov-Smirnov tail (Smirnov / Birnbaum-Tingey), greedy gaps.  Serial, fixed summation order."""
from __future__ import annotations

import math

import numpy as np

from .._numba.jit import kernel
from .._numba.rng import uniform

#: the counter of the audit's randomization stream: uniform(seed, prompt, position, AUDIT_STREAM)
AUDIT_STREAM = 0xA0D17


@kernel
def pit_rows(probs, tokens, prompts, positions, seed, eps_lo, eps_hi, u_out, px_out, tail_out, pi_out):
    """Per row r of ``probs`` [n, V] (float64, >= 0) with emitted ``tokens[r]``: the randomized
    probability-ordered PIT ``u = (P(p > p_x) + U * P(p = p_x)) / sum(p)`` (U from the audit stream keyed by
    (seed, prompt, position)), ``p_x / sum(p)``, the tail indicator ``p_x < eps_lo`` and the tail mass
    ``P(p < eps_hi)`` (both relative to the row's sum)."""
    n, v = probs.shape
    for r in range(n):
        x = tokens[r]
        px = probs[r, x]
        total = 0.0
        gt = 0.0
        eq = 0.0
        low = 0.0
        for j in range(v):
            pj = probs[r, j]
            total += pj
            if pj > px:
                gt += pj
            elif pj == px:
                eq += pj
        if total > 0.0:
            thr_hi = eps_hi * total
            for j in range(v):
                pj = probs[r, j]
                if pj < thr_hi:
                    low += pj
            uu = uniform(seed, prompts[r], positions[r], AUDIT_STREAM)
            u = (gt + uu * eq) / total
            if u > 1.0:
                u = 1.0
            u_out[r] = u
            pxn = px / total
            px_out[r] = pxn
            tail_out[r] = pxn < eps_lo
            pi = low / total
            pi_out[r] = pi if pi < 1.0 else 1.0
        else:  # not reachable for validated rows
            u_out[r] = 1.0
            px_out[r] = 0.0
            tail_out[r] = True
            pi_out[r] = 0.0


@kernel
def greedy_rows(logits, tokens, argmax_out, gap_out):
    """Per row: the argmax (lowest index on ties) and ``max - logits[token]`` (float64)."""
    n, v = logits.shape
    for r in range(n):
        best = 0
        m = np.float64(logits[r, 0])
        for j in range(1, v):
            lj = np.float64(logits[r, j])
            if lj > m:
                m = lj
                best = j
        argmax_out[r] = best
        gap_out[r] = m - np.float64(logits[r, tokens[r]])


@kernel
def poisson_binomial_sf(pi, c):
    """P(C >= c) for C = sum of independent Bernoulli(pi[i]): dynamic programming over counts 0..c with the
    state c absorbing (every term a sum of non-negative products: no cancellation, tiny tails keep their
    relative precision)."""
    if c <= 0:
        return 1.0
    dist = np.zeros(c + 1)
    dist[0] = 1.0
    for i in range(pi.shape[0]):
        p = pi[i]
        if p <= 0.0:
            continue
        q = 1.0 - p
        dist[c] = dist[c] + p * dist[c - 1]
        for j in range(c - 1, 0, -1):
            dist[j] = dist[j] * q + dist[j - 1] * p
        dist[0] = dist[0] * q
    return dist[c]


@kernel
def smirnov_sf(n, d):
    """P(D+_n >= d), the exact one-sided Kolmogorov-Smirnov tail (Smirnov 1944; Birnbaum & Tingey 1951):
    ``d * sum_{j=0}^{floor(n(1-d))} C(n, j) (1 - d - j/n)^(n-j) (d + j/n)^(j-1)``, every term positive and
    computed in logarithms."""
    if d <= 0.0:
        return 1.0
    if d >= 1.0:
        return 0.0
    jmax = int(math.floor(n * (1.0 - d) + 1e-12))
    lgn = math.lgamma(n + 1.0)
    # log-sum-exp in one pass with a running maximum
    m = -math.inf
    s = 0.0
    for j in range(jmax + 1):
        a = 1.0 - d - j / n
        if a <= 0.0:
            if j < n:
                continue
        b = d + j / n
        t = lgn - math.lgamma(j + 1.0) - math.lgamma(n - j + 1.0) + (j - 1) * math.log(b)
        if n - j > 0:
            t += (n - j) * math.log(a)
        if t > m:
            s = s * math.exp(m - t) + 1.0
            m = t
        else:
            s += math.exp(t - m)
    if s == 0.0:
        return 0.0
    out = d * s * math.exp(m)
    return out if out < 1.0 else 1.0


@kernel
def score_rows(probs, tokens, floor, top_out, mtop_out, lx_out, ent_out, var_out, bhi_out, blo_out):
    """Per row r of ``probs`` [n, V] (float64, >= 0, positive sum) with emitted ``tokens[r]``, for the audit's
    score tests (probabilities relative to the row's sum, ``f(p) = log max(p, floor)``, the clipped log):

    * ``top_out[r]``: the emitted token has the row's largest probability (any of them on ties);
      ``mtop_out[r]``: the mass of the tokens with the largest probability;
    * ``lx_out[r]``: ``f(p_x)`` (finite, also for p_x = 0: an impossible token, reported by the audit on its
      own); ``ent_out[r]``: ``E f = sum_{p > 0} p f(p)`` (minus the clipped entropy); ``var_out[r]``:
      ``sum p f(p)^2 - (E f)^2`` (>= 0); ``bhi_out[r] = f(max p) - E f`` and ``blo_out[r] = E f - f(min_{p>0} p)``
      (>= 0): the bounds of ``f(p_Y) - E f`` above and below."""
    n, v = probs.shape
    lf = math.log(floor)
    for r in range(n):
        total = 0.0
        pmax = 0.0
        for j in range(v):
            pj = probs[r, j]
            total += pj
            if pj > pmax:
                pmax = pj
        px = probs[r, tokens[r]]
        s1 = 0.0
        s2 = 0.0
        mtop = 0.0
        pmin = pmax
        for j in range(v):
            pj = probs[r, j]
            if pj > 0.0:
                if pj < pmin:
                    pmin = pj
                q = pj / total
                lq = math.log(q) if q > floor else lf
                s1 += q * lq
                s2 += q * lq * lq
                if pj == pmax:
                    mtop += q
        var = s2 - s1 * s1
        top_out[r] = px == pmax
        mtop_out[r] = mtop if mtop < 1.0 else 1.0
        qx = px / total
        lx_out[r] = math.log(qx) if qx > floor else lf
        ent_out[r] = s1
        var_out[r] = var if var > 0.0 else 0.0
        qmax = pmax / total
        qmin = pmin / total
        bhi = (math.log(qmax) if qmax > floor else lf) - s1
        blo = s1 - (math.log(qmin) if qmin > floor else lf)
        bhi_out[r] = bhi if bhi > 0.0 else 0.0
        blo_out[r] = blo if blo > 0.0 else 0.0
