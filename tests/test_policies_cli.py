"""Policies on the command line and through simulate(): ``fastspec simulate --policy`` rows (table and --json, the
method labelled), ``fastspec policy-search`` (needs a cost table, prints the verdict sentence), bad input (one line
naming the flag, exit 2) and the library's refusals (sparse dump, n-gram draft, argmax drafts)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import fastspec
from fastspec import save_dump
from fastspec.errors import InvalidInput
from fastspec_cli.main import app

runner = CliRunner()


def _table(draft, kmax=8):
    n = kmax + 1
    return {"version": 1, "machine": "test",
            "target": {"forward_s": {str(i): 0.01 + 0.0002 * i for i in range(1, n + 1)}},
            "drafts": {draft: {"forward_s": {"1": 0.002}}},
            "overhead_s": {str(i): 0.0003 for i in range(0, n)}}


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    rng = np.random.default_rng(3)
    n, t, v = 4, 20, 16
    target = rng.normal(0, 2, (n, t, v))
    drafts = {"near": (target + rng.normal(0, 0.5, (n, t, v))).astype(np.float16)}
    path = tmp_path_factory.mktemp("d") / "pair.npz"
    return save_dump(str(path), target.astype(np.float16), drafts, temperature=1.0, top_k=0, top_p=1.0)


@pytest.fixture(scope="module")
def costs(tmp_path_factory):
    p = tmp_path_factory.mktemp("c") / "costs.json"
    p.write_text(json.dumps(_table("near", 20)))
    return str(p)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("spec,needle", [
    ("conf:theta=1.5,kmax=4", "theta=1.5 must be in (0, 1)"),
    ("conf:theta=0,kmax=4", "theta=0 must be in (0, 1)"),
    ("conf:theta=0.4,kmax=0", "kmax=0 must be an integer in [1, 256]"),
    ("fixed:k=257", "k=257 must be an integer in [1, 256]"),
    ("hf:schedule=fast", "schedule=fast is unknown"),
    ("specdec:h=1,kmax=4", "h=1 must be in (0, 1)"),
    ("adaptive:k=3", "unknown policy kind"),
    ("conf:kmax=4", "conf needs theta"),
    ("conf:theta=0.4,on=mean", "on=mean must be token or max"),
    ("hf:tune=maybe", "tune=maybe must be roc or off"),
])
def test_bad_policy_is_one_line_exit_2(dump, spec, needle):
    r = run("simulate", dump, "--policy", spec)
    assert r.exit_code == 2
    err = r.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("fastspec: error: --policy") and needle in err


def test_policy_rows_in_json_and_table(dump, costs):
    r = run("simulate", dump, "--k", "4", "--costs", costs, "--policy", "conf:theta=0.3,kmax=6", "--policy", "hf",
            "--trials", "20", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    rows = {p["policy"]: p for p in d["policies"]}
    conf, hf = rows["conf(theta=0.3,kmax=6,on=token)"], rows["hf(k=20,schedule=constant,theta=0.4,tune=roc)"]
    assert conf["kind"] == hf["kind"] == "policy"
    assert conf["method"] == "exact DP" and conf["exact"] and conf["mc_ci95"] is None
    assert hf["method"] == "Monte-Carlo (trials=20, seed=0)" and not hf["exact"] and hf["mc_ci95"] is not None
    for row in rows.values():
        assert row["speedup"] > 0 and row["speedup_ci95"][0] <= row["speedup"] <= row["speedup_ci95"][1]
        assert sum(row["draft_length_steps"]) == pytest.approx(row["steps"])
    assert d["config"]["policies"] == list(rows)
    t = run("simulate", dump, "--k", "4", "--costs", costs, "--policy", "conf:theta=0.3,kmax=6", "--trials", "20")
    assert t.exit_code == 0, t.stderr
    assert "draft-length policies" in t.stdout and "exact DP" in t.stdout


def test_policy_search_needs_costs_and_prints_the_verdict(dump, costs):
    r = run("policy-search", dump)
    assert r.exit_code == 2 and "needs one" in r.stderr and "--costs" in r.stderr
    r = run("policy-search", dump, "--costs", costs, "--trials", "20", "--top", "3")
    assert r.exit_code == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("near: best fixed k = ") and "Hugging Face's default" in last and "best policy" in last
    j = run("policy-search", dump, "--costs", costs, "--trials", "20", "--json")
    d = json.loads(j.stdout)
    assert d["best_fixed"]["policy"].startswith("fixed(")
    assert d["hf_default"]["method"].startswith("Monte-Carlo")
    assert d["best"]["speedup"] >= max(c["speedup"] for c in d["evaluated"] if c["speedup"] is not None)
    for bad, needle in ((["--budget-s", "0"], "--budget-s"), (["--trials", "1"], "--trials"),
                        (["--top", "-1"], "--top")):
        r = run("policy-search", dump, "--costs", costs, *bad)
        assert r.exit_code == 2 and needle in r.stderr, r.stderr


def test_search_reports_unpriced_hf_default(dump, tmp_path):
    p = tmp_path / "short.json"
    p.write_text(json.dumps(_table("near", 4)))
    from fastspec.simulation.policy_search import search_policies

    res = search_policies(dump, "near", str(p), trials=10)
    assert res.hf_default.speedup is None and any("price every draft length up to 20" in n for n in res.notes)
    assert res.best is not None
    for c in res.evaluated:  # priced exactly when every draft length the policy uses is in the table
        used = np.flatnonzero(c.estimate.draft_length_steps > 0)
        assert (c.speedup is not None) == (used.max() <= 4), c.policy


def test_sparse_dump_refused_naming_the_flag(tmp_path):
    ids = np.tile(np.arange(3), (1, 8, 1))
    lp = np.log(np.full((1, 8, 3), 0.3))
    path = save_dump(tmp_path / "sparse.npz", (ids, lp), {"d": (ids, lp)}, vocab_size=5, temperature=1.0)
    with pytest.raises(InvalidInput, match=r"--policy conf\(theta=0.4.*sparse top-k dump"):
        fastspec.simulate(path, policies=["conf:theta=0.4,kmax=4"])
    r = run("simulate", path, "--policy", "conf:theta=0.4,kmax=4")
    assert r.exit_code == 2 and "sparse" in r.stderr and r.stderr.startswith("fastspec: error: --policy")


def test_ngram_draft_refused(tmp_path):
    rng = np.random.default_rng(0)
    target = rng.normal(size=(2, 12, 8))
    path = save_dump(tmp_path / "t.npz", target, None, tokens=rng.integers(0, 8, (2, 12)),
                     prompt_tokens=rng.integers(0, 8, (2, 5)), prompt_lengths=np.array([5, 5]), temperature=1.0)
    r = run("simulate", path, "--policy", "conf:theta=0.4,kmax=4")
    assert r.exit_code == 2 and "n-gram draft has no probabilities" in r.stderr


def test_argmax_drafts_refused():
    with pytest.raises(InvalidInput, match="policies replay sampled drafts"):
        fastspec.SimulateConfig(policies=["hf"], draft_sampling="argmax")


def test_library_bad_input(dump):
    from fastspec.policies import parse_policy
    from fastspec.simulation import evaluate_policy

    with pytest.raises(InvalidInput, match="trials = 1 is invalid"):
        evaluate_policy(dump, "near", "hf", trials=1)
    with pytest.raises(InvalidInput, match="method 'fast' is unknown"):
        evaluate_policy(dump, "near", "fixed:k=2", method="fast")
    with pytest.raises(InvalidInput, match="has no exact replay"):
        evaluate_policy(dump, "near", "hf", method="exact")
    with pytest.raises(InvalidInput, match="no field 'kmax'"):
        parse_policy("fixed:k=2,kmax=3")
    with pytest.raises(InvalidInput, match="given twice"):
        parse_policy("fixed:k=2,k=3")
    state = parse_policy("hf").start()
    with pytest.raises(InvalidInput, match="n_accepted = 3 must be in"):
        state.update(2, 3, [0.5, 0.5])
    with pytest.raises(InvalidInput, match="drafted_q has 1 values for 2 drafts"):
        state.update(2, 1, [0.5])
    with pytest.raises(InvalidInput, match="q_token = 1.5"):
        parse_policy("conf:theta=0.5,kmax=8").start().keep_drafting(0, 1.5, 0.9)


def test_policy_names_round_trip():
    from fastspec.policies import parse_policy

    for spec in ("fixed:k=4", "conf:theta=0.25,kmax=6,on=max", "specdec:h=0.5,kmax=8", "hf",
                 "hf:k=7,schedule=heuristic_transient,theta=0,tune=off"):
        p = parse_policy(spec)
        assert parse_policy(p.name) == p and parse_policy(p) is p


def test_search_budget_truncates_and_says_so(dump, costs):
    from fastspec.simulation import search_policies

    res = search_policies(dump, "near", costs, budget_s=1e-9, trials=10)
    assert res.truncated and len(res.evaluated) == 1 and res.evaluated[0].policy.startswith("hf(")  # HF's first
    assert f"searched 1 of {res.total} points" in res.verdict
    with pytest.raises(InvalidInput, match="budget_s"):
        search_policies(dump, "near", costs, budget_s=0)
    full = search_policies(dump, "near", costs, grid=["fixed:k=2", "conf:theta=0.5,kmax=4"], trials=10)
    assert not full.truncated and {c.policy for c in full.evaluated} == {
        "fixed(k=2)", "conf(theta=0.5,kmax=4,on=token)", "hf(k=20,schedule=constant,theta=0.4,tune=roc)"}


def test_policy_search_json_is_byte_identical_and_the_clock_goes_to_stderr(dump, costs):
    """Issue #30, item 20: --json carried elapsed_s (the wall clock), so two identical runs differed."""
    a = run("policy-search", dump, "--costs", costs, "--trials", "10", "--json")
    b = run("policy-search", dump, "--costs", costs, "--trials", "10", "--json")
    assert a.exit_code == 0 and b.exit_code == 0, a.stderr
    assert a.stdout == b.stdout and "elapsed" not in a.stdout
    assert " points in " in a.stderr and a.stderr.strip().endswith(" s"), a.stderr


