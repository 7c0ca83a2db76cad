"""Output audit: do the tokens an engine emitted follow the target's processed distribution?

Given, for every emitted token, the distribution the target really samples from at that position (float64
probabilities over the vocabulary after temperature / top-k / top-p / min-p, :func:`fastspec.probabilities`) and
the emitted id, the audit tests **same distribution** -- not same text, not a task score -- with statistics whose
null laws are exact or documented below.  Rows are fed in blocks (:class:`OutputAudit`): memory is O(V) per row
plus O(1) per token, never O(tokens x V).

Statistics (sampling, temperature > 0)
--------------------------------------
* **Probability-ordered randomized PIT.**  At position t with distribution p and emitted x,
  ``u = P(p(Y) > p(x)) + U * P(p(Y) = p(x))`` (Y ~ p, U ~ Uniform(0, 1] from fastspec's counter-based generator
  keyed by (seed, prompt, position, audit stream)).  For *any* fixed ordering of the vocabulary, the randomized
  PIT of a draw from p is exactly Uniform(0, 1); conditionally on the past it is uniform whatever the past, so the
  u of one audit are i.i.d. Uniform(0, 1) under exactness, also along autoregressive continuations.  Tested with
  Kolmogorov-Smirnov (two-sided; p-value :func:`ks_pvalue`) and Anderson-Darling (:func:`ad_pvalue`).  Ordering by
  probability puts the tokens a broken verifier over- or under-emits (the argmax, the tail) at the ends of [0, 1].
* **Tail count.**  C = number of emitted tokens with p(x) < epsilon (default 1e-6), against the Poisson-binomial
  law with success probability pi_t = P(p(Y) < epsilon) at each position (upper-tail p-value by exact dynamic
  programming, :func:`poisson_binomial_sf`).  The law is exact when the pi_t are fixed in advance; along one
  autoregressive continuation pi_t depends on the earlier tokens (each indicator is Bernoulli(pi_t) given the
  past): the Poisson-binomial p-value is then the standard approximation, and the calibration tests
  (tests/test_audit.py) check its false-alarm rate.
* **Score tests** (martingale sums with a known conditional mean and variance at every position, so a bias of
  the same sign at every position adds up instead of cancelling in a pooled CDF):

  - *argmax score*: ``C = #{t: p_t(x_t) = max p_t}`` (the emitted token is a most probable one) against
    ``sum_t m_t``, m_t = the mass of p_t's largest probability.  Each indicator is Bernoulli(m_t) given the past.
    Fields ``argmax_count``, ``argmax_expected``, ``argmax_z`` = (C - sum m) / sqrt(sum m (1 - m)),
    ``argmax_normal_p`` (two-sided normal) and ``argmax_p`` (the verdict's, below).
  - *surprisal score*: ``S = sum_t (f(p_t(x_t)) - E_t f)``, f(p) = log max(p, 1e-3) (the log-probability clipped
    at :data:`SURPRISAL_FLOOR`, so every term is bounded and a token of probability 0 -- reported on its own --
    is finite), E_t f = sum_v p_t(v) f(p_t(v)) (minus the clipped entropy), conditional variance
    ``Var_t = sum_v p_t(v) f^2 - (E_t f)^2``.  Fields ``surprisal_score`` (S), ``surprisal_sd``
    (sqrt(sum Var_t)), ``surprisal_z``, ``surprisal_normal_p``, ``surprisal_p``.

  Of the scores f(p_t(x_t)) tried on the broken verifiers of tests/test_audit.py (f = log p, log p clipped,
  p, sqrt p, the argmax indicator, p < 0.01), the argmax indicator has the largest |z| (the biases move mass to
  or from the most probable token); p and sqrt p come close to it and largely repeat it; the clipped
  log-probability is a little weaker there but also weighs over- or under-emitted unlikely tokens, so it is the
  second test.

  Both are two-sided.  Under exactness the terms are martingale differences (mean 0 given the past, whatever the
  past), so z -> N(0, 1) (martingale CLT) and ``*_normal_p`` is reported; a normal tail is not trustworthy at the
  1e-7 level of the verdict (it needs z = o(n^(1/6)), Cramer's moderate deviations, and a few thousand skewed
  terms do not give that), so the verdict uses ``*_p``, a bound valid at any n: the mixture, over the slopes
  l = +-2^(j/2), j = -20..3 (weights 1/48), of the supermartingales ``exp(l S_n - sum_t L_t(l))`` with L_t(l)
  the exact Bernoulli log-mgf (argmax score) or Bennett's bound ``Var_t (e^(l b_t) - 1 - l b_t) / b_t^2``
  (Freedman's inequality; b_t the term's bound on the side of l) for the surprisal score; Ville's inequality
  gives ``P(p <= a) <= a``.  It is conservative: at |z| = 6.2 the normal p-value is about 5e-10, the bound
  2e-7 (measured in tests/test_audit.py); a score test needs |z| of about 6.3 to 6.5 to fail an audit at
  alpha = 1e-6 (a normal test would need 5.3).
* **Per prompt and per position** (index within the continuation): KS and the tail count of each group.

Multiplicity: the verdict's false alarm is at most ``alpha`` (default 1e-6) per audit, by a weighted Bonferroni
rule (valid whatever the dependence between the tests): half of alpha goes to the five pooled tests
(KS, AD, tail count, argmax score, surprisal score: alpha/10 each, :data:`POOLED_TESTS`), the other half is split
evenly over the 2 x (prompts + positions) group tests (KS and tail per group).  Every reported p-value is the
raw one; ``threshold_pooled`` / ``threshold_group`` say what each is compared with.

Greedy (temperature 0): every token must be the target's argmax (lowest index on ties).  A mismatch whose logit
gap (max logit - logit of the emitted token) is at most ``greedy_tolerance`` (default 0.5) is a near-tie,
reported and tolerated; a mismatch beyond it fails the audit.

Numerics: an engine computes p in bf16/fp16/fp32, the audit in float64 from its own forward pass, so the two
differ by rounding.  Tolerances, and why they cannot hide a real bias:

* The tail count is conservative by a logit margin ``tail_tolerance`` (default 0.25 nats): a token counts as a
  tail event only when p(x) < epsilon * exp(-tolerance), while the null mass uses p < epsilon * exp(+tolerance).
  An engine whose log-probabilities differ from the audit's by less than the margin cannot produce false tail
  events; a broken verifier emits tail tokens at a rate set by its bias (probabilities of 1e-9 emitted hundreds
  of times), far beyond a factor exp(0.5).
* The PIT needs no tolerance for validity: under exactness with respect to the audited p its law is exact.  If the
  engine samples from p_e != p, the CDF of each u moves by at most TV(p_e, p) (total variation), so the KS
  statistic moves by at most the mean TV.  bf16 rounding of logits moves p by a few per cent with random signs
  (mean TV ~1e-2 or less, and the signed shifts of the PIT's CDF largely cancel across tokens and positions),
  below the KS distance the audit can detect at its threshold (about ``sqrt(-ln(alpha/20) / (2 n))``: 0.074 at
  n = 1536).  A broken verifier shifts the PIT's law the same way at every position (it over-emits the argmax, or
  the tail): the ones detected at 1536 tokens shift it by more than 0.1; the subtler ones (no residual, an
  unnormalized residual falling back to the argmax) by ~0.03.  Those two also move the argmax and surprisal
  scores the same way at every position (z of 2 to 4.6 at 1536 tokens, growing as sqrt(n)): with the score
  tests the audit catches the unnormalized-to-argmax residual in 8/10 data sets at 6144 tokens and 10/10 at
  12288, no residual in 2/10 at 6144, 8/10 at 12288 and 10/10 at 24576 (tests/test_audit.py states the power).
  A verifier that divides by the draft's raw instead of its processed q is not detected up to 24576 tokens: its
  deviation depends on q, which an output-only audit does not see, and changes sign from position to position.
  bf16 rounding moves the score tests' per-token means with random signs too (|z| < 1.5 at 1536 tokens in the
  tests).  At ~10^4 tokens a systematic engine-side difference of the same order as these biases would be flagged
  as well: audit an engine at the precision it runs, or against teacher forcing at that precision.
"""
from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import asdict, dataclass
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from .errors import InvalidInput, InvalidType, shown

