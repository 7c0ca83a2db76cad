"""The exact path: speculative verification in rational arithmetic.

Everything here uses :class:`fractions.Fraction`, so the identities that make
speculative sampling lossless are checked with ``==``, not with a tolerance.
Every float kernel and every simulator figure in fastspec is tested against
this module; it is the reference of references.

Three layers:

1. :func:`verify_step` -- one drafted position: accepted mass ``min(p, q)``,
   acceptance ``alpha``, the residual ``max(p - q, 0)``, the recovered
   distribution (the residual *divided by its sum*), and the output
   ``accepted + (1 - alpha) * recovered`` which equals ``p`` exactly.
2. Blocks and context rollback -- target and draft given as functions
   ``prefix -> distribution``; :func:`block_distribution` enumerates what one
   verify step with K drafts emits, :func:`sequence_distribution` what repeated
   verify steps emit (each step restarts from the accepted prefix plus the
   emitted token), both compared with the target's own autoregressive
   distribution.
3. Policy audit -- the same enumeration with a pluggable verification policy
   (:data:`POLICIES`): exact ones give total-variation distance 0 to the
   target, lossy ones show by how much they miss.

"Same distribution" here is the theorem-level claim (infinite samples).  It is
not "same text under a fixed seed" and not "close task score".
"""
from __future__ import annotations

import math
import numbers
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Callable, Mapping, Sequence

__all__ = [
    "to_fraction",
    "as_distribution",
    "total_variation",
    "VerifyStep",
    "verify_step",
    "Policy",
    "POLICIES",
    "get_policy",
    "PositionAudit",
    "audit_step",
    "BlockDistribution",
    "block_distribution",
    "SequenceDistribution",
    "sequence_distribution",
    "target_sequence_distribution",
    "FLOAT_SUM_TOLERANCE",
]

Dist = tuple  # tuple[Fraction, ...]
Model = Callable[[tuple], Sequence]

#: Float inputs rarely sum to exactly 1; within this tolerance they are divided by their exact sum.
FLOAT_SUM_TOLERANCE = 1e-6

ZERO = Fraction(0)
ONE = Fraction(1)


# --------------------------------------------------------------------------- inputs


