"""fastspec.simulate and fastspec.stats with hostile and careless inputs (issue #12): the verify-cost grammar,
bounds checked before any allocation, bounded replay memory and progress, typed argument errors, repeated
drafts, and intervals that too few trials cannot give.  Each test failed before its fix."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
from scipy import stats

from fastspec import save_dump
from fastspec.analysis import expected_tokens_per_step
from fastspec.errors import InvalidInput, InvalidType
from fastspec.simulation import VerifyCost, simulate
from fastspec.simulation import runners

P3 = np.log([0.5, 0.3, 0.2])
Q3 = np.log([0.2, 0.5, 0.3])  # alpha = 0.7 at every position


def constant_dump(path, n, t):
    return save_dump(str(path), np.broadcast_to(P3, (n, t, 3)).copy(), {"d": np.broadcast_to(Q3, (n, t, 3)).copy()},
                     temperature=1.0, top_k=0, top_p=1.0)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return constant_dump(tmp_path_factory.mktemp("s") / "c.npz", 3, 12)


# ------------------------------------------------------------------ --verify-cost: a real grammar

@pytest.mark.parametrize("spec, const, slope", [
    ("1", 1, 0), ("1+0.05k", 1, 0.05), ("1 + 0.05*k", 1, 0.05), ("0.05k+1", 1, 0.05), ("k", 0, 1), ("1+k", 1, 1),
    ("2 - 0.5 k", 2, -0.5), (".5+.5*k", 0.5, 0.5), ("1e-2k + 1", 1, 0.01), ("1.+2E0k", 1, 2), (" 3 ", 3, 0),
    ("1 + 0.02k + 0.03*k", 1, 0.05),
])
def test_verify_cost_grammar_accepts_the_documented_forms(spec, const, slope):
    v = VerifyCost.parse(spec)
    assert v.table is None and v.const == pytest.approx(const) and v.slope == pytest.approx(slope)


@pytest.mark.parametrize("spec", ["1-+2k", "2-+1", "--", "+", "-", "1+", "+1", "-1+2k", "1--1", "*k", "k*2", "1**k",
                                  "2k2", "1 2", "kk", "1+x", "inf", "nan", "1e", "0x10", "1,5", "", "   ", "(1)"])
def test_verify_cost_grammar_refuses_everything_else(spec):
    # before: '1-+2k' was read as 1 + 2k, '2-+1' as 3, '--' and '+' as the constant 0
    with pytest.raises(InvalidInput, match="not understood") as info:
        VerifyCost.parse(spec)
    assert "a sum of terms joined by + or -" in str(info.value) and "1+0.05k" in str(info.value)


def test_verify_cost_tables_and_numbers_still_work(tmp_path):
    f = tmp_path / "cost.json"
    f.write_text('{"1": 1.02, "4": 1.1}')
    assert VerifyCost.parse(str(f))(4) == 1.1 and VerifyCost.parse('{"2": 1.5}')(2) == 1.5
    assert VerifyCost.parse(2)(7) == 2.0
    with pytest.raises(InvalidInput, match="finite"):
        VerifyCost.parse("1e400")


# ------------------------------------------------------------------ sizes: bounds checked before any allocation

def test_every_size_has_a_bound_checked_before_reading(tmp_path):
    missing = str(tmp_path / "not-read.npz")  # never opened: each bound is checked first
    for kw, match in ((dict(k="1-100000000"), "outside"), (dict(k=[2 ** 24]), "too large"),
                      (dict(trials=10 ** 7 + 1), "trials"), (dict(block_trials=10 ** 8), "block_trials"),
                      (dict(batches=10 ** 7, trials=10 ** 7), "batches"), (dict(candidates=65), "candidates")):
        with pytest.raises(InvalidInput, match=match):
            simulate(missing, **kw)
    with pytest.raises(InvalidInput, match=r"\[1, 256\]"):
        expected_tokens_per_step(np.full((1, 4), 0.5), 2 ** 24)


def test_block_trials_are_checked_without_block_verification(tmp_path):
    with pytest.raises(InvalidInput, match="block_trials"):
        simulate(str(tmp_path / "not-read.npz"), block_trials=0)


@pytest.mark.subprocess
def test_token_replay_memory_does_not_grow_with_trials(tmp_path):
    # before: the lockstep replay allocated arrays of sequences * trials int64 up front (12 * 10**7 here: ~5 GB)
    path = constant_dump(tmp_path / "short.npz", 12, 2)
    code = textwrap.dedent(f"""
        import resource
        from fastspec.simulation import simulate

        class Stop(Exception):
            pass

        done = [0]

        def tick(n):
            done[0] += n
            if done[0] > 12:  # past the Bernoulli row of the block run: replays are under way
                raise Stop

        simulate({str(path)!r}, k=1, mode="token", trials=4)  # imports and compilation first
        with open("/proc/self/status") as fh:
            vm = int(fh.read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
        for kw in (dict(mode="token", trials=10 ** 7), dict(verify="block", block_trials=10 ** 7)):
            done[0] = 0
            try:
                simulate({str(path)!r}, k=1, progress=tick, **kw)
            except Stop:
                print("bounded", done[0])
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.stdout.split().count("bounded") == 2, r.stdout + r.stderr


def test_replay_groups_and_blocks_do_not_change_results(small):
    from fastspec import load_dump
    from fastspec.acceptance import dump_acceptance, resolve_sampling

    with load_dump(small) as d:
        sp = resolve_sampling(d)
        alpha = dump_acceptance(d)["d"].alpha
        for method in ("token", "block"):
            whole = runners.token_replay(d, "d", alpha, 3, 6, 3, 11, sp, method=method)
            ticks = []
            grouped = runners.token_replay(d, "d", alpha, 3, 6, 3, 11, sp, ticks.append, method=method, lanes=5)
            assert sum(ticks) == 3 * 6 and len(ticks) > 3  # progress in finished replays, while it runs
            for key, v in whole.items():
                assert (v == grouped[key]) if key == "token_check" else np.array_equal(v, grouped[key]), key
    ticks = []
    ids = np.arange(3, dtype=np.int64)
    lengths = np.full(3, 12, np.int64)
    whole = runners.bernoulli(alpha, lengths, ids, 3, 40, 4, 5)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)  # a block holds at least one row per thread
    try:
        split = runners.bernoulli(alpha, lengths, ids, 3, 40, 4, 5, max_work=1, progress=ticks.append)
    finally:
        numba.set_num_threads(threads)
    assert ticks == [1, 1, 1] and all(np.array_equal(whole[x], split[x]) for x in whole)


