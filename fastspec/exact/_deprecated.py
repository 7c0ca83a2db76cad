"""The old names of the exact enumerations: each warns (DeprecationWarning) and returns what the one name
returns (see the mapping in :mod:`fastspec.exact`)."""
from __future__ import annotations

import warnings

from .candidates import check_widths
from .distributions import BlockDistribution, SequenceDistribution, block_distribution, sequence_distribution
from .walk import Model

__all__ = ["block_verification_distribution", "candidate_block_distribution", "verification_sequence_distribution"]


def _warn(old: str, new: str) -> None:
    warnings.warn(f"fastspec.exact.{old} is deprecated; use fastspec.exact.{new}", DeprecationWarning, stacklevel=3)


def block_verification_distribution(target: Model, draft: Model, k: int, *, prefix: tuple = ()) -> BlockDistribution:
    """Deprecated: ``block_distribution(target, draft, k, method="block", prefix=prefix)``."""
    _warn("block_verification_distribution", 'block_distribution(target, draft, k, method="block")')
    return block_distribution(target, draft, k, method="block", prefix=prefix)


def candidate_block_distribution(target: Model, draft: Model, widths, *, sampling: str = "iid",
                                 prefix: tuple = ()) -> BlockDistribution:
    """Deprecated: ``block_distribution(target, draft, len(widths), method="candidates", widths=widths,
    sampling=sampling, prefix=prefix)``."""
    _warn("candidate_block_distribution",
          'block_distribution(target, draft, len(widths), method="candidates", widths=widths, sampling=...)')
    widths = check_widths(widths)
    return block_distribution(target, draft, len(widths), method="candidates", widths=widths, sampling=sampling,
                              prefix=prefix)


def verification_sequence_distribution(target: Model, draft: Model, k: int, length: int, *, method: str = "token",
                                       widths=None, sampling: str = "iid", prefix: tuple = (),
                                       policy="standard", **policy_params) -> SequenceDistribution:
    """Deprecated: ``sequence_distribution`` with the same arguments (``widths`` and ``sampling`` are used
    with ``method="candidates"`` only, and ignored otherwise as they were)."""
    _warn("verification_sequence_distribution", "sequence_distribution (same arguments)")
    if method != "candidates":
        widths = sampling = None
    return sequence_distribution(target, draft, k, length, method=method, widths=widths, sampling=sampling,
                                 prefix=prefix, policy=policy, **policy_params)
