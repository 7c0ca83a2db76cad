"""fastspec.hf.prediction: the statistics ``fastspec measure`` prints, as library functions (no model needed).

* :func:`ratio_ci` against an independent reduction (equal denominators: the mean of ratios, std / sqrt(n)) and
  scipy's Student t;
* :func:`prediction_over_prompts` against the trajectory DP run prompt by prompt;
* :func:`relative_error`, :func:`z_difference`, :func:`compare` on hand-made inputs (dense point prediction and
  sparse interval).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")
stats = pytest.importorskip("scipy.stats")

from fastspec import expected_tokens_per_step, save_dump  # noqa: E402
from fastspec.acceptance import dump_acceptance  # noqa: E402
from fastspec.hf import prediction as P  # noqa: E402

pytestmark = pytest.mark.hf


def test_ratio_ci_equal_denominators_is_mean_of_ratios():
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 3, size=9)
    est, se, half = P.ratio_ci(4 * x, np.full(9, 4.0))
    assert est == pytest.approx(x.mean())
    assert se == pytest.approx(x.std(ddof=1) / math.sqrt(9))
    assert half / se == pytest.approx(stats.t.ppf(0.975, 8), abs=1e-3)


def test_ratio_ci_degenerate():
    est, se, half = P.ratio_ci([3], [2])
    assert est == 1.5 and se == half == math.inf
    est, se, half = P.ratio_ci([0, 0], [0, 0])
    assert math.isnan(est) and se == half == math.inf


def test_relative_error_and_z():
    assert P.relative_error(2.0, 2.2) == pytest.approx(0.1)
    assert P.relative_error(2.0, None, 1.5, 2.5) == 0.0  # inside the sparse interval
    assert P.relative_error(2.0, None, 2.5, 3.0) == pytest.approx(0.25)  # to the nearest end
    assert P.relative_error(4.0, None, 2.5, 3.0) == pytest.approx(-0.25)
    assert P.relative_error(0.0, 1.0) is None and P.relative_error(float("nan"), 1.0) is None
    assert P.relative_error(2.0, None, None, None) is None
    assert P.z_difference(2.0, 0.3, 1.5, 0.4) == pytest.approx(1.0)
    assert P.z_difference(2.0, math.inf, 1.5, 0.4) is None
    assert P.z_difference(2.0, 0.0, 1.5, 0.0) is None


@pytest.fixture(scope="module")
def dense_dump(tmp_path_factory):
    rng = np.random.default_rng(3)
    N, T, V = 5, 7, 6
    target = rng.normal(size=(N, T, V)).astype(np.float32)
    draft = (target + rng.normal(scale=0.8, size=(N, T, V))).astype(np.float32)
    lengths = np.array([7, 3, 5, 1, 6])
    path = str(tmp_path_factory.mktemp("pred") / "d.npz")
    save_dump(path, target, {"d": draft}, tokens=rng.integers(0, V, size=(N, T)), lengths=lengths, temperature=0.8,
              top_k=0, top_p=1.0, min_p=0.0)
    return path, lengths


def test_prediction_over_prompts_is_the_dp_per_prompt(dense_dump):
    path, lengths = dense_dump
    over = P.prediction_over_prompts(path, ["d"], [1, 3])
    alpha = dump_acceptance(path)["d"].alpha  # the recorded temperature 0.8
    for k in (1, 3):
        per = [expected_tokens_per_step(alpha[n:n + 1], k, lengths=lengths[n:n + 1]) for n in range(len(lengths))]
        tok = [s.accepted + s.steps for s in per]
        steps = [s.steps for s in per]
        assert over[("d", k)] == pytest.approx(P.ratio_ci(tok, steps))
        total = expected_tokens_per_step(alpha, k, lengths=lengths)  # pooled: the same point estimate
        assert over[("d", k)][0] == pytest.approx(total.mean_acceptance_length)
    greedy = P.prediction_over_prompts(path, ["d"], [1], temperature=0)
    assert greedy[("d", 1)][0] != pytest.approx(over[("d", 1)][0])


def _measured(draft, k, mean, se):
    return SimpleNamespace(draft=draft, k=k, mean_acceptance_length=mean, standard_error=se,
                           as_dict=lambda: {"mean_acceptance_length": mean})


def _sim_row(draft, k, exact, lower=None, upper=None):
    return SimpleNamespace(draft=draft, k=k, mean_acceptance_length_exact=exact, mean_acceptance_length=exact,
                           ci95=None, mean_acceptance_length_lower=lower, mean_acceptance_length_upper=upper,
                           alpha=None, alpha_lower=None, alpha_upper=None)


def test_compare_rows_dense_and_sparse():
    sim = SimpleNamespace(results=[_sim_row("a", 2, 1.8), _sim_row("b", 2, None, 1.2, 1.6)], warnings=["w"],
                          config={"dump_kind": "dense"})
    pred = P.Prediction(sim, {("a", 2): (1.8, 0.3, 0.6)})
    rows = P.compare([_measured("a", 2, 1.5, 0.4), _measured("b", 2, 1.7, 0.1)], pred)
    assert [(r["draft"], r["k"]) for r in rows] == [("a", 2), ("b", 2)]
    a, b = rows
    assert set(a) == {"draft", "k", "predicted", "measured", "relative_error", "z_difference",
                      "measured_inside_prediction_interval"}
    assert a["relative_error"] == pytest.approx(0.2) and a["z_difference"] == pytest.approx(0.6)
    assert a["predicted"]["ci95_over_prompts"] == pytest.approx([1.2, 2.4])
    assert a["predicted"]["standard_error_over_prompts"] == 0.3
    assert a["measured_inside_prediction_interval"] is None and a["measured"] == {"mean_acceptance_length": 1.5}
    assert b["relative_error"] == pytest.approx(-0.1 / 1.7) and b["z_difference"] is None
    assert b["measured_inside_prediction_interval"] is False and b["predicted"]["ci95_over_prompts"] is None
    assert pred.warnings == ["w"] and pred.dump_kind == "dense"


def test_predict_combines_simulate_and_over_prompts(dense_dump):
    path, _ = dense_dump
    pred = P.predict(path, ["d"], [2], trials=4, seed=1)
    assert pred.dump_kind == "dense" and set(pred.over_prompts) == {("d", 2)}
    fig = pred.figures("d", 2)
    assert fig["mean_acceptance_length_exact"] == pytest.approx(pred.over_prompts[("d", 2)][0])


# ------------------------------------------------------------------------------- speed-ups: measured and predicted

def test_speedup_ci_equal_tokens_is_ratio_ci_of_seconds():
    """With the same tokens per prompt (fixed-length runs) the throughput ratio is plain seconds / speculative
    seconds summed over prompts, and its interval is ratio_ci's."""
    rng = np.random.default_rng(1)
    tok = np.full(10, 128.0)
    plain = rng.uniform(2, 4, size=10)
    spec = plain * rng.uniform(0.6, 0.9, size=10)
    got = P.speedup_ci(tok, spec, tok, plain)
    assert got == pytest.approx(P.ratio_ci(plain, spec))
    assert got[0] == pytest.approx(plain.sum() / spec.sum())