__all__ = ["OutputAudit", "AuditResult", "GroupResult", "audit_output", "ks_pvalue", "ks_statistic",
           "ad_statistic", "ad_pvalue", "poisson_binomial_sf", "argmax_score_pvalue", "surprisal_score_pvalue",
           "TokenRecord", "read_token_file", "check_token_ids",
           "DEFAULT_ALPHA", "DEFAULT_EPSILON", "MAX_TOKEN_FILE_BYTES"]

DEFAULT_ALPHA = 1e-6
DEFAULT_EPSILON = 1e-6
DEFAULT_TAIL_TOLERANCE = 0.25  # nats
DEFAULT_GREEDY_TOLERANCE = 0.5  # logits
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


def _normal_z_p(s: float, v: float) -> tuple[float, float]:
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


# --------------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class GroupResult:
    """The tests of one prompt or one position: ``key`` is its index; ``min_p`` the smaller of its p-values."""

    key: int
    tokens: int
    ks_statistic: float
    ks_p: float
    tail_count: int
    tail_expected: float
    tail_p: float
    min_p: float


@dataclass(frozen=True)
class AuditResult:
    """What :meth:`OutputAudit.result` found.  ``mode``: ``"sampling"`` or ``"greedy"``.  All floats are finite;
    a statistic that does not apply (the PIT under greedy decoding, greedy gaps under sampling) is None."""

    mode: str
    tokens: int
    prompts: int
    positions: int
    seed: int
    epsilon: float
    alpha: float
    tests: int
    threshold_pooled: float
    threshold_group: float
    ks_statistic: float | None
    ks_p: float | None
    ad_statistic: float | None
    ad_p: float | None
    tail_count: int | None
    tail_expected: float | None
    tail_p: float | None
    argmax_count: int | None
    argmax_expected: float | None
    argmax_z: float | None
    argmax_p: float | None
    argmax_normal_p: float | None
    surprisal_score: float | None
    surprisal_sd: float | None
    surprisal_z: float | None
    surprisal_p: float | None
    surprisal_normal_p: float | None
    zero_probability_tokens: int | None
    tail_tolerance: float
    greedy_mismatches: int | None
    greedy_near_ties: int | None
    greedy_max_gap: float | None
    greedy_tolerance: float
    worst_prompt: int | None
    worst_prompt_p: float | None
    worst_position: int | None
    worst_position_p: float | None
    per_prompt_min_p: tuple
    per_position_min_p: tuple
    failed_tests: tuple
    passed: bool
    verdict: str

    def as_dict(self) -> dict:
        out = asdict(self)
        out["per_prompt_min_p"] = list(self.per_prompt_min_p)
        out["per_position_min_p"] = list(self.per_position_min_p)
        out["failed_tests"] = list(self.failed_tests)
        return out


