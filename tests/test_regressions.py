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
                            np.tile(tokens, (B, 1)), parent=np.tile(parent, (B, 1)), candidate_sampling=sampling,
                            seed=1)
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


# ------------------------------------------------------------------ simulator / loader review findings

def _dump(path, tl, dl, **kw):
    return fastspec.save_dump(str(path), tl, {"d": dl}, temperature=1.0, **kw)


def test_greedy_simulation_does_not_report_false_disagreement(tmp_path):
    from fastspec.simulation import simulate

    rng = np.random.default_rng(0)
    tl = rng.normal(0, 2, (6, 40, 8))
    dl = tl + rng.normal(0, 1.5, tl.shape)
    r = simulate(_dump(tmp_path / "g.npz", tl, dl), k=range(1, 9), temperature=0.0, trials=40)
    assert r.disagreements == []
    for row in r.results:
        assert row.mean_acceptance_length == pytest.approx(row.mean_acceptance_length_exact, rel=1e-9)


def test_nothing_drafted_gives_one_token_per_step(tmp_path):
    from fastspec.simulation import simulate

    rng = np.random.default_rng(1)
    tl = rng.normal(0, 1, (3, 4, 5))
    r = simulate(_dump(tmp_path / "l1.npz", tl, tl + 0.1, lengths=np.ones(3, dtype=np.int64)), k=2, trials=4)
    row = r.results[0]
    assert row.mean_acceptance_length == 1.0 and row.ci95 == (1.0, 1.0) and row.mc_agrees_with_exact
    assert row.mean_acceptance_length_exact == 1.0


def test_fortran_ordered_members_are_read_correctly(tmp_path):
    from fastspec.acceptance import dump_acceptance

    rng = np.random.default_rng(2)
    tl = rng.normal(0, 2, (3, 7, 11))
    dl = tl + rng.normal(0, 1, tl.shape)
    want = fastspec.acceptance_rates(tl, dl)
    for saver, name in ((np.savez_compressed, "fz.npz"), (np.savez, "fs.npz")):
        path = str(tmp_path / name)
        saver(path, target_logits=np.asfortranarray(tl), draft_logits=np.asfortranarray(dl))
        got = dump_acceptance(path, max_bytes=3 * 11 * 8)["draft"].alpha
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_huge_integers_are_bad_input_not_crashes(tmp_path):
    from fastspec.simulation import simulate

    rng = np.random.default_rng(3)
    tl = rng.normal(0, 1, (2, 5, 4))
    path = _dump(tmp_path / "h.npz", tl, tl + 0.2)
    with pytest.raises((ValueError, TypeError)):
        simulate(path, k=1, top_k=10 ** 20, trials=4)
    with pytest.raises(ValueError, match="64 bits"):
        simulate(path, k=1, seed=10 ** 20, trials=4)
    with pytest.raises(ValueError, match="trials"):
        simulate(path, k=1, trials=3 * 10 ** 12)
    np.savez(str(tmp_path / "m.npz"), target_logits=tl, draft_logits=tl, top_k=np.array(1e20))
    with pytest.raises(ValueError, match="top_k"):
        fastspec.load_dump(str(tmp_path / "m.npz"))


def test_bernoulli_blocks_do_not_change_results():
    from fastspec.simulation.runners import bernoulli as _bernoulli

    rng = np.random.default_rng(4)
    alpha = rng.random((37, 30))
    lengths = rng.integers(1, 31, 37).astype(np.int64)
    ids = np.arange(37, dtype=np.int64)
    whole = _bernoulli(alpha, lengths, ids, 5, 20, 10, 7)
    small = _bernoulli(alpha, lengths, ids, 5, 20, 10, 7, max_bytes=1)  # one row per block
    for key in ("tokens", "steps", "drafted", "accepted", "hist", "pos_accepted"):
        np.testing.assert_array_equal(whole[key], small[key])


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("kw", [dict(top_k=3), dict(top_p=0.5), dict(min_p=0.3)])
def test_invalid_draft_is_reported_whatever_the_random_path(method, kw):
    # Issue #12: a drafted token with q(x) = 0 after top-k/top-p/min-p was reported only when its position was
    # visited; after a rejection (or with w = 0 in block verification) the row stopped looking.  Position 0 is
    # rejected for sure (p(x) = 0), the invalid draft sits at position 2.
    V = 16
    rng = np.random.default_rng(1)
    xt = rng.standard_normal((1, 4, V))
    xd = rng.standard_normal((1, 3, V))
    xt[0, 0, :] = -30.0
    xt[0, 0, 5] = 30.0  # p_0 is (numerically) a point mass on token 5 ...
    toks = np.array([[int(np.argmax(xd[0, 0])), int(np.argmax(xd[0, 1])), int(np.argmin(xd[0, 2]))]])
    assert toks[0, 0] != 5  # ... so the first draft is rejected
    for seed in range(12):
        with pytest.raises(ValueError, match=r"draft_tokens\[0, 2\].*q = 0"):
            verify_logits(xt, xd, toks, seed=seed, method=method, **kw)
    ok = toks.copy()
    ok[0, 2] = int(np.argmax(xd[0, 2]))  # the argmax survives every filter
    verify_logits(xt, xd, ok, seed=0, method=method, **kw)
