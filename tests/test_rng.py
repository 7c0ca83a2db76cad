"""Counter-based uniforms: in (0, 1], reproducible, well spread, independent of call order; the seed range."""
from __future__ import annotations

import numba
import numpy as np
import pytest

import naive
from fastspec._numba import rng as _rng


def test_uniform_range_and_determinism():
    us = np.array([_rng.uniform(123, i, 2, 3) for i in range(20_000)])
    assert us.min() > 0 and us.max() <= 1
    again = np.array([_rng.uniform(123, i, 2, 3) for i in reversed(range(20_000))])[::-1]
    assert np.array_equal(us, again)  # a pure function of its counters


@numba.njit
def _to_uniform(h):
    """The generator's own mapping from a 64-bit hash to (0, 1] (as in fastspec._numba.rng.uniform)."""
    return (np.float64(h >> np.uint64(11)) + 1.0) * _rng._INV53


def test_uniform_is_never_zero_even_at_the_smallest_hash():
    # uniform() maps the top 53 bits of the hash h to ((h >> 11) + 1) / 2**53: check the real generator against
    # that formula, then the formula at the extreme hashes (0 and 2**64 - 1)
    for key in [(1, 2, 3, 4), (0, 0, 0, 0), (-1, 7, 9, 11)]:
        h = _rng.hash4(*key)
        assert _rng.uniform(*key) == _to_uniform(np.uint64(h))
    assert _to_uniform(np.uint64(0)) == 2.0 ** -53 > 0
    assert _to_uniform(np.uint64(2 ** 64 - 1)) == 1.0


@pytest.mark.statistical
def test_uniformity_and_stream_independence():
    n, bins = 200_000, 100
    for key in [(0, 0), (1, 0), (0, 1)]:
        us = np.array([_rng.uniform(7, key[0], key[1], i) for i in range(n)])
        counts = np.histogram(us, bins=bins, range=(0, 1))[0]
        assert naive.chi2_fits(counts, np.full(bins, 1 / bins), 1, false_alarm=1e-7)
    a = np.array([_rng.uniform(7, 0, 0, i) for i in range(n)])
    b = np.array([_rng.uniform(7, 0, 1, i) for i in range(n)])
    # correlation of independent uniforms: sd 1/sqrt(n); 6 sd bound
    assert abs(np.corrcoef(a, b)[0, 1]) < 6 / np.sqrt(n)


def test_named_streams_keep_their_counters():
    # the streams' keys are fixed forever (changing them changes every sampled token)
    S = _rng.Stream
    assert [int(S.ACCEPT), int(S.RESIDUAL), int(S.BONUS), int(S.DRAFT), int(S.BLOCK), int(S.CANDIDATE),
            int(S.SIM)] == [1, 2, 3, 4, 5, 6, 7]
    assert _rng.position_uniform(5, 3, S.ACCEPT) == _rng.uniform(5, 3, 1, 0)
    assert _rng.position_uniform(5, 3, S.BLOCK) == _rng.uniform(5, 3, 5, 0)
    assert _rng.candidate_uniform(5, 3, 2) == _rng.uniform(5, 3, 6, 2)
    assert _rng.replay_draft_uniform(5, 9, 4, 7) == _rng.uniform(5, 9, 4 * 16 + 4, 7)


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


def test_seed_range_is_the_same_before_and_after_other_calls():
    # [-2**63, 2**64) is accepted, modulo 2**64: 2**64 - 1 and -1 are one seed, whatever was called before
    first = _rng.row_seeds(2 ** 64 - 1, 3)
    _rng.row_seeds(7, 3)
    assert np.array_equal(_rng.row_seeds(2 ** 64 - 1, 3), first)
    assert np.array_equal(_rng.row_seeds(-1, 3), first)
    assert np.array_equal(_rng.row_seeds(np.array([2 ** 64 - 1], dtype=np.uint64), 1), [-1])
    for bad in (2 ** 64, -(2 ** 63) - 1):
        with pytest.raises(ValueError, match=r"\[-2\*\*63, 2\*\*64\)"):
            _rng.row_seeds(bad, 2)
