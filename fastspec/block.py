"""Block verification: ``verify_logits(..., method="block")`` / ``verify_probs(..., method="block")``.

The algorithm and its kernels are in :mod:`fastspec._kernels.block`; the method names in
:mod:`fastspec.methods`.  This module keeps the names it always had (``METHODS``, ``check_method``).
The page that explains it: ``docs/guide/block-and-candidates.md``.
"""
from __future__ import annotations

from .methods import VERIFICATION_METHODS, check_method

__all__ = ["METHODS", "check_method"]

METHODS = tuple(VERIFICATION_METHODS)
