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

import hashlib
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


def source_fingerprint() -> str:
    """Hash of every fastspec/*.py source: the stamp of every cached kernel (see below)."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            h.update(name.encode())
            with open(os.path.join(here, name), "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()[:16]


def _install_source_stamp() -> None:
    """Invalidate cached kernels whenever *any* fastspec source changes.

    Numba stamps a cached function with the mtime and size of the file that defines it, but kernels
    inline helpers from other modules (``_fastexp``, ``_process``): an edit there would leave stale
    machine code in other files' caches.  For fastspec's own files the stamp becomes a hash of all
    package sources.  Numba internals are used defensively: if they are not there, the default
    per-file stamp stays in force.
    """
    try:
        from numba.core import caching
    except ImportError:  # pragma: no cover
        return
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    classes = getattr(impl, "_locator_classes", None)
    if impl is None or classes is None or any(getattr(c, "_fastspec", False) for c in classes):
        return
    pkg = os.path.dirname(os.path.abspath(__file__)) + os.sep
    stamp = ("fastspec-sources", source_fingerprint())

    def wrap(parent):
        class _FastspecLocator(parent):
            _fastspec = True

            @classmethod
            def from_function(cls, py_func, py_file):
                if not os.path.abspath(py_file).startswith(pkg):
                    return None
                return super().from_function(py_func, py_file)

            def get_source_stamp(self):
                return stamp

        _FastspecLocator.__name__ = f"Fastspec{parent.__name__}"
        return _FastspecLocator

    ours = [wrap(c) for c in classes if c.__name__.lstrip("_") in ("UserProvidedCacheLocator", "InTreeCacheLocator",
                                                                    "UserWideCacheLocator")]
    impl._locator_classes = ours + list(classes)


_install_source_stamp()


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