# ------------------------------------------------------------------------------------------------ accumulator
def _float_param(name: str, value, low: float, high: float, *, open_low: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidType(f"{name} = {value!r} must be a number")
    v = float(value)
    ok = math.isfinite(v) and (v > low if open_low else v >= low) and v <= high
    if not ok:
        side = "(" if open_low else "["
        raise InvalidInput(f"{name} = {value!r} is invalid: use a number in {side}{low:g}, {high:g}]")
    return v


def _index_array(name: str, value, n: int) -> np.ndarray:
    a = np.asarray(value)
    if a.ndim == 0:
        a = np.full(n, a)
    if a.shape != (n,):
        raise InvalidInput(f"{name} must be an integer or have shape [{n}], got shape {list(a.shape)}")
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise InvalidType(f"{name} must hold integers, got dtype {a.dtype}")
    if n and (a.min() < 0 or a.max() >= 2 ** 62):
        i = int(np.argmax((a < 0) | (a >= 2 ** 62)))
        raise InvalidInput(f"{name}[{i}] = {int(a[i])} must be a non-negative integer below 2**62")
    return np.ascontiguousarray(a, dtype=np.int64)


class OutputAudit:
    """Accumulates emitted tokens and their target distributions, block by block; :meth:`result` tests them.

    ``OutputAudit(temperature=0.7)`` (sampling) takes blocks with :meth:`add_probs` (processed probabilities, as
    :func:`fastspec.probabilities` returns them) or :meth:`add_logits` (raw logits, processed here with the
    sampling parameters); ``temperature=0`` audits greedy decoding and takes :meth:`add_logits` only.  Memory:
    a few numbers per token; each block is read once.

    seed: keys the PIT's randomization (same seed, same result).  epsilon: the tail threshold.  alpha: the
    audit's false-alarm probability.  tail_tolerance (nats) and greedy_tolerance (logits): the numerical
    margins of the module docstring."""

    def __init__(self, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, epsilon=DEFAULT_EPSILON,
                 alpha=DEFAULT_ALPHA, tail_tolerance=DEFAULT_TAIL_TOLERANCE,
                 greedy_tolerance=DEFAULT_GREEDY_TOLERANCE):
        from ._numba.rng import seed_bits
        from .params import SamplingParams

        self.params = SamplingParams(temperature, top_k, top_p, min_p)
        self.seed = int(seed)
        self._seed_bits = seed_bits(seed)
        self.epsilon = _float_param("epsilon", epsilon, 0.0, 1.0)
        self.alpha = _float_param("alpha", alpha, 0.0, 0.5)
        self.tail_tolerance = _float_param("tail_tolerance", tail_tolerance, 0.0, 10.0, open_low=False)
        self.greedy_tolerance = _float_param("greedy_tolerance", greedy_tolerance, 0.0, 1e6, open_low=False)
        self.greedy = self.params.temperature == 0
        self._prompt: list[np.ndarray] = []
        self._pos: list[np.ndarray] = []
        self._u: list[np.ndarray] = []
        self._tail: list[np.ndarray] = []
        self._pi: list[np.ndarray] = []
        self._px: list[np.ndarray] = []
        self._top: list[np.ndarray] = []  # per token: the score tests' terms (module docstring)
        self._mtop: list[np.ndarray] = []
        self._lx: list[np.ndarray] = []
        self._ent: list[np.ndarray] = []
        self._var: list[np.ndarray] = []
        self._bhi: list[np.ndarray] = []
        self._blo: list[np.ndarray] = []
        self._gap: list[np.ndarray] = []
        self._match: list[np.ndarray] = []
        self.vocab_size: int | None = None

    @property
    def tokens(self) -> int:
        return int(sum(a.size for a in self._prompt))

    def _check_block(self, name: str, rows: np.ndarray, tokens, prompt, positions):
        if rows.ndim != 2:
            raise InvalidInput(f"{name} must be [tokens, V] (one row per emitted token), got shape {list(rows.shape)}")
        n, v = rows.shape
        if v == 0:
            raise InvalidInput(f"{name} has an empty vocabulary (V = 0)")
        if self.vocab_size is None:
            self.vocab_size = v
        elif v != self.vocab_size:
            raise InvalidInput(f"{name} has V = {v}, earlier blocks had V = {self.vocab_size}")
        toks = np.asarray(tokens)
        if toks.shape != (n,):
            raise InvalidInput(f"tokens must have shape [{n}] (one per row of {name}), got {list(toks.shape)}")
        if toks.dtype == bool or not np.issubdtype(toks.dtype, np.integer):
            raise InvalidType(f"tokens must hold integer ids, got dtype {toks.dtype}")
        bad = (toks < 0) | (toks >= v)
        if bad.any():
            i = int(np.argmax(bad))
            raise InvalidInput(f"tokens[{i}] = {int(toks[i])} is outside the vocabulary [0, {v})")
        return (np.ascontiguousarray(toks, dtype=np.int64), _index_array("prompt", prompt, n),
                _index_array("positions", positions, n))

    def add_probs(self, prompt, positions, probs, tokens) -> None:
        """Add ``tokens[i]`` emitted at ``positions[i]`` of prompt ``prompt`` (an int, or one per row) from the
        processed distribution ``probs[i]`` (float [n, V], non-negative, each row with a positive sum)."""
        from ._kernels.pit import pit_rows, score_rows

        if self.greedy:
            raise InvalidInput("probs of a greedy (temperature 0) audit are one-hot and carry no gap: pass logits "
                               "with add_logits")
        p = np.asarray(probs)
        if p.dtype == bool or not np.issubdtype(p.dtype, np.floating):
            raise InvalidType(f"probs must be floating point, got dtype {p.dtype}")
        toks, pr, pos = self._check_block("probs", p, tokens, prompt, positions)
        p = np.ascontiguousarray(p, dtype=np.float64)
        finite = np.isfinite(p).all(axis=1)
        if not finite.all():
            raise InvalidInput(f"probs[{int(np.argmin(finite))}] holds NaN or infinity")
        neg = (p < 0).any(axis=1)
        if neg.any():
            raise InvalidInput(f"probs[{int(np.argmax(neg))}] holds a negative probability")
        sums = p.sum(axis=1)
        if (sums <= 0).any():
            raise InvalidInput(f"probs[{int(np.argmax(sums <= 0))}] sums to 0")
        n = toks.size
        u, px, pi = np.empty(n), np.empty(n), np.empty(n)
        tail = np.empty(n, np.bool_)
        lo = self.epsilon * math.exp(-self.tail_tolerance)
        hi = min(1.0, self.epsilon * math.exp(self.tail_tolerance))
        pit_rows(p, toks, pr, pos, np.int64(self._seed_bits), lo, hi, u, px, tail, pi)
        top = np.empty(n, np.bool_)
        mtop, lx, ent, var, bhi, blo = (np.empty(n) for _ in range(6))
        score_rows(p, toks, SURPRISAL_FLOOR, top, mtop, lx, ent, var, bhi, blo)
        for store, a in ((self._top, top), (self._mtop, mtop), (self._lx, lx), (self._ent, ent), (self._var, var),
                         (self._bhi, bhi), (self._blo, blo)):
            store.append(a)
        self._prompt.append(pr)
        self._pos.append(pos)
        self._u.append(u)
        self._px.append(px)
        self._tail.append(tail)
        self._pi.append(pi)

    def add_logits(self, prompt, positions, logits, tokens, *, chunk_rows: int = 256) -> None:
        """Like :meth:`add_probs` from raw logits [n, V] (float16/32/64), processed with the audit's sampling
        parameters (:func:`fastspec.probabilities`) ``chunk_rows`` rows at a time; greedy audits compare each
        token with the argmax."""
        from ._kernels.pit import greedy_rows
        from .processing import probabilities, validate_logits

        lg = validate_logits("logits", logits, 2)
        toks, pr, pos = self._check_block("logits", lg, tokens, prompt, positions)
        n = toks.size
        if self.greedy:
            am, gap = np.empty(n, np.int64), np.empty(n)
            if n:
                greedy_rows(lg if lg.dtype != np.float16 else lg.astype(np.float32), toks, am, gap)
            self._prompt.append(pr)
            self._pos.append(pos)
            self._gap.append(gap)
            self._match.append(am == toks)
            return
        for s in range(0, n, max(1, int(chunk_rows))):
            e = min(n, s + max(1, int(chunk_rows)))
            p = probabilities(lg[s:e], **self.params.as_dict())
            self.add_probs(pr[s:e], pos[s:e], p, toks[s:e])

    # ------------------------------------------------------------------------------------------------ result
    def result(self) -> AuditResult:
        """The tests over everything added so far (InvalidInput when nothing was added)."""
        n = self.tokens
        if n == 0:
            raise InvalidInput("the audit holds no tokens: add emitted tokens with add_probs or add_logits first")
        prompt = np.concatenate(self._prompt)
        pos = np.concatenate(self._pos)
        prompts = np.unique(prompt)
        positions = np.unique(pos)
        groups = len(prompts) + len(positions)
        if self.greedy:
            return self._greedy_result(prompt, pos, prompts, positions)
        u = np.concatenate(self._u)
        tail = np.concatenate(self._tail)
        pi = np.concatenate(self._pi)
        px = np.concatenate(self._px)
        tests = POOLED_TESTS + 2 * groups
        t_pool = self.alpha / (2.0 * POOLED_TESTS)
        t_group = self.alpha / (2.0 * 2 * groups)
        d = ks_statistic(u)
        ks_p = ks_pvalue(n, d)
        a2 = ad_statistic(u)
        ad_p = ad_pvalue(n, a2)
        c = int(tail.sum())
        tail_p = poisson_binomial_sf(pi, c)
        top = np.concatenate(self._top)
        mtop = np.concatenate(self._mtop)
        top_c = int(top.sum())
        top_e = float(mtop.sum())
        top_z, top_np = _normal_z_p(top_c - top_e, float(np.sum(mtop * (1.0 - mtop))))
        top_p = argmax_score_pvalue(top, mtop)
        lx = np.concatenate(self._lx)
        ent = np.concatenate(self._ent)
        var = np.concatenate(self._var)
        sur = float(np.sum(lx - ent))
        sur_sd = math.sqrt(float(var.sum()))
        sur_z, sur_np = _normal_z_p(sur, sur_sd * sur_sd)
        sur_p = surprisal_score_pvalue(lx - ent, var, np.concatenate(self._bhi), np.concatenate(self._blo))

        def group(keys, key):
            m = keys == key
            gu = u[m]
            gd = ks_statistic(gu)
            gk = ks_pvalue(gu.size, gd)
            gc = int(tail[m].sum())
            gt = poisson_binomial_sf(pi[m], gc)
            return GroupResult(int(key), int(gu.size), gd, gk, gc, float(pi[m].sum()), gt, min(gk, gt))

        by_prompt = [group(prompt, k) for k in prompts]
        by_pos = [group(pos, k) for k in positions]
        failed = []
        for name, p in (("pooled KS", ks_p), ("pooled AD", ad_p), ("pooled tail count", tail_p),
                        ("pooled argmax score", top_p), ("pooled surprisal score", sur_p)):
            if p < t_pool:
                failed.append(name)
        for label, gs in (("prompt", by_prompt), ("position", by_pos)):
            for g in gs:
                if g.ks_p < t_group:
                    failed.append(f"{label} {g.key} KS")
                if g.tail_p < t_group:
                    failed.append(f"{label} {g.key} tail count")
        wp = min(by_prompt, key=lambda g: g.min_p)
        wq = min(by_pos, key=lambda g: g.min_p)
        passed = not failed
        zero = int((px <= 0).sum())
        what = (f"{n} emitted tokens ({len(prompts)} prompts) tested for the same distribution as the target's "
                f"processed one")
        stats = (f"PIT KS p = {ks_p:.3g}, AD p = {ad_p:.3g}, {c} tokens with p < {self.epsilon:g} where "
                 f"{float(pi.sum()):.3g} are expected (p = {tail_p:.3g}), {top_c} argmax tokens where "
                 f"{top_e:.1f} are expected (p = {top_p:.3g}), surprisal score z = {sur_z:.2f} (p = {sur_p:.3g})")
        if passed:
            verdict = (f"passed: {what}; no test rejects it at a false-alarm rate of {self.alpha:g} per audit "
                       f"({stats}).")
        else:
            verdict = (f"FAILED: {what}; they do not follow it ({', '.join(failed[:3])}"
                       f"{' and more' if len(failed) > 3 else ''} below the threshold of a {self.alpha:g} false "
                       f"alarm per audit; {stats}).")
        return AuditResult(
            mode="sampling", tokens=n, prompts=len(prompts), positions=len(positions), seed=self.seed,
            epsilon=self.epsilon, alpha=self.alpha, tests=tests, threshold_pooled=t_pool, threshold_group=t_group,
            ks_statistic=d, ks_p=ks_p, ad_statistic=a2, ad_p=ad_p, tail_count=c, tail_expected=float(pi.sum()),
            tail_p=tail_p, argmax_count=top_c, argmax_expected=top_e, argmax_z=top_z, argmax_p=top_p,
            argmax_normal_p=top_np, surprisal_score=sur, surprisal_sd=sur_sd, surprisal_z=sur_z, surprisal_p=sur_p,
            surprisal_normal_p=sur_np, zero_probability_tokens=zero, tail_tolerance=self.tail_tolerance,
            greedy_mismatches=None, greedy_near_ties=None, greedy_max_gap=None,
            greedy_tolerance=self.greedy_tolerance, worst_prompt=wp.key, worst_prompt_p=wp.min_p,
            worst_position=wq.key, worst_position_p=wq.min_p,
            per_prompt_min_p=tuple(g.min_p for g in by_prompt), per_position_min_p=tuple(g.min_p for g in by_pos),
            failed_tests=tuple(failed), passed=passed, verdict=verdict)

    def _greedy_result(self, prompt, pos, prompts, positions) -> AuditResult:
        n = prompt.size
        gap = np.concatenate(self._gap)
        match = np.concatenate(self._match)
        miss = ~match
        mism = int(miss.sum())
        near = int((miss & (gap <= self.greedy_tolerance)).sum())
        beyond = mism - near
        max_gap = float(gap[miss].max()) if mism else 0.0
        max_gap = max_gap if math.isfinite(max_gap) else 1e308

        def worst(keys, uniq):
            if not mism:
                return None, None
            counts = [(int((miss & (keys == k) & (gap > self.greedy_tolerance)).sum()), int(k)) for k in uniq]
            cnt, key = max(counts)
            return (key, 0.0 if cnt else 1.0) if cnt else (None, None)

        wp, wpp = worst(prompt, prompts)
        wq, wqp = worst(pos, positions)
        per_prompt = tuple(0.0 if (miss & (prompt == k) & (gap > self.greedy_tolerance)).any() else 1.0
                           for k in prompts)
        per_pos = tuple(0.0 if (miss & (pos == k) & (gap > self.greedy_tolerance)).any() else 1.0 for k in positions)
        passed = beyond == 0
        if passed:
            verdict = (f"passed: all {n} emitted tokens ({len(prompts)} prompts) are the target's greedy (argmax) "
                       f"tokens, {near} of them near-ties within {self.greedy_tolerance:g} logits (greedy decoding: "
                       "same tokens tested).")
        else:
            verdict = (f"FAILED: {beyond} of {n} emitted tokens ({len(prompts)} prompts) are not the target's greedy "
                       f"(argmax) token by more than {self.greedy_tolerance:g} logits (largest gap {max_gap:.3g}); "
                       "greedy decoding must emit the argmax.")
        return AuditResult(
            mode="greedy", tokens=n, prompts=len(prompts), positions=len(positions), seed=self.seed,
            epsilon=self.epsilon, alpha=self.alpha, tests=1, threshold_pooled=0.0, threshold_group=0.0,
            ks_statistic=None, ks_p=None, ad_statistic=None, ad_p=None, tail_count=None, tail_expected=None,
            tail_p=None, argmax_count=None, argmax_expected=None, argmax_z=None, argmax_p=None,
            argmax_normal_p=None, surprisal_score=None, surprisal_sd=None, surprisal_z=None, surprisal_p=None,
            surprisal_normal_p=None, zero_probability_tokens=None, tail_tolerance=self.tail_tolerance,
            greedy_mismatches=mism,
            greedy_near_ties=near, greedy_max_gap=max_gap, greedy_tolerance=self.greedy_tolerance, worst_prompt=wp,
            worst_prompt_p=wpp, worst_position=wq, worst_position_p=wqp, per_prompt_min_p=per_prompt,
            per_position_min_p=per_pos, failed_tests=() if passed else ("greedy argmax",), passed=passed,
            verdict=verdict)


def audit_output(blocks: Iterable, **options) -> AuditResult:
    """Audit an iterator of blocks ``(prompt, positions, probs, tokens)`` (``probs`` processed, float [n, V]) --
    or of ``(prompt, positions, logits, tokens, "logits")`` for raw logits -- with :class:`OutputAudit`'s
    ``options`` (temperature, top_k, top_p, min_p, seed, epsilon, alpha, tail_tolerance, greedy_tolerance)."""
    audit = OutputAudit(**options)
    for i, block in enumerate(blocks):
        if not isinstance(block, tuple) or len(block) not in (4, 5):
            raise InvalidInput(f"blocks[{i}] must be a tuple (prompt, positions, probs, tokens) or (prompt, "
                               "positions, logits, tokens, 'logits')")
        if len(block) == 5:
            if block[4] != "logits":
                raise InvalidInput(f"blocks[{i}][4] must be 'logits', got {block[4]!r}")
            audit.add_logits(*block[:4])
        else:
            audit.add_probs(*block)
    return audit.result()


# ------------------------------------------------------------------------------------------------- token files
#: a token file larger than this is refused before it is read (256 MiB: ~30 million ids)
MAX_TOKEN_FILE_BYTES = 256 * 2 ** 20
#: at most this many ids in one list of a token file (fastspec.config's MAX_NEW_TOKENS)
MAX_IDS_PER_LIST = 1 << 20


class TokenRecord(NamedTuple):
    """One line of a token file: its 1-based line number, the prompt's ids, the emitted ids, the prompt text."""

    line: int
    prompt_token_ids: tuple
    token_ids: tuple
    prompt: str | None


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _id_list(path: str, line_no: int, obj: dict, field: str) -> tuple:
    if field not in obj:
        raise InvalidInput(f"{path}:{line_no}: missing field {field!r} (each line: {{\"prompt_token_ids\": [...], "
                           "\"token_ids\": [...]}})")
    ids = obj[field]
    if not isinstance(ids, list):
        raise InvalidInput(f"{path}:{line_no}: {field} must be a list of integer token ids, got "
                           f"{type(ids).__name__}")
    if len(ids) > MAX_IDS_PER_LIST:
        raise InvalidInput(f"{path}:{line_no}: {field} holds {len(ids)} ids, more than {MAX_IDS_PER_LIST}")
    for j, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int):
            raise InvalidInput(f"{path}:{line_no}: {field}[{j}] = {shown(t)} is not an integer token id")
        if t < 0:
            raise InvalidInput(f"{path}:{line_no}: {field}[{j}] = {t} is negative: token ids lie in [0, V)")
    return tuple(ids)