def test_progress_total_counts_what_the_ticks_count(small):
    for kw in (dict(mode="token", trials=4), dict(), dict(verify="token,block", candidates="1,2", block_trials=3)):
        total, ticks = [], []
        simulate(small, k=[1, 2], progress=ticks.append, progress_total=total.append, **kw)
        assert total == [sum(ticks)], kw


# ------------------------------------------------------------------ arguments: typed errors, drafts once

@pytest.mark.parametrize("kw, err", [
    (dict(draft_cost="0.1"), InvalidType), (dict(draft_cost=float("nan")), InvalidInput),
    (dict(draft_cost=True), InvalidType), (dict(batches=2.5), InvalidType), (dict(batches=1), InvalidInput),
    (dict(batches=np.int64(10 ** 6)), InvalidInput), (dict(trials="9"), InvalidInput),
    (dict(seed=2 ** 64), InvalidInput), (dict(seed=1.5), InvalidType), (dict(drafts=[1]), InvalidType),
    (dict(drafts=5), InvalidType), (dict(progress=3), InvalidType), (dict(progress_total="x"), InvalidType),
    (dict(mode=["token"]), InvalidInput), (dict(k=2.5), InvalidType), (dict(candidates=2.5), InvalidInput),
    (dict(candidates=np.float64(1.5)), InvalidInput), (dict(verify_cost=[1]), InvalidType),
])
def test_argument_errors_are_typed(small, kw, err):
    with pytest.raises(err) as info:
        simulate(small, **kw)
    assert "np." not in str(info.value)  # values as the user wrote them, never np.int64(...)


