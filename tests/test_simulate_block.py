"""fastspec.simulate with --verify block and --candidates w: exact figures where computable, MC otherwise."""
from __future__ import annotations

import json
from fractions import Fraction as F

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec import exact as E
from fastspec import save_dump
from fastspec.acceptance import expected_tokens_per_step
from fastspec.simulation import simulate
from fastspec_cli.main import app


def constant_dump(path, p, q, n=4, t=300):
    target = np.broadcast_to(np.log(p), (n, t, len(p))).astype(np.float64)
    draft = np.broadcast_to(np.log(q), (n, t, len(q))).astype(np.float64)
    return save_dump(str(path), target, {"d": draft}, temperature=1.0, top_k=0, top_p=1.0)


def random_dump(path, n=4, t=20, v=8, seed=0):
    rng = np.random.default_rng(seed)
    target = rng.normal(0, 2, (n, t, v))
    return save_dump(str(path), target.astype(np.float32),
                     {"a": (target + rng.normal(0, 1, (n, t, v))).astype(np.float32)},
                     temperature=1.0, top_k=0, top_p=1.0)


def block_trajectory_expectation(p, q, k, L):
    """Exact tokens per verify step of block verification replayed along one sequence of L positions with
    context-independent p, q (the simulator's end-of-sequence convention), by a renewal DP over Fractions."""
    law = {d: E.block_distribution(lambda _s: p, lambda _s: q, d, method="block").accepted_count
           for d in range(1, k + 1)}
    steps = [F(0)] * (L + 1)
    tokens = [F(0)] * (L + 1)
    for t in range(L - 2, -1, -1):
        d = min(k, L - 1 - t)
        for j, pj in enumerate(law[d]):
            steps[t] += pj * (1 + steps[t + j + 1])
            tokens[t] += pj * (j + 1 + tokens[t + j + 1])
    return tokens[0] / steps[0]


def test_candidates_exact_dp_uses_beta_of_the_worked_case(tmp_path):
    p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    path = constant_dump(tmp_path / "c.npz", p, q)
    res = simulate(path, k=[1, 3], candidates="1,2", seed=3)
    beta = float(E.candidate_step(["0.5", "0.3", "0.2"], ["0.2", "0.3", "0.5"], 2).acceptance)
    assert beta == pytest.approx(19 / 25)
    rows = {(r.k, r.candidates): r for r in res.results}
    assert set(rows) == {(1, 1), (1, 2), (3, 1), (3, 2)}
    for k in (1, 3):
        w2 = rows[(k, 2)]
        assert w2.alpha == pytest.approx(beta, abs=1e-12)
        want = expected_tokens_per_step(np.full((4, 300), beta), k, lengths=np.full(4, 300)).mean_acceptance_length
        assert w2.mean_acceptance_length_exact == pytest.approx(want, rel=1e-12)
        assert w2.mc_agrees_with_exact and w2.verify == "token" and w2.candidate_sampling == "iid"
        assert w2.mean_acceptance_length_exact > rows[(k, 1)].mean_acceptance_length_exact
    det = simulate(path, k=2, candidates=2, candidate_sampling="deterministic", seed=1).results
    assert det[-1].alpha == pytest.approx(0.5)  # top-2 draft logits {2, 1}: target mass 0.2 + 0.3


def test_block_mc_matches_exact_renewal_and_beats_token(tmp_path):
    p, q = [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]
    n, L, k = 4, 300, 2
    path = constant_dump(tmp_path / "b.npz", [1 / 3, 2 / 3], [2 / 3, 1 / 3], n=n, t=L)
    res = simulate(path, k=k, verify="token,block", seed=5, block_trials=40)
    tok, blk = res.results
    assert (tok.verify, blk.verify) == ("token", "block")
    assert blk.mean_acceptance_length_exact is None and "ratio chain" in blk.exact_reason
    exact_block = float(block_trajectory_expectation(p, q, k, L))
    assert abs(blk.mean_acceptance_length - exact_block) <= 5 * blk.standard_error
    assert exact_block > tok.mean_acceptance_length_exact + 0.08  # ~ 11/9 vs 10/9 accepted per step
    assert blk.ci95[0] > tok.mean_acceptance_length_exact
    d = res.as_dict()
    assert d["results"][1]["verify"] == "block" and d["results"][1]["candidates"] == 1
    assert d["config"]["variants"] == [{"verify": "token", "candidates": 1}, {"verify": "block", "candidates": 1}]


def test_block_is_deterministic_and_only_token_rows_pick_best_k(tmp_path):
    path = random_dump(tmp_path / "r.npz")
    a = simulate(path, k=[1, 2], verify="token,block", seed=2, draft_cost=0.1)
    b = simulate(path, k=[1, 2], verify="token,block", seed=2, draft_cost=0.1)
    assert [r.as_dict() for r in a.results] == [r.as_dict() for r in b.results]
    assert a.best["a"] in (1, 2)
    # k = 1: block verification is token verification (same law); MC within its CI of the token DP
    blk1 = [r for r in a.results if r.verify == "block" and r.k == 1][0]
    tok1 = [r for r in a.results if r.verify == "token" and r.k == 1][0]
    assert abs(blk1.mean_acceptance_length - tok1.mean_acceptance_length_exact) <= 5 * blk1.standard_error


def test_sparse_dump_refuses_block_and_candidates(tmp_path):
    rng = np.random.default_rng(0)
    lg = rng.normal(0, 2, (2, 8, 10))
    lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    ids = np.argsort(-lp, axis=-1)[..., :4]
    sp = (ids.astype(np.int64), np.take_along_axis(lp, ids, -1))
    path = save_dump(str(tmp_path / "s.npz"), sp, {"d": sp}, temperature=1.0, vocab_size=10)
    with pytest.raises(ValueError, match="needs the full target and draft distributions"):
        simulate(path, k=2, verify="block")
    with pytest.raises(ValueError, match="needs the full target and draft distributions"):
        simulate(path, k=2, candidates=2)
    assert len(simulate(path, k=2).results) == 1  # the default still reports sparse bounds


@pytest.mark.parametrize("kw, match", [
    (dict(verify="tree"), "verify 'tree' is unknown"),
    (dict(candidates=0), "candidates = 0"),
    (dict(candidates="x"), "not an integer"),
    (dict(verify="block", candidates=2), "one candidate per position"),
    (dict(candidates=2, candidate_sampling="without_replacement"), "without replacement"),
])
def test_argument_errors(tmp_path, kw, match):
    path = random_dump(tmp_path / "e.npz", n=1, t=4)
    with pytest.raises(ValueError, match=match):
        simulate(path, k=1, **kw)


def test_cli_side_by_side(tmp_path):
    path = random_dump(tmp_path / "cli.npz")
    runner = CliRunner()
    r = runner.invoke(app, ["simulate", path, "--k", "2", "--verify", "token,block", "--candidates", "1,2",
                            "--block-trials", "4", "--json"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)["results"]
    assert [(x["verify"], x["candidates"]) for x in rows] == [("token", 1), ("token", 2), ("block", 1)]
    assert rows[2]["mean_acceptance_length_exact"] is None and rows[2]["exact_reason"]
    assert rows[1]["mean_acceptance_length_exact"] is not None
    r = runner.invoke(app, ["simulate", path, "--k", "2", "--verify", "token,block", "--block-trials", "4"])
    assert r.exit_code == 0 and "MC only" in r.stdout and "block" in r.stdout
    r = runner.invoke(app, ["simulate", path, "--verify", "bogus"])
    assert r.exit_code == 2 and "verify 'bogus' is unknown" in r.stderr
