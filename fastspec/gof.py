"""Goodness-of-fit null laws for the output audit (:mod:`fastspec.audit`): Kolmogorov-Smirnov and Anderson-Darling
statistics of uniforms with their p-values, the Poisson-binomial upper tail, and the score tests' any-n p-value
bounds (a fixed mixture of exponential supermartingales and Ville's inequality).  Pure NumPy and Numba (the
kernels in :mod:`fastspec._kernels.pit`); no SciPy.  The derivations and accuracies are in :mod:`fastspec.audit`'s
docstring; the tests check every p-value against SciPy or simulation."""
from __future__ import annotations

import math

import numpy as np


__all__ = ["ks_statistic", "ks_pvalue", "ad_statistic", "ad_pvalue", "poisson_binomial_sf", "argmax_score_pvalue",
           "surprisal_score_pvalue", "KS_EXACT_MAX_N", "PB_DP_MAX_WORK", "POOLED_TESTS", "SCORE_LAMBDAS",
           "SURPRISAL_FLOOR", "AD_TAIL_FROM", "normal_z_p"]

#: pooled KS p-values are exact (Marsaglia-Tsang-Wang) up to this many tokens, beyond it the Kolmogorov limit
KS_EXACT_MAX_N = 4000
#: a Poisson-binomial DP beyond this many (tokens x count) operations uses the Chernoff bound (conservative)
PB_DP_MAX_WORK = 200_000_000


# ----------------------------------------------------------------------------------------------------------- KS
def ks_statistic(u) -> float:
    """Two-sided Kolmogorov-Smirnov distance of the sample ``u`` from Uniform(0, 1)."""
    x = np.sort(np.asarray(u, dtype=np.float64))
    n = x.size
    if n == 0:
        return 0.0
    i = np.arange(1, n + 1, dtype=np.float64)
    return float(max(np.max(i / n - x), np.max(x - (i - 1) / n), 0.0))


def _mtw_cdf(n: int, d: float) -> float:
    """P(D_n < d) exactly (Marsaglia, Tsang & Wang 2003, "Evaluating Kolmogorov's distribution", the matrix
    power; scaling tracked in a separate exponent so nothing overflows)."""
    k = int(n * d) + 1
    m = 2 * k - 1
    h = k - n * d
    i = np.arange(m)
    H = (i[:, None] - i[None, :] + 1 >= 0).astype(np.float64)
    H[:, 0] -= h ** (i + 1.0)
    H[m - 1, :] -= h ** (m - i.astype(np.float64))
    if 2 * h - 1 > 0:
        H[m - 1, 0] += (2 * h - 1) ** m
    diff = i[:, None] - i[None, :] + 1
    fact = np.array([math.lgamma(v + 1.0) if v > 0 else 0.0 for v in range(m + 1)])
    H = H * np.exp(-fact[np.clip(diff, 0, m)])
    # H^n by squaring, log2 scale in `e`
    result, e_res = None, 0
    base, e_base = H, 0
    p = n
    while p:
        if p & 1:
            if result is None:
                result, e_res = base.copy(), e_base
            else:
                result = result @ base
                e_res += e_base
                s = np.max(np.abs(result))
                if s > 1e140 or (0 < s < 1e-140):
                    f = math.frexp(s)[1]
                    result = np.ldexp(result, -f)
                    e_res += f
        p >>= 1
        if p:
            base = base @ base
            e_base *= 2
            s = np.max(np.abs(base))
            if s > 1e140 or (0 < s < 1e-140):
                f = math.frexp(s)[1]
                base = np.ldexp(base, -f)
                e_base += f
    s = float(result[k - 1, k - 1])
    if s <= 0.0:
        return 0.0
    # times n! / n^n
    log = math.log(s) + e_res * math.log(2.0) + math.lgamma(n + 1.0) - n * math.log(n)
    return min(1.0, math.exp(log))


def _kolmogorov_sf(lam: float) -> float:
    """P(K > lam) for Kolmogorov's limit law: 2 sum (-1)^(j-1) exp(-2 j^2 lam^2)."""
    if lam <= 0.2:
        return 1.0
    s = 0.0
    for j in range(1, 101):
        t = math.exp(-2.0 * j * j * lam * lam)
        s += t if j % 2 else -t
        if t < 1e-300:
            break
    return min(1.0, max(0.0, 2.0 * s))


