"""fastspec.stats: Student t at any level without SciPy (checked against SciPy), the intervals' building blocks."""
from __future__ import annotations

import math

import pytest
from scipy import stats

from fastspec.stats import t_isf, t_sf


# ------------------------------------------------------------------ Student t at any level, without SciPy

@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 19, 30, 99, 999, 10 ** 4, 0.5, 2.5])
def test_t_isf_and_t_sf_match_scipy(df):
    for p in (0.45, 0.25, 0.1, 0.025, 1e-3, 5e-5, 1e-8, 1e-12, 1e-15):
        assert t_isf(p, df) == pytest.approx(stats.t.isf(p, df), rel=1e-9)
        assert t_isf(1 - p, df) == pytest.approx(stats.t.isf(1 - p, df), rel=1e-9, abs=1e-12)
    for t in (-3.0, 0.0, 0.3, 2.0, 7.0, 80.0):
        assert t_sf(t, df) == pytest.approx(stats.t.sf(t, df), rel=1e-9)


def test_t_isf_normal_limit_and_errors():
    assert t_isf(5e-5, math.inf) == pytest.approx(stats.norm.isf(5e-5), rel=1e-12)
    assert t_sf(1.5, math.inf) == pytest.approx(stats.norm.sf(1.5), rel=1e-12)
    for bad in ((0.0, 3), (1.0, 3), (0.1, 0), (0.1, -2)):
        with pytest.raises(ValueError):
            t_isf(*bad)
