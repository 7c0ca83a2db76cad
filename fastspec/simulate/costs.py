"""Deprecated: :mod:`fastspec.simulation.costs` (this module is that one)."""
from . import moved

moved(__name__)
