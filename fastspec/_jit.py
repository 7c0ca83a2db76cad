"""The one place that owns Numba compilation options.

Every compiled kernel in fastspec is decorated with :func:`kernel` (serial) or
:func:`parallel_kernel` (``prange`` over rows).  Options live here so that the
whole library changes together:

* ``cache=True`` -- compiled code is cached next to the sources (or under
  ``NUMBA_CACHE_DIR`` when the package directory is read-only).
* ``fastmath`` is a *safe* subset: ``nsz``, ``arcp``, ``contract``, ``reassoc``.
  ``nnan`` and ``ninf`` are never enabled -- they let LLVM assume NaN/inf
  cannot occur, which silently deletes ``np.isnan``/``np.isinf`` checks
  (numba issue 9383) and -inf is a legal masked logit here.  ``afn``
  (approximate libm calls) is left out so ``exp``/``log`` stay accurate to
  an ulp and kernels can be checked against the exact Fraction path.
* ``nogil=True`` so services can call kernels from several Python threads.
"""
from __future__ import annotations

import os
import tempfile

import numba

FASTMATH_FLAGS = frozenset({"nsz", "arcp", "contract", "reassoc"})


def _ensure_cache_dir() -> None:
    """Point Numba's cache at a writable place when the package dir is not writable."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.access(here, os.W_OK):
        path = os.path.join(tempfile.gettempdir(), "fastspec-numba-cache")
        os.makedirs(path, exist_ok=True)
        numba.config.CACHE_DIR = path


_ensure_cache_dir()


def kernel(fn=None, **overrides):
    """``numba.njit`` with fastspec's options (serial)."""
    opts = dict(cache=True, fastmath=set(FASTMATH_FLAGS), nogil=True, error_model="numpy")
    opts.update(overrides)
    if fn is None:
        return lambda f: numba.njit(**opts)(f)
    return numba.njit(**opts)(fn)


def parallel_kernel(fn=None, **overrides):
    """``numba.njit(parallel=True)`` with fastspec's options; use ``numba.prange`` over rows."""
    overrides.setdefault("parallel", True)
    return kernel(fn, **overrides)


prange = numba.prange
