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
The page that explains it: ``docs/design/audit-statistics.md``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable

import numpy as np

from .errors import InvalidInput, InvalidType, about, config_or_settings
from .gof import (POOLED_TESTS, SURPRISAL_FLOOR, ad_pvalue, ad_statistic, argmax_score_pvalue, ks_pvalue,
                  ks_statistic, normal_z_p, poisson_binomial_sf, surprisal_score_pvalue)
from .io.tokens import MAX_TOKEN_FILE_BYTES, TokenRecord, check_token_ids, read_token_file
from .params import GivenSampling, SamplingParams

__all__ = ["OutputAudit", "AuditConfig", "AuditResult", "GroupResult", "audit_output", "ks_pvalue", "ks_statistic",
           "ad_statistic", "ad_pvalue", "poisson_binomial_sf", "argmax_score_pvalue", "surprisal_score_pvalue",
           "TokenRecord", "read_token_file", "check_token_ids", "normal_z_p", "POOLED_TESTS", "SURPRISAL_FLOOR",
           "DEFAULT_ALPHA", "DEFAULT_EPSILON", "MAX_TOKEN_FILE_BYTES", "PROBS_SUM_TOLERANCE"]

DEFAULT_ALPHA = 1e-6
DEFAULT_EPSILON = 1e-6
DEFAULT_TAIL_TOLERANCE = 0.25  # nats
DEFAULT_GREEDY_TOLERANCE = 0.5  # logits
#: how far a row of :meth:`OutputAudit.add_probs` may sum from 1 (the audit renormalizes within it): softmax rows
#: rounded to float32 sum within ~2e-7 of 1, to float16 within ~5e-4 (underflowed tails), to bfloat16 within
#: ~2e-3 (half an ulp is 2**-9 of each probability); a row off by more is not a distribution
PROBS_SUM_TOLERANCE = 1e-2


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
def _float_param(name: str, value, low: float, high: float, *, open_low: bool = True, open_high: bool = False,
                 hint: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidType(f"{name} = {value!r} must be a number")
    v = float(value)
    ok = math.isfinite(v) and (v > low if open_low else v >= low) and (v < high if open_high else v <= high)
    if not ok:
        side, close = "(" if open_low else "[", ")" if open_high else "]"
        raise InvalidInput(f"{name} = {value!r} is invalid: use a number in {side}{low:g}, {high:g}{close}{hint}")
    return v


@dataclass(frozen=True, kw_only=True)
class AuditConfig(GivenSampling):
    """What an output audit tests under (:class:`OutputAudit`, :func:`fastspec.hf.audit.audit_model_output`): the
    sampling settings the engine used (fastspec.params' ranges; None: the default), ``seed`` (keys the PIT's
    randomization), ``epsilon`` (the tail threshold, in (0, 1)), ``alpha`` (the audit's false-alarm probability,
    in (0, 0.5]), ``tail_tolerance`` (nats, [0, 10]) and ``greedy_tolerance`` (logits, [0, 1e6]): the numerical
    margins of the module docstring.  Validated on construction (typed errors tagged with the argument at fault,
    ``exc.arguments``: :func:`fastspec.errors.about`); the fields then hold the validated values."""

    seed: int = 0
    epsilon: float = DEFAULT_EPSILON
    alpha: float = DEFAULT_ALPHA
    tail_tolerance: float = DEFAULT_TAIL_TOLERANCE
    greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE

    def __post_init__(self):
        from ._numba.rng import seed_bits

        checked = self.checked_sampling()
        with about("epsilon"):
            checked["epsilon"] = _float_param("epsilon", self.epsilon, 0.0, 1.0, open_high=True, hint=", e.g. 1e-6")
        with about("seed"):
            seed_bits(self.seed)  # typed: None, a float, 2**70 are refused naming seed
            checked["seed"] = int(self.seed)
        with about("alpha"):
            checked["alpha"] = _float_param("alpha", self.alpha, 0.0, 0.5)
        with about("tail_tolerance"):
            checked["tail_tolerance"] = _float_param("tail_tolerance", self.tail_tolerance, 0.0, 10.0, open_low=False)
        with about("greedy_tolerance"):
            checked["greedy_tolerance"] = _float_param("greedy_tolerance", self.greedy_tolerance, 0.0, 1e6,
                                                       open_low=False)
        for name, value in checked.items():
            object.__setattr__(self, name, value)


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
    margins of the module docstring.  The settings are an :class:`AuditConfig` (``config``) or its fields as
    arguments, not both."""

    def __init__(self, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, epsilon=DEFAULT_EPSILON,
                 alpha=DEFAULT_ALPHA, tail_tolerance=DEFAULT_TAIL_TOLERANCE,
                 greedy_tolerance=DEFAULT_GREEDY_TOLERANCE, sampling: SamplingParams | None = None,
                 config: AuditConfig | None = None):
        from ._numba.rng import seed_bits

        c = config_or_settings(AuditConfig, config, dict(
            sampling=sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
            epsilon=epsilon, alpha=alpha, tail_tolerance=tail_tolerance, greedy_tolerance=greedy_tolerance))
        self.config = c
        self.params = c.params
        self._seed_bits = seed_bits(c.seed)
        self.seed = c.seed
        self.epsilon, self.alpha = c.epsilon, c.alpha
        self.tail_tolerance, self.greedy_tolerance = c.tail_tolerance, c.greedy_tolerance
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
        processed distribution ``probs[i]`` (float [n, V], non-negative, each row summing to 1 within
        :data:`PROBS_SUM_TOLERANCE`)."""
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
        off = np.abs(sums - 1.0) > PROBS_SUM_TOLERANCE
        if off.any():
            i = int(np.argmax(off))
            raise InvalidInput(f"probs[{i}] sums to {float(sums[i]):.6g}, not 1 (within {PROBS_SUM_TOLERANCE:g}): "
                               "pass each emitted token's processed distribution (fastspec.probabilities), or raw "
                               "logits with add_logits")
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
        top_z, top_np = normal_z_p(top_c - top_e, float(np.sum(mtop * (1.0 - mtop))))
        top_p = argmax_score_pvalue(top, mtop)
        lx = np.concatenate(self._lx)
        ent = np.concatenate(self._ent)
        var = np.concatenate(self._var)
        sur = float(np.sum(lx - ent))
        sur_sd = math.sqrt(float(var.sum()))
        sur_z, sur_np = normal_z_p(sur, sur_sd * sur_sd)
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
