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
* :mod:`~fastspec.exact.policies` -- verification policies (:data:`POLICIES`,
  one registry; :func:`get_policy`) and :func:`audit_step`: exact policies
  give total-variation distance 0 to the target, lossy ones show by how much
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

One name per exact enumeration.  The old names still work, warn with
``DeprecationWarning`` and return the same result:

=========================================================  ===================================================
deprecated                                                 use
=========================================================  ===================================================
``block_verification_distribution(t, d, k)``               ``block_distribution(t, d, k, method="block")``
``candidate_block_distribution(t, d, widths, sampling=s)`` ``block_distribution(t, d, len(widths),
                                                           method="candidates", widths=widths, sampling=s)``
``verification_sequence_distribution(t, d, k, n, ...)``    ``sequence_distribution(t, d, k, n, ...)``
=========================================================  ===================================================

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

from ._deprecated import (block_verification_distribution, candidate_block_distribution,
                          verification_sequence_distribution)
from .block import block_acceptance_weights
from .candidates import CANDIDATE_SAMPLING, CandidateStep, candidate_step, top_candidates
from .core import FLOAT_SUM_TOLERANCE, VerifyStep, as_distribution, to_fraction, total_variation, verify_step
from .distributions import (METHODS, BlockDistribution, SequenceDistribution, block_distribution,
                            sequence_distribution)
from .policies import POLICIES, Policy, PositionAudit, audit_step, get_policy, policy_parameters
from .walk import target_sequence_distribution

__all__ = [
    "to_fraction",
    "as_distribution",
    "total_variation",
    "VerifyStep",
    "verify_step",
    "Policy",
    "POLICIES",
    "get_policy",
    "policy_parameters",
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
    # deprecated aliases (see the table above)
    "block_verification_distribution",
    "candidate_block_distribution",
    "verification_sequence_distribution",
]
