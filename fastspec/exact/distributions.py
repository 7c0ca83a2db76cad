"""What verify steps emit, exactly: one step (:func:`block_distribution`) and repeated steps with context
rollback (:func:`sequence_distribution`), for every verification method, compared with the target's own
autoregressive distribution.

``method`` (:data:`METHODS`): "token" (token-by-token verification with a per-position ``rule``), "block"
(block verification, :mod:`fastspec.exact.block`) or "candidates" (token trees with ``widths[i]`` candidates
per node at depth i + 1, drawn with ``candidate_sampling``, :mod:`fastspec.exact.candidates`).  All three are rules of
the one step enumerator :func:`~fastspec.exact.walk.walk_step`.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction

from ..errors import InvalidInput
from ..methods import VERIFICATION_METHODS, check_candidate_sampling, check_method
from . import block
from .candidates import candidate_outcomes, check_widths
from .core import ONE, ZERO, ComparedWithTarget, Dist, check_count, tv_mappings
from .rules import VerificationRule, resolve_rule, rule_outcomes
from .walk import Emit, Model, Rule, extend_with_target, models, target_sequence_distribution, walk_step

__all__ = ["METHODS", "BlockDistribution", "block_distribution", "SequenceDistribution", "sequence_distribution"]

#: The exact path's verification methods: the registry's (:data:`fastspec.methods.VERIFICATION_METHODS`) and
#: "candidates" (token trees; the float path verifies them with ``verify_tree_*``).
METHODS = (*VERIFICATION_METHODS, "candidates")


@dataclass(frozen=True)
class BlockDistribution(ComparedWithTarget):
    """Exact distribution of what one verify step with ``k`` drafts emits.

    ``rule`` names what verified: the token-verification rule, ``"block"``, or
    ``"candidates:SAMPLING:W1xW2..."``.  ``emitted`` maps the emitted token tuple
    (accepted drafts, then the recovered or bonus token) to its probability.
    ``completed`` extends every emitted tuple to k + 1 tokens with the target's
    own continuation; for an exact method it equals ``target``, the target's
    autoregressive distribution over k + 1 tokens, and ``total_variation`` is 0.
    For block verification ``expected_accepted`` (E[tau]) also equals
    ``sum(block_acceptance_weights(...))``.
    """

    k: int
    rule: str
    emitted: dict
    accepted_count: Dist  # P(j drafts accepted), j = 0..k
    expected_accepted: Fraction
    expected_tokens: Fraction  # tokens per verify step, recovered/bonus included
    completed: dict
    target: dict
    total_variation: Fraction


@dataclass(frozen=True)
class SequenceDistribution(ComparedWithTarget):
    """Exact distribution of the first ``length`` tokens produced by repeated verify steps."""

    k: int
    length: int
    rule: str
    distribution: dict
    target: dict
    total_variation: Fraction
    expected_steps: Fraction  # expected number of verify steps to produce `length` tokens


@dataclass(frozen=True)
class _Method:
    """A verification method resolved for the enumerator: its name in results, its rule, the rule's start."""

    name: str
    rule: Rule
    start: object = None


def _per_position(outcomes) -> Rule:
    """A step rule from a one-position rule ``outcomes(p, q, depth)``: a bonus token from p after k drafts."""
    def rule(p, q, depth, _state):
        return (Emit(ONE, p),) if q is None else outcomes(p, q, depth)

    return rule


def check_exact_method(method) -> str:
    """``method`` if it is one of :data:`METHODS`, else InvalidInput."""
    if method == "candidates":
        return method
    try:
        return check_method(method)
    except InvalidInput as exc:
        raise InvalidInput(f"{exc}; or 'candidates' (token trees: widths= candidates per depth)") from None


