"""Deprecated: :mod:`fastspec.simulation.results` (this module is that one)."""
from . import moved

moved(__name__)
