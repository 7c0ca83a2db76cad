"""The one place that owns Numba compilation options and caching.

Every compiled function in fastspec is decorated with :func:`kernel` (serial) or :func:`parallel_kernel`
(``prange``).  Options:

* ``fastmath = FASTMATH_FLAGS = {"nsz"}``.  Never ``nnan``/``ninf`` (they let LLVM delete ``np.isnan`` checks,
  numba issue 9383, and -inf is a legal masked logit); never ``afn`` (approximate libm).  And no ``reassoc``
  (nor ``contract``/``arcp``): floating-point operations are performed in the order the source writes them, so
  a sum has the same bits whether the kernel was compiled in this process or loaded from the on-disk cache,
  whatever the vector width of the CPU and wherever the code is inlined.  Sums that must vectorize are written
  with explicit lanes (:mod:`fastspec._numba.lanes`): a fixed summation order LLVM may not change.
* ``cache=True`` with fastspec's own cache class: a cached kernel is stamped with :func:`kernel_fingerprint`,
  a hash of the kernel sources (:data:`KERNEL_SOURCES`: ``_kernels/``, ``_numba/`` and ``config.py``, whose
  constants the kernels read at compile time), not with the one file that defines it, because kernels inline
  helpers from other files (an edit to the sampler must invalidate the token kernel too).  Editing any other
  module (a docstring in ``engines/``) recompiles nothing.  The hash is computed on first use (the first cache
  look-up), not at import.  A kernel defined outside those sources (a benchmark's, a test's) is also stamped with
  Numba's own stamp of its file.  Only fastspec's kernels get this class; Numba itself and other libraries'
  caches are untouched.  The cache directory follows Numba's rules (``NUMBA_CACHE_DIR``, else next to the
  sources, else the user cache dir); with no writable place at all the kernels simply compile in every process.
* :func:`library_fingerprint` hashes every source file of the package (on demand): the code identity Dask
  workers are checked against (:mod:`fastspec.distributed`).
* ``nogil=True`` so services can call kernels from several Python threads; ``error_model="numpy"``.
"""
from __future__ import annotations

import functools
import hashlib
import os

import numba
from numba.core import caching

FASTMATH_FLAGS = frozenset({"nsz"})
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_SOURCES = ("_kernels", "_numba", "config.py")
"""What the kernels are compiled from, relative to the package: every module a kernel imports at module level
lies in these (``tests/test_jit.py`` checks it)."""


def _hash_sources(paths) -> str:
    """16 hex digits of a hash over the ``.py`` files under ``paths`` (files or folders of the package), by
    their relative path and content."""
    h = hashlib.sha256()
    for top in paths:
        top = os.path.join(_PACKAGE_DIR, top)
        if os.path.isfile(top):
            found = [top]
        else:
            found = []
            for root, dirs, files in os.walk(top):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                found += [os.path.join(root, name) for name in sorted(files) if name.endswith(".py")]
        for path in found:
            h.update(os.path.relpath(path, _PACKAGE_DIR).replace(os.sep, "/").encode())
            with open(path, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()[:16]


@functools.cache
def kernel_fingerprint() -> str:
    """Hash of the kernel sources (:data:`KERNEL_SOURCES`), 16 hex digits: the stamp of every cached kernel.
    Computed once per process, on first use."""
    return _hash_sources(KERNEL_SOURCES)


@functools.cache
def library_fingerprint() -> str:
    """Hash of every ``.py`` file of the fastspec package (subpackages included), 16 hex digits: the code identity
    Dask workers are checked against.  Computed once per process, on demand."""
    return _hash_sources([""])


def _is_kernel_source(path) -> bool:
    rel = os.path.relpath(os.path.abspath(path), _PACKAGE_DIR).replace(os.sep, "/")
    return any(rel == top or rel.startswith(top + "/") for top in KERNEL_SOURCES)


class _LazyStamp:
    """A cache index's source stamp, computed when Numba first compares or writes it (the first call of a kernel),
    not when the kernel is defined.  Written to the index as the plain tuple
    ``("fastspec-kernels", kernel_fingerprint()[, Numba's stamp of the defining file])``."""

    __slots__ = ("_own", "_value")

    def __init__(self, own=None):
        self._own = own  # None, or Numba's stamp of a file outside the kernel sources (a callable)
        self._value = None

    def value(self) -> tuple:
        if self._value is None:
            self._value = ("fastspec-kernels", kernel_fingerprint()) + (() if self._own is None else (self._own(),))
        return self._value

    def __eq__(self, other):
        return self.value() == (other.value() if isinstance(other, _LazyStamp) else other)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self.value())

    def __reduce__(self):
        return tuple, (self.value(),)

    def __repr__(self):
        return repr(self.value())


def _stamped(parent):
    class _Stamped(parent):
        def get_source_stamp(self):
            if _is_kernel_source(self._py_file):
                return _LazyStamp()
            return _LazyStamp(functools.partial(parent.get_source_stamp, self))

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
