"""The Monte-Carlo agreement checks at their defaults (issue #12): calibrated, and with power.

Before: token mode's default (4 trials, so 4 batches) judged |MC - exact| / se against 4, a normal-sized
threshold for a Student t with 3 degrees of freedom, and warned "a bug or too few trials" on 3 or 4 of 12 seeds
of the shipped synthetic dump.  Now every check is judged at a false-alarm probability of 1e-4 (Student t with
batches - 1 df; normal for the acceptance check), and token mode defaults to 20 trials (19 df), enough for the
checks to flag a replay that under-accepts by 3% on the same dump.
"""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

import fastspec.verify
from fastspec.simulation import runners, simulate

pytestmark = pytest.mark.statistical

SYNTHETIC = os.path.join(os.path.dirname(__file__), os.pardir, "data", "synthetic_pair.npz")
SEEDS = range(12)


def under_accepting(verify_logits, rate=0.03, seed=123):
    """verify_logits whose every accepted draft is turned into a rejection with probability ``rate``: each judged
    position accepts with probability (1 - rate) * alpha_t (a 3% under-accepting kernel)."""
    rng = np.random.default_rng(seed)

    def broken(*args, **kwargs):
        res = verify_logits(*args, **kwargs)
        acc = res.num_accepted
        flips = rng.random((acc.size, max(1, int(acc.max(initial=0))))) < rate
        first = np.where(flips.any(1), flips.argmax(1), np.iinfo(np.int64).max)
        return replace(res, num_accepted=np.minimum(acc, first))

    return broken


def test_default_token_mode_gives_no_false_warning_on_12_seeds():
    for seed in SEEDS:
        r = simulate(SYNTHETIC, mode="token", seed=seed)
        assert r.config["trials"] == 20 and r.config["batches"] == 20
        assert r.disagreements == [], [(x.draft, x.mc_vs_exact_z, x.token_check["z"]) for x in r.results]


def test_default_token_mode_detects_a_3_percent_under_acceptance(monkeypatch):
    monkeypatch.setattr(fastspec.verify, "verify_logits", under_accepting(fastspec.verify.verify_logits))
    flagged_mc = flagged_check = 0
    for seed in SEEDS:
        r = simulate(SYNTHETIC, mode="token", seed=seed)
        assert r.disagreements, seed  # every run warns
        near = next(x for x in r.results if x.draft == "near")
        flagged_mc += not near.mc_agrees_with_exact
        flagged_check += not near.token_check["passed"]
    assert flagged_mc == flagged_check == len(SEEDS)  # both checks, on the draft with the most judged positions


def test_default_bernoulli_mode_calibrated_and_detects_a_3_percent_under_acceptance(monkeypatch):
    for seed in SEEDS:
        assert simulate(SYNTHETIC, k="1-4", seed=seed).disagreements == []
    honest = runners.bernoulli
    monkeypatch.setattr(runners, "bernoulli", lambda alpha, *a, **kw: honest(alpha * 0.97, *a, **kw))
    for seed in SEEDS:
        r = simulate(SYNTHETIC, k="1-4", seed=seed)
        assert all(x.mc_agrees_with_exact is False for x in r.results), seed  # |z| >= 7 on all 144 rows