def ks_pvalue(n: int, d: float) -> float:
    """P(D_n >= d) for the two-sided KS distance of n i.i.d. uniforms.

    * When twice the exact one-sided tail (:func:`fastspec._kernels.pit.smirnov_sf`, Smirnov / Birnbaum-Tingey)
      is <= 1e-3, it is returned: the two-sided tail lies in [2 P+ - P+^2, 2 P+], a relative error below 1e-3,
      never below the truth (as scipy's ``kstwo`` does in its tail, Simard & L'Ecuyer 2011).
    * Otherwise, for n <= 4000 (:data:`KS_EXACT_MAX_N`), the exact distribution (Marsaglia, Tsang & Wang 2003).
    * Otherwise Kolmogorov's limit at ``d (sqrt(n) + 0.12 + 0.11 / sqrt(n))`` (Stephens 1970): absolute error
      below 3e-3 for n > 4000 (2e-3 measured against scipy.stats.kstwo at n = 5000).
    """
    from ._kernels.pit import smirnov_sf

    if n <= 0 or d <= 0.0:
        return 1.0
    if d >= 1.0:
        return 0.0
    two = 2.0 * float(smirnov_sf(n, float(d)))
    if two <= 1e-3:
        return max(two, 0.0)
    if n <= KS_EXACT_MAX_N:
        return min(1.0, max(0.0, 1.0 - _mtw_cdf(n, float(d))))
    sq = math.sqrt(n)
    return _kolmogorov_sf(d * (sq + 0.12 + 0.11 / sq))


# ----------------------------------------------------------------------------------------------------------- AD
def ad_statistic(u) -> float:
    """Anderson-Darling A^2 of ``u`` against Uniform(0, 1) (values clipped to [2^-53, 1 - 2^-53])."""
    x = np.sort(np.clip(np.asarray(u, dtype=np.float64), 2.0 ** -53, 1.0 - 2.0 ** -53))
    n = x.size
    if n == 0:
        return 0.0
    i = np.arange(1, n + 1, dtype=np.float64)
    s = np.sum((2 * i - 1) * (np.log(x) + np.log1p(-x[::-1])))
    return float(max(-n - s / n, 0.0))


def _adinf_cdf(z: float) -> float:
    """Marsaglia & Marsaglia (2004), "Evaluating the Anderson-Darling distribution": ADinf."""
    if z <= 0.0:
        return 0.0
    if z < 2.0:
        return (math.exp(-1.2337141 / z) / math.sqrt(z)
                * (2.00012 + (.247105 - (.0649821 - (.0347962 - (.011672 - .00168691 * z) * z) * z) * z) * z))
    return math.exp(-math.exp(1.0776 - (2.30695 - (.43424 - (.082433 - (.008056 - .0003146 * z) * z) * z) * z) * z))


def _ad_errfix(n: int, x: float) -> float:
    """Marsaglia & Marsaglia (2004): the finite-n correction errfix(n, x) of the CDF value x = ADinf(z)."""
    if x > .8:
        return (-130.2137 + (745.2337 - (1705.091 - (1950.646 - (1116.360 - 255.7844 * x) * x) * x) * x) * x) / n
    c = .01265 + .1757 / n
    if x < c:
        t = x / c
        t = math.sqrt(t) * (1. - t) * (49 * t - 102)
        return t * (.0037 / (n * n) + .00078 / n + .00006) / n
    t = (x - c) / (.8 - c)
    t = -.00022633 + (6.54034 - (14.6538 - (14.458 - (8.259 - 1.91864 * t) * t) * t) * t) * t
    return t * (.04213 / n + .01365 / (n * n)) / n


#: above this A^2 the upper tail is the asymptote sqrt(3) erfc(sqrt(A^2)) (1 + 11 / (36 A^2))
AD_TAIL_FROM = 6.0


def ad_pvalue(n: int, a2: float) -> float:
    """P(A^2_n >= a2) for n i.i.d. uniforms.

    Below A^2 = 6 (p > 1e-3): Marsaglia & Marsaglia (2004), ADinf plus their finite-n correction errfix (absolute
    error < 2e-6 in the CDF for n >= 5).  Their ADinf polynomial is fitted for the CDF, not the far tail (at A^2 =
    12 it is 85x too small), so from A^2 = 6 on the upper tail is the exact leading asymptote of
    A^2 = sum_j chi2_j / (j (j + 1)): the largest weight 1/2 gives P(chi2_1 > 2 A^2) = erfc(sqrt(A^2)), times
    prod_{j >= 2} (1 - 2 / (j (j + 1)))^(-1/2) = sqrt(3), times (1 + 11 / (36 A^2)), the first-order correction
    (the tilted mean 11/18 of the other terms); it agrees with ADinf within 1% on 6 <= A^2 <= 8.  The finite-n
    correction, O(1/n) and shrinking in the tail, is not applied there."""
    if n <= 0 or a2 <= 0.0:
        return 1.0
    if a2 >= AD_TAIL_FROM:
        return min(1.0, math.sqrt(3.0) * math.erfc(math.sqrt(a2)) * (1.0 + 11.0 / (36.0 * a2)))
    x = _adinf_cdf(a2)
    cdf = x + _ad_errfix(n, x)
    return min(1.0, max(0.0, 1.0 - cdf))