def test_relative_se_of_a_histogram_reduces_to_loop_cost():
    from fastspec.costs import CostTable, StepCost
    from fastspec.simulation.policy_eval import _relative_se

    t = _table("near", 6)
    t["target"]["forward_s_se"] = {k: 0.0004 for k in t["target"]["forward_s"]}
    t["drafts"]["near"]["forward_s"]["2"] = 0.0025
    t["drafts"]["near"]["forward_s_se"] = {"1": 0.0001, "2": 0.0002}
    t["overhead_s_se"] = {k: 0.00001 for k in t["overhead_s"]}
    loop = StepCost(CostTable.from_dict(t), "near")
    for k in (1, 3, 6):
        h = np.zeros(8)
        h[k] = 11.0
        assert _relative_se(loop, h, 0.3) == pytest.approx(loop.relative_se(k, 0.3), rel=1e-12)
    mixed = np.array([0, 5.0, 0, 2.0, 0, 0, 0])
    assert 0 < _relative_se(loop, mixed, 0.2) < max(loop.relative_se(k, 0.2) for k in (1, 3)) * 2


def test_carry_only_for_the_heuristic_schedule(dump):
    from fastspec.simulation import evaluate_policy

    with pytest.raises(InvalidInput, match="only hf with schedule=heuristic carries"):
        evaluate_policy(dump, "near", "hf:schedule=heuristic_transient", carry=True)
    est = evaluate_policy(dump, "near", "hf:schedule=heuristic,tune=off", carry=True, trials=10)
    assert not est.exact and "cap carried across sequences" in est.method
    fresh = evaluate_policy(dump, "near", "hf:schedule=heuristic,tune=off", trials=10, method="mc")
    assert est.per_sequence_steps[0] == fresh.per_sequence_steps[0]  # the first call starts from the same cap
