"""Hugging Face's assisted-generation policy (transformers 5.24.0) as fastspec replays it: the ROC threshold against a
brute-force enumeration in fractions; the online HFState against a transcription of
``AssistedCandidateGenerator.update_candidate_strategy`` (and, marked hf, against transformers' own code); the
Monte-Carlo kernel's replay of the schedule and the tuning against the online state on the same draws."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from fastspec._kernels.policy import N_P, policy_mc, roc_threshold
from fastspec.policies import HF_DEFAULTS, hf_roc_threshold, parse_policy, roc_curve
from fastspec.simulation.policy_eval import _codes


def brute_costs(y, s):
    """{threshold: exact fpr + 3 fnr} over every candidate threshold (each distinct score, and inf)."""
    P = sum(y)
    N = len(y) - P
    out = {float("inf"): Fraction(3)}
    for t in sorted(set(s), reverse=True):
        tp = sum(1 for yi, si in zip(y, s, strict=True) if si >= t and yi == 1)
        fp = sum(1 for yi, si in zip(y, s, strict=True) if si >= t and yi == 0)
        out[t] = Fraction(fp, N) + 3 * (1 - Fraction(tp, P))
    return out


def _float_cost(y, s, t):
    """fpr + 3 (1 - tpr) at threshold t in scikit-learn's float64 operations."""
    P, N = float(y.sum()), float(len(y) - y.sum())
    tp = float(((s >= t) & (y == 1)).sum())
    fp = float(((s >= t) & (y == 0)).sum())
    return fp / N + 3 * (1 - tp / P)


def _cases(n_cases=300):
    rng = np.random.default_rng(11)
    for _ in range(n_cases):
        m = int(rng.integers(2, 30))
        levels = rng.choice([0.05, 0.1, 0.2, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 0.95, 1.0], size=int(rng.integers(2, 9)))
        s = rng.choice(levels, size=m)
        y = (rng.random(m) < s).astype(int)
        if 0 < y.sum() < m:
            yield y, s


def test_roc_threshold_is_an_exact_minimizer():
    checked = unique = 0
    for y, s in _cases():
        t = hf_roc_threshold(y, s)
        assert roc_threshold(s.astype(np.float64), y.astype(np.float64), len(s)) == t  # the kernel, bit for bit
        costs = brute_costs(list(y), list(s))
        best = min(costs.values())
        assert costs[t] == best, (y, s, t)
        winners = [k for k, c in costs.items() if c == best]
        if len(winners) == 1:
            unique += 1
        else:  # exact ties: scikit-learn's float costs decide; its argmin takes the first (highest) threshold
            fl = {k: _float_cost(y, s, k) for k in costs}
            low = min(fl.values())
            assert t == max(k for k, c in fl.items() if c == low)
        checked += 1
    assert checked > 200 and unique > 50


def test_roc_curve_points_against_brute_force():
    for y, s in _cases(60):
        fpr, tpr, thr = roc_curve(y, s, drop_intermediate=False)
        assert thr[0] == np.inf and fpr[0] == tpr[0] == 0
        for f, tp, t in zip(fpr[1:], tpr[1:], thr[1:], strict=True):
            assert f == pytest.approx(np.mean(s[y == 0] >= t)) and tp == pytest.approx(np.mean(s[y == 1] >= t))
        f2, t2, th2 = roc_curve(y, s)  # drop_intermediate keeps a subset of the points, the ends included
        assert set(th2) <= set(thr) and th2[-1] == thr[-1] and len(th2) <= len(thr)


def test_broken_roc_is_caught():
    """Choosing by fpr + fnr (equal weights) instead of fpr + 3 fnr picks a non-minimizer somewhere."""
    wrong = 0
    for y, s in _cases():
        fpr, tpr, thr = roc_curve(y, s)
        t = float(thr[int(np.argmin(fpr + (1 - tpr)))])
        costs = brute_costs(list(y), list(s))
        wrong += costs[t] != min(costs.values())
    assert wrong > 0


