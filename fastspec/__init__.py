"""fastspec: exact, fast and checkable speculative-decoding verification on the CPU.

The library never imports typer, rich, torch or matplotlib; those belong to the
CLI (``fastspec_cli``) or to optional extras.
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import exact  # noqa: F401  (the Fraction reference path)
from ._rng import row_seeds  # noqa: F401
