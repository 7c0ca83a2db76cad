"""Deprecated: :mod:`fastspec.simulation.runners` (this module is that one)."""
from . import moved

moved(__name__)
