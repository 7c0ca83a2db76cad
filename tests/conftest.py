"""Shared test settings: hypothesis profiles sized for a 2-core CI machine, and one Numba code origin.

Numba cache: a kernel compiled in this process and the same kernel loaded from Numba's disk cache can differ
in the last bit (vectorized reductions are reassociated differently; see
tests/test_shards.py::test_fresh_compile_equals_cached_kernel).  Tests that compare results bitwise inside
this process (sharded vs merged dumps, thread counts, batch composition) must not mix the two origins, which
happens when a subprocess run by an earlier test writes a cache entry that this process later loads.  So the
test process gets its own empty cache directory: every kernel it runs is compiled here.  Subprocesses keep
Numba's default cache (they do not inherit this setting).
"""
import atexit
import shutil
import tempfile

import numba
from hypothesis import HealthCheck, settings

numba.config.CACHE_DIR = tempfile.mkdtemp(prefix="fastspec-test-numba-")
atexit.register(shutil.rmtree, numba.config.CACHE_DIR, ignore_errors=True)

settings.register_profile(
    "fastspec",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # CI runs are reproducible: same examples every time
)
settings.load_profile("fastspec")
