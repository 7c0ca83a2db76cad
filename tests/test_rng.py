"""Counter-based uniforms: in (0, 1], reproducible, well spread, independent of call order."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fastspec import _rng


def test_uniform_range_and_determinism():
    us = np.array([_rng.uniform(123, i, 2, 3) for i in range(20_000)])
    assert us.min() > 0 and us.max() <= 1
    again = np.array([_rng.uniform(123, i, 2, 3) for i in reversed(range(20_000))])[::-1]
    assert np.array_equal(us, again)  # a pure function of its counters


def test_uniform_never_zero_at_smallest_hash():
    # the mapping (h >> 11) + 1 makes the smallest possible uniform 2**-53, never 0
    assert (0.0 + 1.0) * 2.0 ** -53 > 0


def test_uniformity_and_stream_independence():
    n, bins = 200_000, 100
    for key in [(0, 0), (1, 0), (0, 1)]:
        us = np.array([_rng.uniform(7, key[0], key[1], i) for i in range(n)])
        counts = np.histogram(us, bins=bins, range=(0, 1))[0]
        chi2 = ((counts - n / bins) ** 2 / (n / bins)).sum()
        assert chi2 < stats.chi2.isf(1e-7, bins - 1)
    a = np.array([_rng.uniform(7, 0, 0, i) for i in range(n)])
    b = np.array([_rng.uniform(7, 0, 1, i) for i in range(n)])
    # correlation of independent uniforms: sd 1/sqrt(n); 6 sd bound
    assert abs(np.corrcoef(a, b)[0, 1]) < 6 / np.sqrt(n)


def test_row_seeds():
    s = _rng.row_seeds(5, 4)
    assert s.dtype == np.int64 and len(set(s.tolist())) == 4
    assert np.array_equal(_rng.row_seeds(5, 4), s)
    assert np.array_equal(_rng.row_seeds(5, 6)[:4], s)  # row b's seed does not depend on the batch size
    assert np.array_equal(_rng.row_seeds([1, 2, 3], 3), [1, 2, 3])
    with pytest.raises(ValueError, match=r"shape \[3\]"):
        _rng.row_seeds([1, 2], 3)
    with pytest.raises(TypeError, match="seed must be an integer"):
        _rng.row_seeds(1.5, 3)
