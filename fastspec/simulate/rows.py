"""Deprecated: :mod:`fastspec.simulation.rows` (this module is that one)."""
from . import moved

moved(__name__)
