"""Small statistics used across fastspec: Student-t quantiles, batch means, ratio-of-totals intervals."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["t_quantile_975", "batch_means_ci", "ratio_ci"]

_T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706}  # 4-5 digits, as published tables


def t_quantile_975(df: int) -> float:
    """Student-t 0.975 quantile (a table for df <= 5, a Cornish-Fisher expansion above: error < 1e-3)."""
    if df <= 0:
        return float("inf")
    if df in _T975:
        return _T975[df]
    z = 1.959963984540054
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3


def batch_means_ci(numerators, denominators, *, empty: float = float("nan")) -> tuple[float, float, float]:
    """(estimate, standard error, ci95 half-width) of sum(num)/sum(den) from independent batches.

    ``empty`` is the estimate when every denominator is 0 (e.g. 1 token per step when nothing was drafted);
    it is then exact (standard error 0)."""
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    total = den.sum()
    if not total > 0:
        return float(empty), 0.0, 0.0
    est = num.sum() / total
    ok = den > 0
    nb = int(ok.sum())
    if nb < 2:
        return est, float("inf"), float("inf")
    r = num[ok] / den[ok]
    se = float(r.std(ddof=1) / math.sqrt(nb))
    return est, se, se * t_quantile_975(nb - 1)


def ratio_ci(num, den) -> tuple[float, float, float]:
    """(estimate, se, ci95 half-width) of sum(num)/sum(den) with clusters (e.g. prompts) as the unit: delta-method
    (linearized) variance, Student t with clusters - 1 degrees of freedom.  Fewer than two clusters, or a zero
    denominator: infinite se and half-width (estimate NaN when the denominator is 0)."""
    num = np.asarray(num, np.float64)
    den = np.asarray(den, np.float64)
    n = len(num)
    tot = den.sum()
    est = num.sum() / tot if tot > 0 else float("nan")
    if n < 2 or tot <= 0:
        return est, float("inf"), float("inf")
    r = num - est * den
    se = math.sqrt(n / (n - 1) * float((r ** 2).sum())) / tot
    return est, se, se * t_quantile_975(n - 1)
