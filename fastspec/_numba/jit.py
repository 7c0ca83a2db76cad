"""The one place that owns Numba compilation options and caching.

Every compiled function in fastspec is decorated with :func:`kernel` (serial) or :func:`parallel_kernel`
(``prange``).  Options:

* ``fastmath = FASTMATH_FLAGS = {"nsz"}``.  Never ``nnan``/``ninf`` (they let LLVM delete ``np.isnan`` checks,
  numba issue 9383, and -inf is a legal masked logit); never ``afn`` (approximate libm).  And no ``reassoc``
  (nor ``contract``/``arcp``): floating-point operations are performed in the order the source writes them, so
  a sum has the same bits whether the kernel was compiled in this process or loaded from the on-disk cache,
  whatever the vector width of the CPU and wherever the code is inlined.  Sums that must vectorize are written
  with explicit lanes (:mod:`fastspec._numba.lanes`): a fixed summation order LLVM may not change.
* ``cache=True`` with fastspec's own cache class: a cached kernel is stamped with :func:`source_fingerprint`,
  a hash of every fastspec source file, not with the mtime of the one file that defines it, because kernels
  inline helpers from other files (an edit to the sampler must invalidate the token kernel too).  Only
  fastspec's kernels get this class; Numba itself and other libraries' caches are untouched.  The cache
  directory follows Numba's rules (``NUMBA_CACHE_DIR``, else next to the sources, else the user cache dir);
  with no writable place at all the kernels simply compile in every process.
* ``nogil=True`` so services can call kernels from several Python threads; ``error_model="numpy"``.
"""
from __future__ import annotations

import hashlib
import os

import numba
from numba.core import caching

FASTMATH_FLAGS = frozenset({"nsz"})
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_fingerprint() -> str:
    """Hash of every ``.py`` file of the fastspec package (subpackages included), 16 hex digits.

    The stamp of every cached kernel and the code identity Dask workers are checked against."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(_PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                h.update(os.path.relpath(path, _PACKAGE_DIR).replace(os.sep, "/").encode())
                with open(path, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()[:16]


SOURCE_FINGERPRINT = source_fingerprint()


def _stamped(parent):
    class _Stamped(parent):
        def get_source_stamp(self):
            return ("fastspec-sources", SOURCE_FINGERPRINT)

    _Stamped.__name__ = _Stamped.__qualname__ = f"Fastspec{parent.__name__}"
    return _Stamped


class _KernelCacheImpl(caching.CompileResultCacheImpl):
    _locator_classes = [_stamped(caching.UserProvidedCacheLocator), _stamped(caching.InTreeCacheLocator),
                        _stamped(caching.UserWideCacheLocator)]


class KernelCache(caching.FunctionCache):
    """Numba's function cache with the fastspec source stamp (see the module docstring)."""

    _impl_class = _KernelCacheImpl


def _enable_cache(dispatcher):
    try:
        dispatcher._cache = KernelCache(dispatcher.py_func)
    except RuntimeError:  # no writable cache location: compile in every process
        pass
    return dispatcher


def kernel(fn=None, **overrides):
    """``numba.njit`` with fastspec's options (serial)."""
    cache = overrides.pop("cache", True)
    opts = dict(fastmath=set(FASTMATH_FLAGS), nogil=True, error_model="numpy")
    opts.update(overrides)

    def wrap(f):
        disp = numba.njit(**opts)(f)
        return _enable_cache(disp) if cache else disp

    return wrap if fn is None else wrap(fn)


def parallel_kernel(fn=None, **overrides):
    """``numba.njit(parallel=True)`` with fastspec's options; use :data:`prange` over rows."""
    overrides.setdefault("parallel", True)
    return kernel(fn, **overrides)


prange = numba.prange