def to_fraction(value, name: str = "value", index: int | None = None) -> Fraction:
    """Convert one probability to an exact :class:`Fraction`.

    ``Fraction`` and ``int`` are taken as they are; a decimal string means the
    decimal exactly (``"0.1"`` is 1/10; ``"1/3"`` also works); a float is
    converted exactly (``Fraction(0.1)`` is 3602879701896397/36028797018963968)
    so a float kernel's inputs can be checked exactly.
    """
    where = f"{name}[{index}]" if index is not None else name
    if isinstance(value, bool):
        raise TypeError(f"{where} is a bool; give a number (Fraction, int, decimal string or float)")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{where} is {value}; probabilities must be finite")
        return Fraction(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{where} is {value!r}, not a number; write e.g. '0.25' or '1/4'") from None
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise ValueError(f"{where} is {f}; probabilities must be finite")
        return Fraction(f)
    raise TypeError(f"{where} has type {type(value).__name__}; give a Fraction, int, decimal string or float")


def as_distribution(values, name: str = "p", *, normalize: bool = False) -> Dist:
    """Validate and convert a probability vector to a tuple of Fractions.

    Raises ``ValueError`` naming the problem and the index: empty vector,
    negative entry, or a sum different from 1.  Sums are checked exactly for
    rational inputs (ints, Fractions, decimal strings); a vector containing
    floats may be off by at most :data:`FLOAT_SUM_TOLERANCE` and is then divided
    by its exact sum.  ``normalize=True`` divides any vector with a positive sum
    by that sum.
    """
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of probabilities, not a string; split it first")
    if not hasattr(values, "__len__"):
        try:
            values = list(values)
        except TypeError:
            raise TypeError(f"{name} must be a sequence of probabilities, got {type(values).__name__}") from None
    if len(values) == 0:
        raise ValueError(f"{name} is empty; give at least one probability")
    fracs = []
    has_float = False
    for i, v in enumerate(values):
        f = to_fraction(v, name, i)
        if f < 0:
            raise ValueError(f"{name}[{i}] = {f} is negative; probabilities must be >= 0")
        if isinstance(v, numbers.Real) and not isinstance(v, (numbers.Rational, Decimal)):
            has_float = True
        fracs.append(f)
    total = sum(fracs, ZERO)
    if total == 0:
        raise ValueError(f"{name} sums to 0; at least one probability must be positive")
    if total != 1:
        if normalize or (has_float and abs(float(total) - 1.0) <= FLOAT_SUM_TOLERANCE):
            fracs = [f / total for f in fracs]
        else:
            hint = "pass normalize=True (CLI: --normalize) to divide by the sum" if not normalize else ""
            raise ValueError(f"{name} sums to {total} (= {float(total):.12g}), not 1; fix the entries or {hint}")
    return tuple(fracs)


def total_variation(p: Sequence[Fraction], q: Sequence[Fraction]) -> Fraction:
    """TV(p, q) = (1/2) sum |p - q| over equal-length vectors."""
    if len(p) != len(q):
        raise ValueError(f"length mismatch: {len(p)} vs {len(q)}")
    return sum((abs(a - b) for a, b in zip(p, q)), ZERO) / 2


def _tv_mappings(a: Mapping, b: Mapping) -> Fraction:
    keys = set(a) | set(b)
    return sum((abs(a.get(k, ZERO) - b.get(k, ZERO)) for k in keys), ZERO) / 2


def _pair(p, q, normalize: bool) -> tuple[Dist, Dist]:
    p = as_distribution(p, "p", normalize=normalize)
    q = as_distribution(q, "q", normalize=normalize)
    if len(p) != len(q):
        raise ValueError(f"length mismatch: p has {len(p)} entries, q has {len(q)}; both must cover the same vocabulary")
    return p, q


# --------------------------------------------------------------------------- one position


@dataclass(frozen=True)
class VerifyStep:
    """Exact anatomy of verifying one drafted token (all fields are Fractions).

    ``recovered`` is ``None`` when ``rejection == 0`` (p == q): the rejection
    branch is unreachable and no division happens.
    """

    p: Dist
    q: Dist
    accepted: Dist
    acceptance: Fraction
    rejection: Fraction
    residual: Dist
    recovered: Dist | None
    output: Dist

    @property
    def total_variation(self) -> Fraction:
        """TV(p, q), which equals the rejection probability 1 - alpha."""
        return total_variation(self.p, self.q)


def _residual(p: Sequence[Fraction], q: Sequence[Fraction]) -> Dist:
    return tuple(max(a - b, ZERO) for a, b in zip(p, q))


def _normalized(weights: Sequence[Fraction]) -> Dist | None:
    total = sum(weights, ZERO)
    if total == 0:
        return None
    return tuple(w / total for w in weights)


def verify_step(p, q, *, normalize: bool = False) -> VerifyStep:
    """Exact speculative verification of one drafted token x ~ q against target p.

    Accept x with probability min(1, p(x)/q(x)); on rejection sample from the
    residual max(p - q, 0) divided by its sum.  The returned ``output`` equals
    ``p`` exactly -- this is checked, and an ``AssertionError`` would mean a
    bug in this function, never in the caller's input.
    """
    p, q = _pair(p, q, normalize)
    accepted = tuple(min(a, b) for a, b in zip(p, q))
    acceptance = sum(accepted, ZERO)
    rejection = ONE - acceptance
    residual = _residual(p, q)
    if rejection == 0:
        recovered = None
        output = accepted
    else:
        # sum(residual) == rejection exactly, since sum(p) == 1
        recovered = tuple(r / rejection for r in residual)
        output = tuple(a + rejection * r for a, r in zip(accepted, recovered))
    if output != p:
        raise AssertionError("exact verification output differs from p: this is a bug in fastspec.exact")
    return VerifyStep(p, q, accepted, acceptance, rejection, residual, recovered, output)


# --------------------------------------------------------------------------- policies

Decision = tuple  # (accept probability: Fraction, distribution on rejection: Dist | None)


@dataclass(frozen=True)
class Policy:
    """A verification rule for one drafted position.

    ``decide(p, q, x)`` returns ``(a, r)``: accept the drafted token ``x`` (sampled
    from ``q``) with probability ``a``; otherwise emit a token from distribution
    ``r`` and end the verify step (``r`` may be ``None`` only when ``a == 1``).
    ``claims_exact`` is what the literature claims; the audit measures it.
    """

    name: str
    decide: Callable[[Dist, Dist, int], Decision]
    claims_exact: bool
    description: str
    params: Mapping[str, object] = field(default_factory=dict)


def _standard(p: Dist, q: Dist, x: int) -> Decision:
    a = min(ONE, p[x] / q[x])
    return a, (_normalized(_residual(p, q)) if a != 1 else None)


def _unnormalized_residual(p: Dist, q: Dist, x: int) -> Decision:
    # Inverse CDF over max(p - q, 0) *without* dividing by its sum, u ~ U[0, 1):
    # token i is chosen when u < cumulative residual; u beyond the residual mass
    # falls through to the last token.  P(i) = r_i, plus (1 - sum r) on the last one.
    a = min(ONE, p[x] / q[x])
    if a == 1:
        return a, None
    r = list(_residual(p, q))
    r[-1] += ONE - sum(r, ZERO)
    return a, tuple(r)


def _resample_from_target(p: Dist, q: Dist, x: int) -> Decision:
    a = min(ONE, p[x] / q[x])
    return a, (p if a != 1 else None)


def _prune_by_draft_prob(tau: Fraction) -> Callable:
    def decide(p: Dist, q: Dist, x: int) -> Decision:
        if q[x] < tau:  # dropped slot: a fresh target sample
            return ZERO, p
        return _standard(p, q, x)

    return decide


def _prune_by_draft_prob_corrected(tau: Fraction) -> Callable:
    def decide(p: Dist, q: Dist, x: int) -> Decision:
        if q[x] < tau:
            return ZERO, p
        kept = sum((w for w in q if w >= tau), ZERO)
        q_kept = tuple((w / kept if w >= tau else ZERO) for w in q)
        return _standard(p, q_kept, x)

    return decide


def _typical_acceptance(epsilon: Fraction, delta: Fraction) -> Callable:
    def decide(p: Dist, q: Dist, x: int) -> Decision:
        # The entropy threshold is irrational; it is computed in float64 and the
        # comparison made exactly against that float (a deterministic rule).
        entropy = -sum(float(v) * math.log(float(v)) for v in p if v > 0)
        threshold = min(epsilon, Fraction(float(delta) * math.exp(-entropy)))
        if p[x] > threshold:
            return ONE, None
        best = max(range(len(p)), key=lambda i: (p[i], -i))  # argmax, lowest index on ties
        return ZERO, tuple(ONE if i == best else ZERO for i in range(len(p)))

    return decide


def _exact_match(p: Dist, q: Dist, x: int) -> Decision:
    # Draw y ~ p independently; accept iff y == x, else emit y.
    a = p[x]
    if a == 1:
        return a, None
    rest = ONE - a
    return a, tuple((ZERO if i == x else v / rest) for i, v in enumerate(p))


def get_policy(name: str, *, tau=None, epsilon="0.09", delta="0.3") -> Policy:
    """Build a verification policy by name (see :data:`POLICIES` for the names)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    if name == "standard":
        return Policy(name, _standard, True, POLICIES[name])
    if name == "unnormalized_residual":
        return Policy(name, _unnormalized_residual, False, POLICIES[name])
    if name == "resample_from_target":
        return Policy(name, _resample_from_target, False, POLICIES[name])
    if name in ("prune_by_draft_prob", "prune_by_draft_prob_corrected"):
        if tau is None:
            raise ValueError(f"policy {name!r} needs tau (CLI: --tau), the draft-probability threshold below which a candidate is dropped")
        t = to_fraction(tau, "tau")
        if not 0 <= t <= 1:
            raise ValueError(f"tau = {t} must lie in [0, 1]")
        fn = _prune_by_draft_prob(t) if name == "prune_by_draft_prob" else _prune_by_draft_prob_corrected(t)
        return Policy(name, fn, name.endswith("corrected"), POLICIES[name], {"tau": t})
    if name == "typical_acceptance":
        e, d = to_fraction(epsilon, "epsilon"), to_fraction(delta, "delta")
        if e < 0 or d < 0:
            raise ValueError("epsilon and delta must be >= 0")
        return Policy(name, _typical_acceptance(e, d), False, POLICIES[name], {"epsilon": e, "delta": d})
    return Policy(name, _exact_match, True, POLICIES[name])


#: Policy names and what they do.
POLICIES: dict[str, str] = {
    "standard": "accept with min(1, p/q); on rejection sample the residual max(p-q,0) divided by its sum (exact)",
    "unnormalized_residual": "inverse CDF over max(p-q,0) without dividing by its sum; u beyond the residual mass falls "
    "through to the last token (biased: the bug a figure omitting normalization invites)",
    "resample_from_target": "on rejection sample from p instead of the residual (biased)",
    "prune_by_draft_prob": "drop a drafted candidate whose own q(x) < tau (a fresh target sample is emitted); verify "
    "kept candidates against the unchanged q (biased)",
    "prune_by_draft_prob_corrected": "same pruning, kept candidates verified against q restricted to the kept set and "
    "renormalized (exact)",
    "typical_acceptance": "Medusa-style: accept iff p(x) > min(epsilon, delta*exp(-H(p))), rejection emits the target "
    "argmax (lossy; defaults epsilon=0.09, delta=0.3)",
    "exact_match": "accept iff the draft equals an independent target sample, else emit that sample (exact; acceptance "
    "sum p*q instead of sum min(p,q))",
}

STANDARD = get_policy("standard")


@dataclass(frozen=True)
class PositionAudit:
    """Exact output distribution of a policy at one position, with its acceptance and TV to the target."""

    policy: str
    p: Dist
    q: Dist
    output: Dist
    acceptance: Fraction
    total_variation: Fraction

    @property
    def exact(self) -> bool:
        return self.total_variation == 0


def _position_output(p: Dist, q: Dist, policy: Policy) -> tuple[Dist, Fraction]:
    out = [ZERO] * len(p)
    acceptance = ZERO
    for x, qx in enumerate(q):
        if qx == 0:
            continue
        a, rej = policy.decide(p, q, x)
        acceptance += qx * a
        out[x] += qx * a
        if a != 1:
            for y, ry in enumerate(rej):
                out[y] += qx * (1 - a) * ry
    return tuple(out), acceptance


def audit_step(p, q, policy: Policy | str = "standard", *, normalize: bool = False, **params) -> PositionAudit:
    """Exact output distribution, acceptance and TV to ``p`` of ``policy`` at one drafted position."""
    if isinstance(policy, str):
        policy = get_policy(policy, **params)
    p, q = _pair(p, q, normalize)
    out, acceptance = _position_output(p, q, policy)
    return PositionAudit(policy.name, p, q, out, acceptance, total_variation(out, p))


# --------------------------------------------------------------------------- blocks and sequences


class _Model:
    """Wraps ``prefix -> distribution``: exact conversion, caching, vocabulary-size check."""

    def __init__(self, fn: Model, name: str, vocab: int | None = None):
        if not callable(fn):
            raise TypeError(f"{name} must be a function prefix -> distribution, got {type(fn).__name__}")
        self.fn, self.name, self.vocab, self.cache = fn, name, vocab, {}

    def __call__(self, prefix: tuple) -> Dist:
        d = self.cache.get(prefix)
        if d is None:
            d = as_distribution(self.fn(prefix), f"{self.name}({prefix})")
            if self.vocab is None:
                self.vocab = len(d)
            elif len(d) != self.vocab:
                raise ValueError(f"{self.name}({prefix}) has {len(d)} entries but the vocabulary has {self.vocab}")
            self.cache[prefix] = d
        return d


def _models(target, draft):
    t = target if isinstance(target, _Model) else _Model(target, "target")
    d = draft if isinstance(draft, _Model) else _Model(draft, "draft", t.vocab)
    return t, d


def target_sequence_distribution(target: Model, length: int, prefix: tuple = ()) -> dict[tuple, Fraction]:
    """The target's own autoregressive distribution over the next ``length`` tokens after ``prefix``."""
    t = target if isinstance(target, _Model) else _Model(target, "target")
    dist = {(): ONE}
    for _ in range(length):
        nxt: dict[tuple, Fraction] = {}
        for seq, pr in dist.items():
            for y, py in enumerate(t(tuple(prefix) + seq)):
                if py:
                    nxt[seq + (y,)] = pr * py
        dist = nxt
    return dist


def _extend_with_target(dist: Mapping[tuple, Fraction], target: _Model, prefix: tuple, length: int):
    """Complete each emitted tuple to ``length`` tokens by sampling the rest from the target."""
    out: dict[tuple, Fraction] = defaultdict(Fraction)
    for seq, pr in dist.items():
        if len(seq) >= length:
            out[seq[:length]] += pr
            continue
        for tail, pt in target_sequence_distribution(target, length - len(seq), tuple(prefix) + seq).items():
            out[seq + tail] += pr * pt
    return dict(out)


@dataclass(frozen=True)
class BlockDistribution:
    """Exact distribution of what one verify step with ``k`` drafts emits.

    ``emitted`` maps the emitted token tuple (accepted drafts, then the
    recovered or bonus token) to its probability.  ``completed`` extends every
    emitted tuple to k + 1 tokens with the target's own continuation; for an
    exact policy it equals ``target``, the target's autoregressive distribution
    over k + 1 tokens, and ``total_variation`` is 0.
    """

    k: int
    policy: str
    emitted: dict
    accepted_count: Dist  # P(j drafts accepted), j = 0..k
    expected_accepted: Fraction
    expected_tokens: Fraction  # tokens per verify step, recovered/bonus included
    completed: dict
    target: dict
    total_variation: Fraction

    @property
    def exact(self) -> bool:
        return self.total_variation == 0


def _block(t: _Model, d: _Model, k: int, prefix: tuple, policy: Policy):
    emitted: dict[tuple, Fraction] = defaultdict(Fraction)
    accepted = [ZERO] * (k + 1)

    def rec(ctx: tuple, i: int, prob: Fraction, out: tuple):
        p = t(ctx)
        if i == k:  # every draft accepted: bonus token from the target's next distribution
            accepted[k] += prob
            for y, py in enumerate(p):
                if py:
                    emitted[out + (y,)] += prob * py
            return
        q = d(ctx)
        if len(q) != len(p):
            raise ValueError(f"draft({ctx}) has {len(q)} entries but the vocabulary has {len(p)} (target({ctx}))")
        for x, qx in enumerate(q):
            if qx == 0:
                continue
            a, rej = policy.decide(p, q, x)
            if a:
                rec(ctx + (x,), i + 1, prob * qx * a, out + (x,))
            if a != 1:
                pr = prob * qx * (1 - a)
                accepted[i] += pr
                for y, ry in enumerate(rej):
                    if ry:
                        emitted[out + (y,)] += pr * ry

    rec(tuple(prefix), 0, ONE, ())
    return dict(emitted), tuple(accepted)


def _check_k(k, name="k"):
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {k!r}")
    return int(k)


def block_distribution(target: Model, draft: Model, k: int, *, prefix: tuple = (),
                       policy: Policy | str = "standard", method: str = "token", **policy_params) -> BlockDistribution:
    """Enumerate exactly one verify step with ``k`` drafts after ``prefix``.

    ``target`` and ``draft`` are functions ``prefix -> distribution`` (tuples of
    token ids to probability vectors over one vocabulary).  ``method="block"``
    enumerates block verification instead (:func:`block_verification_distribution`).
    """
    if method == "block":
        if (policy.name if isinstance(policy, Policy) else policy) != "standard" or policy_params:
            raise ValueError("policy applies to token verification only (method='token')")
        return block_verification_distribution(target, draft, k, prefix=prefix)
    if method != "token":
        raise ValueError(f"method {method!r} is unknown; choose 'token' or 'block' "
                         "(trees: candidate_block_distribution)")
    k = _check_k(k)
    if isinstance(policy, str):
        policy = get_policy(policy, **policy_params)
    t, d = _models(target, draft)
    emitted, accepted = _block(t, d, k, tuple(prefix), policy)
    expected_accepted = sum((j * pj for j, pj in enumerate(accepted)), ZERO)
    completed = _extend_with_target(emitted, t, tuple(prefix), k + 1)
    own = target_sequence_distribution(t, k + 1, tuple(prefix))
    return BlockDistribution(k, policy.name, emitted, accepted, expected_accepted, expected_accepted + 1,
                             completed, own, _tv_mappings(completed, own))


@dataclass(frozen=True)
class SequenceDistribution:
    """Exact distribution of the first ``length`` tokens produced by repeated verify steps."""

    k: int
    length: int
    policy: str
    distribution: dict
    target: dict
    total_variation: Fraction
    expected_steps: Fraction  # expected number of verify steps to produce `length` tokens

    @property
    def exact(self) -> bool:
        return self.total_variation == 0


def sequence_distribution(target: Model, draft: Model, k: int, length: int, *, prefix: tuple = (),
                          policy: Policy | str = "standard", method: str = "token",
                          **policy_params) -> SequenceDistribution:
    """Enumerate repeated verify steps until ``length`` tokens exist.

    Each step starts from the context rolled back to the accepted prefix plus the
    emitted token (what the KV caches hold after rollback); tokens past
    ``length`` are cut off.  Compared with the target's own distribution over
    ``length`` tokens.  ``method="block"`` uses block verification for every step
    (trees: :func:`verification_sequence_distribution`).
    """
    return verification_sequence_distribution(target, draft, k, length, method=method, prefix=prefix,
                                              policy=policy, **policy_params)


# --------------------------------------------------------------------------- block verification
#
# Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh; arXiv 2403.10444) judges the
# whole block of drafts jointly.  With p_i, q_i the target and draft distributions at drafted position i
# (context: prefix and the drafts x_<i), w_0 = 1 and
#
#     w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1),
#     Z_{i+1} = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0),   h_i = Z_{i+1} / (Z_{i+1} + 1 - w_i)   (i < k),
#     h_k = w_k,
#
# eta_i ~ Bernoulli(h_i) independently and tau = max{i : eta_i = 1} (0 if none): a later success rescues the
# earlier drafts.  tau < k emits Y ~ max(w_tau p_{tau+1} - q_{tau+1}, 0) / Z_{tau+1}; tau = k a bonus token from
# p_{k+1}.  It is not a per-position Policy (tau depends on later positions), so it has its own enumeration.

METHODS = ("token", "block", "candidates")


def _h(z: Fraction, w: Fraction) -> Fraction:
    den = z + 1 - w
    return ONE if den == 0 else z / den


def _block_verification(t: _Model, d: _Model, k: int, prefix: tuple):
    """Enumerate block verification of one block of ``k`` drafts; returns (emitted, P(tau = j), E[w_i])."""
    emitted: dict[tuple, Fraction] = defaultdict(Fraction)
    accepted = [ZERO] * (k + 1)
    mean_w = [ZERO] * (k + 1)

    def rec(ctx: tuple, i: int, prob: Fraction, xs: tuple, w: Fraction, hs: tuple, residuals: tuple):
        # i drafts so far (x_1..x_i = xs), w = w_i; hs = (h_1..h_{i-1}); residuals[j] = residual at tau = j
        mean_w[i] += prob * w
        p = t(ctx)
        if i == k:
            hs = hs + (w,) if k > 0 else hs
            # P(tau = j) = h_j prod_{l > j} (1 - h_l), h indexed 1..k; tau = 0 when every eta is 0
            tail = ONE
            for j in range(k, -1, -1):
                pj = tail * (hs[j - 1] if j > 0 else ONE)
                if j > 0:
                    tail *= 1 - hs[j - 1]
                if pj == 0:
                    continue
                accepted[j] += prob * pj
                dist = p if j == k else residuals[j]
                if dist is None:
                    raise AssertionError("block verification reached a zero residual: a bug in fastspec.exact")
                for y, py in enumerate(dist):
                    if py:
                        emitted[xs[:j] + (y,)] += prob * pj * py
            return
        q = d(ctx)
        if len(q) != len(p):
            raise ValueError(f"draft({ctx}) has {len(q)} entries but the vocabulary has {len(p)} (target({ctx}))")
        res = tuple(max(w * a - b, ZERO) for a, b in zip(p, q))
        z = sum(res, ZERO)
        if i > 0:
            hs = hs + (_h(z, w),)
        residuals = residuals + (_normalized(res),)
        for x, qx in enumerate(q):
            if qx:
                rec(ctx + (x,), i + 1, prob * qx, xs + (x,), min(w * p[x] / qx, ONE), hs, residuals)

    rec(tuple(prefix), 0, ONE, (), ONE, (), ())
    return dict(emitted), tuple(accepted), tuple(mean_w)


def block_verification_distribution(target: Model, draft: Model, k: int, *, prefix: tuple = ()) -> BlockDistribution:
    """Enumerate exactly one block-verification step with ``k`` drafts after ``prefix``.

    Same fields as :func:`block_distribution`; ``policy`` is ``"block"``.  ``expected_accepted`` is E[tau],
    which also equals sum_i E[w_i] (the probability that at least i drafts are accepted is E[w_i]).
    """
    k = _check_k(k)
    t, d = _models(target, draft)
    emitted, accepted, _ = _block_verification(t, d, k, tuple(prefix))
    return _block_result(t, k, tuple(prefix), "block", emitted, accepted)


def block_acceptance_weights(target: Model, draft: Model, k: int, *, prefix: tuple = ()) -> Dist:
    """(E[w_1], ..., E[w_k]) of block verification: E[w_i] = P(at least i drafts accepted)."""
    k = _check_k(k)
    t, d = _models(target, draft)
    return _block_verification(t, d, k, tuple(prefix))[2][1:]


def _block_result(t: _Model, k: int, prefix: tuple, name: str, emitted, accepted) -> BlockDistribution:
    expected_accepted = sum((j * pj for j, pj in enumerate(accepted)), ZERO)
    completed = _extend_with_target(emitted, t, prefix, k + 1)
    own = target_sequence_distribution(t, k + 1, prefix)
    return BlockDistribution(k, name, emitted, accepted, expected_accepted, expected_accepted + 1,
                             completed, own, _tv_mappings(completed, own))


# --------------------------------------------------------------------------- multi-candidate verification
#
# w candidates per drafted position, verified by recursive rejection sampling: starting from r = p, candidate
# x_s (drawn from the proposal g_s) is accepted with probability min(1, r(x_s) / g_s(x_s)); on rejection
# r <- normalize(max(r - g_s, 0)); if every candidate is rejected, a token is sampled from r.  Proposals:
#
# * "iid": g_s = q for every s (SpecInfer's multi-step speculative sampling);
# * "without_replacement": g_s = q with x_1..x_{s-1} removed and renormalized (recursive speculative decoding);
#   fewer than w candidates are drawn when q's support runs out;
# * "deterministic": given candidate ids (default: the top-w of q, lowest id on ties), each a point mass.
#
# Each step outputs r exactly whatever g_s is, as long as x_s really is drawn from g_s; so the output is p.

CANDIDATE_SAMPLING = ("iid", "without_replacement", "deterministic")


def _check_sampling(sampling: str) -> str:
    if sampling not in CANDIDATE_SAMPLING:
        raise ValueError(f"sampling {sampling!r} is unknown; choose one of: {', '.join(CANDIDATE_SAMPLING)}")
    return sampling


def top_candidates(q: Sequence[Fraction], w: int) -> tuple:
    """The ``w`` most likely ids of ``q`` (lowest id on ties); fewer if q has fewer than w positive entries."""
    order = sorted((i for i in range(len(q)) if q[i] > 0), key=lambda i: (-q[i], i))
    return tuple(order[:w])


def _candidates_enumerate(p: Dist, q: Dist, w: int, sampling: str, candidates, on_accept, on_final):
    """Recursive rejection over the candidates of one position.

    Calls ``on_accept(x, prob, s)`` for candidate x accepted at step s (1-based) with probability ``prob`` and
    ``on_final(r, prob)`` when every candidate was rejected (a token is then sampled from r).
    """
    V = len(p)
    if sampling == "deterministic" and candidates is None:
        candidates = top_candidates(q, w)

    def proposal(s: int, used: tuple):
        if sampling == "iid":
            return q
        if sampling == "deterministic":
            if s >= len(candidates):
                return None
            return tuple(ONE if v == candidates[s] else ZERO for v in range(V))
        mass = ONE - sum((q[v] for v in used), ZERO)
        if mass == 0:
            return None
        return tuple(ZERO if v in used else q[v] / mass for v in range(V))

    def rec(s: int, r: Dist, used: tuple, prob: Fraction):
        g = proposal(s, used) if s < w else None
        if g is None:
            on_final(r, prob)
            return
        rej = _residual(r, g)
        r_next = _normalized(rej)
        for x, gx in enumerate(g):
            if not gx:
                continue
            a = min(ONE, r[x] / gx)
            if a:
                on_accept(x, prob * gx * a, s + 1)
            if a != 1:
                rec(s + 1, r_next, used + (x,), prob * gx * (1 - a))

    rec(0, p, (), ONE)


@dataclass(frozen=True)
class CandidateStep:
    """Exact anatomy of verifying ``w`` candidates at one position (all Fractions).

    ``accepted_at[s]``: probability that candidate s+1 is the accepted one; ``acceptance``: probability that
    some candidate is accepted; ``output``: the emitted token's distribution (equals ``p`` for every sampling).
    """

    p: Dist
    q: Dist
    w: int
    sampling: str
    candidates: tuple | None
    accepted_at: Dist
    acceptance: Fraction
    output: Dist
    total_variation: Fraction

    @property
    def exact(self) -> bool:
        return self.total_variation == 0


def candidate_step(p, q, w: int, *, sampling: str = "iid", candidates=None, normalize: bool = False) -> CandidateStep:
    """Exact recursive rejection sampling of ``w`` candidates at one position (see the section comment).

    ``candidates`` (only with ``sampling="deterministic"``): the candidate ids, distinct, at most ``w``;
    default the top-w of ``q``.
    """
    p, q = _pair(p, q, normalize)
    w = _check_k(w, "w")
    if w < 1:
        raise ValueError("w must be >= 1 (candidates per position)")
    _check_sampling(sampling)
    if candidates is not None:
        if sampling != "deterministic":
            raise ValueError("candidates are given only with sampling='deterministic' (point-mass proposals)")
        candidates = tuple(int(c) for c in candidates)
        if len(set(candidates)) != len(candidates) or any(not 0 <= c < len(p) for c in candidates):
            raise ValueError(f"candidates {candidates} must be distinct ids in [0, {len(p)})")
        w = min(w, len(candidates))
    elif sampling == "deterministic":
        candidates = top_candidates(q, w)
    out = [ZERO] * len(p)
    at = [ZERO] * w

    def on_accept(x, prob, s):
        out[x] += prob
        at[s - 1] += prob

    def on_final(r, prob):
        for y, ry in enumerate(r):
            out[y] += prob * ry

    _candidates_enumerate(p, q, w, sampling, candidates, on_accept, on_final)
    out = tuple(out)
    return CandidateStep(p, q, w, sampling, candidates, tuple(at), sum(at, ZERO), out, total_variation(out, p))


def _check_widths(widths) -> tuple:
    if isinstance(widths, numbers.Integral) and not isinstance(widths, bool):
        raise TypeError("widths must be a sequence (w_1, ..., w_k) of candidates per depth")
    ws = tuple(widths)
    for i, v in enumerate(ws):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"widths[{i}] = {v!r} must be an integer >= 1 (candidates at depth {i + 1})")
    return tuple(int(v) for v in ws)


