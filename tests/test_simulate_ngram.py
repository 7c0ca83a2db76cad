"""The n-gram draft in the simulator: the step-dependent DP against a direct replay through verify_logits."""
from __future__ import annotations

import types

import numpy as np
import pytest

from fastspec import verify_logits
from fastspec.ngram import NgramProposer
from fastspec.params import SamplingParams
from fastspec.simulate.ngram import ngram_replay, parse_ngram_draft


def _dump(seed, N=5, T=40, V=12, greedy=True):
    """A stub dense target-only dump (prompt + generated tokens) whose text repeats, so lookup has matches."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((N, T, V)) * 2.0
    base = rng.integers(0, V, 6)
    prompts = np.stack([np.concatenate([base, base, rng.integers(0, V, 2)]) for _ in range(N)])
    tokens = np.zeros((N, T), np.int64)
    for n in range(N):
        for t in range(T):
            favoured = base[t % len(base)]
            logits[n, t, favoured] += 3.0  # the text tends to repeat the prompt's pattern
            p = np.exp(logits[n, t] - logits[n, t].max())
            tokens[n, t] = int(np.argmax(logits[n, t])) if greedy else int(rng.choice(V, p=p / p.sum()))
    lengths = np.where(np.arange(N) % 2 == 0, T, T - 1 - np.arange(N))

    def iter_chunks(drafts=()):  # noqa: ARG001 - the Dump interface
        yield types.SimpleNamespace(start=0, stop=N * T, target=logits.reshape(N * T, V).astype(np.float32),
                                    drafts={})

    return types.SimpleNamespace(path="<stub>", kind="dense", N=N, T=T, V=V, lengths=lengths, tokens=tokens,
                                 prompt_tokens=prompts, prompt_lengths=np.full(N, prompts.shape[1]),
                                 iter_chunks=iter_chunks, logits=logits.astype(np.float32))


def _direct(d, proposer, k, temperature, seed):
    """The replay step by step through verify_logits with one-hot drafts along the recorded contexts."""
    steps = plain = accepted = 0
    for n in range(d.N):
        L = int(d.lengths[n])
        ctx_prompt = list(d.prompt_tokens[n])
        t = 0
        while t < L:
            prop = NgramProposer(k, proposer.min_n, proposer.max_n).propose(ctx_prompt + list(d.tokens[n, :t]))
            dd = min(len(prop), k, L - 1 - t)
            if dd == 0:
                plain += 1
                t += 1
                continue
            res = verify_logits(d.logits[n:n + 1, t:t + dd + 1], None, prop[None, :dd], temperature=temperature,
                                seed=seed * 100003 + n * 1009 + t)
            a = int(res.num_accepted[0])
            steps += 1
            accepted += a
            t += a + 1
    return steps, plain, accepted


def test_greedy_replay_is_exactly_the_loop():
    d = _dump(1)
    proposer = NgramProposer(4, 1, 3)
    rows = ngram_replay(d, proposer, [1, 2, 4], SamplingParams(temperature=0.0))
    for r in rows:
        steps, plain, accepted = _direct(d, proposer, r["k"], 0.0, 0)
        assert (r["verify_steps"], r["plain_steps"]) == (steps, plain)
        assert r["mean_acceptance_length_exact"] == pytest.approx(1 + accepted / steps, abs=1e-12)
        assert r["off_record"] == 0.0  # a greedy dump analysed greedily never leaves the recording


@pytest.mark.statistical
def test_sampled_dp_matches_monte_carlo_through_the_verifier():
    d = _dump(2, N=6, T=60, greedy=False)
    proposer = NgramProposer(3, 1, 3)
    r = ngram_replay(d, proposer, [3], SamplingParams(temperature=1.0))[0]
    runs = np.array([_direct(d, proposer, 3, 1.0, s) for s in range(150)], dtype=float)
    from fastspec.stats import ratio_ci

    est, se, _ = ratio_ci(runs[:, 0] + runs[:, 2], runs[:, 0])  # tokens / verify steps, ratio of totals
    z = (est - r["mean_acceptance_length_exact"]) / se
    assert abs(z) < 5.3  # two-sided ~1e-7: the DP is the exact expectation of this replay
    # a DP that judged the drafts with the wrong distribution (here: the recorded greedy law) is caught
    wrong = ngram_replay(d, proposer, [3], SamplingParams(temperature=0.0))[0]
    assert abs((est - wrong["mean_acceptance_length_exact"]) / se) > 5.3


def test_parse_ngram_draft():
    assert parse_ngram_draft("exit12", 4) is None
    p = parse_ngram_draft("ngram2-4", 4)
    assert (p.k, p.min_n, p.max_n) == (4, 2, 4)
    assert parse_ngram_draft("ngram", 2).max_n == 3
    with pytest.raises(ValueError, match="ngramMIN-MAX"):
        parse_ngram_draft("ngram:x", 2)