def read_token_file(path, *, max_bytes: int | None = None) -> list[TokenRecord]:
    """The records of a token file: JSONL, one object per prompt, ``{"prompt_token_ids": [ints], "token_ids":
    [ints], "prompt": "text" (optional)}`` (vLLM's field names; other fields are ignored).

    Refused with InvalidInput naming the file, the line and the index: not a regular file, larger than
    ``max_bytes``, not UTF-8, an empty line, a line that is not a JSON object (NaN and Infinity are not JSON), a
    missing field, a non-integer or negative id, an empty ``prompt_token_ids`` or ``token_ids``, no lines at all.
    Ids at or above the vocabulary size are checked by :func:`check_token_ids` once V is known.  ``max_bytes``
    defaults to :data:`MAX_TOKEN_FILE_BYTES`."""
    path = os.fspath(path)
    if max_bytes is None:
        max_bytes = MAX_TOKEN_FILE_BYTES
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InvalidInput(f"token file {path!r}: no such file") from None
    except OSError as exc:
        raise InvalidInput(f"token file {path!r}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"token file {path!r} is not a regular file")
    if st.st_size > max_bytes:
        raise InvalidInput(f"token file {path!r} is {st.st_size} bytes, more than the {max_bytes} bytes an audit "
                           "reads; split it")
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InvalidInput(f"token file {path!r} is more than the {max_bytes} bytes an audit reads; split it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"token file {path!r} is not UTF-8 text (byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise InvalidInput(f"token file {path!r} is empty: write one JSON object per prompt")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            raise InvalidInput(f"{path}:{i}: empty line (one JSON object per prompt, no blank lines)")
        try:
            obj = json.loads(line, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else " ".join(str(exc).split())[:80]
            raise InvalidInput(f"{path}:{i}: not valid JSON ({msg})") from None
        if not isinstance(obj, dict):
            raise InvalidInput(f"{path}:{i}: expected a JSON object with prompt_token_ids and token_ids, got "
                               f"{type(obj).__name__}")
        prompt_ids = _id_list(path, i, obj, "prompt_token_ids")
        token_ids = _id_list(path, i, obj, "token_ids")
        if not prompt_ids:
            raise InvalidInput(f"{path}:{i}: prompt_token_ids is empty (the first emitted token needs a context)")
        if not token_ids:
            raise InvalidInput(f"{path}:{i}: token_ids is empty (nothing was emitted for this prompt)")
        prompt = obj.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise InvalidInput(f"{path}:{i}: prompt must be a string, got {type(prompt).__name__}")
        out.append(TokenRecord(i, prompt_ids, token_ids, prompt))
    return out


def check_token_ids(records: Sequence[TokenRecord], vocab_size: int, name: str = "token file") -> None:
    """Every id of every record lies in [0, vocab_size): else InvalidInput naming the line, the field and the
    index."""
    for r in records:
        for field in ("prompt_token_ids", "token_ids"):
            ids = getattr(r, field)
            if not ids:
                continue
            if min(ids) < 0 or max(ids) >= vocab_size:
                j = next(j for j, t in enumerate(ids) if not 0 <= t < vocab_size)
                raise InvalidInput(f"{name} line {r.line}: {field}[{j}] = {shown(ids[j])} is outside the target's "
                                   f"vocabulary [0, {vocab_size})")
