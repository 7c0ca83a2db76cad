"""Draft-length policies (issue 23): the exact DP against a brute-force enumeration of every drafting / acceptance
outcome in fractions.Fraction, driven by the online PolicyState itself; fixed k against the simulator; the
Monte-Carlo replay against the exact DP (and a broken replay shown to fail)."""
from __future__ import annotations

import copy
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

import fastspec
from fastspec.io import save_dump
from fastspec.policies import parse_policy
from fastspec.simulation.policy_eval import evaluate_features, evaluate_policy
from fastspec.simulation.policy_features import policy_features
from fastspec.stats import t_isf

V = 3
# dyadic distributions: exact in float64, so the DP's float sums meet the Fractions to ~1e-16
DYADIC = [(Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)), (Fraction(3, 4), Fraction(1, 8), Fraction(1, 8)),
          (Fraction(1, 8), Fraction(5, 8), Fraction(1, 4)), (Fraction(1, 4), Fraction(1, 4), Fraction(1, 2)),
          (Fraction(7, 8), Fraction(1, 16), Fraction(1, 16)), (Fraction(1, 16), Fraction(3, 16), Fraction(3, 4))]


def _tiny(seed, N=3, T=6):
    rng = np.random.default_rng(seed)
    P = [[DYADIC[rng.integers(len(DYADIC))] for _ in range(T)] for _ in range(N)]
    Q = [[tuple(np.array(DYADIC[rng.integers(len(DYADIC))])[rng.permutation(V)]) for _ in range(T)]
         for _ in range(N)]
    lengths = np.array([T, T - 1, T - 2][:N], np.int64)
    return P, Q, lengths


def _save(tmp_path, P, Q, lengths):
    logit = lambda D: np.log(np.array([[[float(x) for x in row] for row in seq] for seq in D]))  # noqa: E731
    return save_dump(tmp_path / "tiny.npz", logit(P), {"d": logit(Q)}, lengths=lengths, temperature=1.0)


def brute(p, q, L, policy):
    """Expected (steps, drafted, accepted, {n: steps drafting n}, {n: of those all accepted}) of one sequence by
    enumerating every drafted token and verification outcome, with the policy's own online state."""
    out = {"steps": Fraction(0), "drafted": Fraction(0), "accepted": Fraction(0)}
    hist, hall = {}, {}

    def outcomes(t, judged):
        qmax = max(q[t])
        for v in range(V):
            if q[t][v] == 0:
                continue
            if not judged:
                yield q[t][v], qmax, True, q[t][v]
                continue
            a = min(p[t][v], q[t][v])
            if a > 0:
                yield q[t][v], qmax, True, a
            if q[t][v] - a > 0:
                yield q[t][v], qmax, False, q[t][v] - a

    def walk(s, state, w):
        if s >= L - 1:
            return
        d = min(state.budget(), L - 1 - s)

        def draft(j, st, w, rej, qs):
            for qv, qm, ok, pr in outcomes(s + j, rej < 0):
                st2 = copy.deepcopy(st)
                go = st2.keep_drafting(j, float(qv), float(qm))
                r2 = rej if rej >= 0 or ok else j
                if go and j + 1 < d:
                    draft(j + 1, st2, w * pr, r2, qs + [float(qv)])
                else:
                    D = j + 1
                    acc = r2 if r2 >= 0 else D
                    ww = w * pr
                    out["steps"] += ww
                    out["drafted"] += ww * D
                    out["accepted"] += ww * acc
                    hist[D] = hist.get(D, 0) + ww
                    if acc == D:
                        hall[D] = hall.get(D, 0) + ww
                    st2.update(D, acc, qs + [float(qv)])
                    walk(s + acc + 1, st2, ww)

        draft(0, state, w, -1, [])

    walk(0, policy.start(), Fraction(1))
    return out, hist, hall


EXACT_SPECS = ["fixed:k=1", "fixed:k=3", "conf:theta=0.3,kmax=3", "conf:theta=0.6,kmax=4,on=token",
               "conf:theta=0.3,kmax=3,on=max", "conf:theta=0.7,kmax=2,on=max", "specdec:h=0.5,kmax=4,on=max",
               "specdec:h=0.2,kmax=3,on=max", "hf:k=2,tune=off,theta=0.3", "hf:k=1,schedule=heuristic,tune=off",
               "hf:k=2,schedule=heuristic_transient,theta=0.3,tune=off", "hf:k=3,theta=0"]


@pytest.mark.parametrize("spec", EXACT_SPECS)
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_dp_matches_brute_force(tmp_path, spec, seed):
    P, Q, lengths = _tiny(seed)
    pol = parse_policy(spec)
    assert pol.exact_replay
    est = evaluate_policy(_save(tmp_path, P, Q, lengths), "d", pol)
    assert est.exact and est.method == "exact DP"
    for n, L in enumerate(lengths):
        ref, hist, hall = brute(P[n], Q[n], int(L), pol)
        assert est.per_sequence_steps[n] == pytest.approx(float(ref["steps"]), abs=1e-12)
        assert est.per_sequence_drafted[n] == pytest.approx(float(ref["drafted"]), abs=1e-12)
        assert est.per_sequence_accepted[n] == pytest.approx(float(ref["accepted"]), abs=1e-12)
        got = est.per_sequence_draft_lengths[n]
        got_all = est.per_sequence_all_accepted[n]
        for k in range(len(got)):
            assert got[k] == pytest.approx(float(hist.get(k, 0)), abs=1e-12), (k, got, hist)
            assert got_all[k] == pytest.approx(float(hall.get(k, 0)), abs=1e-12), (k, got_all, hall)