def test_dump_argument_of_the_wrong_type():
    with pytest.raises(InvalidType, match="dump must be a path"):
        simulate(123)


def test_repeated_drafts_are_simulated_once(small):
    r = simulate(small, k=2, drafts=["d", "d"], trials=4)
    assert [x.draft for x in r.results] == ["d"] and r.config["drafts"] == ["d"]
    assert simulate(small, k=2, drafts="d", trials=4).config["drafts"] == ["d"]


# ------------------------------------------------------------------ too few trials: no zero-width interval

def test_two_trials_never_give_a_zero_width_interval_or_infinite_z(tmp_path):
    # one verify step per trial (L = 2, k = 1): two trials often agree; before, ci95 was zero-width and z = inf
    path = constant_dump(tmp_path / "one.npz", 1, 2)
    seen = set()
    for seed in range(8):
        r = simulate(path, k=1, trials=2, seed=seed)
        row = r.results[0]
        assert row.ci95 is None or row.ci95[1] > row.ci95[0]
        assert row.mc_vs_exact_z is None or math.isfinite(row.mc_vs_exact_z)
        if row.ci95 is None:
            seen.add("unavailable")
            assert row.standard_error is None and row.mc_agrees_with_exact is None and r.disagreements == []
            assert any("no Monte-Carlo interval for d k=1" in w for w in r.warnings)
        else:
            seen.add("interval")
            assert row.mc_agrees_with_exact is True and row.mc_vs_exact_threshold > 6000  # t, 1 df, 1e-4
    assert seen == {"unavailable", "interval"}


def test_a_deterministic_process_keeps_its_exact_zero_width_interval(tmp_path):
    rng = np.random.default_rng(0)
    t = rng.normal(0, 2, (2, 10, 6))
    path = save_dump(str(tmp_path / "g.npz"), t, {"d": t + rng.normal(0, 1, t.shape)}, temperature=1.0)
    row = simulate(path, k=3, temperature=0.0, trials=2).results[0]
    assert row.ci95[0] == row.ci95[1] and row.mc_vs_exact_z == 0.0 and row.mc_agrees_with_exact is True


def test_agreement_threshold_is_student_t_at_the_documented_false_alarm():
    from fastspec.config import AGREEMENT_FALSE_ALARM

    assert AGREEMENT_FALSE_ALARM == 1e-4
    for df in (1, 3, 19, 99):
        assert runners.agreement_threshold(df) == pytest.approx(stats.t.isf(5e-5, df), rel=1e-9)
    assert runners.agreement_threshold(math.inf) == pytest.approx(stats.norm.isf(5e-5), rel=1e-12)


def test_rows_carry_the_threshold_they_were_judged_by(small):
    r = simulate(small, k=2, mode="token", trials=4, seed=1).results[0]
    assert r.mc_vs_exact_threshold == pytest.approx(stats.t.isf(5e-5, 3), rel=1e-9)  # 4 batches: 28.0
    assert r.token_check["threshold"] == pytest.approx(stats.norm.isf(5e-5), rel=1e-9)
    assert simulate(small, k=2, trials=200).results[0].mc_vs_exact_threshold == pytest.approx(4.897, abs=1e-3)


if os.name != "posix":  # the memory test reads /proc and sets an address-space limit
    test_token_replay_memory_does_not_grow_with_trials = pytest.mark.skip("Linux only")(
        test_token_replay_memory_does_not_grow_with_trials)
