"""fastspec.simulate: Monte-Carlo replay vs the exact DP vs the closed form; token mode; cost model."""
from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from scipy import stats

from fastspec import save_dump
from fastspec.acceptance import expected_tokens_closed_form, expected_tokens_per_step
from fastspec.simulation import CostModel, VerifyCost, batch_means_ci, parse_k_list, simulate
from fastspec.simulation.runners import bernoulli as _bernoulli

P3 = np.log([0.5, 0.3, 0.2])
Q3 = np.log([0.2, 0.5, 0.3])  # alpha = 0.7 exactly (worked case)


def constant_alpha_dump(path, n=4, t=400, meta=True):
    target = np.broadcast_to(P3, (n, t, 3)).astype(np.float64)
    draft = np.broadcast_to(Q3, (n, t, 3)).astype(np.float64)
    kw = dict(temperature=1.0, top_k=0, top_p=1.0) if meta else {}
    return save_dump(str(path), target, {"d": draft}, **kw)


def random_dump(path, n=5, t=24, v=8, seed=0, drafts=("a", "b"), scale=1.0):
    rng = np.random.default_rng(seed)
    target = rng.normal(0, 2, (n, t, v))
    ds = {name: target + rng.normal(0, scale * (i + 1), (n, t, v)) for i, name in enumerate(drafts)}
    lengths = np.full(n, t)
    lengths[0] = t // 2
    return save_dump(str(path), target.astype(np.float32), {k: v.astype(np.float32) for k, v in ds.items()},
                     lengths=lengths, temperature=1.0, top_k=0, top_p=1.0)


# ------------------------------------------------------------------ exact vs closed form

def test_exact_matches_closed_form_up_to_end_effect(tmp_path):
    for k in (1, 2, 4, 8):
        closed = expected_tokens_closed_form(0.7, k)
        gaps = []
        for t in (200, 400):
            r = simulate(constant_alpha_dump(tmp_path / f"c{t}.npz", n=2, t=t), k=k, trials=20)
            row = r.results[0]
            assert row.alpha == pytest.approx(0.7, abs=1e-12)
            assert row.mean_acceptance_length_closed_form == pytest.approx(closed, rel=1e-12)
            gaps.append(abs(row.mean_acceptance_length_exact - closed))
        # the end effect is O(k / T): at T = 400 the gap is below 2.5 k / T and about half the T = 200 gap
        assert gaps[1] < 2.5 * k / 400
        assert gaps[1] < 0.6 * gaps[0] + 1e-12


def test_end_effect_is_the_documented_convention():
    # L = 3, k = 4: the first step drafts min(4, 2) = 2; with alpha = 1 it accepts both and emits a bonus: 3 tokens
    s = expected_tokens_per_step(np.ones((1, 3)), 4)
    assert s.steps == 1 and s.accepted == 2 and s.mean_acceptance_length == 3
    # alpha = 0 everywhere: steps at t = 0, 1 each emit one recovered token, t = 2 is a plain target step
    s = expected_tokens_per_step(np.zeros((1, 3)), 4)
    assert s.steps == 2 and s.accepted == 0 and s.mean_acceptance_length == 1


# ------------------------------------------------------------------ Monte-Carlo vs exact, calibrated

N_CALIBRATED = 12
BATCHES = 100
# two-sided threshold for a t statistic with BATCHES-1 df so that all N_CALIBRATED checks together fail
# with probability < 1e-6 for a correct implementation
T_THRESHOLD = stats.t.isf(1e-6 / (2 * N_CALIBRATED), BATCHES - 1)


def _mc_z(alpha, lengths, k, seed, alpha_for_mc=None):
    row_ids = np.arange(alpha.shape[0], dtype=np.int64)
    mc = _bernoulli(alpha if alpha_for_mc is None else alpha_for_mc, lengths, row_ids, k, 2000, BATCHES, seed)
    est, se, _ = batch_means_ci(mc["tokens"], mc["steps"])
    exact = expected_tokens_per_step(alpha, k, lengths=lengths).mean_acceptance_length
    return (est - exact) / se


@pytest.mark.statistical
def test_mc_agrees_with_exact_calibrated():
    rng = np.random.default_rng(11)
    alpha = rng.beta(3, 1.5, size=(6, 60))
    lengths = np.array([60, 60, 45, 30, 60, 12], dtype=np.int64)
    zs = [_mc_z(alpha, lengths, k, seed) for k in (1, 3, 6) for seed in range(4)]
    assert len(zs) == N_CALIBRATED
    assert max(abs(z) for z in zs) < T_THRESHOLD, zs


