"""Deprecated: :mod:`fastspec.simulation.config` (this module is that one)."""
from . import moved

moved(__name__)