def _candidate_block(t: _Model, d: _Model, widths: tuple, prefix: tuple, sampling: str):
    """Enumerate one verify step over a static token tree: depth i has ``widths[i]`` candidates per node."""
    k = len(widths)
    emitted: dict[tuple, Fraction] = defaultdict(Fraction)
    accepted = [ZERO] * (k + 1)

    def rec(ctx: tuple, i: int, prob: Fraction, out: tuple):
        p = t(ctx)
        if i == k:
            accepted[k] += prob
            for y, py in enumerate(p):
                if py:
                    emitted[out + (y,)] += prob * py
            return
        q = d(ctx)
        if len(q) != len(p):
            raise ValueError(f"draft({ctx}) has {len(q)} entries but the vocabulary has {len(p)} (target({ctx}))")

        def on_accept(x, pr, s):
            rec(ctx + (x,), i + 1, prob * pr, out + (x,))

        def on_final(r, pr):
            accepted[i] += prob * pr
            for y, ry in enumerate(r):
                if ry:
                    emitted[out + (y,)] += prob * pr * ry

        _candidates_enumerate(p, q, widths[i], sampling, None, on_accept, on_final)

    rec(tuple(prefix), 0, ONE, ())
    return dict(emitted), tuple(accepted)


def candidate_block_distribution(target: Model, draft: Model, widths, *, sampling: str = "iid",
                                 prefix: tuple = ()) -> BlockDistribution:
    """Enumerate one verify step over a token tree with ``widths[i]`` candidates per node at depth i+1.

    Candidates at a node are drawn from the draft's distribution there (``sampling`` "iid" or
    "without_replacement") or are the draft's top-w ("deterministic"); an accepted candidate's children are
    judged next; when all children of a node are rejected the residual token is emitted, at a leaf a bonus
    token from the target.  ``widths = (1,) * k`` is token verification.
    """
    widths = _check_widths(widths)
    _check_sampling(sampling)
    t, d = _models(target, draft)
    emitted, accepted = _candidate_block(t, d, widths, tuple(prefix), sampling)
    return _block_result(t, len(widths), tuple(prefix), f"candidates:{sampling}:{'x'.join(map(str, widths))}",
                         emitted, accepted)


