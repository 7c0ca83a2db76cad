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


def test_kernels_are_stamped_with_the_kernel_sources_and_nothing_else_is_touched():
    cache = row_max._cache
    assert isinstance(cache, jit.KernelCache)
    assert cache._impl.locator.get_source_stamp() == ("fastspec-kernels", jit.kernel_fingerprint())
    # Numba's own cache machinery (and every other library's kernels) keep Numba's locators and stamps
    assert not any(c.__name__.startswith("Fastspec") for c in caching.CacheImpl._locator_classes)
    plain = numba.njit(cache=True)(lambda x: x + 1)
    assert type(plain._cache) is caching.FunctionCache


def test_a_kernel_outside_the_kernel_sources_also_carries_its_own_file_stamp():
    @jit.kernel
    def plus_one(x):
        return x + 1

    stamp = plus_one._cache._impl.locator.get_source_stamp().value()
    assert stamp[:2] == ("fastspec-kernels", jit.kernel_fingerprint()) and len(stamp) == 3


def _package_copy(tmp_path):
    pkg = tmp_path / "fastspec"
    shutil.copytree(os.path.dirname(os.path.dirname(jit.__file__)), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def _fingerprints(monkeypatch, pkg):
    monkeypatch.setattr(jit, "_PACKAGE_DIR", str(pkg))
    return jit._hash_sources(jit.KERNEL_SOURCES), jit._hash_sources([""])


def test_fingerprints_are_stable_and_cover_what_they_say(tmp_path, monkeypatch):
    k, lib = jit.kernel_fingerprint(), jit.library_fingerprint()
    assert k == jit.kernel_fingerprint() and lib == jit.library_fingerprint() and len(k) == len(lib) == 16 and k != lib
    pkg = _package_copy(tmp_path)
    assert _fingerprints(monkeypatch, pkg) == (k, lib)
    (pkg / "simulation" / "__init__.py").write_text((pkg / "simulation" / "__init__.py").read_text() + "\n# edited\n")
    k2, lib2 = _fingerprints(monkeypatch, pkg)
    assert k2 == k and lib2 != lib  # outside the kernels: the workers' code identity changes, no kernel stamp does
    for edited in ("_kernels/sample.py", "_numba/lanes.py", "config.py"):  # an inlined helper, a constant
        (pkg / edited).write_text((pkg / edited).read_text() + "\n# edited\n")
        k3, lib3 = _fingerprints(monkeypatch, pkg)
        assert k3 != k2 and lib3 != lib2, edited
        k2, lib2 = k3, lib3


_RUN_ONE = r"""
import sys, numpy as np
import fastspec
from fastspec._kernels.rows import row_max
from fastspec._numba import jit
assert jit.kernel_fingerprint.cache_info().currsize == 0, "kernel stamp computed at import"
assert jit.library_fingerprint.cache_info().currsize == 0, "library hash computed at import"
assert row_max(np.arange(5.0)) == 4.0
hits, misses = sum(row_max.stats.cache_hits.values()), sum(row_max.stats.cache_misses.values())
print(hits, misses)
"""


@pytest.mark.subprocess
def test_editing_a_docstring_outside_the_kernels_recompiles_nothing(tmp_path):
    """A copy of the package with its own Numba cache: a kernel compiled once is loaded from the cache after a
    docstring outside _kernels/ and _numba/ changed, and compiled again after a kernel source changed.  Neither
    hash is computed at import."""
    pkg = _package_copy(tmp_path / "src")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run():
        out = subprocess.run([sys.executable, "-c", _RUN_ONE], env=env, check=True, capture_output=True, text=True,
                             cwd=tmp_path)
        hits, misses = map(int, out.stdout.split())
        return hits, misses

    def edit(rel, old, new):
        text = (pkg / rel).read_text()
        assert old in text, rel
        (pkg / rel).write_text(text.replace(old, new, 1))

    assert run() == (0, 1)  # cold: compiled, and written to the cache
    assert run() == (1, 0)  # warm
    outside = next(p for p in sorted((pkg / "engines").rglob("*.py")) + sorted((pkg / "simulation").rglob("*.py"))
                   if p.read_text().lstrip().startswith('"""'))
    edit(outside.relative_to(pkg), '"""', '"""Edited. ')
    assert run() == (1, 0)  # a docstring elsewhere: nothing recompiled
    edit("_kernels/sample.py", '"""', '"""Edited. ')  # a kernel source (an inlined helper, not row_max's own file)
    assert run() == (0, 1)


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
