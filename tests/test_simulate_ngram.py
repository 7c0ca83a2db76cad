"""The n-gram draft in the simulator: the step-dependent DP against a direct replay through verify_logits."""
from __future__ import annotations

import types

import numpy as np
import pytest

from fastspec import verify_logits
from fastspec.ngram import NgramProposer, parse_ngram_draft
from fastspec.params import SamplingParams
from fastspec.simulation.ngram import ngram_replay


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


# ------------------------------------------------------------------ through fastspec.simulate and the CLI

def _saved(tmp_path, name="t.npz", rows=slice(None), costs=None, drafts=None):
    """The stub as a saved target-only dump (prompt tokens recorded), optionally rows of it and a draft model."""
    from fastspec import save_dump

    d = _dump(1)
    lg = d.logits[rows]
    return save_dump(str(tmp_path / name), lg, drafts(lg) if drafts else None, tokens=d.tokens[rows],
                     lengths=d.lengths[rows], prompt_tokens=d.prompt_tokens[rows],
                     prompt_lengths=d.prompt_lengths[rows], temperature=0.0, costs=costs)


NGRAM_COSTS = {"version": 1, "target": {"forward_s": {str(n): 0.02 + 0.002 * n for n in range(1, 6)}},
               "drafts": {"ngram": {"forward_s": {"1": 0.00003}, "one_call_per_step": True}},
               "overhead_s": {"0": 0.0002, "1": 0.0003, "2": 0.00035, "3": 0.00038, "4": 0.0004}}


def test_simulate_target_only_dump_defaults_to_ngram(tmp_path):
    from fastspec.simulation import simulate

    p = _saved(tmp_path, costs=NGRAM_COSTS)
    res = simulate(p, k=[1, 2, 4])
    assert res.config["drafts"] == ["ngram1-3"] and res.config["costs"]["source"] == "dump"
    direct = ngram_replay(_dump(1), NgramProposer(4, 1, 3), [1, 2, 4], SamplingParams(temperature=0.0))
    for r, want in zip(res.results, direct, strict=True):
        assert r.mean_acceptance_length_exact == pytest.approx(want["mean_acceptance_length_exact"], rel=1e-12)
        assert r.speedup is not None and r.speedup_ci95[0] < r.speedup < r.speedup_ci95[1]
        assert r.off_record == 0.0 and r.ci95_sequences is not None
    assert res.best_overall["draft"] == "ngram1-3" and res.verdict.startswith("best: ngram1-3")
    assert not any("Monte-Carlo" in w for w in res.warnings)  # exact rows miss no interval
    named = simulate(p, k=2, drafts=["ngram2-3"])
    assert named.config["drafts"] == ["ngram2-3"] and named.config["ngram"]["ngram2-3"]["min_n"] == 2


def test_ngram_speedup_by_hand(tmp_path):
    from fastspec.simulation import simulate

    p = _saved(tmp_path, costs=NGRAM_COSTS)
    d = _dump(1)
    k = 2
    # the greedy replay step by step, priced with the table's loop model
    t_fwd = NGRAM_COSTS["target"]["forward_s"]
    over = NGRAM_COSTS["overhead_s"]
    call = NGRAM_COSTS["drafts"]["ngram"]["forward_s"]["1"]
    plain = t_fwd["1"] + over["0"]
    total_time = total_tokens = 0.0
    for n in range(d.N):
        L = int(d.lengths[n])
        t = 0
        while t < L:
            prop = NgramProposer(k, 1, 3).propose(list(d.prompt_tokens[n]) + list(d.tokens[n, :t]))
            dd = min(len(prop), k, L - 1 - t)
            if dd == 0:
                total_time += call + plain
                t += 1
                continue
            res = verify_logits(d.logits[n:n + 1, t:t + dd + 1], None, prop[None, :dd], temperature=0.0)
            a = int(res.num_accepted[0])
            total_time += call + t_fwd[str(dd + 1)] + over[str(dd)]
            t += a + 1
        total_tokens += L
    r = simulate(p, k=k).results[0]
    assert r.speedup == pytest.approx(total_tokens * plain / total_time, rel=1e-12)


def test_ngram_sharded_equals_single(tmp_path):
    from fastspec.simulation import simulate

    single = _saved(tmp_path, "one.npz", costs=NGRAM_COSTS)
    sdir = tmp_path / "shards"
    sdir.mkdir()
    _saved(sdir, "a.npz", rows=slice(0, 2), costs=NGRAM_COSTS)
    _saved(sdir, "b.npz", rows=slice(2, None), costs=NGRAM_COSTS)
    a = simulate(single, k=[1, 3]).as_dict()
    b = simulate(str(sdir), k=[1, 3]).as_dict()
    assert a["results"] == b["results"] and a["verdict"] == b["verdict"]


def test_ngram_needs_prompt_tokens_and_a_valid_spec(tmp_path):
    from fastspec import save_dump
    from fastspec.simulation import simulate

    d = _dump(1)
    bare = save_dump(str(tmp_path / "bare.npz"), d.logits, None, tokens=d.tokens, lengths=d.lengths,
                     temperature=0.0)
    with pytest.raises(ValueError, match="no draft model and no prompt tokens"):
        simulate(bare, k=2)
    with pytest.raises(ValueError, match="prompt_tokens"):
        simulate(bare, k=2, drafts=["ngram"])
    p = _saved(tmp_path)
    with pytest.raises(ValueError, match="ngramMIN-MAX"):
        simulate(p, k=2, drafts=["ngram3"])
    with pytest.raises(ValueError, match="no draft named 'exit'"):
        simulate(p, k=2, drafts=["exit"])
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    run = CliRunner().invoke
    r = run(app, ["simulate", bare, "--k", "2", "--draft", "ngram"])
    assert r.exit_code == 2 and "prompt_tokens" in r.stderr and "Traceback" not in r.output
    r = run(app, ["simulate", p, "--k", "2", "--draft", "ngram5-2"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
    r = run(app, ["simulate", p, "--k", "1,2", "--draft", "ngram1-2", "--json"])
    assert r.exit_code == 0, r.output
    import json

    out = json.loads(r.stdout)
    assert [x["draft"] for x in out["results"]] == ["ngram1-2", "ngram1-2"] and out["verdict"]
