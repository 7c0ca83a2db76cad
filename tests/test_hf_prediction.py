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