def test_brute_force_reference_can_fail(tmp_path):
    """The comparison has teeth: a different threshold gives a different exact answer."""
    P, Q, lengths = _tiny(0)
    est = evaluate_policy(_save(tmp_path, P, Q, lengths), "d", "conf:theta=0.3,kmax=3")
    ref, _, _ = brute(P[0], Q[0], int(lengths[0]), parse_policy("conf:theta=0.6,kmax=3"))
    assert abs(est.per_sequence_drafted[0] - float(ref["drafted"])) > 1e-3


SYNTH = "data/synthetic_pair.npz"


@pytest.mark.parametrize("k", [1, 4, 7])
def test_fixed_k_reproduces_simulate(k):
    import os

    path = os.path.join(os.path.dirname(__file__), os.pardir, SYNTH)
    sim = fastspec.simulate(path, k=k, drafts=["mid"], trials=2)
    est = evaluate_policy(path, "mid", f"fixed:k={k}")
    assert abs(est.mean_acceptance_length - sim.results[0].mean_acceptance_length_exact) < 1e-12
    assert est.ci95_sequences == pytest.approx(sim.results[0].ci95_sequences, abs=1e-12)


@pytest.fixture(scope="module")
def synth_features():
    import os

    from fastspec.acceptance import resolve_sampling
    from fastspec.io import load_dump

    path = os.path.join(os.path.dirname(__file__), os.pardir, SYNTH)
    with load_dump(path) as d:
        sp = resolve_sampling(d)
        good = policy_features(d, "far", sp, thetas=[0.2], trials=1500, seed=3)
        broken = policy_features(d, "far", sp, thetas=[0.2], trials=1500, seed=3, joint=False)
    return good, broken


def _z(f, spec):
    ex = evaluate_features(f, spec)
    mc = evaluate_features(f, spec, method="mc")
    return (mc.mean_acceptance_length - ex.mean_acceptance_length) / mc.mc_standard_error


# two-sided false-failure probability 1e-7 per check, Student t with the batches' 19 degrees of freedom
BOUND = t_isf(0.5e-7, 19)


@pytest.mark.parametrize("spec", ["fixed:k=4", "conf:theta=0.2,kmax=6", "conf:theta=0.2,kmax=6,on=max",
                                  "specdec:h=0.6,kmax=6,on=max", "hf:k=5,schedule=heuristic,theta=0.2,tune=off"])
def test_monte_carlo_agrees_with_exact(synth_features, spec):
    good, _ = synth_features
    assert abs(_z(good, spec)) < BOUND


def test_broken_monte_carlo_is_caught(synth_features):
    """Drawing the acceptance coin for another token than the one whose probability the stop reads breaks the
    joint law of (q(x), accepted): the check must flag it."""
    _, broken = synth_features
    assert abs(_z(broken, "conf:theta=0.2,kmax=6")) > BOUND


def test_mc_policies_report_their_method(tmp_path):
    P, Q, lengths = _tiny(2)
    path = _save(tmp_path, P, Q, lengths)
    for spec in ("hf", "specdec:h=0.5,kmax=4"):
        est = evaluate_policy(path, "d", spec, trials=40, seed=5)
        assert not est.exact and est.method == "Monte-Carlo (trials=40, seed=5)"
        again = evaluate_policy(path, "d", spec, trials=40, seed=5)
        assert again.mean_acceptance_length == est.mean_acceptance_length  # keyed, fixed seed
        assert math.isfinite(est.mean_acceptance_length)


def test_monte_carlo_hf_tuning_matches_brute_force_law(tmp_path):
    """hf with ROC tuning (Monte-Carlo only) against the brute-force enumeration with the online state."""
    P, Q, lengths = _tiny(4, N=1, T=6)
    pol = parse_policy("hf:k=3,theta=0.3")
    est = evaluate_policy(_save(tmp_path, P, Q, lengths), "d", pol, trials=4000, seed=1)
    ref, _, _ = brute(P[0], Q[0], int(lengths[0]), pol)
    m_ref = 1 + float(ref["accepted"] / ref["steps"])
    assert abs(est.mean_acceptance_length - m_ref) < BOUND * est.mc_standard_error


def test_every_dp_outcome_enumerated_once():
    """The brute force itself: probabilities of one position's outcomes add up to 1."""
    for pq in itertools.product(DYADIC, repeat=2):
        p, q = pq
        tot = sum(min(a, b) + (b - min(a, b)) for a, b in zip(p, q, strict=True))
        assert tot == 1


def test_hf_without_stop_is_fixed_k(tmp_path):
    """hf with theta 0 and the constant schedule drafts k every step: the same DP result as fixed k."""
    P, Q, lengths = _tiny(3)
    path = _save(tmp_path, P, Q, lengths)
    a = evaluate_policy(path, "d", "hf:k=3,theta=0")
    b = evaluate_policy(path, "d", "fixed:k=3")
    assert np.array_equal(a.per_sequence_accepted, b.per_sequence_accepted)
    assert np.array_equal(a.per_sequence_draft_lengths, b.per_sequence_draft_lengths)
