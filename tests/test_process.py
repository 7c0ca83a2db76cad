"""Sampling-parameter processing: fexp accuracy, the cutoff contract, probabilities vs the naive reference."""
from __future__ import annotations

import numpy as np
import pytest

import naive
import numba

from fastspec import probabilities
from fastspec._kernels.process import kth_largest, row_cutoff, top_p_cutoff
from fastspec._kernels.rows import argmax_of, row_max
from fastspec._numba.fastexp import FEXP_REL_ERROR_BOUND, fexp
from fastspec.params import per_row


@numba.njit
def fexp_array(y, out):
    for i in range(y.shape[0]):
        out[i] = fexp(y[i])
    return out


def test_fexp_error_bound():
    y = np.concatenate([np.linspace(-708.0, 0.0, 400001), -np.logspace(-12, 2.8, 20001), [0.0, -0.0]])
    out = fexp_array(y, np.empty_like(y))
    rel = np.abs(out / np.exp(y) - 1.0)
    assert rel.max() <= FEXP_REL_ERROR_BOUND
    tail = fexp_array(np.array([-708.5, -745.0, -1e6, -np.inf]), np.empty(4))
    assert (tail == 0.0).all()


def test_kth_largest_and_top_p_cutoff_against_sort():
    rng = np.random.default_rng(1)
    for n in (1, 5, 17, 100, 1000):
        for _ in range(20):
            a = rng.integers(0, 8, n).astype(float) if rng.random() < 0.5 else rng.random(n)
            k = int(rng.integers(1, n + 1))
            assert kth_largest(a.copy(), n, k) == np.sort(a)[::-1][k - 1]
            target = rng.random() * a.sum()
            c, mass = top_p_cutoff(a.copy(), n, target)
            vals = np.unique(a)[::-1]
            expect = next(v for v in vals if a[a >= v].sum() >= target)
            assert c == expect
            assert mass == pytest.approx(a[a >= c].sum(), rel=1e-12)


CASES = [
    dict(),
    dict(temperature=0.7),
    dict(temperature=1.3, top_k=5),
    dict(temperature=0.9, top_p=0.8),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.6, top_k=20, top_p=0.9, min_p=0.02),
    dict(temperature=0.0),
    dict(temperature=2.0, top_k=1),
    dict(top_p=1e-9),
]


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("V", [1, 2, 37, 8193])
def test_probabilities_matches_naive(kw, V):
    rng = np.random.default_rng(V)
    x = (rng.standard_normal((3, V)) * 3).astype(np.float32)
    x[0, : V // 3] = -np.inf if V > 3 else x[0, : V // 3]
    got = probabilities(x, **kw)
    ref = naive.probabilities(x, **kw)
    assert got.dtype == np.float64 and got.shape == x.shape
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-12)


def test_row_cutoff_contract():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1000)
    x[[5, 9]] = x.max() + 1.0  # tie for the max: lowest index wins
    scratch = np.empty(1000)
    m = row_max(x)
    assert m == x[5] and argmax_of(x, m) == 5
    inv_t, thr = row_cutoff(x, m, (0.5, 50, 0.9, 0.01), scratch)
    assert inv_t == 2.0
    w = np.where(x >= thr, np.exp((x - m) * inv_t), 0.0)
    np.testing.assert_allclose(w / w.sum(), naive.probabilities_row(x, 0.5, 50, 0.9, 0.01), atol=1e-12)
    np.testing.assert_allclose(probabilities(x, temperature=0.5, top_k=50, top_p=0.9, min_p=0.01), w / w.sum(),
                               atol=1e-15)
    x32 = x.astype(np.float32)
    assert row_cutoff(x32, row_max(x32), (1.0, 0, 1.0, 0.0), scratch)[1] == -np.inf  # nothing filtered


def test_ties_at_cutoffs_are_kept():
    x = np.array([3.0, 1.0, 2.0, 2.0, 2.0, 0.0])
    p = probabilities(x, top_k=2)
    assert (p[[0, 2, 3, 4]] > 0).all() and p[1] == 0 and p[5] == 0
    # top-p: mass of token 0 alone is < 0.5 only if ties count; here token 0 has ~0.4
    p = probabilities(np.array([1.0, 1.0, 1.0, 0.0]), top_p=0.3)
    assert (p[:3] > 0).all() and p[3] == 0
    g = probabilities(np.array([1.0, 4.0, 4.0]), temperature=0.0)
    assert g.tolist() == [0.0, 1.0, 0.0]


def test_layouts_dtypes_and_per_row_params(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 3, 50))
    ref = naive.probabilities(x, temperature=np.repeat([0.5, 1.0, 0.0, 2.0], 3), top_k=7)
    t = np.repeat([0.5, 1.0, 0.0, 2.0], 3).reshape(4, 3)
    np.testing.assert_allclose(probabilities(x, temperature=t, top_k=7), ref, atol=1e-12)
    np.testing.assert_allclose(probabilities(np.asfortranarray(x), temperature=t, top_k=7), ref, atol=1e-12)
    ro = x.copy()
    ro.setflags(write=False)
    np.testing.assert_allclose(probabilities(ro, temperature=t, top_k=7), ref, atol=1e-12)
    path = tmp_path / "x.npy"
    np.save(path, x.astype(np.float32))
    mm = np.load(path, mmap_mode="r", allow_pickle=False)
    np.testing.assert_allclose(probabilities(mm), naive.probabilities(mm), atol=1e-12)
    h = x.astype(np.float16)
    np.testing.assert_allclose(probabilities(h), naive.probabilities(h.astype(np.float64)), atol=1e-12)


def test_all_minus_inf_but_one_and_v1():
    x = np.full(10, -np.inf)
    x[7] = -3.0
    for kw in CASES:
        p = probabilities(x, **kw)
        assert p[7] == 1.0 and p.sum() == 1.0
    assert probabilities(np.array([[0.5]]), top_p=0.5).tolist() == [[1.0]]


@pytest.mark.parametrize("kw, name", [
    (dict(temperature=-1.0), "temperature"), (dict(temperature=np.nan), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-1), "top_k"),
    (dict(min_p=1.0), "min_p"), (dict(min_p=-0.1), "min_p"), (dict(top_k=1.5), "top_k"),
    (dict(temperature="hot"), "temperature"), (dict(temperature=[1.0, 2.0]), "temperature"),
])
def test_bad_params(kw, name):
    with pytest.raises((ValueError, TypeError), match=name):
        probabilities(np.zeros((3, 4)), **kw)


def test_bad_logits():
    for bad in (np.nan, np.inf):
        x = np.zeros((2, 4))
        x[1, 2] = bad
        with pytest.raises(ValueError, match=r"logits\[1, 2\]"):
            probabilities(x)
    with pytest.raises(ValueError, match="no finite logit"):
        probabilities(np.full((2, 3), -np.inf))
    with pytest.raises(TypeError, match="logits"):
        probabilities(np.array(["a", "b"]))


def test_per_row_params():
    t, k, p, mp = per_row(3, [0.0, 1.0, 2.0], 5, 0.9, 0.0)
    assert t.tolist() == [0.0, 1.0, 2.0] and k.tolist() == [5, 5, 5] and p.dtype == np.float64
    with pytest.raises(ValueError, match=r"top_p\[1\]"):
        per_row(3, 1.0, 0, [1.0, 0.0, 0.5], 0.0)