@pytest.mark.statistical
def test_broken_replay_is_detected():
    # a replay that under-accepts by 3% (a typical off-by-something bug) must fail the same test
    rng = np.random.default_rng(11)
    alpha = rng.beta(3, 1.5, size=(6, 60))
    lengths = np.full(6, 60, dtype=np.int64)
    z = _mc_z(alpha, lengths, 3, 0, alpha_for_mc=alpha * 0.97)
    assert abs(z) > T_THRESHOLD


def test_mc_on_constant_alpha_matches_closed_form(tmp_path):
    r = simulate(constant_alpha_dump(tmp_path / "c.npz", n=4, t=2000), k=4, trials=200, batches=50, seed=3)
    row = r.results[0]
    assert row.mc_agrees_with_exact
    slack = 6 * row.standard_error
    assert row.ci95[0] - slack < expected_tokens_closed_form(0.7, 4) < row.ci95[1] + slack
    assert row.draft_acceptance_rate == pytest.approx(row.draft_acceptance_rate_exact, abs=0.01)
    np.testing.assert_allclose(row.per_position_acceptance, [0.7 ** (j + 1) for j in range(4)], atol=0.01)
    assert sum(row.accepted_length_histogram) == pytest.approx(1.0)


# ------------------------------------------------------------------ modes

def test_token_mode_agrees_with_bernoulli_and_exact(tmp_path):
    path = random_dump(tmp_path / "r.npz", n=4, t=20, v=8, drafts=("a",), scale=0.7)
    tok = simulate(path, k=2, mode="token", trials=200, batches=20, seed=5).results[0]
    ber = simulate(path, k=2, mode="bernoulli", trials=2000, seed=5).results[0]
    assert tok.mean_acceptance_length_exact == ber.mean_acceptance_length_exact
    assert tok.token_check is not None and tok.token_check["passed"], tok.token_check
    assert abs(tok.token_check["z"]) < 5.5
    assert abs(tok.mc_vs_exact_z) < 5.5 and abs(ber.mc_vs_exact_z) < 5.5
    # the two MC estimates are independent: their difference is within 5.5 combined standard errors
    assert abs(tok.mean_acceptance_length - ber.mean_acceptance_length) < 5.5 * math.hypot(tok.standard_error,
                                                                                              ber.standard_error)


def test_greedy_alpha_is_zero_or_one(tmp_path):
    path = random_dump(tmp_path / "g.npz", n=3, t=16, v=6)
    r = simulate(path, k=3, temperature=0.0, trials=20)
    from fastspec.acceptance import dump_acceptance

    acc = dump_acceptance(path, temperature=0.0)
    for a in acc.values():
        vals = a.alpha[a.valid]
        assert set(np.unique(vals)) <= {0.0, 1.0}
    assert any("temperature 0" in w for w in r.warnings)


def test_deterministic_across_threads_and_calls(tmp_path):
    path = random_dump(tmp_path / "d.npz")
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = simulate(path, k="1-3", seed=9).as_dict()
        numba.set_num_threads(max(2, before))
        two = simulate(path, k="1-3", seed=9).as_dict()
    finally:
        numba.set_num_threads(before)
    assert one == two
    assert simulate(path, k="1-3", seed=10).as_dict() != one


def test_sparse_dump_reports_bounds(tmp_path):
    rng = np.random.default_rng(0)
    n, t, v, kk = 3, 12, 10, 4
    logits_t = rng.normal(0, 2, (n, t, v))
    logits_d = logits_t + rng.normal(0, 1, (n, t, v))

    def topk(lg):
        lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        ids = np.argsort(-lp, axis=-1)[..., :kk]
        return ids.astype(np.int64), np.take_along_axis(lp, ids, -1)

    path = save_dump(str(tmp_path / "s.npz"), topk(logits_t), {"d": topk(logits_d)}, temperature=1.0, vocab_size=v)
    r = simulate(path, k=[1, 3], draft_cost=0.1)
    for row in r.results:
        assert row.mean_acceptance_length is None and row.alpha is None
        assert 0 <= row.alpha_lower <= row.alpha_upper <= 1
        assert 1 <= row.mean_acceptance_length_lower <= row.mean_acceptance_length_upper <= row.k + 1
        assert row.speedup_lower <= row.speedup_upper
    with pytest.raises(ValueError, match="token mode needs dense"):
        simulate(path, k=1, mode="token")


