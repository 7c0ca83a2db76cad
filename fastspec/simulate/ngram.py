"""Deprecated: :mod:`fastspec.simulation.ngram` (this module is that one)."""
from . import moved

moved(__name__)