class TranscribedHF:
    """transformers 5.24.0 candidate_generator.py, AssistedCandidateGenerator.update_candidate_strategy and the
    probs bookkeeping of _generate_candidates, transcribed (scikit-learn's roc_curve -> fastspec's)."""

    def __init__(self, num_assistant_tokens, schedule, threshold, sklearn=True):
        self.num_assistant_tokens = num_assistant_tokens
        self.schedule = schedule
        self.threshold = threshold
        self.sklearn = sklearn
        if sklearn and threshold:
            self.probs, self.matches = [], []

    def generate_candidates(self, p):
        if self.sklearn and self.threshold:
            self.probs.extend(p)

    def update_candidate_strategy(self, candidate_length, num_matches):
        if self.schedule in {"heuristic", "heuristic_transient"}:
            if num_matches == candidate_length:  # len(scores[0]) - 1
                self.num_assistant_tokens += 2
            else:
                self.num_assistant_tokens = max(1, self.num_assistant_tokens - 1)
        if self.sklearn and self.threshold:
            self.matches.extend([1] * num_matches)
            if len(self.probs) > len(self.matches):
                self.matches.append(0)
            excess_length = len(self.probs) - len(self.matches)
            if excess_length > 0:
                del self.probs[-excess_length:]
            if len(self.probs) > 5 and {0, 1}.issubset(self.matches):
                fpr, tpr, thresholds = roc_curve(self.matches, self.probs)
                fnr = 1 - tpr
                costs = fpr + 3 * fnr
                self.threshold = thresholds[np.argmin(costs)]


def check_drive(pol, ref, rng, steps=80):
    state = pol.start()
    for _ in range(steps):
        n = state.budget()
        assert n == max(1, ref.num_assistant_tokens)
        qs = []
        for j in range(n):
            q = float(rng.choice([0.05, 0.2, 0.35, 0.5, 0.7, 0.9, 1.0]))
            qs.append(q)
            go = state.keep_drafting(j, q, max(q, 0.5))
            assert go == (not (ref.threshold > 0 and q < ref.threshold))  # ConfidenceCriteria
            if not go:
                break
        acc = int(rng.integers(0, len(qs) + 1))
        ref.generate_candidates(qs)
        ref.update_candidate_strategy(len(qs), acc)
        state.update(len(qs), acc, qs)
        assert state.num_assistant_tokens == ref.num_assistant_tokens
        assert state.threshold == ref.threshold
    return state


@pytest.mark.parametrize("spec", ["hf", "hf:schedule=heuristic", "hf:schedule=heuristic_transient,k=3",
                                  "hf:schedule=heuristic,tune=off", "hf:theta=0,schedule=heuristic"])
def test_hf_state_matches_transcription(spec):
    pol = parse_policy(spec)
    rng = np.random.default_rng(5)
    ref = TranscribedHF(pol.k, pol.schedule, pol.theta, sklearn=pol.tune == "roc")
    check_drive(pol, ref, rng)


def test_hf_state_transcription_check_can_fail():
    pol = parse_policy("hf:schedule=heuristic")
    ref = TranscribedHF(pol.k, "constant", pol.theta)  # the wrong schedule
    with pytest.raises(AssertionError):
        check_drive(pol, ref, np.random.default_rng(5))


def test_hf_defaults_and_persistence():
    assert HF_DEFAULTS == {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
                           "assistant_confidence_threshold": 0.4}
    pol = parse_policy("hf")
    assert (pol.hf_num_assistant_tokens, pol.hf_schedule, pol.hf_confidence_threshold, pol.hf_tune) == \
        (20, "constant", 0.4, "roc")
    h = parse_policy("hf:schedule=heuristic,k=5")
    s = h.start()
    s.update(3, 3, [0.9, 0.9, 0.9])
    s.update(2, 0, [0.9, 0.1])
    assert s.num_assistant_tokens == 6 and h.start(s).num_assistant_tokens == 6  # carried over (heuristic)
    t = parse_policy("hf:schedule=heuristic_transient,k=5")
    s = t.start()
    s.update(3, 3, [0.9] * 3)
    assert t.start(s).num_assistant_tokens == 5  # transient: reset
    s = pol.start()
    for _ in range(4):
        s.update(2, 1, [0.9, 0.2])
    assert s.threshold != 0.4 and pol.start(s).threshold == 0.4  # the tuned threshold does not persist


def _replay_online(pol, qx, acc, qmax, L, previous=None):
    """(steps, accepted, final state) of one trial replayed with the online state (the reference for the kernel)."""
    st = pol.start(previous)
    s = steps = accepted = 0
    while s < L - 1:
        d = min(st.budget(), L - 1 - s)
        qs, rej = [], -1
        for j in range(d):
            t = s + j
            qs.append(qx[t])
            if rej < 0 and not acc[t]:
                rej = j
            if not st.keep_drafting(j, qx[t], qmax[t]):
                break
        a = rej if rej >= 0 else len(qs)
        st.update(len(qs), a, qs)
        steps += 1
        accepted += a
        s += a + 1
    if s == L - 1:  # the last token alone: HF's plain step, an update with nothing drafted
        st.update(0, 0, [])
    return steps, accepted, st


@pytest.mark.parametrize("spec", ["hf:k=4", "hf:k=2,schedule=heuristic", "specdec:h=0.5,kmax=5", "fixed:k=3",
                                  "hf:k=3,schedule=heuristic_transient,theta=0.6", "conf:theta=0.4,kmax=5"])