def test_speedup_ci_is_the_delta_method_on_the_four_totals():
    """The standard error is sqrt(g' S g): g the gradient of (A/B)/(C/D) at the totals (finite differences
    here), S = n/(n-1) * n * the covariance of the per-prompt vectors (the variance of a sum of n clusters)."""
    rng = np.random.default_rng(2)
    n = 9
    x = np.column_stack([rng.integers(60, 130, n), rng.uniform(1, 3, n), rng.integers(60, 130, n),
                         rng.uniform(2, 5, n)]).astype(float)
    est, se, half = P.speedup_ci(*x.T)

    def f(t):
        return (t[0] / t[1]) / (t[2] / t[3])

    tot = x.sum(0)
    g = np.array([(f(tot + h) - f(tot - h)) / (2 * 1e-6 * tot[i]) for i, h in enumerate(np.diag(1e-6 * tot))])
    cov = np.cov(x.T, ddof=1) * n  # variance of the total of n clusters (centred: sum of squares / (n - 1))
    assert est == pytest.approx(f(tot))
    assert se == pytest.approx(math.sqrt(g @ cov @ g), rel=1e-6)
    assert half / se == pytest.approx(stats.t.ppf(0.975, n - 1), abs=1e-3)
    # invariant to the units of time and to scaling the token counts
    assert P.speedup_ci(x[:, 0] * 3, x[:, 1] * 1e3, x[:, 2] * 3, x[:, 3] * 1e3) == pytest.approx((est, se, half))


