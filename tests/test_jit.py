"""The one place that owns Numba options: safe fastmath flags, fastspec-only source-stamped caches, and kernels
that give the same bits whether compiled in this process or loaded from the cache."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numba
import numpy as np
import pytest
from numba.core import caching

from fastspec._kernels.rows import row_max
from fastspec._numba import jit


def test_fastmath_flags_keep_nan_checks_and_the_summation_order():
    assert not {"nnan", "ninf", "fast", "afn", "reassoc"} & set(jit.FASTMATH_FLAGS)

    @jit.kernel(cache=False)
    def has_nan(x):
        for v in x:
            if np.isnan(v):
                return True
        return False

    assert has_nan(np.array([1.0, np.nan])) and not has_nan(np.array([1.0, -np.inf]))


def test_kernels_are_stamped_with_all_sources_and_nothing_else_is_touched():
    cache = row_max._cache
    assert isinstance(cache, jit.KernelCache)
    assert cache._impl.locator.get_source_stamp() == ("fastspec-sources", jit.SOURCE_FINGERPRINT)
    # Numba's own cache machinery (and every other library's kernels) keep Numba's locators and stamps
    assert not any(c.__name__.startswith("Fastspec") for c in caching.CacheImpl._locator_classes)
    plain = numba.njit(cache=True)(lambda x: x + 1)
    assert type(plain._cache) is caching.FunctionCache


def test_fingerprint_is_stable_and_sensitive(tmp_path, monkeypatch):
    a = jit.source_fingerprint()
    assert a == jit.source_fingerprint() == jit.SOURCE_FINGERPRINT and len(a) == 16
    pkg = tmp_path / "fastspec"
    shutil.copytree(os.path.dirname(os.path.dirname(jit.__file__)), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(jit, "_PACKAGE_DIR", str(pkg))
    assert jit.source_fingerprint() == a
    (pkg / "_kernels" / "sample.py").write_text((pkg / "_kernels" / "sample.py").read_text() + "\n# edited\n")
    assert jit.source_fingerprint() != a  # an edit in any file (here an inlined helper) changes every stamp


_ONCE = r"""
import sys, numpy as np, numba
import fastspec
if len(sys.argv) > 2:
    numba.set_num_threads(int(sys.argv[2]))
rng = np.random.default_rng(0)
P = (rng.standard_normal((64, 3001)) * 2.5).astype(np.float32)
Q = (P + rng.standard_normal((64, 3001))).astype(np.float32)
alpha = fastspec.acceptance_rates(P, Q, temperature=0.9)
alpha16 = fastspec.acceptance_rates(P.astype(np.float16), Q.astype(np.float16), temperature=1.3, top_p=0.9)
xt = P[:60].reshape(12, 5, 3001)
xd = Q[:48].reshape(12, 4, 3001)
toks = fastspec.sample_tokens(xd, np.full((12, 4), 0.37), temperature=0.8)
tok = fastspec.verify_logits(xt, xd, toks, temperature=0.8, seed=3)
blk = fastspec.verify_logits(xt, xd, toks, temperature=0.8, seed=3, method="block")
probs = fastspec.probabilities(P[:8], temperature=0.7, top_k=100)
np.savez(sys.argv[1], alpha=alpha, alpha16=alpha16, tok=tok.tokens, blk=blk.tokens, probs=probs)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_fresh_compile_equals_cached_kernel(tmp_path):
    """A first run (empty cache: every kernel compiled in the process) and later runs (kernels loaded from the
    cache, and with one thread) give the same bits: sums have a fixed order (no reassoc, explicit lanes)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    outs = []
    for i, extra in enumerate([[], [], ["1"]]):  # 1st compiles (and writes the cache); then loads it
        subprocess.run([sys.executable, "-c", _ONCE, str(tmp_path / f"o{i}.npz"), *extra], env=env, check=True)
        outs.append(np.load(tmp_path / f"o{i}.npz"))
    assert any(f.endswith(".nbi") for _, _, fs in os.walk(tmp_path / "cache") for f in fs)
    for key in outs[0].files:
        assert outs[0][key].tobytes() == outs[1][key].tobytes() == outs[2][key].tobytes(), key