def test_mc_kernel_replays_the_online_state(spec):
    pol = parse_policy(spec)
    rng = np.random.default_rng(9)
    L, trials = 40, 30
    qx = rng.choice([0.1, 0.25, 0.3, 0.45, 0.6, 0.8, 0.95], size=(trials, L))
    acc = rng.random((trials, L)) < qx
    qmax = np.maximum(qx[0], 0.5)
    rule, on_token, theta, h, k0, heur, tune = _codes(pol)
    tot, hist, hall, per = np.zeros(N_P), np.zeros(L + 2), np.zeros(L + 2), np.zeros((trials, 2))
    policy_mc(qx, acc, qmax, L, (rule, on_token, theta, h, k0, heur, tune), tot, hist, hall, per,
              np.zeros(trials, np.int64))
    for r in range(trials):
        assert tuple(per[r]) == _replay_online(pol, qx[r], acc[r], qmax, L)[:2], r


def test_mc_kernel_carries_the_heuristic_cap_like_start_previous():
    """carry: successive sequences continue from the previous call's cap, as DraftPolicy.start(previous) does (and HF's
    write-back to the assistant's generation_config); the plain step of the last token counts (+2)."""
    pol = parse_policy("hf:k=2,schedule=heuristic,theta=0.3")
    rng = np.random.default_rng(4)
    trials, lengths = 12, [30, 17, 25]
    rule, on_token, theta, h, k0, heur, tune = _codes(pol)
    cap = np.zeros(trials, np.int64)
    states = [None] * trials
    for L in lengths:
        qx = rng.choice([0.1, 0.3, 0.5, 0.7, 0.9], size=(trials, L))
        acc = rng.random((trials, L)) < qx
        per = np.zeros((trials, 2))
        policy_mc(qx, acc, qx[0], L, (rule, on_token, theta, h, k0, heur, tune), np.zeros(N_P), np.zeros(L + 2),
                  np.zeros(L + 2), per, cap)
        for r in range(trials):
            steps, accepted, states[r] = _replay_online(pol, qx[r], acc[r], qx[0], L, states[r])
            assert tuple(per[r]) == (steps, accepted) and cap[r] == states[r].num_assistant_tokens


@pytest.mark.hf
def test_hf_state_matches_transformers_source(monkeypatch):
    """transformers' own update_candidate_strategy and ConfidenceCriteria (scikit-learn replaced by fastspec's
    roc_curve, which is what lets it run here) against HFState."""
    import sys
    import types

    import torch
    from transformers.generation import candidate_generator as cg
    from transformers.generation.stopping_criteria import ConfidenceCriteria

    fake = types.ModuleType("sklearn.metrics")
    fake.roc_curve = roc_curve
    monkeypatch.setitem(sys.modules, "sklearn", types.ModuleType("sklearn"))
    monkeypatch.setitem(sys.modules, "sklearn.metrics", fake)
    monkeypatch.setattr(cg, "is_sklearn_available", lambda: True)
    for spec in ("hf", "hf:schedule=heuristic,k=3", "hf:schedule=heuristic_transient,theta=0.3"):
        pol = parse_policy(spec)
        gen = cg.AssistedCandidateGenerator.__new__(cg.AssistedCandidateGenerator)
        gen.assistant_generation_config = types.SimpleNamespace(
            num_assistant_tokens_schedule=pol.schedule, assistant_confidence_threshold=pol.theta)
        gen.generation_config = types.SimpleNamespace(assistant_confidence_threshold=pol.theta)
        gen.num_assistant_tokens = pol.k
        gen.probs, gen.matches = [], []
        state = pol.start()
        rng = np.random.default_rng(2)
        for _ in range(60):
            thr = gen.generation_config.assistant_confidence_threshold
            crit = ConfidenceCriteria(thr)
            qs = []
            for j in range(state.budget()):
                q0 = float(rng.choice([0.05, 0.2, 0.35, 0.5, 0.7, 0.9]))
                scores = torch.log(torch.tensor([[q0, 1.0 - q0]], dtype=torch.float64))
                q = scores.softmax(-1)[0, 0].item()  # what _generate_candidates records
                qs.append(q)
                stop = bool(crit(torch.tensor([[0]]), (scores,)))
                assert state.keep_drafting(j, q, max(q, 1 - q)) == (not stop)
                if stop:
                    break
            acc = int(rng.integers(0, len(qs) + 1))
            gen.probs.extend(qs)
            cg.AssistedCandidateGenerator.update_candidate_strategy(gen, None, torch.zeros(1, len(qs) + 1, 2), acc)
            state.update(len(qs), acc, qs)
            assert state.num_assistant_tokens == gen.num_assistant_tokens
            assert state.threshold == float(gen.assistant_generation_config.assistant_confidence_threshold)