def test_speedup_ci_degenerate_and_bad_input():
    est, se, half = P.speedup_ci([10], [1.0], [10], [2.0])
    assert est == 2.0 and se == half == math.inf
    est, se, half = P.speedup_ci([0, 0], [1, 1], [5, 5], [1, 1])
    assert math.isnan(est) and se == math.inf
    with pytest.raises(ValueError, match="one entry per prompt"):
        P.speedup_ci([1, 2], [1, 2], [1], [1])


@pytest.mark.statistical
def test_speedup_ci_coverage():
    """Calibration of the interval: speculative seconds = plain seconds x (true ratio) x independent noise, 12
    prompts of different lengths; the 95% interval covers the true throughput ratio in 93-97.5% of 4000
    replications (binomial sd 0.34%)."""
    rng = np.random.default_rng(3)
    true = 1.25
    hits = 0
    reps = 4000
    for _ in range(reps):
        base = rng.lognormal(1.0, 0.4, size=12)
        plain = base * rng.lognormal(0, 0.1, size=12)
        spec = base / true * rng.gamma(25.0, 1 / 25.0, size=12)
        tok = np.round(base * 40)
        est, se, half = P.speedup_ci(tok, spec, tok, plain)
        hits += est - half <= true * np.exp(0.1 ** 2 / 2) <= est + half  # E[plain] / E[spec] = true * E[lognormal]
    assert 0.93 <= hits / reps <= 0.975, hits / reps


def _table():
    from fastspec.costs import CostTable

    return CostTable.from_dict({
        "target": {"forward_s": {"1": 0.020, "2": 0.022, "3": 0.024, "5": 0.030},
                   "forward_s_se": {"1": 0.0004, "3": 0.0005}},
        "drafts": {"d": {"forward_s": {"1": 0.004, "2": 0.0045}, "forward_s_se": {"1": 0.0001}},
                   "look": {"forward_s": {"1": 0.0001}, "one_call_per_step": True}},
        "overhead_s": {"0": 0.0003, "1": 0.0005, "2": 0.0006, "4": 0.0008}})


def test_predict_speedups_from_a_cost_table(dense_dump):
    """predict(costs=...) prices every row with the loop's cost model (simulate's speed-up): a model draft's
    speed-up is StepCost.speedup of the exact tokens per step; its interval is simulate's, and the standard
    error the interval's half-width / 1.96.  Without a table: no speed-up."""
    from fastspec.costs import StepCost

    path, _ = dense_dump
    table = _table()
    pred = P.predict(path, ["d"], [1, 2], costs=table, trials=4)
    for k in (1, 2):
        sp = pred.speedup("d", k)
        row = pred.row("d", k)
        m = pred.figures("d", k)["mean_acceptance_length_exact"]
        assert sp["estimate"] == pytest.approx(StepCost(table, "d").speedup(m, k, row.p_all_accepted))
        lo, hi = sp["ci95"]
        assert lo < sp["estimate"] < hi  # the log-scale interval's standard error, back on the speed-up's scale
        assert sp["standard_error"] == pytest.approx(sp["estimate"] * math.log(hi / lo) / (2 * P.Z95))
    assert P.predict(path, ["d"], [1], costs=False, trials=4).speedup("d", 1) is None


def test_compare_rows_with_speedups():
    sim = SimpleNamespace(results=[_sim_row("d", 2, 2.5)], warnings=[], config={"dump_kind": "dense"})
    sim.results[0].speedup, sim.results[0].speedup_ci95 = 1.5, (1.2, 1.8)
    pred = P.Prediction(sim, {("d", 2): (2.5, 0.1, 0.3)})
    sp = pred.speedup("d", 2)
    assert sp["estimate"] == 1.5 and sp["standard_error"] == pytest.approx(1.5 * math.log(1.8 / 1.2) / (2 * P.Z95))
    m = _measured("d", 2, 2.4, 0.1)
    m.speedup = {"estimate": 1.25, "standard_error": 0.05, "ci95": [1.15, 1.35]}
    row, = P.compare([m], pred)
    s = row["speedup"]
    assert s["predicted"] == sp and s["measured"] is m.speedup
    assert s["relative_error"] == pytest.approx(0.2)
    assert s["z_difference"] == pytest.approx(0.25 / math.hypot(sp["standard_error"], 0.05))
    assert s["agrees"] is bool(abs(s["z_difference"]) <= 1.96)  # |relative error| = 20% > 10%
    # no priced row and no clock: no speedup object (the acceptance-only rows of before)
    sim.results[0].speedup = None
    row, = P.compare([_measured("d", 2, 2.4, 0.1)], pred)
    assert "speedup" not in row
