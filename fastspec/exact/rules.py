"""Verification rules for one drafted position, one registry of them (:data:`RULES`), and the audit of a rule.

A rule decides, for the drafted token x ~ q, with which probability x is accepted and what is emitted
otherwise.  Exact rules give total-variation distance 0 to the target; lossy ones show by how much they
miss (:func:`audit_step` for one position; :func:`~fastspec.exact.block_distribution` and
:func:`~fastspec.exact.sequence_distribution` with ``rule=`` for whole verify steps).  The command line calls
them verification policies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Iterator, Mapping

from ..errors import InvalidInput, InvalidType
from .core import ONE, ZERO, ComparedWithTarget, Dist, normalized, pair, residual, to_fraction, total_variation
from .walk import Accept, Emit, position_law

__all__ = ["VerificationRule", "RULES", "get_rule", "rule_parameters", "resolve_rule", "rule_outcomes",
           "PositionAudit", "audit_step"]

Decision = tuple  # (accept probability: Fraction, distribution on rejection: Dist | None)


@dataclass(frozen=True)
class VerificationRule:
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


# --------------------------------------------------------------------------- the decision rules


def _standard(p: Dist, q: Dist, x: int) -> Decision:
    a = min(ONE, p[x] / q[x])
    return a, (normalized(residual(p, q)) if a != 1 else None)


def _unnormalized_residual(p: Dist, q: Dist, x: int) -> Decision:
    # Inverse CDF over max(p - q, 0) *without* dividing by its sum, u ~ U[0, 1):
    # token i is chosen when u < cumulative residual; u beyond the residual mass
    # falls through to the last token.  P(i) = r_i, plus (1 - sum r) on the last one.
    a = min(ONE, p[x] / q[x])
    if a == 1:
        return a, None
    r = list(residual(p, q))
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
    def decide(p: Dist, _q: Dist, x: int) -> Decision:
        # The entropy threshold is irrational; it is computed in float64 and the
        # comparison made exactly against that float (a deterministic rule).
        entropy = -sum(float(v) * math.log(float(v)) for v in p if v > 0)
        threshold = min(epsilon, Fraction(float(delta) * math.exp(-entropy)))
        if p[x] > threshold:
            return ONE, None
        best = max(range(len(p)), key=lambda i: (p[i], -i))  # argmax, lowest index on ties
        return ZERO, tuple(ONE if i == best else ZERO for i in range(len(p)))

    return decide


def _exact_match(p: Dist, _q: Dist, x: int) -> Decision:
    # Draw y ~ p independently; accept iff y == x, else emit y.
    a = p[x]
    if a == 1:
        return a, None
    rest = ONE - a
    return a, tuple((ZERO if i == x else v / rest) for i, v in enumerate(p))


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class _Entry:
    description: str
    claims_exact: bool
    build: Callable[..., Callable]  # the rule's parameters (Fractions, by name) -> decide
    params: Mapping[str, str | None] = field(default_factory=dict)  # parameter -> default (None: required)


#: parameter -> (what it is, upper bound or None); every parameter is a number >= 0
_PARAMETERS = {
    "tau": ("the draft-probability threshold below which a drafted candidate is dropped", ONE),
    "epsilon": ("typical acceptance's hard threshold", None),
    "delta": ("typical acceptance's entropy-scaled threshold", None),
}

_REGISTRY: dict[str, _Entry] = {
    "standard": _Entry(
        "accept with min(1, p/q); on rejection sample the residual max(p-q,0) divided by its sum (exact)",
        True, lambda: _standard),
    "unnormalized_residual": _Entry(
        "inverse CDF over max(p-q,0) without dividing by its sum; u beyond the residual mass falls through to the "
        "last token (biased: the bug a figure omitting normalization invites)",
        False, lambda: _unnormalized_residual),
    "resample_from_target": _Entry(
        "on rejection sample from p instead of the residual (biased)", False, lambda: _resample_from_target),
    "prune_by_draft_prob": _Entry(
        "drop a drafted candidate whose own q(x) < tau (a fresh target sample is emitted); verify kept candidates "
        "against the unchanged q (biased)",
        False, _prune_by_draft_prob, {"tau": None}),
    "prune_by_draft_prob_corrected": _Entry(
        "same pruning, kept candidates verified against q restricted to the kept set and renormalized (exact)",
        True, _prune_by_draft_prob_corrected, {"tau": None}),
    "typical_acceptance": _Entry(
        "Medusa-style: accept iff p(x) > min(epsilon, delta*exp(-H(p))), rejection emits the target argmax "
        "(lossy; defaults epsilon=0.09, delta=0.3)",
        False, _typical_acceptance, {"epsilon": "0.09", "delta": "0.3"}),
    "exact_match": _Entry(
        "accept iff the draft equals an independent target sample, else emit that sample (exact; acceptance "
        "sum p*q instead of sum min(p,q))",
        True, lambda: _exact_match),
}

#: Verification rule names and what they do.
RULES: dict[str, str] = {name: entry.description for name, entry in _REGISTRY.items()}


def _entry(name) -> _Entry:
    if not isinstance(name, str):
        raise InvalidType(f"rule must be a rule name ({', '.join(RULES)}) or a VerificationRule, "
                          f"got {type(name).__name__}", argument="rule")
    if name not in _REGISTRY:
        raise InvalidInput(f"unknown verification rule {name!r}; choose one of: {', '.join(RULES)}", argument="rule")
    return _REGISTRY[name]


def rule_parameters(name: str) -> dict[str, str | None]:
    """The parameters rule ``name`` takes, each with its default (``None``: it must be given)."""
    return dict(_entry(name).params)


def _parameter(name: str, value) -> Fraction:
    meaning, upper = _PARAMETERS[name]
    v = to_fraction(value, name)
    if v < 0 or (upper is not None and v > upper):
        bounds = f"lie in [0, {upper}]" if upper is not None else "be >= 0"
        raise InvalidInput(f"{name} = {v} must {bounds} ({meaning})")
    return v


def get_rule(name: str, *, tau=None, epsilon=None, delta=None) -> VerificationRule:
    """Build a verification rule by name (see :data:`RULES` for the names).

    ``tau`` (``prune_by_draft_prob``, ``prune_by_draft_prob_corrected``; required) and ``epsilon``, ``delta``
    (``typical_acceptance``; default 0.09 and 0.3) are numbers as :func:`~fastspec.exact.to_fraction` reads
    them.  A parameter the rule does not take is refused, not ignored.
    """
    entry = _entry(name)
    given = {k: v for k, v in (("tau", tau), ("epsilon", epsilon), ("delta", delta)) if v is not None}
    for param in given:
        if param not in entry.params:
            takers = [n for n, e in _REGISTRY.items() if param in e.params]
            raise InvalidInput(f"rule {name!r} takes no {param}; {param} applies to: {', '.join(takers)}")
    values = {}
    for param, default in entry.params.items():
        value = given.get(param, default)
        if value is None:
            raise InvalidInput(f"rule {name!r} needs {param}, {_PARAMETERS[param][0]}; pass e.g. {param}='0.3'")
        values[param] = _parameter(param, value)
    return VerificationRule(name, entry.build(**values), entry.claims_exact, entry.description, values)


def resolve_rule(rule, params: Mapping) -> VerificationRule:
    """``rule`` as a :class:`VerificationRule`: built by name with ``params``, or given as one (then without
    params)."""
    if isinstance(rule, VerificationRule):
        if params:
            raise InvalidInput(f"rule parameters ({', '.join(params)}) apply only to a rule given by name; "
                               f"the VerificationRule {rule.name!r} is already built")
        return rule
    unknown = [k for k in params if k not in _PARAMETERS]
    if unknown:
        raise InvalidType(f"unknown rule parameter {unknown[0]!r}; rules take: {', '.join(_PARAMETERS)}",
                          argument=unknown[0])
    return get_rule(rule, **params)  # a name; anything else is refused there (InvalidType)


def rule_outcomes(rule: VerificationRule, p: Dist, q: Dist) -> Iterator:
    """What ``rule`` does at one drafted position: :class:`~fastspec.exact.walk.Accept` / ``Emit`` outcomes."""
    for x, qx in enumerate(q):
        if qx == 0:
            continue
        a, rejected = rule.decide(p, q, x)
        if a:
            yield Accept(x, qx * a)
        if a != 1:
            yield Emit(qx * (1 - a), rejected)


# --------------------------------------------------------------------------- the audit of one position


@dataclass(frozen=True)
class PositionAudit(ComparedWithTarget):
    """Exact output distribution of a rule at one position, with its acceptance and TV to the target."""

    rule: str
    p: Dist
    q: Dist
    output: Dist
    acceptance: Fraction
    total_variation: Fraction


def audit_step(p, q, rule: VerificationRule | str = "standard", *, normalize: bool = False,
               **params) -> PositionAudit:
    """Exact output distribution, acceptance and TV to ``p`` of ``rule`` at one drafted position.

    ``rule``: a name of :data:`RULES` (then ``params`` are its parameters, see :func:`get_rule`) or a
    :class:`VerificationRule`.
    """
    rule = resolve_rule(rule, params)
    p, q = pair(p, q, normalize)
    out, accepted = position_law(rule_outcomes(rule, p, q), len(p))
    return PositionAudit(rule.name, p, q, out, sum(accepted.values(), ZERO), total_variation(out, p))
