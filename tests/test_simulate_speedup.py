"""simulate's speed-up from measured costs (issue #13): the real loop's cost model applied to the exact tokens per
step, its interval over prompts and cost standard errors, where the costs come from (dump, file, flags), the best
(draft, k) overall and the closing sentence."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fastspec import save_dump
from fastspec.analysis import expected_tokens_per_step
from fastspec.costs import CostTable, StepCost
from fastspec.errors import InvalidInput, InvalidType
from fastspec.io import load_dump
from fastspec.simulation import simulate
from fastspec.simulation.speedup import Z95, best_overall, speedup_interval, verdict
from fastspec.stats import ratio_ci

TABLE = {
    "version": 1, "machine": "test machine", "threads": 2,
    "target": {"forward_s": {str(n): 0.020 + 0.001 * n for n in range(1, 10)},
               "forward_s_se": {str(n): 0.0002 for n in range(1, 10)}},
    "drafts": {"d": {"forward_s": {"1": 0.006, "2": 0.0065}, "forward_s_se": {"1": 0.0001, "2": 0.0001}},
               "e": {"forward_s": {"1": 0.015}}},
    "overhead_s": {"0": 0.0002, "1": 0.0004, "2": 0.00045, "4": 0.0005},
}


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    rng = np.random.default_rng(5)
    N, T, V = 7, 30, 16
    P = rng.standard_normal((N, T, V)) * 2
    Q = P + rng.standard_normal((N, T, V)) * np.linspace(0.2, 1.5, N)[:, None, None]  # prompts differ
    E = rng.standard_normal((N, T, V))
    lengths = np.array([30, 30, 25, 30, 12, 30, 28])
    return save_dump(str(tmp_path_factory.mktemp("sp") / "d.npz"), P.astype(np.float32),
                     {"d": Q.astype(np.float32), "e": E.astype(np.float32)}, lengths=lengths, temperature=1.0,
                     top_k=0, top_p=1.0)


def _by_hand(path, draft, k, table):
    """(speed-up, interval) of one (draft, k) from the DP per sequence and the cost model, written out."""
    from fastspec.acceptance import dump_acceptance

    acc = dump_acceptance(path, drafts=[draft])[draft]
    with load_dump(path) as d:
        L = d.lengths.astype(np.int64)
    ex = expected_tokens_per_step(acc.alpha, k, lengths=L)
    m = ex.mean_acceptance_length
    p_all = ex.per_position_acceptance[k - 1]
    t = table
    d1, d2 = t["drafts"][draft]["forward_s"]["1"], t["drafts"][draft]["forward_s"].get("2")
    d2 = d1 if d2 is None else d2
    over = t["overhead_s"]
    ov = over[str(k)]  # measured, never substituted
    step = p_all * d2 + (1 - p_all) * d1 + (k - 1) * d1 + t["target"]["forward_s"][str(k + 1)] + ov
    plain = t["target"]["forward_s"]["1"] + over["0"]
    s = m * plain / step
    per_tok = [expected_tokens_per_step(acc.alpha[n:n + 1], k, lengths=L[n:n + 1]) for n in range(len(L))]
    est, _, half = ratio_ci([x.accepted + x.steps for x in per_tok], [x.steps for x in per_tok])
    assert est == pytest.approx(m, rel=1e-12)
    return s, m, half


def test_speedup_from_a_cost_table_is_the_loops_model(dense):
    res = simulate(dense, k=[1, 2, 4], costs=TABLE, trials=20)
    assert res.config["costs"]["source"] == "file" and res.config["draft_cost"] is None
    for r in res.results:
        s, m, half = _by_hand(dense, r.draft, r.k, TABLE)
        assert r.speedup == pytest.approx(s, rel=1e-12)
        assert r.mean_acceptance_length_exact == pytest.approx(m, rel=1e-12)
        assert r.ci95_sequences == pytest.approx((m - half, m + half), rel=1e-12)
        lo, hi = r.speedup_ci95
        assert lo < r.speedup < hi
        rel = StepCost(CostTable.from_dict(TABLE), r.draft).relative_se(r.k, r.p_all_accepted)
        assert rel > 0  # the costs' standard errors widen the prompts' interval, in quadrature
        assert math.log(hi / lo) / 2 == pytest.approx(math.hypot(half / m, Z95 * rel), rel=1e-9)
        assert lo * hi == pytest.approx(s * s, rel=1e-12)  # symmetric on the log scale
    json.dumps(res.as_dict())  # JSON-ready (no numpy scalars)
    bare = json.loads(json.dumps(TABLE))  # no standard errors: the interval is the prompts' alone
    del bare["target"]["forward_s_se"], bare["drafts"]["d"]["forward_s_se"]
    for r in simulate(dense, k=[1, 4], costs=bare, trials=20).results:
        s, m, half = _by_hand(dense, r.draft, r.k, bare)
        assert math.log(r.speedup_ci95[1] / r.speedup_ci95[0]) / 2 == pytest.approx(half / m, rel=1e-9)


def test_interval_arithmetic():
    assert speedup_interval(None, 2.0, 0.1, 0.0) is None
    assert speedup_interval(1.5, 2.0, math.inf, 0.0) is None
    lo, hi = speedup_interval(1.5, 2.0, 0.1, 0.01)
    rel = math.hypot(0.1 / 2.0, Z95 * 0.01)
    assert (lo, hi) == pytest.approx((1.5 * math.exp(-rel), 1.5 * math.exp(rel)), rel=1e-12)
    # issue #19, item 20: large standard errors never give a negative end (was [1.5 (1 - 19.6), ...])
    lo, hi = speedup_interval(1.5, 2.0, 0.1, 10.0)
    assert 0 < lo < 1.5 < hi and math.isfinite(hi)
    assert speedup_interval(1.5, 2.0, 0.1, 1e300) is None  # no finite upper end: no interval, never inf or NaN


def test_recorded_costs_are_used_by_default_and_flags_override(dense):
    table = CostTable.from_dict(TABLE)
    with load_dump(dense) as d:
        d.costs = table  # what a dump written by `fastspec dump` carries
        rec = simulate(d, k=2, trials=20)
        assert rec.config["costs"]["source"] == "dump" and rec.results[0].speedup is not None
        none = simulate(d, k=2, trials=20, costs=False)
        assert none.config["costs"] is None and all(r.speedup is None for r in none.results)
        assert none.verdict.startswith("speed-up not computed")
        flags = simulate(d, k=2, trials=20, draft_cost=0.5)
        assert flags.config["costs"]["source"] == "flags"
        r = flags.results[0]
        assert r.speedup == pytest.approx(r.mean_acceptance_length_exact / (2 * 0.5 + 1.0))
        assert "relative costs" in flags.verdict


def test_table_without_a_draft_or_a_k_says_so(dense):
    partial = json.loads(json.dumps(TABLE))
    del partial["drafts"]["e"]
    partial["target"]["forward_s"] = {"1": 0.02, "2": 0.021, "3": 0.022}
    del partial["target"]["forward_s_se"]
    res = simulate(dense, k=[1, 2, 4], costs=partial, trials=20)
    speed = {(r.draft, r.k): r.speedup for r in res.results}
    assert speed[("e", 1)] is None and speed[("d", 4)] is None and speed[("d", 2)] is not None
    text = " ".join(res.warnings)
    assert "no entry for e" in text and 'lacks target.forward_s["5"]: no speed-up at k = 4' in text


def test_a_missing_overhead_is_not_priced_and_plain_decoding_has_one_price(dense):
    """Issue #19, item 2: overhead_s {"0", "1", "8"} priced k = 2 with overhead(8) (the largest k), and the
    printed plain-decoding time used another fallback (min) than the speed-ups (max)."""
    table = {**TABLE, "overhead_s": {"0": 0.0001, "1": 0.0002, "8": 5.0}}
    res = simulate(dense, k=[1, 2], costs=table, drafts=["d"], trials=20)
    speed = {r.k: r.speedup for r in res.results}
    assert speed[2] is None and speed[1] is not None
    assert any('lacks overhead_s["2"]: no speed-up at k = 2' in w for w in res.warnings)
    plain = table["target"]["forward_s"]["1"] + 0.0001
    assert res.config["costs"]["plain_step_s"] == pytest.approx(plain, rel=1e-15)
    s, m, _ = _by_hand(dense, "d", 1, table)
    assert speed[1] == pytest.approx(s, rel=1e-12)
    with pytest.raises(InvalidInput, match=r'overhead_s needs k = 0'):
        simulate(dense, k=1, costs={**TABLE, "overhead_s": {"1": 0.0002}})


@pytest.mark.parametrize("costs, error, needle", [
    ({**TABLE, "target": {}}, InvalidInput, "target must be an object"),
    ({**TABLE, "gpu": 1}, InvalidInput, "unknown key"),
    ({**TABLE, "overhead_s": {"0": -1}}, InvalidInput, "overhead_s"),
    ({**TABLE, "target": {"forward_s": {"1": 0}}}, InvalidInput, "> 0"),
    (3.5, InvalidType, "costs must be"),
    ("/nonexistent/costs.json", InvalidInput, "no such file"),
])
def test_bad_cost_tables_are_refused_before_reading(dense, costs, error, needle):
    with pytest.raises(error, match=needle):
        simulate(dense, k=2, costs=costs)


def test_sparse_dump_gets_bounds_and_an_interval(tmp_path):
    rng = np.random.default_rng(2)
    N, T, V, K = 5, 20, 50, 8
    lp = np.log(rng.dirichlet(np.ones(V), size=(N, T)))
    ids = np.argsort(-lp, axis=-1)[..., :K]
    tl = np.take_along_axis(lp, ids, -1)
    lq = np.log(rng.dirichlet(np.ones(V), size=(N, T)))
    qi = np.argsort(-lq, axis=-1)[..., :K]
    p = save_dump(str(tmp_path / "s.npz"), (ids, tl), {"d": (qi, np.take_along_axis(lq, qi, -1))}, vocab_size=V,
                  temperature=1.0)
    res = simulate(p, k=[1, 2], costs=TABLE)
    for r in res.results:
        assert r.speedup is None and r.speedup_lower <= r.speedup_upper
        lo, hi = r.speedup_ci95
        assert lo <= r.speedup_lower and r.speedup_upper <= hi
        assert r.ci95_sequences[0] <= r.mean_acceptance_length_lower
        assert r.mean_acceptance_length_upper <= r.ci95_sequences[1]
    assert res.best_overall["speedup_lower"] is not None and "sparse" in res.verdict


class _Row:
    def __init__(self, draft, k, s, ci, verify="token", w=1):
        self.draft, self.k, self.speedup, self.speedup_ci95 = draft, k, s, ci
        self.speedup_lower = self.speedup_upper = None
        self.verify, self.candidates = verify, w


@pytest.mark.parametrize("s, ci, word", [(1.4, (1.2, 1.6), "faster than plain decoding"),
                                         (0.74, (0.70, 0.78), "slower than plain decoding"),
                                         (1.02, (0.95, 1.09), "not distinguishable from plain decoding")])
def test_verdict_sentence(s, ci, word):
    from fastspec.simulation.speedup import TablePricing

    rows = [_Row("a", 1, 0.5, (0.4, 0.6)), _Row("b", 2, s, ci), _Row("c", 4, None, None)]
    best = best_overall(rows)
    assert (best["draft"], best["k"]) == ("b", 2)
    text = verdict(best, TablePricing(CostTable.from_dict(TABLE), "dump"))
    assert text.startswith(f"best: b at k = 2, {s:.2f}x") and word in text and "recorded machine" in text


def test_best_overall_prefers_smaller_k_on_ties():
    best = best_overall([_Row("a", 4, 1.5, None), _Row("a", 2, 1.5, None)])
    assert best["k"] == 2 and best["speedup_ci95"] is None
    assert best_overall([_Row("a", 1, None, None)]) is None