def test_sampling_metadata_warnings(tmp_path):
    path = constant_alpha_dump(tmp_path / "m.npz", n=1, t=20, meta=False)
    r = simulate(path, k=1, trials=4)
    assert any("does not record the sampling config" in w for w in r.warnings)
    path = constant_alpha_dump(tmp_path / "m2.npz", n=1, t=20)
    assert simulate(path, k=1, trials=4).warnings == []
    w = simulate(path, k=1, trials=4, temperature=0.7).warnings
    assert len(w) == 1 and "temperature 0.7 (recorded 1)" in w[0]


# ------------------------------------------------------------------ cost model and parsing

def test_cost_model_and_best_k(tmp_path):
    path = constant_alpha_dump(tmp_path / "c.npz", n=2, t=300)
    r = simulate(path, k="1-8", draft_cost=0.1, trials=10)
    speeds = {row.k: row.speedup for row in r.results}
    for row in r.results:
        assert row.speedup == pytest.approx(row.mean_acceptance_length_exact / (row.k * 0.1 + 1))
    assert r.best["d"] == max(speeds, key=speeds.get)
    # with a single alpha = 0.7 and c = 0.1 the closed-form optimum is k = 4 (1.981x; k = 3: 1.948x, k = 5: 1.961x)
    from fastspec.acceptance import optimal_k

    assert r.best["d"] == optimal_k(0.7, 0.1, 8) == 4
    r2 = simulate(path, k=[1, 2], verify_cost='{"1": 1.0, "2": 1.5}', trials=10)
    assert r2.results[1].speedup == pytest.approx(r2.results[1].mean_acceptance_length_exact / 1.5)
    assert simulate(path, k=2, trials=10).results[0].speedup is None


@pytest.mark.parametrize("spec, k, value", [(None, 3, 1.0), ("1", 3, 1.0), ("1+0.05k", 4, 1.2), ("1 + 0.05*k", 2, 1.1),
                                            ("0.05k+1", 2, 1.1), ("2", 5, 2.0), ('{"4": 1.3}', 4, 1.3), (1.5, 9, 1.5)])
def test_verify_cost_parsing(spec, k, value):
    assert VerifyCost.parse(spec)(k) == pytest.approx(value)


@pytest.mark.parametrize("spec, match", [("1+x", "not understood"), ('{"a": 1}', "not an integer"),
                                         ("{", "not valid JSON"), ('{"1": -1}', "> 0"),
                                         ("nofile/x.json", "no such file"), ('{"2": "x"}', "not a number")])
def test_verify_cost_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        VerifyCost.parse(spec)


def test_verify_cost_table_coverage():
    with pytest.raises(ValueError, match="no entry for k = 3"):
        CostModel(0.1, VerifyCost.parse('{"1": 1, "2": 1.1}')).step_cost(3)


@pytest.mark.parametrize("spec, ks", [(4, [4]), ("4", [4]), ("1,2,4,8", [1, 2, 4, 8]), ("1-4", [1, 2, 3, 4]),
                                      ("1-3,8", [1, 2, 3, 8]), ([2, 1, 2], [1, 2])])
def test_parse_k_list(spec, ks):
    assert parse_k_list(spec) == ks


@pytest.mark.parametrize("spec", ["0", "-1", "a", "4-2", "", "1,,2", "999"])
def test_parse_k_list_errors(spec):
    with pytest.raises(ValueError):
        parse_k_list(spec)


def test_simulate_argument_errors(tmp_path):
    path = constant_alpha_dump(tmp_path / "c.npz", n=1, t=20)
    with pytest.raises(ValueError, match="mode"):
        simulate(path, mode="fast")
    with pytest.raises(ValueError, match="trials"):
        simulate(path, trials=1)
    with pytest.raises(ValueError, match="no draft named 'zz'"):
        simulate(path, drafts=["zz"])
    with pytest.raises(ValueError, match="draft_cost"):
        simulate(path, draft_cost=-1)
    with pytest.raises(ValueError, match="temperature"):
        simulate(path, temperature=-1)


# ------------------------------------------------------------------ monotonicity (what makes sparse bounds bounds)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300)
@given(st.integers(1, 3), st.integers(2, 9), st.integers(1, 5), st.integers(0, 2 ** 31 - 1))
def test_mean_acceptance_length_is_monotone_in_alpha(n, t, k, seed):
    rng = np.random.default_rng(seed)
    grid = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    lo = rng.choice(grid, size=(n, t))
    hi = np.minimum(1.0, lo + rng.choice([0.0, 0.1, 0.5, 1.0], size=(n, t)))
    mid = lo + (hi - lo) * rng.random((n, t))
    f = lambda a: expected_tokens_per_step(a, k).mean_acceptance_length  # noqa: E731
    assert f(lo) <= f(mid) + 1e-12 <= f(hi) + 2e-12
