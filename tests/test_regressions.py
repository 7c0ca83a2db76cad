"""Regression tests for bugs found in review (each failed before its fix)."""
from __future__ import annotations

import numpy as np
import pytest

import fastspec
from fastspec import verify_logits, verify_probs, verify_tree_probs


def test_tiny_positive_temperature_is_refused_not_nan():
    x = np.array([[[1.0, 2.0, 0.5], [0.0, 0.0, 1.0]]])
    for call in (lambda: fastspec.probabilities(x[0], temperature=1e-310),
                 lambda: verify_logits(x, None, np.array([[1]]), temperature=1e-310),
                 lambda: verify_logits(x, None, np.array([[1]]), temperature=np.array([1e-310]))):
        with pytest.raises(ValueError, match="too small"):
            call()
    # a small but representable temperature is effectively greedy and never NaN
    p = fastspec.probabilities(x[0], temperature=1e-200)
    assert np.isfinite(p).all() and np.allclose(p.sum(-1), 1)


def test_bonus_flag_is_false_after_a_rejection():
    p = np.array([[[0.0, 1.0], [0.5, 0.5]]])
    q = np.array([[[1.0, 0.0]]])
    r = verify_probs(p, q, np.array([[0]]))  # the draft has p = 0: always rejected
    assert r.tokens.tolist() == [[1, -1]] and r.bonus.tolist() == [False]
    r = verify_probs(np.array([[[0.0, 1.0], [0.5, 0.5]]]), np.array([[[0.0, 1.0]]]), np.array([[1]]))
    assert r.num_accepted.tolist() == [1] and r.bonus.tolist() == [True]
    r = verify_probs(p, q, np.array([[-1]]), num_draft=np.array([0]))  # nothing drafted: the one token is a bonus
    assert r.bonus.tolist() == [True]


def _tree_counts(p, q, tokens, parent, n, sampling="without_replacement"):
    B = n
    res = verify_tree_probs(np.tile(p, (B, len(tokens), 1)), np.tile(q, (B, len(tokens), 1)),
                            np.tile(tokens, (B, 1)), parent=np.tile(parent, (B, 1)), sampling=sampling, seed=1)
    first = res.tokens[:, 0]
    return np.bincount(first, minlength=len(p)) / B


def test_without_replacement_never_emits_zero_probability_token():
    # q sums to 1 + 5e-7 (accepted by validation): 1 - used went negative and accepted token 2 with p = 0
    p = np.array([0.1, 0.1, 0.0, 0.8])
    q = np.array([0.6, 0.4000005, 1e-9, 0.0])
    freq = _tree_counts(p, q, [0, 0, 1, 2], [-1, 0, 0, 0], 4000)
    assert freq[2] == 0


def test_without_replacement_point_mass_after_rounding():
    # 1 - used rounded to 0: the second candidate was always rejected and the output was biased (0.75, 0.25)
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([1.0, 3e-17, 0.0])
    freq = _tree_counts(p, q, [0, 0, 1], [-1, 0, 0], 20000)
    # 20000 draws of a fair coin: sd 0.0035; 6 sd bound
    assert abs(freq[0] - 0.5) < 0.021 and abs(freq[1] - 0.5) < 0.021