def _resolve(method, k: int, rule, rule_params, widths, candidate_sampling) -> _Method:
    check_exact_method(method)
    name = rule.name if isinstance(rule, VerificationRule) else rule
    if method != "token" and isinstance(name, str) and (name != "standard" or rule_params):
        raise InvalidInput(f"rule {name!r} applies to token verification only (method='token'), not to "
                           f"method={method!r}; drop rule and its parameters", argument="rule")
    verifier = resolve_rule(rule, rule_params)  # a bad name or type is refused whatever the method
    if method != "candidates" and (widths is not None or candidate_sampling is not None):
        raise InvalidInput(f"widths and candidate_sampling apply to method='candidates' only, not to method={method!r}")
    if method == "token":
        return _Method(verifier.name, _per_position(lambda p, q, _depth: rule_outcomes(verifier, p, q)))
    if method == "block":
        return _Method("block", block.rule, block.START)
    widths = (1,) * k if widths is None else check_widths(widths)
    if len(widths) != k:
        raise InvalidInput(f"widths has {len(widths)} entries but k = {k}; give one width per depth")
    candidate_sampling = check_candidate_sampling("iid" if candidate_sampling is None else candidate_sampling)
    return _Method(f"candidates:{candidate_sampling}:{'x'.join(map(str, widths))}",
                   _per_position(lambda p, q, depth: candidate_outcomes(p, q, widths[depth], candidate_sampling)))


def block_distribution(target: Model, draft: Model, k: int, *, method: str = "token", prefix: tuple = (),
                       rule: VerificationRule | str = "standard", widths=None, candidate_sampling: str | None = None,
                       **rule_params) -> BlockDistribution:
    """Enumerate exactly one verify step with ``k`` drafts after ``prefix``.

    ``target`` and ``draft`` are functions ``prefix -> distribution`` (tuples of
    token ids to probability vectors over one vocabulary).  ``method``:

    * ``"token"`` (default): token verification with ``rule`` (a name of
      :data:`~fastspec.exact.RULES`, its parameters as keywords, or a
      :class:`~fastspec.exact.VerificationRule`);
    * ``"block"``: block verification (Sun et al. 2024);
    * ``"candidates"``: a token tree with ``widths[i]`` candidates per node at depth i + 1
      (default ``(1,) * k``, which is token verification), drawn with ``candidate_sampling``
      (default ``"iid"``); an accepted candidate's children are judged next, when all
      children of a node are rejected the residual token is emitted.
    """
    k = check_count(k, "k")
    how = _resolve(method, k, rule, rule_params, widths, candidate_sampling)
    t, d = models(target, draft)
    prefix = tuple(prefix)
    emitted, accepted = walk_step(t, d, k, how.rule, prefix, start=how.start)
    expected_accepted = sum((j * pj for j, pj in enumerate(accepted)), ZERO)
    completed = extend_with_target(emitted, t, prefix, k + 1)
    own = target_sequence_distribution(t, k + 1, prefix)
    return BlockDistribution(k, how.name, emitted, accepted, expected_accepted, expected_accepted + 1,
                             completed, own, tv_mappings(completed, own))


def sequence_distribution(target: Model, draft: Model, k: int, length: int, *, method: str = "token",
                          prefix: tuple = (), rule: VerificationRule | str = "standard", widths=None,
                          candidate_sampling: str | None = None, **rule_params) -> SequenceDistribution:
    """Enumerate repeated verify steps until ``length`` tokens exist.

    Each step starts from the context rolled back to the accepted prefix plus the
    emitted token (what the KV caches hold after rollback); tokens past
    ``length`` are cut off.  Compared with the target's own distribution over
    ``length`` tokens.  ``method``, ``rule``, ``widths`` and ``candidate_sampling`` as in
    :func:`block_distribution`, for every step.
    """
    k = check_count(k, "k")
    length = check_count(length, "length")
    how = _resolve(method, k, rule, rule_params, widths, candidate_sampling)
    t, d = models(target, draft)
    prefix = tuple(prefix)
    steps: dict[tuple, dict] = {}
    final: dict[tuple, Fraction] = defaultdict(Fraction)
    expected_steps = ZERO
    frontier = [((), ONE)] if length > 0 else []
    if length == 0:
        final[()] = ONE
    while frontier:
        gen, pr = frontier.pop()
        expected_steps += pr
        ctx = prefix + gen
        if ctx not in steps:
            steps[ctx] = walk_step(t, d, k, how.rule, ctx, start=how.start)[0]
        for y, py in steps[ctx].items():
            new = gen + y
            if len(new) >= length:
                final[new[:length]] += pr * py
            else:
                frontier.append((new, pr * py))
    own = target_sequence_distribution(t, length, prefix)
    return SequenceDistribution(k, length, how.name, dict(final), own, tv_mappings(final, own), expected_steps)