# ------------------------------------------------------------------------------------------------- tail count
def poisson_binomial_sf(pi, count: int) -> float:
    """P(C >= count), C a sum of independent Bernoulli(pi[i]): exact DP (no cancellation); when the DP would cost
    more than :data:`PB_DP_MAX_WORK` operations, the Chernoff bound
    ``exp(-(count * log(count / mu) - count + mu))`` at mu = sum(pi) (a valid upper bound, so conservative)."""
    from ._kernels.pit import poisson_binomial_sf as _sf

    pi = np.ascontiguousarray(np.clip(np.asarray(pi, dtype=np.float64), 0.0, 1.0))
    count = int(count)
    if count <= 0:
        return 1.0
    if count > pi.size:
        return 0.0
    if pi.size * (count + 1) <= PB_DP_MAX_WORK:
        return float(min(1.0, max(0.0, _sf(pi, count))))
    mu = float(pi.sum())
    if count <= mu:
        return 1.0
    if mu <= 0.0:
        return 0.0
    # Chernoff (Poisson-dominated mgf: prod(1 + p (e^l - 1)) <= exp(mu (e^l - 1)))
    return float(min(1.0, math.exp(-(count * math.log(count / mu) - count + mu))))


# ------------------------------------------------------------------------------------------------ score tests
#: the pooled tests: KS, AD, tail count, argmax score, surprisal score (each gets alpha / (2 * POOLED_TESTS))
POOLED_TESTS = 5
#: the mixture's slopes: +-2^(j/2), j = -20..3 (1e-3 .. 2.8), each with weight 1 / 48
SCORE_LAMBDAS = 2.0 ** (np.arange(-20, 4) / 2.0)
#: the surprisal score's log is clipped below at log(SURPRISAL_FLOOR): bounded terms, a tight Bennett bound
SURPRISAL_FLOOR = 1e-3


def normal_z_p(s: float, v: float) -> tuple[float, float]:
    """z = s / sqrt(v) and its two-sided normal p-value (z = 0, p = 1 when v = 0)."""
    if not v > 0.0:
        return 0.0, 1.0
    z = s / math.sqrt(v)
    return float(z), float(min(1.0, math.erfc(abs(z) / math.sqrt(2.0))))


def _mixture_pvalue(s: float, log_mgf) -> float:
    """``1 / sum_k w_k exp(l_k s - L(l_k))`` over the slopes l_k = +-:data:`SCORE_LAMBDAS` (w_k = 1 / 48), where
    ``L(l)`` (``log_mgf``) bounds the summed conditional log moment generating functions of the terms: each
    ``exp(l S_t - L_t(l))`` is a non-negative supermartingale of mean <= 1, so is their mixture, and Ville's
    (Markov's) inequality makes the result a valid p-value at any number of tokens, whatever the dependence of
    each position's distribution on the earlier tokens."""
    lams = np.concatenate([SCORE_LAMBDAS, -SCORE_LAMBDAS])
    with np.errstate(over="ignore", invalid="ignore"):
        logm = np.array([lam * s - log_mgf(float(lam)) for lam in lams])
    logm = np.where(np.isnan(logm), -np.inf, logm)
    top = float(np.max(logm))
    if top == -math.inf:
        return 1.0
    log_mix = top + math.log(float(np.sum(np.exp(logm - top)))) - math.log(lams.size)
    return float(min(1.0, math.exp(-log_mix))) if log_mix > -700 else 1.0


def argmax_score_pvalue(top, mtop) -> float:
    """Two-sided p-value of the argmax count ``C = sum_t top_t`` (top_t: the token emitted at t has the largest
    probability of p_t) against its conditional means ``m_t`` (the mass of p_t's largest probability): the
    mixture martingale of :func:`_mixture_pvalue` with the exact Bernoulli log-mgf
    ``log(1 + m_t (e^l - 1)) - l m_t`` of each term -- a Chernoff bound valid at any n, never below the truth."""
    top = np.asarray(top, dtype=np.float64)
    m = np.clip(np.asarray(mtop, dtype=np.float64), 0.0, 1.0)
    s = float(np.sum(top - m))
    return _mixture_pvalue(s, lambda lam: float(np.sum(np.log1p(m * math.expm1(lam)) - lam * m)))


def surprisal_score_pvalue(x, var, bhi, blo) -> float:
    """Two-sided p-value of the surprisal (log-probability) score ``S = sum_t x_t``, ``x_t = log p_t(x_t) +
    H(p_t)`` (mean 0, conditional variance ``var_t``, ``-blo_t <= x_t <= bhi_t``): the mixture martingale of
    :func:`_mixture_pvalue` with Bennett's (Freedman's) bound of each term's log-mgf, ``var_t psi(l b_t) / b_t^2``,
    ``psi(y) = e^y - 1 - y``, b_t = bhi_t for l > 0 and blo_t for l < 0 -- valid at any n."""
    x = np.asarray(x, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    bhi = np.asarray(bhi, dtype=np.float64)
    blo = np.asarray(blo, dtype=np.float64)
    s = float(np.sum(x))

    def log_mgf(lam: float) -> float:
        b = bhi if lam > 0 else blo
        y = abs(lam) * b
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            f = np.where(b > 1e-6, (np.expm1(y) - y) / (b * b), 0.5 * lam * lam * (1.0 + y))
            return float(np.sum(np.where(var > 0.0, var * f, 0.0)))

    return _mixture_pvalue(s, log_mgf)
