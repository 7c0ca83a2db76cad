"""fastspec.analysis: the trajectory DP against brute force, the closed forms (Leviathan et al.), optimal k."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from fastspec.analysis import expected_speedup, expected_tokens_closed_form, expected_tokens_per_step, optimal_k


# ---------------------------------------------------------------- trajectory DP
def _brute_force(alpha, L, k):
    """Enumerate the per-position coins (each position is drafted at most once)."""
    steps = drafted = accepted = 0.0
    per_pos = np.zeros(k)
    for coins in itertools.product((0, 1), repeat=L):
        pr = 1.0
        for t, c in enumerate(coins):
            pr *= alpha[t] if c else 1.0 - alpha[t]
        if pr == 0.0:
            continue
        t = 0
        while t < L:
            d = min(k, L - 1 - t)
            if d == 0:
                t += 1
                continue
            j = 0
            while j < d and coins[t + j]:
                j += 1
            steps += pr
            drafted += pr * d
            accepted += pr * j
            per_pos[:j] += pr
            t += j + 1
    return steps, drafted, accepted, per_pos


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_dp_equals_brute_force(k):
    rng = np.random.default_rng(k)
    for L in (1, 2, 5, 9):
        alpha = rng.uniform(size=L)
        alpha[rng.uniform(size=L) < 0.2] = 1.0
        s = expected_tokens_per_step(alpha, k)
        S, D, A, pp = _brute_force(alpha, L, k)
        assert s.steps == pytest.approx(S, abs=1e-12)
        assert s.drafted == pytest.approx(D, abs=1e-12)
        assert s.accepted == pytest.approx(A, abs=1e-12)
        if S > 0:
            np.testing.assert_allclose(s.per_position_acceptance, pp / S, atol=1e-12)
            assert s.mean_acceptance_length == pytest.approx(1 + A / S, abs=1e-12)
            assert s.draft_acceptance_rate == pytest.approx(A / D, abs=1e-12)


def test_dp_lengths_and_aggregation():
    rng = np.random.default_rng(5)
    a = rng.uniform(size=(3, 8))
    lengths = np.array([8, 3, 1])
    s = expected_tokens_per_step(a, 2, lengths=lengths)
    tot = [_brute_force(a[n, :L], L, 2) for n, L in enumerate(lengths)]
    assert s.steps == pytest.approx(sum(x[0] for x in tot), abs=1e-12)
    assert s.accepted == pytest.approx(sum(x[2] for x in tot), abs=1e-12)
    # the padding values must not matter
    b = a.copy()
    b[1, 3:] = 0.123
    assert expected_tokens_per_step(b, 2, lengths=lengths).accepted == pytest.approx(s.accepted, abs=1e-15)
    with pytest.raises(ValueError, match=r"alpha\[0, 1\]"):
        expected_tokens_per_step(np.array([[0.5, 1.5, 0.2]]), 2)
    with pytest.raises(ValueError, match="k must be"):
        expected_tokens_per_step(a, 0)


@pytest.mark.parametrize("alpha,k", [(0.8, 5), (0.9, 10), (0.3, 1), (0.0, 3), (1.0, 4)])
def test_dp_equals_closed_form_with_constant_alpha(alpha, k):
    # End effects controlled: L = m (k + 1) + 1 with alpha in {0, 1} is exact; otherwise the
    # truncated final steps are a vanishing fraction of a long sequence.
    if alpha in (0.0, 1.0):
        L = 7 * (k + 1) + 1
        s = expected_tokens_per_step(np.full(L, alpha), k)
        assert s.mean_acceptance_length == pytest.approx(expected_tokens_closed_form(alpha, k), abs=1e-12)
    L = 200_000
    s = expected_tokens_per_step(np.full(L, alpha), k)
    ref = expected_tokens_closed_form(alpha, k)
    assert s.mean_acceptance_length == pytest.approx(ref, rel=20 * (k + 1) / L)
    for j in range(k):
        assert s.per_position_acceptance[j] == pytest.approx(alpha ** (j + 1), abs=1e-3)


def test_closed_forms_match_leviathan():
    assert round(expected_tokens_closed_form(0.8, 5), 2) == 3.69
    assert round(expected_tokens_closed_form(0.9, 10), 2) == 6.86
    assert round(expected_speedup(0.8, 5, 0.0), 2) == 3.69
    assert expected_speedup(0.8, 4, 0.1) == pytest.approx(2.401, abs=5e-4)
    assert expected_tokens_closed_form(1.0, 4) == 5.0
    assert expected_tokens_closed_form(0.0, 4) == 1.0
    k = optimal_k(0.8, 0.1, 64)
    assert all(expected_speedup(0.8, j, 0.1) <= expected_speedup(0.8, k, 0.1) for j in range(65))
    assert optimal_k(0.1, 0.5) == 0  # alpha < c: never worth it
    assert optimal_k(0.9, 0.0, 20) == 20
    with pytest.raises(ValueError):
        expected_tokens_closed_form(1.2, 3)
    with pytest.raises(ValueError):
        expected_speedup(0.5, 3, -1)


def test_position_dependent_alpha_differs_from_iid():
    # Jensen: alternating easy/hard positions vs their mean plugged into the formula
    a = np.tile([1.0, 1.0, 1.0, 0.0], 5000)  # blocks restart right after the hard position
    s = expected_tokens_per_step(a, 4)
    assert s.mean_acceptance_length == pytest.approx(4.0, abs=1e-3)
    assert expected_tokens_closed_form(a.mean(), 4) == pytest.approx(3.05078125)
