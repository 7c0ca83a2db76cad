"""The one place that owns Numba options: safe fastmath flags and a cache that notices any source change."""
from __future__ import annotations

import numba
import numpy as np
from numba.core import caching

from fastspec import _jit
from fastspec._fastexp import fexp


def test_fastmath_flags_keep_nan_checks():
    assert not {"nnan", "ninf", "fast", "afn"} & set(_jit.FASTMATH_FLAGS)

    @_jit.kernel(cache=False)
    def has_nan(x):
        for v in x:
            if np.isnan(v):
                return True
        return False

    assert has_nan(np.array([1.0, np.nan])) and not has_nan(np.array([1.0, -np.inf]))


def test_cached_kernels_are_stamped_with_all_sources():
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    first = impl._locator_classes[0]
    assert getattr(first, "_fastspec", False)
    py_func = fexp.py_func
    loc = None
    for cls in impl._locator_classes:
        loc = cls.from_function(py_func, py_func.__code__.co_filename)
        if loc is not None:
            break
    assert getattr(type(loc), "_fastspec", False)
    assert loc.get_source_stamp() == ("fastspec-sources", _jit.source_fingerprint())
    # functions outside fastspec keep Numba's own locators
    def outside(x):
        return x
    assert first.from_function(outside, __file__) is None


def test_fingerprint_is_stable_and_sensitive(tmp_path, monkeypatch):
    a = _jit.source_fingerprint()
    assert a == _jit.source_fingerprint() and len(a) == 16
    # a copy of the package with one edited helper gets a different stamp
    import shutil
    import os

    pkg = tmp_path / "fastspec"
    shutil.copytree(os.path.dirname(_jit.__file__), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "_fastexp.py").write_text((pkg / "_fastexp.py").read_text() + "\n# edited\n")
    monkeypatch.setattr(_jit, "__file__", str(pkg / "_jit.py"))
    assert _jit.source_fingerprint() != a
