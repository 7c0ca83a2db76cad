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
from fastspec.errors import InvalidInput, InvalidType
from fastspec.io import save_dump
from fastspec.params import SamplingParams
from fastspec.policies import POLICY_GRAMMAR, DraftPolicy, parse_policy
from fastspec.simulation.policy_eval import evaluate_features, evaluate_policy
from fastspec.simulation.policy_search import search_policies
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


# ------------------------------------------------------------------ issue 30: the policy contract


@pytest.mark.parametrize("build, error, argument, match", [
    (lambda: DraftPolicy("fixed", k=-5), InvalidInput, "k", r"k = -5 must be an integer in \[1, 256\]"),
    (lambda: DraftPolicy("fixed", k=0), InvalidInput, "k", r"k = 0 must be an integer in \[1, 256\]"),
    (lambda: DraftPolicy("fixed", k=10**6), InvalidInput, "k", r"k = 1000000 must be an integer"),
    (lambda: DraftPolicy("fixed", k=True), InvalidType, "k", "k = True must be an integer"),
    (lambda: DraftPolicy("fixed", k=2.0), InvalidType, "k", "k = 2.0 must be an integer"),
    (lambda: DraftPolicy("fixed"), InvalidInput, "k", "fixed needs k"),
    (lambda: DraftPolicy("conf", theta=math.nan, kmax=8), InvalidInput, "theta", r"theta = nan must be in \(0, 1\)"),
    (lambda: DraftPolicy("conf", theta=5, kmax=8), InvalidInput, "theta", r"theta = 5 must be in \(0, 1\)"),
    (lambda: DraftPolicy("conf", theta="0.4", kmax=8), InvalidType, "theta", "theta = '0.4' must be a number"),
    (lambda: DraftPolicy("conf", theta=0.4), InvalidInput, "kmax", "conf needs kmax"),
    (lambda: DraftPolicy("conf", theta=0.4, kmax=8, on="mean"), InvalidInput, "on", "on = 'mean' must be token or max"),
    (lambda: DraftPolicy("specdec", h=1.0, kmax=4), InvalidInput, "h", r"h = 1 must be in \(0, 1\)"),
    (lambda: DraftPolicy("hf", theta=-0.0), InvalidInput, "theta", r"theta = -0 must be in \[0, 1\)"),
    (lambda: DraftPolicy("hf", schedule="fast"), InvalidInput, "schedule", "schedule = 'fast' must be constant"),
    (lambda: DraftPolicy("fixed", k=4, theta=0.3), InvalidInput, "theta", "fixed has no field 'theta'"),
    (lambda: DraftPolicy("bogus"), InvalidInput, "kind", r"kind = 'bogus' is unknown \(known: fixed, conf"),
    (lambda: DraftPolicy(None), InvalidType, "kind", "kind must be a policy kind"),
])
def test_draft_policy_built_directly_is_checked(build, error, argument, match):
    """#30 item 2: DraftPolicy(...) enforces what parse_policy enforces, with typed errors naming the field (on
    7aba47f these were evaluated and returned numbers, and an unknown kind raised a bare TypeError)."""
    with pytest.raises(error, match=match) as exc:
        build()
    assert exc.value.argument == argument


def test_draft_policy_built_directly_equals_the_parsed_one():
    assert DraftPolicy("conf", theta=0.4, kmax=8) == parse_policy("conf:theta=0.4,kmax=8")  # on=token filled in
    assert DraftPolicy("hf") == parse_policy("hf") and DraftPolicy("fixed", k=np.int64(3)).k == 3
    assert DraftPolicy("hf", theta=0).name == "hf(k=20,schedule=constant,theta=0,tune=roc)"


@pytest.mark.parametrize("spec, match", [
    ("conf:theta=0.4", "conf needs kmax"),         # the grammar shows kmax as required: no silent kmax = 8
    ("specdec:h=0.5,on=max", "specdec needs kmax"),
    ("fixed:k=4)", "unbalanced parentheses"),
    ("fixed(k=4", "unbalanced parentheses"),
    ("hf:theta=-0", r"theta=-0 must be in \[0, 1\)"),
    ("conf:theta=2", r"theta=2 must be in \(0, 1\)"),  # a bad value is still named before a missing field
])
def test_grammar_and_parser_agree(spec, match):
    """#30 item 21: what POLICY_GRAMMAR shows is what parse_policy takes."""
    assert "conf:theta=T,kmax=K[" in POLICY_GRAMMAR and "specdec:h=H,kmax=K[" in POLICY_GRAMMAR
    with pytest.raises(InvalidInput, match=match):
        parse_policy(spec)
    assert parse_policy("fixed(k=4)") == parse_policy("fixed:k=4") and parse_policy("hf:theta=0").theta == 0.0


@pytest.mark.parametrize("seed, error", [(None, InvalidType), (2**70, InvalidInput), (-2**63 - 1, InvalidInput),
                                         (1.5, InvalidType), (True, InvalidType)])
def test_policy_replays_check_the_seed(tmp_path, seed, error):
    """#30 item 18: evaluate_policy and search_policies refuse a seed the verify functions refuse, with the same
    typed check (on 7aba47f seed=None gave a plain TypeError and 2**70 was accepted)."""
    P, Q, lengths = _tiny(2)
    path = _save(tmp_path, P, Q, lengths)
    with pytest.raises(error, match="seed"):
        evaluate_policy(path, "d", "hf:k=3,theta=0.3", seed=seed)
    with pytest.raises(error, match="seed"):
        search_policies(path, "d", "dump", seed=seed)
    with pytest.raises(error, match="seed"):
        fastspec.verify_probs(np.full((1, 2, 2), 0.5), np.full((1, 1, 2), 0.5), np.zeros((1, 1), np.int64), seed=seed)
    assert evaluate_policy(path, "d", "fixed:k=2", seed=2**64 - 1).mean_acceptance_length > 1


def test_policy_replays_take_sampling_params(tmp_path):
    """sampling= is a SamplingParams (issue 29, item 2); single settings go one by one, as in SimulateConfig."""
    P, Q, lengths = _tiny(2)
    path = _save(tmp_path, P, Q, lengths)
    a = evaluate_policy(path, "d", "conf:theta=0.4,kmax=3", sampling=SamplingParams(temperature=1.0))
    b = evaluate_policy(path, "d", "conf:theta=0.4,kmax=3", temperature=1.0)
    assert a.mean_acceptance_length == b.mean_acceptance_length
    with pytest.raises(InvalidType, match="sampling must be a SamplingParams"):
        evaluate_policy(path, "d", "fixed:k=2", sampling={"temperature": 1.0})
    with pytest.raises(InvalidInput, match="either as sampling= or one by one"):
        evaluate_policy(path, "d", "fixed:k=2", sampling=SamplingParams(), top_p=0.9)