def _step_enumerator(method: str, k: int, policy, widths, sampling):
    """(t, d, ctx) -> emitted mapping of one verify step for ``sequence_distribution``."""
    if method == "token":
        return lambda t, d, ctx: _block(t, d, k, ctx, policy)[0]
    if method == "block":
        return lambda t, d, ctx: _block_verification(t, d, k, ctx)[0]
    return lambda t, d, ctx: _candidate_block(t, d, widths, ctx, sampling)[0]


def verification_sequence_distribution(target: Model, draft: Model, k: int, length: int, *, method: str = "token",
                                       widths=None, sampling: str = "iid", prefix: tuple = (),
                                       policy: Policy | str = "standard", **policy_params) -> SequenceDistribution:
    """:func:`sequence_distribution` for any verification method.

    ``method``: "token" (per-position ``policy``), "block" (block verification) or "candidates" (token trees
    with ``widths`` candidates per depth, default ``(1,) * k``, drawn with ``sampling``).
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r} is unknown; choose one of: {', '.join(METHODS)}")
    k = _check_k(k)
    length = _check_k(length, "length")
    if isinstance(policy, str):
        policy = get_policy(policy, **policy_params)
    if method != "token" and policy.name != "standard":
        raise ValueError(f"policy {policy.name!r} applies to token verification only (method='token')")
    if method == "candidates":
        widths = (1,) * k if widths is None else _check_widths(widths)
        if len(widths) != k:
            raise ValueError(f"widths has {len(widths)} entries but k = {k}; give one width per depth")
        _check_sampling(sampling)
    name = {"token": policy.name, "block": "block",
            "candidates": f"candidates:{sampling}:{'x'.join(map(str, widths or ()))}"}[method]
    step = _step_enumerator(method, k, policy, widths, sampling)
    t, d = _models(target, draft)
    prefix = tuple(prefix)
    blocks: dict[tuple, dict] = {}
    final: dict[tuple, Fraction] = defaultdict(Fraction)
    expected_steps = ZERO
    frontier = [((), ONE)] if length > 0 else []
    if length == 0:
        final[()] = ONE
    while frontier:
        gen, pr = frontier.pop()
        expected_steps += pr
        ctx = prefix + gen
        if ctx not in blocks:
            blocks[ctx] = step(t, d, ctx)
        for y, py in blocks[ctx].items():
            new = gen + y
            if len(new) >= length:
                final[new[:length]] += pr * py
            else:
                frontier.append((new, pr * py))
    own = target_sequence_distribution(t, length, prefix)
    return SequenceDistribution(k, length, name, dict(final), own, _tv_mappings(final, own), expected_steps)


__all__ += ["METHODS", "block_verification_distribution", "block_acceptance_weights", "CANDIDATE_SAMPLING",
            "top_candidates", "CandidateStep", "candidate_step", "candidate_block_distribution",
            "verification_sequence_distribution"]
