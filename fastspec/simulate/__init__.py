"""Deprecated: the simulator is the ordinary package :mod:`fastspec.simulation`, and ``fastspec.simulate(dump, ...)``
runs :func:`fastspec.simulation.simulate`.

This module keeps the old imports working: ``fastspec.simulate`` stays callable, its names
(``from fastspec.simulate import simulate, VerifyCost``) and submodules (``fastspec.simulate.ngram`` *is*
``fastspec.simulation.ngram``) resolve to the new package with a DeprecationWarning.  Import from
:mod:`fastspec.simulation` instead.
"""
from __future__ import annotations

import importlib
import inspect
import sys
import types
import warnings

from .. import simulation as _simulation

SUBMODULES = ("config", "costs", "ngram", "results", "rows", "runners", "speedup")
#: star imports of the old path give the new package's names
__all__ = list(_simulation.__all__)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def moved(name: str) -> None:
    """Make the old submodule ``name`` the new one (called by the one-line modules of this package)."""
    short = name.rpartition(".")[2]
    _deprecated(name, f"fastspec.simulation.{short}")
    sys.modules[name] = importlib.import_module(f"fastspec.simulation.{short}")


def __getattr__(name):
    if name == "CANDIDATE_SAMPLING":  # it had the registry's name but not its contents
        warnings.warn("fastspec.simulate.CANDIDATE_SAMPLING is deprecated: the candidate sampling the simulator "
                      "replays is fastspec.simulation.SIMULATED_SAMPLING (the registry of every scheme is "
                      "fastspec.methods.CANDIDATE_SAMPLING)", DeprecationWarning, stacklevel=2)
        return _simulation.SIMULATED_SAMPLING
    if name in SUBMODULES:
        _deprecated(f"fastspec.simulate.{name}", f"fastspec.simulation.{name}")
        return importlib.import_module(f"fastspec.simulation.{name}")
    try:
        value = getattr(_simulation, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    _deprecated(f"fastspec.simulate.{name}", f"fastspec.simulation.{name}")
    return value


def __dir__():
    return sorted(set(dir(_simulation)) | set(SUBMODULES))


#: ``inspect.signature(fastspec.simulate)`` is the function's
__signature__ = inspect.signature(_simulation.simulate)


class _CallableModule(types.ModuleType):
    """``fastspec.simulate(dump, k=4)``: :func:`fastspec.simulation.simulate` (no warning: that call stays)."""

    def __call__(self, *args, **kwargs):
        return _simulation.simulate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
