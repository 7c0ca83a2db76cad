"""Deprecated: :mod:`fastspec.simulation.speedup` (this module is that one)."""
from . import moved

moved(__name__)
