"""The exact path: speculative verification in rational arithmetic.

Everything here uses :class:`fractions.Fraction`, so the identities that make
speculative sampling lossless are checked with ``==``, not with a tolerance.
Every float kernel and every simulator figure in fastspec is tested against
this package; it is the reference of references.

Modules, one concept each:

* :mod:`~fastspec.exact.core` -- exact inputs (:func:`to_fraction`,
  :func:`as_distribution`), :func:`total_variation`, and :func:`verify_step`:
  one drafted position, with accepted mass ``min(p, q)``, acceptance
  ``alpha``, the residual ``max(p - q, 0)``, the recovered distribution (the
  residual *divided by its sum*), and the output
  ``accepted + (1 - alpha) * recovered`` which equals ``p`` exactly.
* :mod:`~fastspec.exact.rules` -- verification rules (:data:`RULES`, one
  registry; :func:`get_rule`, :class:`VerificationRule`) and :func:`audit_step`:
  exact rules give total-variation distance 0 to the target, lossy ones show by how much
  they miss.
* :mod:`~fastspec.exact.candidates` -- ``w`` candidates at one position by
  recursive rejection sampling (:func:`candidate_step`).
* :mod:`~fastspec.exact.walk` -- the one enumerator of a verify step over the
  draft tree (target and draft given as functions ``prefix -> distribution``);
  token, block and candidate verification are rules of it.
* :mod:`~fastspec.exact.block` -- block verification (Sun et al. 2024) as such
  a rule, and :func:`block_acceptance_weights`.
* :mod:`~fastspec.exact.distributions` -- :func:`block_distribution` (what one
  verify step with K drafts emits) and :func:`sequence_distribution` (what
  repeated verify steps emit, each restarting from the accepted prefix plus
  the emitted token), for every ``method`` of :data:`METHODS`, both compared
  with the target's own autoregressive distribution.

One name per exact enumeration: :func:`block_distribution` and
:func:`sequence_distribution`, each with a ``method``.

Method names come from the registry :mod:`fastspec.methods` (plus
"candidates" for token trees); bad input raises
:class:`~fastspec.errors.InvalidInput` (a ``ValueError``) or
:class:`~fastspec.errors.InvalidType` (a ``TypeError``) naming the argument,
the index and the fix.

"Same distribution" here is the theorem-level claim (infinite samples).  It is
not "same text under a fixed seed" and not "close task score".
The page that explains it: ``docs/design/lossless-verification.md``.
"""
from __future__ import annotations

from fractions import Fraction as Fraction  # re-exported: fastspec.exact.Fraction

from .block import block_acceptance_weights
from .candidates import CANDIDATE_SAMPLING, CandidateStep, candidate_step, top_candidates
from .core import FLOAT_SUM_TOLERANCE, VerifyStep, as_distribution, to_fraction, total_variation, verify_step
from .distributions import (METHODS, BlockDistribution, SequenceDistribution, block_distribution,
                            sequence_distribution)
from .rules import RULES, PositionAudit, VerificationRule, audit_step, get_rule, rule_parameters
from .walk import target_sequence_distribution

__all__ = [
    "to_fraction",
    "as_distribution",
    "total_variation",
    "VerifyStep",
    "verify_step",
    "VerificationRule",
    "RULES",
    "get_rule",
    "rule_parameters",
    "PositionAudit",
    "audit_step",
    "BlockDistribution",
    "block_distribution",
    "SequenceDistribution",
    "sequence_distribution",
    "target_sequence_distribution",
    "FLOAT_SUM_TOLERANCE",
    "METHODS",
    "block_acceptance_weights",
    "CANDIDATE_SAMPLING",
    "top_candidates",
    "CandidateStep",
    "candidate_step",
]
