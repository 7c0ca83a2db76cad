"""The engines' runtime error."""
from __future__ import annotations

from ..errors import FastspecError

__all__ = ["EngineError"]


class EngineError(FastspecError, RuntimeError):
    """An engine that is missing, fails to start or fails during a run (the CLI exits 1)."""
